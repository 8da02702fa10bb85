"""The index of a lower cache tier (host RAM, disk): token sequences -> keys, LRU, a byte budget.

Each entry belongs to a cache scope (a tenant's): a lookup sees only its own scope's entries.

Pure bookkeeping (no threads, no I/O, no llama calls); the tier that owns the bytes keeps it.
An entry is the KV of one whole token sequence, restorable and then trimmable to any prefix, so
the best entry for a prompt is the one sharing the longest common prefix with it. The entries are
kept sorted as (scope, tokens) tuples: the one with the longest common prefix with a query is a
neighbour of the query's place in that order, so a lookup costs a bisection and two comparisons. An entry that is
a prefix of another is redundant (the longer one serves everything it would) and goes.

Also the rule that says when restoring an entry beats recomputing (``restore_pays``), and what a
restore takes of the prefix index (``plan_restore``, on the scheduler's behalf).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from llamactor.scheduling.kv_nodes import KvOp, common_prefix_len
from llamactor.scheduling.prefix_index import PrefixIndex

# Measured on this project's 2-core machine with Gemma 3 270M (docs/operations.md, "Host-RAM
# tier"): restoring copies every position of an entry, ~0.01 ms per token (9 ms for 1,024, 40 ms
# for 4,096, save ~2-4x that); recomputing costs ~1.8 ms per token (a 400-token prefill), 6 and
# more under load. Restoring pays once the tokens it saves recomputing exceed 1/20 of the entry's
# length (a wide margin), and a floor keeps few-token gains on the plain path.
RESTORE_COST_PER_TOKEN = 1 / 20
RESTORE_MIN_GAIN = 16


def restore_pays(n_gain: int, n_entry: int) -> bool:
    """Restoring an ``n_entry``-token entry to compute ``n_gain`` fewer tokens beats recomputing them."""
    return n_gain >= RESTORE_MIN_GAIN and n_gain >= n_entry * RESTORE_COST_PER_TOKEN


@dataclass(frozen=True, slots=True)
class TierMatch:
    n_tokens: int  # leading tokens of the query the entry holds
    key: str | None = None  # None: no entry shares a token with the query
    n_entry: int = 0  # the entry's whole length (a restore copies all of it, then trims)

    def __post_init__(self) -> None:
        if self.n_tokens < 0 or self.n_tokens > self.n_entry or (self.key is None) != (self.n_tokens == 0):
            raise ValueError(f"bad tier match {self!r}")


NO_MATCH = TierMatch(0)


def restore_worth_it(found: TierMatch, n_matched: int) -> bool:
    """Whether restoring the tier's ``found`` pays over the ``n_matched`` tokens the cells hold: what
    admission restores (``plan_restore``) and ``lpm`` ranks as cached."""
    return found.key is not None and restore_pays(found.n_tokens - n_matched, found.n_entry)


@dataclass(frozen=True, slots=True)
class TierEntry:
    key: str
    scope: str
    tokens: tuple[int, ...]
    nbytes: int


class TierIndex:
    """Entries by tokens, least recently used first out when over ``budget_bytes``. One thread at
    a time (the owner's lock)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("the budget must be >= 0")
        self.budget_bytes = budget_bytes
        self.bytes_used = 0
        self._sorted: list[tuple[str, tuple[int, ...], str]] = []  # (scope, tokens, key)
        self._lru: OrderedDict[str, TierEntry] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def entry(self, key: str) -> TierEntry:
        return self._lru[key]

    def lookup(self, scope: str, tokens: Sequence[int]) -> TierMatch:
        """The entry of ``scope`` sharing the longest common prefix with ``tokens``."""
        query = tuple(tokens)
        i = bisect.bisect_left(self._sorted, (scope, query, ""))
        best = NO_MATCH
        for j in (i - 1, i):
            if 0 <= j < len(self._sorted) and self._sorted[j][0] == scope:
                _, entry_tokens, key = self._sorted[j]
                n = common_prefix_len(entry_tokens, query)
                if n > best.n_tokens:
                    best = TierMatch(n, key, len(entry_tokens))
        return best

    def covers(self, scope: str, tokens: Sequence[int]) -> str | None:
        """The key of an entry of ``scope`` that starts with all of ``tokens`` (saving them again
        is useless)."""
        match = self.lookup(scope, tokens)
        return match.key if match.n_tokens == len(tokens) and tokens else None

    def touch(self, key: str) -> None:
        self._lru.move_to_end(key)

    def add(self, key: str, scope: str, tokens: Sequence[int], nbytes: int) -> list[str]:
        """Index a new entry as the most recently used; returns the keys that leave: entries of its
        scope it makes redundant, then least recently used ones over the budget (itself, if it
        alone is)."""
        entry = TierEntry(key, scope, tuple(tokens), nbytes)
        if not entry.tokens or key in self._lru:
            raise ValueError(f"cannot index {key!r}: empty or already there")
        gone = [e.key for e in self._lru.values() if e.scope == scope and entry.tokens[:len(e.tokens)] == e.tokens]
        for k in gone:
            self.remove(k)
        bisect.insort(self._sorted, (scope, entry.tokens, key))
        self._lru[key] = entry
        self.bytes_used += nbytes
        while self.bytes_used > self.budget_bytes:
            gone.append(self._lru_key())
            self.remove(gone[-1])
        return gone

    def remove(self, key: str) -> TierEntry:
        entry = self._lru.pop(key)
        del self._sorted[bisect.bisect_left(self._sorted, (entry.scope, entry.tokens, key))]
        self.bytes_used -= entry.nbytes
        return entry

    def keys_by_recency(self) -> list[str]:
        """Most recently used first."""
        return list(reversed(self._lru))

    def oldest(self) -> TierEntry | None:
        """The least recently used entry (the next to leave), if any."""
        return next(iter(self._lru.values()), None)

    def _lru_key(self) -> str:
        return next(iter(self._lru))


@dataclass(frozen=True, slots=True)
class RestoreOp:
    """Put the tier's entry ``key`` into the fresh ``seq_id`` (its older sliding-window cells pass
    through the empty ``scratch_id``), then keep only its first ``n_keep`` cells."""

    seq_id: int
    key: str
    n_keep: int
    scratch_id: int

    def __post_init__(self) -> None:
        if self.seq_id < 0 or self.scratch_id < 0 or self.seq_id == self.scratch_id or self.n_keep < 1:
            raise ValueError(f"bad restore {self!r}")


def plan_restore(index: PrefixIndex, found: TierMatch, seq_id: int, reusable: list[int], n_matched: int,
                 ops: list[KvOp], now: float) -> RestoreOp | None:
    """Restore ``found`` (the tier's entry for ``reusable``) into the fresh ``seq_id`` when it pays
    over the ``n_matched`` tokens the index's cells hold; ``ops`` gets what must happen before
    (cached prefixes evicted for its cells, an entry dropped for a scratch id). Batcher thread."""
    key = found.key  # (not None once it is worth it; the type checker needs to see it)
    if key is None or not restore_worth_it(found, n_matched):
        return None
    free = index.n_cells - index.cells_used
    if free < found.n_entry:  # the whole entry comes back before it is trimmed to the match
        ops += index.evict(found.n_entry - free)
        if index.n_cells - index.cells_used < found.n_entry:
            return None
    try:
        scratch, scratch_ops = index.allocate()
    except IndexError:
        return None
    ops += scratch_ops
    index.release(scratch)  # it holds no cells before or after the restore
    index.restored(seq_id, reusable[:found.n_tokens], now)
    return RestoreOp(seq_id, key, found.n_tokens, scratch)

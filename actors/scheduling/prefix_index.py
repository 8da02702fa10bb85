"""The prefix index: which token prefixes have KV cells in the unified cache, and on which seq_ids.

Pure bookkeeping (no threads, no llama calls), run on the batcher's thread through the scheduler.
It is a radix tree whose nodes (``kv_nodes``: walked, split and cut there) are *physical* runs
of KV cells: a node's tokens sit at positions ``[start, end)`` and every seq_id in
``node.seq_ids`` holds those very cells (llama.cpp's unified cache keeps a set of seq_ids per
cell; ``seq_cp`` adds an id to cells, ``seq_rm`` removes it and frees a cell when its set empties). A sequence is a path from the root to its ``leaf`` node, so a
node's ``seq_ids`` contain its children's. Two sequences that computed the same tokens on their
own own different cells: the tree may hold sibling nodes with equal tokens.

Tracked sequences are either *running* (the scheduler's) or *entries*: finished requests whose
KV stays as a cached prefix, and pinned entries (the configured system prompt) that are never
evicted. Every sequence has a cache *scope* (its tenant's): a lookup sees only the sequences of
its own scope and the pinned entries, so one tenant never attaches -- nor learns, by how fast its
prompt runs -- another's prefix; the operator's system prompt stays shared by all. The index also owns the pool of seq_ids. What it decides about the KV cache (drop an
entry, trim its tail) it returns as ``KvOp`` values for the batcher to apply to the engine, in
order, before the step that follows.

Batch-invariant mode's ``PackedPrefixIndex`` (``packed_kv.py``) overrides how cells are freed:
only by ``flush``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.scheduling.kv_nodes import (KvOp, Match, Node, common_prefix_len, cut, descendants, own_tail, path, split,
                                             unlink)


# An attached prefix at least this long is a sign that its entry may be asked for again (a few
# tokens, a BOS and a chat template's opening, are shared by every prompt).
REUSED_MIN_TOKENS = 16


class PrefixIndex:
    """Radix tree of KV cells, the seq_id pool and LRU eviction. Batcher thread only."""

    def __init__(self, *, n_seq_ids: int, n_cells: int, offer_evicted: bool = False) -> None:
        if n_seq_ids < 1 or n_cells < 1:
            raise ValueError("the index needs at least one seq_id and one cell")
        self.n_cells = n_cells  # KV cells in the context
        self.offer_evicted = offer_evicted  # evicting KvOps carry the entry's tokens (a lower tier keeps them)
        self.root = Node([], 0, None)
        self.leaf: dict[int, Node] = {}  # every tracked seq_id -> the node its KV ends in
        self.scopes: dict[int, str | None] = {}  # every tracked seq_id -> its cache scope (None: shared)
        self.entries: dict[int, bool] = {}  # cached seq_ids -> pinned
        self.free_ids: list[int] = list(range(n_seq_ids - 1, -1, -1))  # popped from the end: 0 first
        self.cells_used = 0
        # Whose cells came last: a sequence whose cells another's came between starts a new run.
        self._n_extends = 0
        self._last_extend: dict[int, int] = {}
        self.counters = {"lookups": 0, "hits": 0, "hit_tokens": 0, "evicted_entries": 0, "evicted_cells": 0}

    # -- questions ----------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], *, scope: str = DEFAULT_TENANT, pinned_only: bool = False,
               shared: bool = True) -> Match:
        """The longest prefix of ``tokens`` that has KV cells, and a sequence that holds it, among
        the sequences of ``scope`` and the pinned entries (``pinned_only``: those alone; without
        ``shared``, a LoRA adapter's scope, not those: they were computed on the base model)."""
        def visible(s: int) -> bool:
            return (shared and bool(self.entries.get(s))) or (not pinned_only and self.scopes.get(s) == scope)

        best_n, best_node = 0, self.root
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in node.children:
                if not any(visible(s) for s in child.seq_ids):
                    continue
                if child.start < len(tokens) and child.tokens[0] == tokens[child.start]:
                    n = child.start + common_prefix_len(child.tokens, tokens[child.start:child.end])
                    if n > best_n:
                        best_n, best_node = n, child
                    if n == child.end:
                        stack.append(child)
        return Match(best_n, min(s for s in best_node.seq_ids if visible(s)) if best_n else -1)

    def length(self, seq_id: int) -> int:
        """How many cells ``seq_id`` holds (its positions are 0 .. length - 1)."""
        return self.leaf[seq_id].end

    def tokens(self, seq_id: int) -> list[int]:
        return [t for node in reversed(list(path(self.leaf[seq_id]))) for t in node.tokens]

    def cache_cells(self) -> int:
        """Cells held by unpinned entries alone: what evicting every entry would free."""
        return sum(len(n.tokens) for n in descendants(self.root)
                   if all(self.entries.get(s) is False for s in n.seq_ids))

    def pinned_cells(self) -> int:
        return sum(len(n.tokens) for n in descendants(self.root) if any(self.entries.get(s) for s in n.seq_ids))

    def spare_id(self) -> bool:
        """Whether ``allocate`` can give a seq_id without freeing any cell: a free one, or a
        covered entry's (another sequence holds all its cells)."""
        return bool(self.free_ids) or self._redundant_entry() is not None

    def stats(self) -> dict[str, int]:
        n_pinned = sum(self.entries.values())
        return {"entries": len(self.entries) - n_pinned, "cells": self.cache_cells(), "pinned": n_pinned,
                "pinned_cells": self.pinned_cells(), **self.counters}

    # -- sequences ----------------------------------------------------------------------------

    def allocate(self, scope: str | None = DEFAULT_TENANT) -> tuple[int, list[KvOp]]:
        """A free seq_id for a sequence of ``scope`` (None: shared, as a pinned system prompt is),
        dropping the least useful entry if none is free (``IndexError``: none can be)."""
        ops = [] if self.free_ids else [self._free_seq_id()]
        seq_id = self.free_ids.pop()
        self.leaf[seq_id] = self.root
        self.scopes[seq_id] = scope
        return seq_id, ops

    def attach(self, seq_id: int, match: Match, now: float) -> list[KvOp]:
        """Give the fresh ``seq_id`` the first ``match.n_tokens`` cells of ``match.seq_id`` (seq_cp)."""
        if self.leaf.get(seq_id) is not self.root:
            raise ValueError(f"seq_id {seq_id} is not a fresh sequence")
        self.counters["lookups"] += 1
        if match.n_tokens == 0:
            return []
        node = self.leaf[match.seq_id]
        while node.start >= match.n_tokens:
            assert node.parent is not None
            node = node.parent
        if node.end > match.n_tokens:
            node = split(node, match.n_tokens - node.start)
        self.leaf[seq_id] = node
        for n in path(node):
            n.seq_ids.add(seq_id)
            n.last_used = now
            n.reused |= match.n_tokens >= REUSED_MIN_TOKENS
        self.counters["hits"] += 1
        self.counters["hit_tokens"] += match.n_tokens
        return [KvOp(seq_id, match.n_tokens, src=match.seq_id)]

    def extend(self, seq_id: int, tokens: Sequence[int], now: float) -> None:
        """``seq_id`` computed the KV of ``tokens`` at its next positions."""
        if not tokens:
            return
        self._n_extends += 1
        interleaved = self._last_extend.get(seq_id) != self._n_extends - 1
        self._last_extend[seq_id] = self._n_extends
        leaf = self.leaf[seq_id]
        if leaf is not self.root and leaf.seq_ids == {seq_id}:
            leaf.tokens.extend(tokens)  # its own cells, and nobody branches off them: grow in place
            leaf.runs += interleaved
        else:
            child = Node(list(tokens), leaf.end, leaf, {seq_id})
            leaf.children.append(child)
            self.leaf[seq_id] = leaf = child
        leaf.last_used = now
        self.cells_used += len(tokens)

    def finish(self, seq_id: int, now: float, *, keep: bool, budget_cells: int | None = None,
               keep_upto: int | None = None) -> list[KvOp]:
        """A running sequence ends. With ``keep`` its KV becomes a cached entry (entries it
        extends are dropped: it holds their cells now) -- only its first ``keep_upto`` cells,
        where the rest is one-off (``Sequence.cache_upto``) -- then LRU tails go until the
        entries hold at most ``budget_cells``; without, its cells are released."""
        leaf = self.leaf[seq_id]
        if not keep or leaf is self.root or self._covered(seq_id, entries_only=True):
            return [self._drop(seq_id)]
        self.entries[seq_id] = False
        leaf.last_used = now
        ops = [self._drop(e) for node in path(leaf) for e in list(node.seq_ids)
               if e != seq_id and self.entries.get(e) is False and self.leaf[e] is node]
        if keep_upto is not None and keep_upto < leaf.end:
            ops += self._trim_finished(seq_id, keep_upto)
        if budget_cells is not None:
            ops += self.evict(self.cache_cells() - budget_cells)
        return ops

    def _trim_finished(self, seq_id: int, keep_upto: int) -> list[KvOp]:
        """A finished entry cut to its first ``keep_upto`` cells (what it shares with others is
        kept whole): dropped when nothing of its own is left or another entry holds the rest."""
        cut = max(keep_upto, self.leaf[seq_id].end - own_tail(self.leaf[seq_id], seq_id))
        if cut == 0:
            return [self._drop(seq_id)]
        self._truncate(seq_id, cut)
        if self._covered(seq_id, entries_only=True):
            return [self._drop(seq_id)]
        return [KvOp(seq_id, cut)]

    def pin(self, seq_id: int) -> None:
        """Make the sequence (a prefilled system prompt) a pinned entry: never evicted."""
        self.entries[seq_id] = True

    def release(self, seq_id: int) -> None:
        """Forget ``seq_id`` whose cells llama.cpp already removed (a failed decode)."""
        self._drop(seq_id)

    def evict(self, n_cells: int) -> list[KvOp]:
        """Free at least ``n_cells`` cells held by entries alone, least recently used tails first;
        a tail is trimmed (``seq_rm`` from a position) rather than its entry dropped where that
        is enough. Running sequences lose nothing. Returns the operations (maybe too few)."""
        ops: list[KvOp] = []
        while n_cells > 0:
            victim = self._lru_entry(any_owner=False)
            if victim is None:
                break
            own = own_tail(self.leaf[victim], victim)
            if own > n_cells:
                offer = self._offered(victim)
                keep = self.leaf[victim].end - n_cells
                self._truncate(victim, keep)
                ops.append(KvOp(victim, keep, **offer))
                self.counters["evicted_cells"] += n_cells
                break
            n_cells -= own
            ops.append(self._evict_entry(victim))
        return ops

    def flush(self) -> list[KvOp]:
        """Drop every unpinned entry, each offered to the lower tier: the cells that only entries
        held are freed, and the seq_ids of entries come free. Running sequences lose nothing."""
        return [self._evict_entry(e) for e, pinned in list(self.entries.items()) if not pinned]

    def restored(self, seq_id: int, tokens: Sequence[int], now: float) -> None:
        """The fresh ``seq_id`` got the KV of ``tokens`` from a lower tier (new cells of its own)."""
        if self.leaf.get(seq_id) is not self.root:
            raise ValueError(f"seq_id {seq_id} is not a fresh sequence")
        self.counters["lookups"] += 1
        self.extend(seq_id, tokens, now)
        self.leaf[seq_id].reused = True

    def forget_cells(self, seq_id: int) -> None:
        """``seq_id``'s restore failed: it holds no cells after all (it stays allocated)."""
        for node in list(path(self.leaf[seq_id])):
            node.seq_ids.discard(seq_id)
            if not node.seq_ids:
                self.cells_used -= unlink(node)
        self.leaf[seq_id] = self.root

    # -- internals ----------------------------------------------------------------------------

    def _free_seq_id(self) -> KvOp:
        """Drop an entry for its seq_id: one another sequence covers (nothing to save), else the
        least recently used (``IndexError``: none can be)."""
        victim = self._redundant_entry()
        return self._drop(victim) if victim is not None else self._evict_for_seq_id()

    def _evict_for_seq_id(self) -> KvOp:
        """Drop the least recently used entry, offered to the lower tier, for its seq_id."""
        victim = self._lru_entry(any_owner=True)
        if victim is None:
            raise IndexError("every seq_id is running or pinned")
        offer = self._offered(victim)
        return KvOp(self._drop(victim).seq_id, **offer)

    def _drop(self, seq_id: int) -> KvOp:
        for node in list(path(self.leaf[seq_id])):
            node.seq_ids.discard(seq_id)
            if not node.seq_ids:
                self.cells_used -= unlink(node)
        del self.leaf[seq_id]
        del self.scopes[seq_id]
        self._last_extend.pop(seq_id, None)
        self.entries.pop(seq_id, None)
        self.free_ids.append(seq_id)
        return KvOp(seq_id)

    def _evict_entry(self, seq_id: int) -> KvOp:
        """Drop the entry ``seq_id`` whole, counted as evicted and offered to the lower tier."""
        offer = self._offered(seq_id)
        self.counters["evicted_cells"] += own_tail(self.leaf[seq_id], seq_id)
        self.counters["evicted_entries"] += 1
        return KvOp(self._drop(seq_id).seq_id, **offer)

    def _offered(self, seq_id: int) -> dict[str, Any]:
        """What an evicting ``KvOp`` of ``seq_id`` carries to the lower tier: its tokens, scope,
        cell runs, and whether a part of it not pinned was used again."""
        if not self.offer_evicted:
            return {}
        held = list(path(self.leaf[seq_id]))
        # a long reused run: a short head node that a long attach passed through is every prompt's opening
        returning = any(n.reused and n.end >= REUSED_MIN_TOKENS and not any(self.entries.get(s) for s in n.seq_ids)
                        for n in held)
        return {"save": tuple(self.tokens(seq_id)), "scope": self.scopes[seq_id],
                "runs": max(1, sum(n.runs for n in held)), "returning": returning}

    def _truncate(self, seq_id: int, n: int) -> None:
        """Keep only the first ``n`` cells of ``seq_id``, whose tail beyond ``n`` it owns alone."""
        self.leaf[seq_id], freed = cut(self.leaf[seq_id], seq_id, n)
        self.cells_used -= freed

    def _covered(self, seq_id: int, *, entries_only: bool) -> bool:
        """Another sequence (an entry, if ``entries_only``) holds every cell of ``seq_id``."""
        holders = self.leaf[seq_id].seq_ids - {seq_id}
        return any(s in self.entries for s in holders) if entries_only else bool(holders)

    def _redundant_entry(self) -> int | None:
        return next((e for e, pinned in self.entries.items() if not pinned and self._covered(e, entries_only=False)),
                    None)

    def _lru_entry(self, *, any_owner: bool) -> int | None:
        """The unpinned entry whose last cells were used longest ago (owning some alone, unless
        ``any_owner``)."""
        best, best_time = None, float("inf")
        for e, pinned in self.entries.items():
            leaf = self.leaf[e]
            if not pinned and leaf.last_used < best_time and (any_owner or leaf.seq_ids == {e}):
                best, best_time = e, leaf.last_used
        return best

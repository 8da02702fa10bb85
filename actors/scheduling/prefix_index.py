"""The prefix index: what to do with the KV cells of the prefix tree (``prefix_tree.py``).

Pure bookkeeping (no threads, no llama calls), run on the batcher's thread through the scheduler.
Tracked sequences are either *running* (the scheduler's) or *entries*: finished requests whose
KV stays as a cached prefix, and pinned entries (the configured system prompt) that are never
evicted. The index allocates seq_ids, attaches a fresh sequence to a prefix it found, grows and
finishes sequences and evicts entries (least recently used first). What it decides about the KV
cache (drop an entry, trim its tail) it returns as ``KvOp`` values for the batcher to apply to the
engine, in order, before the step that follows.

Batch-invariant mode's ``PackedPrefixIndex`` (``packed_kv.py``) overrides how cells are freed:
only by ``flush``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.scheduling.kv_nodes import IdleEntry, KvOp, Match, Node, own_tail, path, split
from llamactor.scheduling.prefix_tree import PrefixTree


# An attached prefix at least this long is a sign that its entry may be asked for again (a few
# tokens, a BOS and a chat template's opening, are shared by every prompt).
REUSED_MIN_TOKENS = 16


class PrefixIndex(PrefixTree):
    """The prefix tree's seq_id pool, sequences' lifecycle and LRU eviction. Batcher thread only."""

    def spare_id(self) -> bool:
        """Whether ``allocate`` can give a seq_id without freeing any cell: a free one, or a
        covered entry's (another sequence holds all its cells)."""
        return bool(self.free_ids) or self._redundant_entry() is not None

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
        return self.evict_entries([e for e, pinned in self.entries.items() if not pinned])

    def idle_entries(self) -> list[IdleEntry]:
        """The unpinned entries holding cells alone, as their eviction would offer them to the lower tier."""
        return [IdleEntry(e, own, self.leaf[e].last_used, self.leaf[e].end, *self._save_traits(e))
                for e, pinned in self.entries.items() if not pinned and (own := own_tail(self.leaf[e], e)) > 0]

    def evict_entries(self, seq_ids: Sequence[int]) -> list[KvOp]:
        """Drop these entries whole, each offered to the lower tier (as ``evict``'s victims are)."""
        return [self._evict_entry(e) for e in seq_ids]

    def restored(self, seq_id: int, tokens: Sequence[int], now: float) -> None:
        """The fresh ``seq_id`` got the KV of ``tokens`` from a lower tier (new cells of its own)."""
        if self.leaf.get(seq_id) is not self.root:
            raise ValueError(f"seq_id {seq_id} is not a fresh sequence")
        self.counters["lookups"] += 1
        self.extend(seq_id, tokens, now)
        self.leaf[seq_id].reused = True

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
        runs, returning = self._save_traits(seq_id)
        return {"save": tuple(self.tokens(seq_id)), "scope": self.scopes[seq_id], "runs": runs, "returning": returning}

    def _save_traits(self, seq_id: int) -> tuple[int, bool]:
        """The entry's cell runs, and whether a part of it not pinned was used again."""
        held = list(path(self.leaf[seq_id]))
        # a long reused run: a short head node that a long attach passed through is every prompt's opening
        returning = any(n.reused and n.end >= REUSED_MIN_TOKENS and not any(self.entries.get(s) for s in n.seq_ids)
                        for n in held)
        return max(1, sum(n.runs for n in held)), returning

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

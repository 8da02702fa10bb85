"""The prefix index's tree: which token prefixes have KV cells in the unified cache, on which seq_ids.

Pure bookkeeping (no threads, no llama calls), run on the batcher's thread through the scheduler.
It is a radix tree whose nodes (``kv_nodes``: walked, split and cut there) are *physical* runs
of KV cells: a node's tokens sit at positions ``[start, end)`` and every seq_id in
``node.seq_ids`` holds those very cells (llama.cpp's unified cache keeps a set of seq_ids per
cell; ``seq_cp`` adds an id to cells, ``seq_rm`` removes it and frees a cell when its set
empties). A sequence is a path from the root to its ``leaf`` node, so a node's ``seq_ids``
contain its children's. Two sequences that computed the same tokens on their own own different
cells: the tree may hold sibling nodes with equal tokens.

Every sequence has a cache *scope* (its tenant's): a lookup sees only the sequences of its own
scope and the pinned entries, so one tenant never attaches -- nor learns, by how fast its prompt
runs -- another's prefix; the operator's system prompt stays shared by all. ``PrefixTree`` holds
this state, answers questions about it and forgets cells; what to keep, attach and evict is
``PrefixIndex``'s (``prefix_index.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.scheduling.kv_nodes import KvOp, Match, Node, common_prefix_len, cut, descendants, path, unlink


class PrefixTree:
    """The radix tree of KV cells, the tracked sequences and the seq_id pool. Batcher thread only."""

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
        # The seq_ids it may see, gathered once: each node's ids are then tested against them in
        # one set operation, not a call per id per node.
        visible = {s for s, pinned in self.entries.items() if pinned} if shared else set()
        if not pinned_only:
            visible.update(s for s, s_scope in self.scopes.items() if s_scope == scope)
        best_n, best_node = 0, self.root
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in node.children:
                if child.seq_ids.isdisjoint(visible):
                    continue
                if child.start < len(tokens) and child.tokens[0] == tokens[child.start]:
                    n = child.start + common_prefix_len(child.tokens, tokens[child.start:child.end])
                    if n > best_n:
                        best_n, best_node = n, child
                    if n == child.end:
                        stack.append(child)
        return Match(best_n, min(best_node.seq_ids & visible) if best_n else -1)

    def length(self, seq_id: int) -> int:
        """How many cells ``seq_id`` holds (its positions are 0 .. length - 1)."""
        return self.leaf[seq_id].end

    def tokens(self, seq_id: int) -> list[int]:
        return [t for node in reversed(list(path(self.leaf[seq_id]))) for t in node.tokens]

    def cache_cells(self) -> int:
        """Cells held by unpinned entries alone: what evicting every entry would free."""
        return self._cells()[0]

    def pinned_cells(self) -> int:
        return self._cells()[1]

    def _cells(self) -> tuple[int, int]:
        """(``cache_cells``, ``pinned_cells``), in one walk: the nodes held by unpinned entries
        alone, and those a pinned entry holds (the id sets gathered once, tested per node in C)."""
        unpinned = {s for s, pinned in self.entries.items() if not pinned}
        pinned = self.entries.keys() - unpinned
        cache = held = 0
        for node in descendants(self.root):
            if node.seq_ids <= unpinned:
                cache += len(node.tokens)
            if not node.seq_ids.isdisjoint(pinned):
                held += len(node.tokens)
        return cache, held

    def stats(self) -> dict[str, int]:
        n_pinned = sum(self.entries.values())
        cache, pinned = self._cells()
        return {"entries": len(self.entries) - n_pinned, "cells": cache, "pinned": n_pinned,
                "pinned_cells": pinned, **self.counters}

    # -- cells ------------------------------------------------------------------------------------

    def forget_cells(self, seq_id: int) -> None:
        """``seq_id``'s restore failed: it holds no cells after all (it stays allocated)."""
        for node in list(path(self.leaf[seq_id])):
            node.seq_ids.discard(seq_id)
            if not node.seq_ids:
                self.cells_used -= unlink(node)
        self.leaf[seq_id] = self.root

    def _drop(self, seq_id: int) -> KvOp:
        """Stop tracking ``seq_id``: its cells freed where no other sequence holds them, its id free."""
        self.forget_cells(seq_id)
        del self.leaf[seq_id]
        del self.scopes[seq_id]
        self._last_extend.pop(seq_id, None)
        self.entries.pop(seq_id, None)
        self.free_ids.append(seq_id)
        return KvOp(seq_id)

    def _truncate(self, seq_id: int, n: int) -> None:
        """Keep only the first ``n`` cells of ``seq_id``, whose tail beyond ``n`` it owns alone."""
        self.leaf[seq_id], freed = cut(self.leaf[seq_id], seq_id, n)
        self.cells_used -= freed

    def _covered(self, seq_id: int, *, entries_only: bool) -> bool:
        """Another sequence (an entry, if ``entries_only``) holds every cell of ``seq_id``."""
        holders = self.leaf[seq_id].seq_ids - {seq_id}
        return any(s in self.entries for s in holders) if entries_only else bool(holders)

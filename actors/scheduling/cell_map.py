"""Where llama.cpp's unified KV cache has laid each sequence's positions: a mirror of its cells.

A decode step attends over every cell up to the highest one in use (llama.cpp's ``n_kv``, the
cells' ``used_max_p1``), not over the cells in use: an idle cached entry whose cells lie on top
costs every step what all the cells below it cost, and one in a hole below costs almost nothing
(docs/performance.md, *Stop 54*: on SmolLM2 with 16 entries stacked in 8,192 cells, a lone stream's
step took 11.8 ms with none kept, 12.1 with the lowest kept, 15.7 with the highest). llama.cpp does
not say where a sequence's cells are, so ``CellMap`` works it out the way ``llama_kv_cache::find_slot``
does (``llama-kv-cache.cpp``):

- a ubatch's tokens take the free cells from the *head* on, in order, wrapping to cell 0; the
  search starts at 0 instead when the head lies more than the cells in use plus twice the ubatch's
  tokens up (to fill the holes below); the head then moves past the last cell taken;
- a decode is split into ubatches of ``n_ubatch`` tokens in order (the unified cache's simple split);
- removing a sequence frees the cells nobody else owns, and moves the head down to the first freed
  one; copying one adds an owner to its cells (no new cells);
- a restored sequence (``llama_state_seq_set_data``) is removed, then its saved positions are laid
  as one ubatch in the order they were saved, which is the order of the cells they lay in.

Only the full-attention cells are mirrored: a model with sliding-window layers (Gemma 3) has a second
cache for them, laid the same way except where a restore puts back older windows
(``native/kv_state.py``). The mirror was checked against llama.cpp's own debug log
(``LLAMA_KV_CACHE_DEBUG``; tests/native/test_cell_map.py). It is advice for a cost model, never
for correctness: where it ever finds fewer free cells than llama.cpp did, it takes what it has and
counts the drift.

Pure: numpy arrays, no llama calls. The engine feeds it every KV operation it issues (batcher thread).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Free cells searched for right after the head first (most ubatches find theirs there), per token.
NEAR_HEAD_CELLS_PER_TOKEN = 4


class CellMap:
    """The cells of ``n_cells``, which sequences (``0 .. n_seqs - 1``) own each and at which
    position, and the head: as llama.cpp's unified cache has them after the same operations."""

    def __init__(self, n_cells: int, n_seqs: int, n_ubatch: int) -> None:
        self.n_ubatch = n_ubatch
        self.owned = np.zeros((n_seqs, n_cells), dtype=bool)  # [sequence, cell]
        self.owners = np.zeros(n_cells, dtype=np.int32)  # how many sequences own each cell
        self.pos = np.full(n_cells, -1, dtype=np.int32)  # each cell's position (-1: free)
        self.seq_top = np.full(n_seqs, -1, dtype=np.int64)  # each sequence's highest cell (-1: none)
        self.head = 0
        self.used = 0
        self.top = 0  # one past the highest cell in use: what a step attends over (llama.cpp's used_max_p1)
        self.drifted = 0  # tokens the mirror found no free cell for, where llama.cpp did

    def placed(self, pos: np.ndarray, seq_id: np.ndarray) -> None:
        """A decode of these tokens (one position and sequence each, in batch order) succeeded."""
        for start in range(0, len(pos), self.n_ubatch):
            self._lay(pos[start:start + self.n_ubatch], seq_id[start:start + self.n_ubatch])

    def restored(self, seq_id: int, n_tokens: int, order: np.ndarray | None) -> None:
        """``seq_id`` was given a saved state of positions ``0 .. n_tokens - 1`` in ``order``, that of
        the cells they lay in when saved (None, or not all of them: unknown, and taken to be
        position order, as in a sequence laid in one piece)."""
        if order is None or len(order) != n_tokens:
            order = np.arange(n_tokens, dtype=np.int32)
        self.seq_rm(seq_id)
        self._lay(order, np.full(n_tokens, seq_id, dtype=np.int32))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """``seq_id`` leaves its cells at positions [p0, p1) (-1: open end)."""
        cells = np.flatnonzero(self.owned[seq_id] & self._in(p0, p1))
        if len(cells) == 0:
            return
        self.owned[seq_id, cells] = False
        self.owners[cells] -= 1
        if cells[-1] == self.seq_top[seq_id]:
            left = np.flatnonzero(self.owned[seq_id, :cells[-1]])
            self.seq_top[seq_id] = left[-1] if len(left) else -1
        freed = cells[self.owners[cells] == 0]
        if len(freed) == 0:
            return
        self.pos[freed] = -1
        self.used -= len(freed)
        self.head = min(self.head, int(freed[0]))
        if freed[-1] == self.top - 1:
            in_use = np.flatnonzero(self.owners[:self.top])
            self.top = int(in_use[-1]) + 1 if len(in_use) else 0

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``dst`` comes to own ``src``'s cells at positions [p0, p1) too."""
        cells = np.flatnonzero(self.owned[src] & self._in(p0, p1) & ~self.owned[dst])
        if len(cells) == 0:
            return
        self.owned[dst, cells] = True
        self.owners[cells] += 1
        self.seq_top[dst] = max(self.seq_top[dst], cells[-1])

    def clear(self) -> None:
        self.owned[:] = False
        self.owners[:] = 0
        self.pos[:] = -1
        self.seq_top[:] = -1
        self.head = self.used = self.top = 0

    def order(self, seq_id: int) -> np.ndarray:
        """``seq_id``'s positions in the order of its cells (the order a saved state holds them)."""
        return self.pos[self.owned[seq_id]]

    def layers(self, kept: Sequence[int]) -> list[tuple[int, int]]:
        """The ``kept`` sequences (the cached entries) that hold cells, highest top cell first, each
        with how far the top of the kept cells would come down if it and every one above it went:
        from the highest kept cell down to the next one's highest (free cells between included).
        Running sequences are left out: they end, or their next tokens move down into freed
        cells, and then the kept cells are what every step attends over."""
        ids = np.asarray(kept, dtype=np.int64)
        tops = self.seq_top[ids]
        order = np.argsort(-tops, kind="stable")
        ids, tops = ids[order], tops[order]
        held = int(np.count_nonzero(tops >= 0))
        if held == 0:
            return []
        below = np.append(tops[1:held], -1)  # each one's next kept top cell down (-1: none)
        return list(zip(ids[:held].tolist(), (tops[0] - below).tolist()))

    def stats(self) -> dict[str, int]:
        return {"top": self.top, "used": self.used, "drifted": self.drifted}

    # -- internals ----------------------------------------------------------------------------

    def _in(self, p0: int, p1: int) -> np.ndarray:
        low = self.pos >= max(p0, 0)
        return low if p1 < 0 else low & (self.pos < p1)

    def _lay(self, pos: np.ndarray, seq_id: np.ndarray) -> None:
        """One ubatch: each token takes the next free cell, as ``find_slot`` picks them."""
        n = len(pos)
        if n == 0:
            return
        start = 0 if self.head > self.used + 2 * n else self.head
        cells = self._free_from(start, n)
        if len(cells) < n:
            self.drifted += n - len(cells)
            pos, seq_id = pos[:len(cells)], seq_id[:len(cells)]
            if len(cells) == 0:
                return
        self.owned[seq_id, cells] = True
        self.owners[cells] += 1
        np.maximum.at(self.seq_top, seq_id, cells)
        self.pos[cells] = pos
        self.used += len(cells)
        self.head = int(cells[-1]) + 1
        self.top = max(self.top, int(cells.max()) + 1)

    def _free_from(self, start: int, n: int) -> np.ndarray:
        """The first ``n`` free cells from ``start`` on, wrapping to 0 (fewer where there are not)."""
        near = self.owners[start:start + NEAR_HEAD_CELLS_PER_TOKEN * n + 64]
        found = np.flatnonzero(near == 0)[:n] + start
        if len(found) == n:
            return found
        after = np.flatnonzero(self.owners[start:] == 0)[:n] + start
        before = np.flatnonzero(self.owners[:start] == 0)[:n - len(after)]
        return np.concatenate([after, before])

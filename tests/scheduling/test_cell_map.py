"""The cell map (pure): where llama.cpp's find_slot lays tokens, what removing and copying do to the
cells and the head, and how far the kept cells' top comes down as entries go. Against llama.cpp itself:
tests/native/test_cell_map.py (its debug log)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from llamactor.scheduling.cell_map import CellMap

pytestmark = pytest.mark.pure


def lay(cells: CellMap, seq_id: int, positions: range) -> None:
    cells.placed(np.array(positions, np.int32), np.full(len(positions), seq_id, np.int32))


def cells_of(cells: CellMap, seq_id: int) -> list[int]:
    return np.flatnonzero(cells.owned[seq_id]).tolist()


class ReferenceCells:
    """llama.cpp's find_slot and seq_rm/seq_cp written cell by cell, as llama-kv-cache.cpp has them."""

    def __init__(self, n_cells: int, n_ubatch: int) -> None:
        self.seqs: list[set[int]] = [set() for _ in range(n_cells)]
        self.pos = [-1] * n_cells
        self.head, self.n_ubatch = 0, n_ubatch

    def used(self) -> int:
        return sum(1 for s in self.seqs if s)

    def top(self) -> int:
        return max((i + 1 for i, s in enumerate(self.seqs) if s), default=0)

    def placed(self, tokens: list[tuple[int, int]]) -> None:
        for start in range(0, len(tokens), self.n_ubatch):
            ubatch = tokens[start:start + self.n_ubatch]
            head = 0 if self.head > self.used() + 2 * len(ubatch) else self.head
            taken: list[int] = []
            tested = 0
            while len(taken) < len(ubatch) and tested < len(self.seqs):
                if head >= len(self.seqs):
                    head = 0
                if not self.seqs[head]:
                    taken.append(head)
                head, tested = head + 1, tested + 1
            for cell, (seq_id, pos) in zip(taken, ubatch):
                self.seqs[cell], self.pos[cell] = {seq_id}, pos
            self.head = taken[-1] + 1

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> None:
        new_head = None
        for i, s in enumerate(self.seqs):
            if seq_id in s and self.pos[i] >= max(p0, 0) and (p1 < 0 or self.pos[i] < p1):
                s.discard(seq_id)
                if not s:
                    self.pos[i] = -1
                    new_head = i if new_head is None else new_head
        if new_head is not None and new_head < self.head:
            self.head = new_head

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        for i, s in enumerate(self.seqs):
            if src in s and self.pos[i] >= max(p0, 0) and (p1 < 0 or self.pos[i] < p1):
                s.add(dst)


OPS = st.lists(st.one_of(
    st.tuples(st.just("lay"), st.integers(0, 3), st.integers(1, 40)),
    st.tuples(st.just("rm"), st.integers(0, 3), st.integers(-1, 30)),
    st.tuples(st.just("cp"), st.integers(0, 3), st.integers(0, 3))), max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_the_map_lays_removes_and_copies_as_llama_cpps_find_slot_does_cell_by_cell(ops: list[tuple[str, int, int]]) -> None:
    cells, reference = CellMap(96, 4, n_ubatch=16), ReferenceCells(96, 16)
    n_past = [0] * 4
    for op, a, b in ops:
        if op == "lay" and reference.used() + b <= 96:
            tokens = [(a, n_past[a] + i) for i in range(b)]
            cells.placed(np.array([p for _, p in tokens], np.int32), np.full(b, a, np.int32))
            reference.placed(tokens)
            n_past[a] += b
        elif op == "rm":
            cells.seq_rm(a, b, -1)
            reference.seq_rm(a, b, -1)
            n_past[a] = min(n_past[a], max(b, 0))
        elif op == "cp" and a != b and n_past[b] == 0:
            cells.seq_cp(a, b)
            reference.seq_cp(a, b, -1, -1)
            n_past[b] = n_past[a]
        assert (cells.top, cells.used, cells.head) == (reference.top(), reference.used(), reference.head)
        assert [set(np.flatnonzero(cells.owned[:, i]).tolist()) for i in range(96)] == reference.seqs
        assert cells.pos.tolist() == reference.pos
        assert cells.seq_top.tolist() == [max((i for i, o in enumerate(reference.seqs) if q in o), default=-1)
                                          for q in range(4)]
    assert cells.drifted == 0


def test_tokens_take_the_free_cells_from_the_head_and_a_removal_brings_the_head_down_to_its_first_freed_cell() -> None:
    cells = CellMap(64, 4, n_ubatch=64)
    lay(cells, 0, range(10))
    lay(cells, 1, range(20))
    cells.seq_rm(0)  # cells 0-9 free: the head comes down to 0
    assert cells.head == 0 and cells.used == 20 and cells.top == 30
    lay(cells, 2, range(4))
    assert cells_of(cells, 2) == [0, 1, 2, 3] and cells.head == 4
    cells.seq_rm(2)  # back to 0
    lay(cells, 3, range(3))
    assert cells_of(cells, 3) == [0, 1, 2] and cells.head == 3
    cells.seq_rm(1)  # frees 10-29: above the head, which stays
    assert cells.top == 3 and cells.head == 3


def test_a_head_more_than_the_cells_in_use_plus_twice_the_ubatch_up_searches_from_cell_0() -> None:
    cells = CellMap(64, 4, n_ubatch=64)
    lay(cells, 0, range(20))
    lay(cells, 1, range(20))  # head 40
    cells.seq_rm(0, 0, 10)  # cells 0-9 free; the head comes down to 0
    lay(cells, 2, range(2))
    assert cells_of(cells, 2) == [0, 1] and cells.head == 2
    cells.head = 40  # as after a run of appends: 40 > 30 cells in use + 2·2
    lay(cells, 3, range(2))
    assert cells_of(cells, 3) == [2, 3]


def test_a_decode_is_laid_in_ubatches_each_from_where_the_last_ended() -> None:
    cells = CellMap(64, 4, n_ubatch=8)
    lay(cells, 0, range(24))
    cells.seq_rm(0, 4, 8)  # cells 4-7 free, head 4; then 8 tokens: 4 > 20 + 16 is false, from cell 4
    lay(cells, 1, range(8))
    assert cells_of(cells, 1) == [4, 5, 6, 7, 24, 25, 26, 27]


def test_a_restored_sequence_takes_its_positions_in_its_saved_cells_order() -> None:
    cells = CellMap(64, 4, n_ubatch=64)
    lay(cells, 0, range(4))
    lay(cells, 1, range(4))
    lay(cells, 0, range(4, 8))  # sequence 0 lies in cells 0-3 and 8-11
    order = cells.order(0)
    assert order.tolist() == list(range(8))
    cells.seq_rm(1)  # cells 4-7 free
    cells.seq_rm(0, 0, 2)
    assert cells.order(0).tolist() == [2, 3, 4, 5, 6, 7]
    cells.restored(2, 6, cells.order(0))
    assert cells.pos[cells.owned[2]].tolist() == [2, 3, 4, 5, 6, 7] and cells.used == 12


def test_a_restore_whose_order_is_unknown_lays_its_positions_in_order() -> None:
    cells = CellMap(32, 2, n_ubatch=32)
    cells.restored(1, 5, None)
    assert cells.order(1).tolist() == [0, 1, 2, 3, 4] and cells_of(cells, 1) == [0, 1, 2, 3, 4]


def test_copied_cells_have_two_owners_and_stay_until_both_leave() -> None:
    cells = CellMap(32, 3, n_ubatch=32)
    lay(cells, 0, range(6))
    cells.seq_cp(0, 1, 0, 4)
    cells.seq_rm(0)
    assert cells_of(cells, 1) == [0, 1, 2, 3] and cells.used == 4 and cells.top == 4 and cells.head == 4
    cells.clear()
    assert (cells.top, cells.used, cells.head) == (0, 0, 0) and not cells.owned.any()


def test_the_layers_are_the_kept_sequences_from_the_top_each_with_how_far_the_top_comes_down_with_it() -> None:
    cells = CellMap(64, 5, n_ubatch=64)
    lay(cells, 0, range(10))
    lay(cells, 1, range(10))
    lay(cells, 2, range(10))
    lay(cells, 4, range(5))  # a running sequence above them all: not kept, so not counted
    cells.seq_rm(1)  # cells 10-19 free
    assert cells.layers([0, 2, 3]) == [(2, 20), (0, 30)]  # 2 gone: the top from 30 to 10; both: to 0
    assert cells.layers([0]) == [(0, 10)]
    lay(cells, 3, range(3))  # into the hole: cells 10-12
    assert cells.layers([3, 0, 2]) == [(2, 17), (3, 20), (0, 30)]
    assert cells.layers([]) == []
    cells.clear()
    assert cells.layers([0, 2]) == []


def test_a_decode_that_finds_fewer_free_cells_than_llama_cpp_did_counts_a_drift_and_lays_what_fits() -> None:
    cells = CellMap(8, 2, n_ubatch=8)
    lay(cells, 0, range(6))
    lay(cells, 1, range(4))
    assert cells.used == 8 and cells.drifted == 2

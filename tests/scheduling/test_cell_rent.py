"""The kept cells' rent (pure): its rates fitted from decode and prefill steps, the charge to the entry
entries stacked from the top cells, and the ski-rental rule that lets an idle entry go once its rent reaches its price. The real engine's
side is tests/tree/test_cache_tiers.py (an idle cache leaves the cells, its prefixes come back)."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, strategies as st

from llamactor.scheduling import cell_rent
from llamactor.scheduling.cell_map import CellMap
from llamactor.scheduling.cell_rent import CHECK_EVERY, PRIOR_CELL_TOKEN_RATIO, CellRent, let_go
from llamactor.scheduling.kv_nodes import IdleEntry
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.tier_cost import Calibration, TierCostModel

pytestmark = pytest.mark.pure

CPU = Calibration(range_ms=0.004, cell_ms=0.01, token_ms=2.0, step_ms=100.0)


def idle(seq_id: int, own_cells: int, last_used: float) -> IdleEntry:
    return IdleEntry(seq_id, own_cells, last_used, n_tokens=own_cells, runs=1, returning=False)


def step_all(rent: CellRent, steps: list[tuple[int, float, int]]) -> None:
    """Feed ``(rows, ms, cells)`` steps, looking every ``CHECK_EVERY``."""
    for rows, ms, cells in steps:
        rent.stepped(rows, ms, cells)
        rent.check_due()


def noisy_steps(seed: int, n: int, rows: tuple[int, int], ms: Callable[[int, int], float],
                noise: float) -> list[tuple[int, float, int]]:
    """``n`` steps of random rows (in ``rows``) and cells in use (0-8192), each taking ``ms(rows,
    cells)`` give or take ``noise`` (a Gaussian's deviation)."""
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        r, cells = rng.randint(*rows), rng.randint(0, 8192)
        steps.append((r, ms(r, cells) + rng.gauss(0, noise), cells))
    return steps


def test_the_rates_are_fitted_from_decode_steps_once_the_cells_in_use_have_spread() -> None:
    rent = CellRent(token_ms=2.0)
    step_all(rent, noisy_steps(1, 3000, (1, 16), lambda rows, cells: 3.0 + 2.0 * rows + (0.0008 - 0.00005 * rows) * cells,
                               0.5))
    assert rent.fitted
    assert rent.cell_step_ms == pytest.approx(0.0008, rel=0.1)
    assert rent.cell_row_ms == pytest.approx(-0.00005, rel=0.1)
    assert rent.per_cell_ms(1) == pytest.approx(0.00075, rel=0.1) and rent.per_cell_ms(16) == 0.0  # never negative


def test_a_lone_streams_steps_fit_a_cost_per_cell_at_its_one_row() -> None:
    rng = random.Random(2)
    rent = CellRent(token_ms=2.0)
    cells = [rng.randint(0, 8192) for _ in range(2000)]
    step_all(rent, [(1, 10.0 + 0.0008 * c + rng.gauss(0, 0.5), c) for c in cells])
    assert rent.fitted and rent.cell_row_ms == 0.0
    assert rent.per_cell_ms(1) == pytest.approx(0.0008, rel=0.1)


def test_a_cache_whose_cells_in_use_never_spread_keeps_the_prior_rates() -> None:
    rent = CellRent(token_ms=2.0)
    step_all(rent, [(rows, 3.0 + 2.0 * rows + 0.0008 * rows * 8192, 8192) for rows in range(1, 17)] * 100)
    assert not rent.fitted
    assert rent.per_cell_ms(1) == rent.per_cell_ms(16) == pytest.approx(2.0 * PRIOR_CELL_TOKEN_RATIO)


def test_prefill_steps_stay_out_of_the_decode_fit_and_fit_a_cost_per_cell_per_prompt_row() -> None:
    rent = CellRent(token_ms=2.0)
    # Prompt chunks of many sizes, each row paying 0.2 µs per cell in use: a slope far steeper
    # than any decode's, and folded into the decode rates it would be.
    step_all(rent, noisy_steps(3, 1500, (32, 512), lambda rows, cells: 5.0 + 0.3 * rows + 0.0002 * rows * cells, 2.0))
    assert not rent.fitted and rent.per_cell_ms(1) == pytest.approx(2.0 * PRIOR_CELL_TOKEN_RATIO)
    assert rent.cell_prefill_row_ms == pytest.approx(0.0002, rel=0.1)
    assert rent.per_cell_ms(400) == pytest.approx(400 * 0.0002, rel=0.1)


def test_prompt_chunks_of_one_size_fit_the_cost_per_cell_per_row_too() -> None:
    rent = CellRent(token_ms=2.0)
    step_all(rent, [(512, 10.0 + 0.0002 * 512 * cells, cells) for cells in range(0, 8192, 64)])
    assert rent.cell_prefill_row_ms == pytest.approx(0.0002, rel=0.01)


def test_a_handful_of_prompt_chunks_is_not_enough_for_a_prefill_fit() -> None:
    rent = CellRent(token_ms=2.0)
    few = [(512, 10.0 + 0.0002 * 512 * cells, cells) for cells in range(0, 8192, 8192 // 16)]  # 16 chunks
    step_all(rent, few)
    assert rent.cell_prefill_row_ms is None
    step_all(rent, few * 2)
    assert rent.cell_prefill_row_ms == pytest.approx(0.0002, rel=0.01)


def test_before_a_prefill_fit_a_prompt_chunk_is_charged_as_a_decode_step() -> None:
    rent = CellRent(token_ms=2.0)
    rent.cell_row_ms = 0.0001
    assert rent.per_cell_ms(512) == rent.per_cell_ms(cell_rent.DECODE_ROWS - 1)
    step_all(rent, [(512, 50.0, 8192)] * 64)  # a full cache whose cells in use never spread: no fit
    assert rent.cell_prefill_row_ms is None and rent.per_cell_ms(512) == rent.per_cell_ms(cell_rent.DECODE_ROWS - 1)


@given(st.lists(st.tuples(st.integers(1, 600), st.booleans()), max_size=80), st.integers(1, 5000))
def test_an_option_owes_the_cells_it_would_bring_the_top_down_by_times_the_rent_per_cell_of_the_steps_since_each_look(
        steps: list[tuple[int, bool]], held: int) -> None:
    rent, entry, owed = CellRent(token_ms=1.0), idle(2, 10, 0.0), 0.0
    rent.cell_row_ms = 0.0001
    since_look = 0.0
    for rows, look in steps:
        since_look += rent.per_cell_ms(rows)
        rent.stepped(rows, 1.0, 0)
        if look:
            rent.charge_layers([(2, held)], [entry])
            owed, since_look = owed + held * since_look, 0.0
    assert rent.owed_ms(entry) == pytest.approx(owed, abs=1e-9)


def test_an_idle_entry_goes_once_its_rent_reaches_its_price_and_not_before() -> None:
    rent = CellRent(token_ms=1.0)  # 0.001 ms a cell a step
    entry = idle(3, 100, 0.0)  # holding up 100 cells at a price of 2 ms: due after 20 steps
    step_all(rent, [(1, 1.0, 100)] * 19)
    rent.charge_layers([(3, 100)], [entry])
    assert rent.owed_ms(entry) == pytest.approx(1.9) and rent.due([(entry, 2.0)]) == []
    step_all(rent, [(1, 1.0, 100)])
    rent.charge_layers([(3, 100)], [entry])
    assert rent.due([(entry, 2.0)]) == [3] and rent.let_go == 1


def test_the_largest_option_from_the_top_whose_rent_has_reached_its_entries_prices_goes_whole() -> None:
    rent = CellRent(token_ms=1.0)
    top, middle, bottom = idle(1, 100, 0.0), idle(2, 100, 0.0), idle(3, 100, 0.0)
    step_all(rent, [(1, 1.0, 300)] * 10)  # 0.01 ms a cell
    rent.charge_layers([(1, 100), (2, 250), (3, 300)], [top, middle, bottom])
    assert [rent.owed_ms(e) for e in (top, middle, bottom)] == pytest.approx([1.0, 2.5, 3.0])
    assert rent.due([(top, 1.1), (middle, 1.1), (bottom, 1.1)]) == [1, 2]  # 2.5 >= 2.2; 3.0 < 3.3
    assert rent.due([(top, 0.5), (middle, 5.0), (bottom, 0.1)]) == [1]  # the top one alone pays
    assert rent.due([(top, None), (middle, 0.1), (bottom, 0.1)]) == []  # under one with no price: waits


def test_an_entry_used_again_owes_nothing_of_what_it_owed_before() -> None:
    rent = CellRent(token_ms=1.0)
    rent.cell_row_ms = 0.0005
    step_all(rent, [(4, 1.0, 100)] * 10)
    rent.charge_layers([(1, 100)], [idle(1, 100, 0.0)])
    used = idle(1, 100, 10.0)  # used at 10: a new last use
    step_all(rent, [(4, 1.0, 100)] * 4)
    rent.charge_layers([(1, 100)], [used])
    assert rent.owed_ms(used) == pytest.approx(100 * (0.001 + 4 * 0.0005) * 4) and rent.due([(used, 2.0)]) == []
    assert rent.owed_ms(idle(1, 100, 0.0)) == 0


def test_a_pinned_or_running_sequence_in_the_layers_owes_nothing() -> None:
    rent = CellRent(token_ms=1.0)
    entry = idle(1, 100, 0.0)
    step_all(rent, [(1, 1.0, 100)] * 10)
    rent.charge_layers([(5, 300), (1, 400)], [entry])  # 5 is not idle
    assert rent.owed_ms(entry) == pytest.approx(4.0) and rent.owed_ms(idle(5, 300, 0.0)) == 0


def test_without_steps_no_rent_is_owed_however_long_an_entry_waits() -> None:
    rent = CellRent(token_ms=1.0)
    step_all(rent, [(1, 1.0, 100)] * 5)
    rent.charge_layers([], [])
    entry = idle(1, 10_000, 6.0)
    rent.charge_layers([(1, 10_000)], [entry])
    assert rent.owed_ms(entry) == 0 and rent.due([(entry, 0.001)]) == []


def test_an_entry_without_a_price_now_stays_whatever_it_owes() -> None:
    rent = CellRent(token_ms=1.0)
    step_all(rent, [(16, 1.0, 100)] * 100)
    entry = idle(1, 1000, 0.0)
    rent.charge_layers([(1, 1000)], [entry])
    assert rent.owed_ms(entry) > 0 and rent.due([(entry, None)]) == []


def test_the_entries_are_looked_at_every_check_every_steps() -> None:
    rent = CellRent(token_ms=1.0)
    looks = []
    for _ in range(3 * CHECK_EVERY):
        rent.stepped(1, 1.0, 0)
        looks.append(rent.check_due())
    assert sum(looks) == 3 and looks[CHECK_EVERY - 1]


def finished_entry(index: PrefixIndex, cells: CellMap, tokens: list[int], now: float, pin: bool = False) -> int:
    """An entry of ``tokens``, in the index and laid in ``cells`` as the engine would lay it."""
    seq_id, _ = index.allocate(scope=None if pin else "")
    index.extend(seq_id, tokens, now)
    cells.placed(np.arange(len(tokens), dtype=np.int32), np.full(len(tokens), seq_id, np.int32))
    if pin:
        index.pin(seq_id)
    else:
        index.finish(seq_id, now, keep=True)
    return seq_id


def test_let_go_evicts_the_entry_on_top_first_then_the_one_below_and_never_a_pinned_one() -> None:
    index, cells = PrefixIndex(n_seq_ids=8, n_cells=4096, offer_evicted=True), CellMap(4096, 8, 512)
    finished_entry(index, cells, list(range(1000, 1300)), 0.0, pin=True)
    below = finished_entry(index, cells, list(range(300)), 0.0)
    top = finished_entry(index, cells, list(range(2000, 2300)), 50.0)  # used last, but on top
    cost = TierCostModel(CPU)
    rent = CellRent(token_ms=CPU.token_ms)  # 0.002 ms a cell a step: 300 cells owe 0.6 ms a step
    price = cost.price_ms(cell_rent.SaveCandidate(300, 1, 300, False))
    assert price is not None
    steps_due = int(price / (300 * rent.per_cell_ms(1))) + 1
    ops = []
    for _ in range(CHECK_EVERY * (2 * steps_due // CHECK_EVERY + 4)):
        rent.stepped(1, 1.0, cells.top)
        if rent.check_due():
            gone = let_go(index, cells, rent, cost)
            for op in gone:
                cells.seq_rm(op.seq_id)
            ops += gone
    assert [op.seq_id for op in ops] == [top, below]
    assert all(op.save and op.p0 == 0 for op in ops)
    assert len(index.entries) == 1 and cells.top == 300  # the pinned entry's cells


def test_let_go_waits_while_a_save_that_pays_cannot_fit_the_steps_share() -> None:
    index, cells = PrefixIndex(n_seq_ids=4, n_cells=4096, offer_evicted=True), CellMap(4096, 4, 512)
    entry = finished_entry(index, cells, list(range(300)), 0.0)
    cost = TierCostModel(CPU)
    cost.credit_ms = 0.0
    rent = CellRent(token_ms=CPU.token_ms)
    for _ in range(100 * CHECK_EVERY):  # 300 cells: the rent is long past any price
        rent.stepped(16, 1.0, 300)
        assert let_go(index, cells, rent, cost) == []
    assert len(index.entries) == 1 and cells.layers(list(index.entries)) == [(entry, 300)]
    cost.credit_ms = 1000.0
    rent.stepped(16, 1.0, 300)
    assert len(let_go(index, cells, rent, cost)) == 1 and not index.entries


def test_an_entry_under_a_pinned_one_never_goes_for_its_rent() -> None:
    index, cells = PrefixIndex(n_seq_ids=4, n_cells=4096, offer_evicted=True), CellMap(4096, 4, 512)
    finished_entry(index, cells, list(range(300)), 0.0)
    finished_entry(index, cells, list(range(1000, 1300)), 0.0, pin=True)  # above it: the top stays
    cost = TierCostModel(CPU)
    rent = CellRent(token_ms=CPU.token_ms)
    for _ in range(100 * CHECK_EVERY):
        rent.stepped(16, 1.0, 600)
        if rent.check_due():
            assert let_go(index, cells, rent, cost) == []
    assert len(index.entries) == 2

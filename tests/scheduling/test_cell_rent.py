"""The kept cells' rent (pure): its rates fitted from decode and prefill steps, the row clock, and the
ski-rental rule that lets an idle entry go once its rent reaches its price. The real engine's
side is tests/tree/test_cache_tiers.py (an idle cache leaves the cells, its prefixes come back)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, strategies as st

from llamactor.scheduling import cell_rent
from llamactor.scheduling.cell_rent import CHECK_EVERY, PRIOR_CELL_TOKEN_RATIO, CellRent, let_go
from llamactor.scheduling.kv_nodes import IdleEntry
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.tier_cost import Calibration, TierCostModel

pytestmark = pytest.mark.pure

CPU = Calibration(range_ms=0.004, cell_ms=0.01, token_ms=2.0, step_ms=100.0)


def idle(seq_id: int, own_cells: int, last_used: float) -> IdleEntry:
    return IdleEntry(seq_id, own_cells, last_used, n_tokens=own_cells, runs=1, returning=False)


def step_all(rent: CellRent, steps: list[tuple[int, float, int]], t0: float = 0.0) -> float:
    """Feed ``(rows, ms, cells)`` steps one ms apart from ``t0``, looking every ``CHECK_EVERY``; the last time."""
    t = t0
    for rows, ms, cells in steps:
        t += 1.0
        rent.stepped(rows, ms, cells, t)
        rent.check_due()
    return t


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
    step_all(rent, few * 2, t0=100.0)
    assert rent.cell_prefill_row_ms == pytest.approx(0.0002, rel=0.01)


def test_before_a_prefill_fit_a_prompt_chunk_is_charged_as_a_decode_step() -> None:
    rent = CellRent(token_ms=2.0)
    rent.cell_row_ms = 0.0001
    assert rent.per_cell_ms(512) == rent.per_cell_ms(cell_rent.DECODE_ROWS - 1)
    step_all(rent, [(512, 50.0, 8192)] * 64)  # a full cache whose cells in use never spread: no fit
    assert rent.cell_prefill_row_ms is None and rent.per_cell_ms(512) == rent.per_cell_ms(cell_rent.DECODE_ROWS - 1)


@given(st.lists(st.tuples(st.integers(1, 600), st.floats(0.0, 5.0)), max_size=60), st.floats(-1.0, 400.0))
def test_the_rent_charged_since_a_time_is_that_of_the_steps_that_ended_after_it(steps: list[tuple[int, float]],
                                                                                t: float) -> None:
    rent, now, ended = CellRent(token_ms=1.0), 0.0, []
    rent.cell_row_ms = 0.0001
    for rows, gap in steps:
        now += gap
        ended.append((now, rent.per_cell_ms(rows)))
        rent.stepped(rows, 1.0, 0, now)
    assert rent.charged_since(t) == pytest.approx(sum(ms for at, ms in ended if at > t), abs=1e-9)


def test_the_rent_clock_keeps_its_newest_steps_and_charges_an_older_entry_all_of_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cell_rent, "CLOCK_STEPS", 4)
    rent = CellRent(token_ms=1.0)  # 0.001 ms a cell a step
    for i in range(1, 20):
        rent.stepped(1, 1.0, 0, float(i))
    assert len(rent._times) <= 8
    assert rent.charged_since(18.5) == pytest.approx(0.001) and rent.charged_since(16.0) == pytest.approx(0.003)
    assert rent.charged_since(0.0) == pytest.approx(0.001 * (len(rent._times) - 1))  # older: all it holds


def test_an_idle_entry_goes_once_its_rent_reaches_its_price_and_not_before() -> None:
    rent = CellRent(token_ms=1.0)  # 0.001 ms a cell a step
    entry = idle(3, 100, 0.0)  # at a price of 2 ms: due after 20 steps
    t = step_all(rent, [(1, 1.0, 100)] * 19)
    assert rent.owed_ms(entry) == pytest.approx(1.9) and rent.due([(entry, 2.0)]) == []
    step_all(rent, [(1, 1.0, 100)], t)
    assert rent.due([(entry, 2.0)]) == [3] and rent.let_go == 1


def test_an_entry_used_since_owes_only_the_steps_after_its_use() -> None:
    rent = CellRent(token_ms=1.0)
    rent.cell_row_ms = 0.0005
    t = step_all(rent, [(4, 1.0, 100)] * 10)
    fresh = idle(1, 100, t)
    step_all(rent, [(4, 1.0, 100)] * 4, t)
    assert rent.owed_ms(fresh) == pytest.approx(100 * (0.001 + 4 * 0.0005) * 4) and rent.due([(fresh, 2.0)]) == []


def test_without_steps_no_rent_is_owed_however_long_an_entry_waits() -> None:
    rent = CellRent(token_ms=1.0)
    step_all(rent, [(1, 1.0, 100)] * 5)
    entry = idle(1, 10_000, 6.0)
    assert rent.charged_since(6.0) == 0 and rent.due([(entry, 0.001)]) == []


def test_an_entry_without_a_price_now_stays_whatever_it_owes() -> None:
    rent = CellRent(token_ms=1.0)
    step_all(rent, [(16, 1.0, 100)] * 100)
    assert rent.due([(idle(1, 1000, 0.0), None)]) == []


def test_the_entries_are_looked_at_every_check_every_steps() -> None:
    rent = CellRent(token_ms=1.0)
    looks = []
    for i in range(1, 3 * CHECK_EVERY + 1):
        rent.stepped(1, 1.0, 0, float(i))
        looks.append(rent.check_due())
    assert sum(looks) == 3 and looks[CHECK_EVERY - 1]


def finished_entry(index: PrefixIndex, tokens: list[int], now: float) -> int:
    seq_id, _ = index.allocate()
    index.extend(seq_id, tokens, now)
    index.finish(seq_id, now, keep=True)
    return seq_id


def test_let_go_evicts_the_idle_entries_whose_rent_is_due_offered_to_the_tier_and_never_a_pinned_one() -> None:
    index = PrefixIndex(n_seq_ids=8, n_cells=4096, offer_evicted=True)
    pinned, _ = index.allocate(scope=None)
    index.extend(pinned, list(range(1000, 1300)), 0.0)
    index.pin(pinned)
    old = finished_entry(index, list(range(300)), 0.0)
    recent = finished_entry(index, list(range(2000, 2300)), 50.0)
    cost = TierCostModel(CPU)
    rent = CellRent(token_ms=CPU.token_ms)  # 0.002 ms a cell a step: 300 cells owe 0.6 ms a step
    price = cost.price_ms(cell_rent.SaveCandidate(300, 1, 300, False))
    assert price is not None
    steps_due = int(price / (300 * rent.per_cell_ms(1))) + 1
    ops = []
    for i in range(CHECK_EVERY * (steps_due // CHECK_EVERY + 2)):
        rent.stepped(1, 1.0, index.cells_used, 51.0 + i)
        if rent.check_due():
            ops += let_go(index, rent, cost)
    assert [op.seq_id for op in ops] == [old, recent]  # the older first: it began owing earlier
    assert all(op.save and op.p0 == 0 for op in ops)
    assert set(index.entries) == {pinned}


def test_let_go_waits_while_a_save_that_pays_cannot_fit_the_steps_share() -> None:
    index = PrefixIndex(n_seq_ids=4, n_cells=4096, offer_evicted=True)
    finished_entry(index, list(range(300)), 0.0)
    cost = TierCostModel(CPU)
    cost.credit_ms = 0.0
    rent = CellRent(token_ms=CPU.token_ms)
    for i in range(100 * CHECK_EVERY):  # 300 cells: the rent is long past any price
        rent.stepped(16, 1.0, 300, 1.0 + i)
        assert let_go(index, rent, cost) == []
    assert len(index.entries) == 1
    cost.credit_ms = 1000.0
    rent.stepped(16, 1.0, 300, 2000.0)
    assert len(let_go(index, rent, cost)) == 1 and not index.entries

"""The draft budget, model-free (``llamactor.scheduling.draft_budget``): a step's cost fitted from
timed steps (robust to stalls, non-decreasing, pessimistic until two row counts are timed, a probe
to time the second), what an accepted token saves (a share of a step), and the plan of drafted rows
per sequence: drafts at one stream, none at high concurrency, never more than proposed or than the
room left, more as acceptance rises. Property-tested on any wishes and costs.
The batcher's side (the plan applied in the step) is tested with the real model."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llamactor.scheduling.draft_budget import (HOPEFUL, PROBE_ROWS, PROBES, WINDOW, DraftWish, Line, StepCost,
                                               draft_shares, draft_together, plan_drafts)

pytestmark = pytest.mark.pure


def fitted(fixed: float, per_row: float, rows: range = range(1, 40)) -> StepCost:
    cost = StepCost()
    for n in rows:
        cost.record(n, fixed + per_row * n)
    return cost


def test_the_fit_recovers_a_steps_fixed_and_per_row_parts() -> None:
    line = fitted(35.0, 15.0).line()
    assert line.fixed == pytest.approx(35.0) and line.per_row == pytest.approx(15.0)


def test_a_stalled_step_does_not_move_the_fit() -> None:
    cost = fitted(10.0, 0.5)
    cost.record(3, 900.0)  # the host stalled
    assert cost.line().fixed == pytest.approx(10.0) and cost.line().per_row == pytest.approx(0.5)


def test_the_fit_follows_the_recent_steps() -> None:
    cost = fitted(10.0, 0.5, range(1, WINDOW + 1))
    for n in range(1, WINDOW + 1):  # the machine got loaded: steps twice as long
        cost.record(n, 2 * (10.0 + 0.5 * n))
    assert cost.line().per_row == pytest.approx(1.0) and cost.line().fixed == pytest.approx(20.0)


def test_until_two_row_counts_are_timed_every_row_costs_the_average_row() -> None:
    cost = StepCost()
    assert not cost.measured() and cost.line() == Line(0.0, 1.0)
    for _ in range(3 * WINDOW):  # one stream decoding: every step one row, 33 ms
        cost.record(1, 33.0)
    assert not cost.measured() and cost.line() == Line(0.0, 33.0)
    for ms in (40.0, 900.0):
        cost.record(1 + PROBE_ROWS, ms)
    assert not cost.measured()  # two steps of another size are not yet a slope
    cost.record(1 + PROBE_ROWS, 40.0)
    # measured: the median of the three, the stalled one aside
    assert cost.measured() and cost.line().per_row == pytest.approx(7 / PROBE_ROWS)


def timed_at(n_rows: int, line: Line, steps: int = WINDOW) -> StepCost:
    cost = StepCost()
    for _ in range(steps):
        cost.record(n_rows, line.ms(n_rows))
    return cost


CPU, GPU = Line(35.0, 15.0), Line(10.0, 0.05)  # a row a sizeable part of a step, or nearly free


def probe_and_plan(cost: StepCost, line: Line, wishes: list[DraftWish], n_rows: int) -> list[int]:
    """The probe a cost without a slope plans, its steps timed on ``line``, then the plan."""
    for _ in range(PROBES):
        probe = plan_drafts(wishes, n_rows, 512, cost)
        assert sum(probe) == min(PROBE_ROWS, sum(w.n_proposed for w in wishes))
        cost.record(n_rows + sum(probe), line.ms(n_rows + sum(probe)))
    return plan_drafts(wishes, n_rows, 512, cost)


def test_uniform_steps_on_a_cpu_plan_no_drafts_once_a_probe_is_timed() -> None:
    wishes = [DraftWish(16, 0.8, 1 / 16)] * 16
    cost = timed_at(16, CPU)
    assert probe_and_plan(cost, CPU, wishes, 16) == [0] * 16
    for _ in range(WINDOW):  # no drafts, so every step is 16 rows again: the probe is forgotten ...
        cost.record(16, CPU.ms(16))
    assert sum(plan_drafts(wishes, 16, 512, cost)) == PROBE_ROWS  # ... and made again


def test_one_stream_on_a_gpu_drafts_once_a_probe_is_timed() -> None:
    assert probe_and_plan(timed_at(1, GPU), GPU, [DraftWish(16, 0.8)], 1) == [16]


def test_nothing_is_drafted_before_a_step_of_its_own_size_is_timed() -> None:
    assert plan_drafts([DraftWish(16, 0.9)], 1, 512, StepCost()) == [0]
    assert plan_drafts([DraftWish(16, 0.9)], 3, 512, timed_at(1, GPU)) == [0]


def test_an_accepted_token_saves_a_share_of_a_step_only_where_it_shortens_the_batch() -> None:
    assert draft_shares([5, None, 3], waiting=False) == [1 / 3] * 3  # a length unknown: a 1/n share
    assert draft_shares([5, 9, 3], waiting=True) == [1 / 3] * 3  # a slot freed early is filled
    assert draft_shares([9, 5, 9, 3], waiting=False) == [0.5, 0.0, 0.5, 0.0]  # the longest last
    cost = timed_at(1, CPU)
    for n in range(1, 40):
        cost.record(n, CPU.ms(n))
    ahead, last = DraftWish(16, 0.9, 0.0), DraftWish(16, 0.9, 1.0)
    assert plan_drafts([ahead, last], 2, 512, cost) == [0, 11]


@given(st.lists(st.tuples(st.integers(1, 600), st.floats(0, 1e4, allow_nan=False)), max_size=3 * WINDOW))
def test_the_fitted_cost_is_never_negative_nor_falls_with_rows(steps: list[tuple[int, float]]) -> None:
    cost = StepCost()
    for n, ms in steps:
        cost.record(n, ms)
    line = cost.line()
    assert line.fixed >= 0 and line.per_row >= 0


def test_one_stream_drafts_when_the_fixed_part_dominates() -> None:
    assert plan_drafts([DraftWish(16, 0.9)], n_rows=1, room=511, cost=fitted(10.0, 0.1)) == [16]
    # a CPU-like cost, a row a third of the step: a few drafts still pay, fewer when less likely
    cpu = fitted(35.0, 15.0)
    assert plan_drafts([DraftWish(16, 0.9)], 1, 511, cpu) == [11]  # while 0.9 ** i * 50 ms > 15 ms
    assert plan_drafts([DraftWish(16, 0.5)], 1, 511, cpu) == [1]


def test_an_unproven_drafters_first_row_is_judged_as_hopeful_and_only_its_first() -> None:
    cpu = fitted(35.0, 15.0)
    assert plan_drafts([DraftWish(16, 0.3)], 1, 511, cpu) == [0]  # 0.3 * 50 ms saves no more than a 15 ms row
    assert plan_drafts([DraftWish(16, 0.3, unproven=True)], 1, 511, cpu) == [1]  # HOPEFUL * 50 ms does
    assert plan_drafts([DraftWish(16, 0.9, unproven=True)], 1, 511, cpu) == plan_drafts([DraftWish(16, 0.9)], 1, 511, cpu)
    # where even a sure token saves less than its row, an unproven drafter gets nothing either
    assert plan_drafts([DraftWish(16, 0.3, 1 / 64, unproven=True)] * 64, 64, 448, cpu) == [0] * 64


def test_high_concurrency_plans_no_drafts() -> None:
    gpu = fitted(10.0, 0.1, range(1, 600, 7))
    assert plan_drafts([DraftWish(16, 0.6)], n_rows=1, room=511, cost=gpu) == [9]  # until 0.6 ** i is tiny
    assert plan_drafts([DraftWish(16, 0.6, 1 / 256)] * 256, n_rows=256, room=256, cost=gpu) == [0] * 256
    cpu = fitted(35.0, 15.0)
    assert plan_drafts([DraftWish(16, 0.8)], n_rows=1, room=511, cost=cpu) == [5]
    assert plan_drafts([DraftWish(16, 0.8, 1 / 16)] * 16, n_rows=16, room=496, cost=cpu) == [0] * 16


def test_the_room_left_caps_the_drafts_and_the_most_promising_go_first() -> None:
    cost = fitted(10.0, 0.01)
    assert plan_drafts([DraftWish(16, 0.3), DraftWish(16, 0.95)], 2, 6, cost) == [0, 6]
    assert plan_drafts([DraftWish(16, 0.95)], 512, 0, cost) == [0]


wishes_strategy = st.lists(st.builds(DraftWish, st.integers(0, 64), st.floats(0, 1), st.floats(0, 1),
                                     unproven=st.booleans()), max_size=24)
costs = st.builds(Line, st.floats(0, 100), st.floats(0, 50))


def cost_of(line: Line) -> StepCost:
    cost = StepCost()
    for n in (1, 2, 5, 9, 17, 33, 65, 129, 257, 513):
        cost.record(n, line.ms(n))
    return cost


@settings(max_examples=300, deadline=None)
@given(wishes_strategy, st.integers(1, 512), st.integers(0, 512), costs)
def test_never_more_than_proposed_nor_than_the_room(wishes: list[DraftWish], n_rows: int, room: int,
                                                   line: Line) -> None:
    plan = plan_drafts(wishes, n_rows, room, cost_of(line))
    assert len(plan) == len(wishes)
    assert all(0 <= d <= w.n_proposed for d, w in zip(plan, wishes))
    assert sum(plan) <= room
    assert room > 0 or not any(plan)
    assert all(d == 0 for d, w in zip(plan, wishes) if w.acceptance == 0 and not w.unproven)
    assert all(d <= 1 for d, w in zip(plan, wishes) if w.acceptance == 0)  # an unproven one's first row at most


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.floats(0, 1), st.floats(0, 1), st.integers(1, 256), costs)
def test_more_likely_drafts_get_at_least_as_many_rows(n: int, p: float, q: float, n_rows: int, line: Line) -> None:
    low, high = sorted((p, q))
    cost = cost_of(line)
    assert plan_drafts([DraftWish(n, low)], n_rows, 512, cost)[0] <= plan_drafts([DraftWish(n, high)], n_rows, 512, cost)[0]


@settings(max_examples=300, deadline=None)
@given(wishes_strategy, st.integers(1, 512), costs)
def test_every_planned_row_is_expected_to_save_more_than_it_costs(wishes: list[DraftWish], n_rows: int,
                                                                 line: Line) -> None:
    cost = cost_of(line)
    plan = plan_drafts(wishes, n_rows, 512, cost)
    fitted_line = cost.line()
    for d, w in zip(plan, wishes):
        saving = fitted_line.per_row + fitted_line.fixed * w.share
        judged = [max(w.acceptance, HOPEFUL) if w.unproven and i == 1 else w.acceptance for i in range(1, d + 1)]
        assert all(p ** i * saving >= fitted_line.per_row for i, p in enumerate(judged, 1))


@settings(max_examples=200, deadline=None)
@given(wishes_strategy, st.integers(1, 512), st.floats(0.01, 100))
def test_no_drafts_when_a_row_costs_as_much_as_a_step_of_them(wishes: list[DraftWish], n_rows: int,
                                                             per_row: float) -> None:
    # no fixed part: each row costs the same, so a draft (worth at most one row) never gains
    assert plan_drafts(wishes, n_rows, 512, cost_of(Line(0.0, per_row))) == [0] * len(wishes)


def test_plans_for_many_sequences_are_cheap_enough_for_every_step() -> None:
    rng = random.Random(1)
    wishes = [DraftWish(16, rng.random()) for _ in range(64)]
    cost = fitted(10.0, 0.05)
    import time
    start = time.perf_counter()
    for _ in range(20):
        plan_drafts(wishes, 64, 448, cost)
    assert (time.perf_counter() - start) / 20 < 0.01


def test_sequences_the_batch_waits_for_together_draft_as_deep_as_the_lesser_run_they_all_reach() -> None:
    assert draft_together([1 / 3] * 3, waiting=True) == 1  # a slot freed early is filled
    assert draft_together([0.5, 0.0, 0.5, 0.0], waiting=False) == 2  # the two tied for the longest
    assert draft_together([1 / 2] * 2, waiting=False) == 2
    assert draft_together([1.0], waiting=False) == 1
    cpu = fitted(35.0, 15.0)
    alone = plan_drafts([DraftWish(16, 0.8, 1 / 2)] * 2, n_rows=2, room=510, cost=cpu)
    tied = plan_drafts([DraftWish(16, 0.8, 1 / 2, together=2)] * 2, n_rows=2, room=510, cost=cpu)
    # both must get ahead: 0.8 ** i * 15 + 0.8 ** (2 i) * 17.5 > 15 ms up to i = 2; alone 0.8 ** i * 32.5 up to 3
    assert tied == [2, 2] and alone == [3, 3]
    assert plan_drafts([DraftWish(16, 0.8, 1.0, together=1)], 1, 511, cpu) == \
        plan_drafts([DraftWish(16, 0.8)], 1, 511, cpu)  # one stream: as before

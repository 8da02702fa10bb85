"""The draft budget, model-free (``llamactor.scheduling.draft_budget``): a step's cost fitted from
timed steps (robust to stalls, non-decreasing, the prior's shape until the steps vary), and the plan
of drafted rows per sequence: drafts at one stream, none at high concurrency, never more than
proposed or than the room left, more as acceptance rises. Property-tested on any wishes and costs.
The batcher's side (the plan applied in the step) is tested with the real model."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llamactor.scheduling.draft_budget import MIN_STEPS, WINDOW, DraftWish, Line, StepCost, plan_drafts

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


def test_before_the_steps_vary_the_prior_shape_is_kept_at_their_level() -> None:
    prior = Line(10.0, 0.1)
    cost = StepCost(prior)
    assert cost.line() == prior
    for _ in range(3 * MIN_STEPS):  # one stream decoding: every step one row, 33 ms
        cost.record(1, 33.0)
    assert cost.ms(1) == pytest.approx(33.0)
    assert cost.line().per_row / cost.line().fixed == pytest.approx(0.01)


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
    assert plan_drafts([DraftWish(16, 0.9)], 1, 511, cpu) == [5]
    assert plan_drafts([DraftWish(16, 0.5)], 1, 511, cpu) == [1]


def test_high_concurrency_plans_no_drafts() -> None:
    gpu = fitted(10.0, 0.1, range(1, 600, 7))
    assert plan_drafts([DraftWish(16, 0.6)], n_rows=1, room=511, cost=gpu) == [7]  # until 0.6 ** i is tiny
    assert plan_drafts([DraftWish(16, 0.6)] * 256, n_rows=256, room=256, cost=gpu) == [0] * 256
    cpu = fitted(35.0, 15.0)
    assert plan_drafts([DraftWish(16, 0.8)], n_rows=1, room=511, cost=cpu) == [3]
    assert plan_drafts([DraftWish(16, 0.8)] * 16, n_rows=16, room=496, cost=cpu) == [0] * 16


def test_the_room_left_caps_the_drafts_and_the_most_promising_go_first() -> None:
    cost = fitted(10.0, 0.01)
    assert plan_drafts([DraftWish(16, 0.3), DraftWish(16, 0.95)], 2, 6, cost) == [0, 6]
    assert plan_drafts([DraftWish(16, 0.95)], 512, 0, cost) == [0]


wishes_strategy = st.lists(st.builds(DraftWish, st.integers(0, 64), st.floats(0, 1)), max_size=24)
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
    assert all(d == 0 for d, w in zip(plan, wishes) if w.acceptance == 0)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.floats(0, 1), st.floats(0, 1), st.integers(1, 256), costs)
def test_more_likely_drafts_get_at_least_as_many_rows(n: int, p: float, q: float, n_rows: int, line: Line) -> None:
    low, high = sorted((p, q))
    cost = cost_of(line)
    assert plan_drafts([DraftWish(n, low)], n_rows, 512, cost)[0] <= plan_drafts([DraftWish(n, high)], n_rows, 512, cost)[0]


@settings(max_examples=300, deadline=None)
@given(wishes_strategy, st.integers(1, 512), costs)
def test_a_planned_step_never_expects_less_throughput_than_without_drafts(wishes: list[DraftWish], n_rows: int,
                                                                       line: Line) -> None:
    cost = cost_of(line)
    assume(cost.ms(n_rows) > 0)
    plan = plan_drafts(wishes, n_rows, 512, cost)
    expected = n_rows + sum(sum(w.acceptance ** i for i in range(1, d + 1)) for d, w in zip(plan, wishes))
    assert expected / cost.ms(n_rows + sum(plan)) >= n_rows / cost.ms(n_rows) * (1 - 1e-9)


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

"""Priorities, policies and preemption as pure scheduling logic (no threads, no llama.cpp).

tests/tree/test_priorities.py checks the same rules on the real engine."""

from __future__ import annotations

import pytest

from llamactor.base.errors import InvalidRequestError
from llamactor.base.priority import parse_priority
from llamactor.scheduling.policy import LPM_MAX_WAITING, Policy, effective_priority
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence
from llamactor.scheduling.tier_index import RestoreOp, TierMatch

from tests.support.scheduling import make_scheduler, make_seq, run_to_end

pytestmark = pytest.mark.pure

HIGH, NORMAL, LOW = 0, 1, 2


def step(s: Scheduler, now: float, sampled: int = 7) -> list[Sequence]:
    """Schedule, pretend the chunks were decoded, append a sampled token to each that sampled."""
    plan = s.schedule(now)
    for chunk in plan.chunks:
        samples = chunk.samples
        s.computed(chunk, now)
        if samples:
            chunk.seq.token_ids.append(sampled)
    return plan.preempted


def test_priority_names_and_integers_parse_and_anything_else_is_a_clear_error() -> None:
    assert [parse_priority(v) for v in ("high", "normal", "LOW", -5, 7)] == [0, 1, 2, -5, 7]
    for bad in (True, 1.5, "urgent", 10**6, None):
        with pytest.raises(InvalidRequestError, match="priority must be"):
            parse_priority(bad)


def test_effective_priority_improves_by_the_aging_rate_for_each_second_waited() -> None:
    assert effective_priority(LOW, submitted_at=0.0, now=10.0, aging_per_s=0.1) == pytest.approx(NORMAL)
    assert effective_priority(LOW, submitted_at=5.0, now=4.0, aging_per_s=0.1) == LOW  # clocks never un-age


def test_an_unknown_policy_or_a_negative_aging_rate_is_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="schedule_policy"):
        Policy("sjf")
    with pytest.raises(InvalidRequestError, match="aging"):
        Policy("priority", -1.0)


def test_the_priority_policy_orders_by_effective_priority_then_arrival_and_fcfs_ignores_priority() -> None:
    low_old, normal, high, normal_late = (make_seq(2, at=0.0, rid="low-old", priority=LOW),
                                          make_seq(2, at=1.0, rid="normal", priority=NORMAL),
                                          make_seq(2, at=2.0, rid="high", priority=HIGH),
                                          make_seq(2, at=3.0, rid="normal-late", priority=NORMAL))
    waiting = [low_old, normal, high, normal_late]
    order = Policy("priority").order_waiting(waiting, 3.0, lambda _s: 0)
    assert [q.request_id for q in order] == ["high", "normal", "normal-late", "low-old"]
    assert Policy("fcfs").order_waiting(waiting, 3.0, lambda _s: 0) == waiting
    # 20 s later the old low-priority request (2 - 2.3) is ahead of everything fresh
    later = [low_old, make_seq(2, at=23.0, rid="fresh-high", priority=HIGH)]
    assert [q.request_id for q in Policy("priority").order_waiting(later, 23.0, lambda _s: 0)] == ["low-old",
                                                                                                    "fresh-high"]


def test_lpm_orders_by_cached_prefix_and_falls_back_to_priority_for_long_queues() -> None:
    waiting = [make_seq(2, at=float(i), rid=f"r{i}") for i in range(3)]
    cached = {"r0": 0, "r1": 50, "r2": 10}
    order = Policy("lpm").order_waiting(waiting, 5.0, lambda s: cached[s.request_id])
    assert [q.request_id for q in order] == ["r1", "r2", "r0"]
    many = [make_seq(2, at=float(i), rid=f"m{i}") for i in range(LPM_MAX_WAITING + 1)]
    assert Policy("lpm").order_waiting(many, 0.0, lambda s: pytest.fail("no lookups past the cap")) == many


def test_the_preemption_victim_is_the_lowest_effective_priority_then_the_newest() -> None:
    a, b, c = (make_seq(2, at=0.0, rid="a", priority=LOW), make_seq(2, at=1.0, rid="b", priority=LOW),
               make_seq(2, at=2.0, rid="c", priority=HIGH))
    assert Policy("priority").preemption_victim([a, b, c], 2.0).request_id == "b"
    assert Policy("fcfs").preemption_victim([a, b, c], 2.0).request_id == "c"


def test_a_freed_sequence_goes_to_the_waiting_high_priority_request_before_older_low_ones() -> None:
    s = make_scheduler(n_parallel=1, batch_size=1)
    running = make_seq(2, at=0.0, rid="running", priority=LOW)
    s.add(running)
    step(s, 0.0)
    for i, prio in enumerate((LOW, LOW, HIGH)):
        s.add(make_seq(2, at=0.1 + i / 10, rid=f"w{i}", priority=prio))
    s.finish(running, 0.5)
    assert [q.request_id for q in s.schedule(0.5).admitted] == ["w2"]


def test_an_aged_low_priority_request_overtakes_fresh_normal_ones() -> None:
    s = make_scheduler(n_parallel=1, batch_size=1, policy=Policy("priority", 0.1))
    s.add(make_seq(2, at=0.0, rid="low", priority=LOW))
    s.add(make_seq(2, at=15.0, rid="normal", priority=NORMAL))
    assert [q.request_id for q in s.schedule(15.0).admitted] == ["low"]  # 2 - 1.5 < 1


def test_lpm_admits_the_request_with_the_longest_cached_prefix_first() -> None:
    s = make_scheduler(n_parallel=1, batch_size=1, policy=Policy("lpm"))
    history = make_seq(0, tokens=list(range(1, 41)))
    s.add(history)
    run_to_end(s, history)
    s.add(make_seq(0, at=1.0, rid="new-topic", tokens=list(range(100, 140))))
    s.add(make_seq(0, at=2.0, rid="next-turn", tokens=list(range(1, 41)) + [50, 51]))
    plan = s.schedule(3.0)
    assert [(q.request_id, q.n_cached) for q in plan.admitted] == [("next-turn", 40)]


def test_lpm_ranks_a_prefix_held_by_a_lower_tier_as_cached_since_admission_restores_it() -> None:
    history = list(range(1, 41))  # gone from the cells to RAM: the tier holds it, the cells nothing
    s = make_scheduler(n_parallel=1, batch_size=1, n_batch=64, policy=Policy("lpm"),
                       tier=lambda _, tokens: TierMatch(40, "k", 40) if tokens[:40] == history else TierMatch(0))
    s.add(make_seq(0, at=1.0, rid="new-topic", tokens=list(range(100, 140))))
    s.add(make_seq(0, at=2.0, rid="next-turn", tokens=history + [50, 51]))
    plan = s.schedule(3.0)
    assert [(q.request_id, q.n_cached) for q in plan.admitted] == [("next-turn", 40)]
    assert [op.n_keep for op in plan.kv_ops if isinstance(op, RestoreOp)] == [40]


def test_lpm_ranks_a_lower_tier_match_too_short_to_restore_as_uncached() -> None:
    s = make_scheduler(n_parallel=1, batch_size=1, n_batch=64, policy=Policy("lpm"),
                       tier=lambda _, tokens: TierMatch(2, "k", 400) if tokens[0] == 1 else TierMatch(0))
    s.add(make_seq(0, at=1.0, rid="first", tokens=list(range(100, 140))))
    s.add(make_seq(0, at=2.0, rid="tiny-match", tokens=list(range(1, 41))))
    assert [q.request_id for q in s.schedule(3.0).admitted] == ["first"]


def test_prompt_chunks_get_the_step_budget_in_priority_order() -> None:
    s = make_scheduler(n_parallel=2, n_batch=8, batch_size=2)
    s.add(make_seq(0, at=0.0, rid="low", priority=LOW, tokens=list(range(1, 21))))
    s.add(make_seq(0, at=1.0, rid="high", priority=HIGH, tokens=list(range(30, 50))))
    assert [(c.seq.request_id, c.n_tokens) for c in s.schedule(1.0).chunks] == [("high", 8)]


def test_a_step_that_cannot_fit_preempts_the_least_urgent_sequence_which_resumes_from_its_cached_prefix() -> None:
    s = make_scheduler(n_cells=20, n_parallel=2, batch_size=2, n_batch=16)
    keep = make_seq(0, at=0.0, rid="keep", priority=HIGH, tokens=list(range(1, 9)))
    victim = make_seq(0, at=1.0, rid="victim", priority=LOW, tokens=list(range(20, 28)))
    s.add(keep)
    s.add(victim)
    now = 1.0
    for _ in range(100):  # 16 cells after the prompts, then one more per step each: a few steps
        now += 0.01
        if preempted := step(s, now):
            break
    else:
        pytest.fail("nothing was preempted in 100 steps")
    assert preempted == [victim] and victim.seq_id == -1 and victim in s.pending and s.n_preemptions == 1
    assert victim.n_generated > 0 and victim.n_preempted == 1
    tokens_so_far = list(victim.token_ids)
    for _ in range(100):  # keep grows: the victim's cached KV is evicted bit by bit
        if keep.n_generated >= 6:
            break
        step(s, now)
    else:
        pytest.fail("keep did not generate 6 tokens in 100 steps")
    s.finish(keep, now)
    plan = s.schedule(now)
    assert plan.admitted == [victim] and victim.token_ids == tokens_so_far
    assert victim.n_past == s.index.lookup(tokens_so_far[:-1]).n_tokens > 0  # resumed from its cached prefix
    assert victim.n_cached == 0  # usage reports the first admission's cache hit, not the resume's
    assert sum(c.n_tokens for c in plan.chunks) == len(tokens_so_far) - victim.n_past


def test_a_sequence_that_cannot_fit_even_alone_fails_and_a_waiting_one_is_not_admitted_without_room() -> None:
    s = make_scheduler(n_cells=10, n_parallel=2, batch_size=1)
    big = make_seq(0, at=0.0, rid="big", tokens=list(range(1, 10)))
    s.add(big)
    step(s, 0.0)  # 9 cells, and a sampled token to decode
    s.add(make_seq(0, at=0.5, rid="late", tokens=[50, 51, 52]))
    plan = s.schedule(1.0)
    assert plan.admitted == [] and [q.request_id for q in s.pending] == ["late"]  # no room for its prompt
    step(s, 1.0)  # the 10th cell
    plan = s.schedule(2.0)
    assert plan.failed == [big] and plan.chunks == [] and plan.preempted == []


def test_preemption_never_touches_the_pinned_system_prompt() -> None:
    index = PrefixIndex(n_seq_ids=8, n_cells=12)
    system_id, _ = index.allocate()
    index.extend(system_id, [1, 2, 3, 4], 0.0)
    index.pin(system_id)
    s = make_scheduler(index=index, n_parallel=2, batch_size=2)
    for rid in ("a", "b"):
        s.add(make_seq(0, rid=rid, tokens=[1, 2, 3, 4, 5 if rid == "a" else 6]))
    for _ in range(100):
        if preempted := step(s, 1.0):
            break
    else:
        pytest.fail("nothing was preempted in 100 steps")
    assert index.length(system_id) == 4 and index.entries[system_id] is True

"""Step k+1 planned ahead (pure): the rows laid out while step k computes are the ones the scheduler
plans after k's commit, in its order; no plan where the steady state of decoding does not hold;
and a plan that no longer holds when step k's tokens come is dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.tree.planned_step import PLACEHOLDER, PlannedStep, matches, plan_ahead, still_holds

from tests.support.scheduling import make_scheduler, make_seq, run_to_end

pytestmark = pytest.mark.pure

N_CTX_SEQ = 1000


def decoding(n_prompt: int, rid: str) -> Sequence:
    """A sequence whose prompt shares no prefix with the others' (none waits to share one)."""
    seq = make_seq(n_prompt, rid=rid, tokens=[1000 * (len(rid) + ord(rid[-1])) + i for i in range(n_prompt)])
    seq.state = state()
    return seq


def state(drafter: object = None, max_tokens: int | None = None, ignore_eos: bool = False) -> SimpleNamespace:
    return SimpleNamespace(drafter=drafter, n_generated=0,
                           params=SimpleNamespace(max_tokens=max_tokens, ignore_eos=ignore_eos))


def commit(s: Scheduler, plan: StepPlan, token: int = 50) -> None:
    """Step k's tokens in KV and each sampled token appended, as the overlapped loop's commit does."""
    for chunk in plan.chunks:
        samples = chunk.samples
        s.computed(chunk, 0.0)
        if samples:
            chunk.seq.token_ids.append(token)


def started(lengths: list[int], n_batch: int = 64, n_cells: int = 1000) -> tuple[Scheduler, list[Sequence]]:
    s = make_scheduler(n_cells, n_parallel=len(lengths), batch_size=len(lengths), n_batch=n_batch, max_queue=8)
    seqs = [decoding(n, f"r{i}") for i, n in enumerate(lengths)]
    for seq in seqs:
        s.add(seq)
    return s, seqs


def no_eog(token: int) -> bool:
    return False


def refuse(ops: list[KvOp]) -> None:
    raise AssertionError(f"nothing to evict here: {ops}")


def test_the_planned_rows_are_the_schedulers_next_step_in_its_order() -> None:
    s, (a, b, c) = started([3, 40, 5], n_batch=20)
    commit(s, s.schedule(0.0))  # a samples; b computed 17 of its 40
    commit(s, s.schedule(0.0))  # a decodes, b computes 19 more
    step_k = s.schedule(0.0)
    assert [(ch.seq, ch.n_tokens) for ch in step_k.chunks] == [(a, 1), (b, 4), (c, 5)]  # each samples
    # A step's decodes are packed in the running order, its prompt chunks after them (a prompt
    # whose prefix was all cached is a decode at once): the next step's rows follow the running order.
    s.running[:] = [c, a, b]
    planned = plan_ahead(step_k, s, N_CTX_SEQ)
    assert planned is not None and planned.seqs == [c, a, b] and planned.drawn == [a, b, c]
    assert (planned.tokens == PLACEHOLDER).all()
    commit(s, step_k)
    step_next = s.schedule(0.0)
    assert matches(planned, step_next)
    tokens, positions, seq_ids, wants = planned.fill([7, 8, 9])  # drawn in step k's order: a, b, c
    assert tokens.tolist() == [9, 7, 8]
    _, want_positions, want_seq_ids, want_wants = step_next.rows()
    assert positions.tolist() == want_positions and seq_ids.tolist() == want_seq_ids and wants.tolist() == want_wants


def test_no_plan_ahead_while_a_request_waits_or_a_sequence_prefills_drafts_or_is_not_in_the_step() -> None:
    s, (a, b) = started([3, 40], n_batch=20)
    plan = s.schedule(0.0)
    assert plan_ahead(plan, s, N_CTX_SEQ) is None  # b's prompt chunk does not sample: its next step is another chunk
    s, (a, b) = started([3, 4])
    commit(s, s.schedule(0.0))
    plan = s.schedule(0.0)
    s.add(decoding(3, "late"))
    assert plan_ahead(plan, s, N_CTX_SEQ) is None  # a request waits: the next plan may admit it
    s, (a, b) = started([3, 4])
    plan = s.schedule(0.0)
    b.state = state(drafter=object())
    assert plan_ahead(plan, s, N_CTX_SEQ) is None  # its drafts are planned with its next step
    plan.chunks = plan.chunks[:1]
    b.state = state()
    assert plan_ahead(plan, s, N_CTX_SEQ) is None  # a running sequence without a row in step k


def test_no_plan_ahead_where_a_token_of_step_k_ends_its_request_by_its_length() -> None:
    s, (a, b) = started([3, 4])
    plan = s.schedule(0.0)
    b.state = state(max_tokens=1)  # its first token is its last
    assert plan_ahead(plan, s, N_CTX_SEQ) is None
    b.state = state(max_tokens=2)
    assert plan_ahead(plan, s, N_CTX_SEQ) is not None
    assert plan_ahead(plan, s, 5) is None  # b's 4 tokens and the next fill its context


def holding(**changes: Any) -> tuple[Scheduler, PlannedStep, list[Sequence]]:
    s, seqs = started([3, 4])
    planned = plan_ahead(s.schedule(0.0), s, N_CTX_SEQ)
    assert planned is not None and still_holds(planned, seqs, [1, 2], s, False, no_eog, refuse)
    return s, planned, seqs


def test_a_plan_no_longer_holds_when_a_token_ends_a_request_or_anything_arrived_or_ended_meanwhile() -> None:
    s, planned, seqs = holding()
    assert not still_holds(planned, seqs, [1, 2], s, False, lambda token: token == 2, refuse)  # an EOG
    assert not still_holds(planned, seqs, [1, 2], s, True, no_eog, refuse)  # a cancel or a stop string pending
    assert not still_holds(planned, seqs[:1], [1], s, False, no_eog, refuse)  # a row dropped or refused
    s.add(decoding(3, "late"))
    assert not still_holds(planned, seqs, [1, 2], s, False, no_eog, refuse)  # a request arrived


def test_an_eog_drawn_for_a_request_that_ignores_it_keeps_the_plan() -> None:
    s, (a, b) = started([3, 4])
    b.state = state(ignore_eos=True)
    planned = plan_ahead(s.schedule(0.0), s, N_CTX_SEQ)
    assert planned is not None and planned.eog_rows == [0]
    assert still_holds(planned, [a, b], [1, 2], s, False, lambda token: token == 2, refuse)


def test_a_plan_no_longer_holds_without_a_free_cell_for_each_row() -> None:
    s, planned, seqs = holding()
    s.index.cells_used = s.index.n_cells - planned.cells_needed + 1  # one short once step k commits
    assert not still_holds(planned, seqs, [1, 2], s, False, no_eog, lambda ops: None)
    s.index.cells_used -= 1
    assert still_holds(planned, seqs, [1, 2], s, False, no_eog, refuse)


def with_a_cached_prefix(n_cells: int) -> tuple[Scheduler, StepPlan, list[Sequence]]:
    """A finished request's 10 cells cached, then two sequences' first step (7 cells) planned."""
    s = make_scheduler(n_cells, n_parallel=2, batch_size=1, max_queue=8)
    old = decoding(10, "old")
    s.add(old)
    run_to_end(s, old)
    a, b = decoding(3, "a"), decoding(4, "b")
    s.add(a)
    s.add(b)
    plan = s.schedule(0.0)
    assert s.index.cells_used == 10 and [c.seq for c in plan.chunks] == [a, b]
    return s, plan, [a, b]


def test_cached_prefixes_are_evicted_for_the_planned_rows_as_the_scheduler_would_evict_them() -> None:
    # 18 cells: 10 cached + 7 of step k + 2 rows of step k+1 is one too many
    s, step_k, seqs = with_a_cached_prefix(18)
    planned = plan_ahead(step_k, s, N_CTX_SEQ)
    assert planned is not None
    evicted: list[KvOp] = []
    assert still_holds(planned, seqs, [1, 2], s, False, no_eog, evicted.extend)
    commit(s, step_k)
    assert matches(planned, s.schedule(0.0))  # no eviction left for the scheduler's plan
    twin, twin_k, _ = with_a_cached_prefix(18)
    commit(twin, twin_k)
    assert evicted and twin.schedule(0.0).kv_ops == evicted  # the ones the scheduler evicts after the commit


def test_where_evicting_is_not_enough_the_plan_no_longer_holds() -> None:
    s, step_k, seqs = with_a_cached_prefix(18)
    planned = plan_ahead(step_k, s, N_CTX_SEQ)
    assert planned is not None
    s.index.cells_used += 10  # as if running sequences held 10 more: evicting every entry frees too few
    assert not still_holds(planned, seqs, [1, 2], s, False, no_eog, lambda ops: None)


def test_a_plan_that_differs_from_the_schedulers_does_not_match() -> None:
    s, (a, b) = started([3, 4])
    step_k = s.schedule(0.0)
    planned = plan_ahead(step_k, s, N_CTX_SEQ)
    assert planned is not None
    commit(s, step_k)
    plan = s.schedule(0.0)
    assert matches(planned, plan)
    assert not matches(planned, StepPlan(chunks=plan.chunks[::-1], adapters=plan.adapters))
    assert not matches(planned, StepPlan(chunks=plan.chunks, adapters=(("other", 1.0),)))
    assert not matches(planned, StepPlan(chunks=plan.chunks, admitted=[a]))
    assert np.array_equal(planned.positions, [3, 4])

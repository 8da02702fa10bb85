"""Step k+1 planned ahead (pure): the rows laid out while step k computes are the ones the scheduler
plans after k's commit, in its order; no plan where the steady state of decoding does not hold;
and a plan that no longer holds when step k's tokens come is dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.tree.planned_step import PLACEHOLDER, PlannedStep, matches, plan_ahead, still_holds

from tests.support.scheduling import make_scheduler, make_seq

pytestmark = pytest.mark.pure


def decoding(n_prompt: int, rid: str) -> Sequence:
    """A sequence whose prompt shares no prefix with the others' (none waits to share one)."""
    seq = make_seq(n_prompt, rid=rid, tokens=[1000 * (len(rid) + ord(rid[-1])) + i for i in range(n_prompt)])
    seq.state = SimpleNamespace(drafter=None)
    return seq


def commit(s: Scheduler, plan: StepPlan, token: int = 50) -> None:
    """Step k's tokens in KV and each sampled token appended, as the overlapped loop's commit does."""
    for chunk in plan.chunks:
        samples = chunk.samples
        s.computed(chunk, 0.0)
        if samples:
            chunk.seq.token_ids.append(token)


def started(lengths: list[int], n_batch: int = 64) -> tuple[Scheduler, list[Sequence]]:
    s = make_scheduler(n_parallel=len(lengths), batch_size=len(lengths), n_batch=n_batch, max_queue=8)
    seqs = [decoding(n, f"r{i}") for i, n in enumerate(lengths)]
    for seq in seqs:
        s.add(seq)
    return s, seqs


def never_ends(seq: Sequence, token: int) -> bool:
    return False


def test_the_planned_rows_are_the_schedulers_next_step_in_its_order() -> None:
    s, (a, b, c) = started([3, 40, 5], n_batch=20)
    commit(s, s.schedule(0.0))  # a samples; b computed 17 of its 40
    commit(s, s.schedule(0.0))  # a decodes, b computes 19 more
    step_k = s.schedule(0.0)
    assert [(ch.seq, ch.n_tokens) for ch in step_k.chunks] == [(a, 1), (b, 4), (c, 5)]  # each samples
    # A step's decodes are packed in the running order, its prompt chunks after them (a prompt
    # whose prefix was all cached is a decode at once): the next step's rows follow the running order.
    s.running[:] = [c, a, b]
    planned = plan_ahead(step_k, s)
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
    assert plan_ahead(plan, s) is None  # b's prompt chunk does not sample: its next step is another chunk
    s, (a, b) = started([3, 4])
    commit(s, s.schedule(0.0))
    plan = s.schedule(0.0)
    s.add(decoding(3, "late"))
    assert plan_ahead(plan, s) is None  # a request waits: the next plan may admit it
    s, (a, b) = started([3, 4])
    plan = s.schedule(0.0)
    b.state = SimpleNamespace(drafter=object())
    assert plan_ahead(plan, s) is None  # its drafts are planned with its next step
    plan.chunks = plan.chunks[:1]
    b.state = SimpleNamespace(drafter=None)
    assert plan_ahead(plan, s) is None  # a running sequence without a row in step k


def holding(**changes: Any) -> tuple[Scheduler, PlannedStep, list[Sequence]]:
    s, seqs = started([3, 4])
    planned = plan_ahead(s.schedule(0.0), s)
    assert planned is not None and still_holds(planned, seqs, [1, 2], s, False, never_ends)
    return s, planned, seqs


def test_a_plan_no_longer_holds_when_a_token_ends_a_request_or_anything_arrived_or_ended_meanwhile() -> None:
    s, planned, seqs = holding()
    assert not still_holds(planned, seqs, [1, 2], s, False, lambda seq, token: token == 2)  # EOG, max_tokens
    assert not still_holds(planned, seqs, [1, 2], s, True, never_ends)  # a cancel or a stop string pending
    assert not still_holds(planned, seqs[:1], [1], s, False, never_ends)  # a row dropped or refused
    s.add(decoding(3, "late"))
    assert not still_holds(planned, seqs, [1, 2], s, False, never_ends)  # a request arrived


def test_a_plan_no_longer_holds_without_a_free_cell_for_each_row() -> None:
    s, planned, seqs = holding()
    s.index.cells_used = s.index.n_cells - planned.cells_needed + 1  # one short once step k commits
    assert not still_holds(planned, seqs, [1, 2], s, False, never_ends)
    s.index.cells_used -= 1
    assert still_holds(planned, seqs, [1, 2], s, False, never_ends)


def test_a_plan_that_differs_from_the_schedulers_does_not_match() -> None:
    s, (a, b) = started([3, 4])
    step_k = s.schedule(0.0)
    planned = plan_ahead(step_k, s)
    assert planned is not None
    commit(s, step_k)
    plan = s.schedule(0.0)
    assert matches(planned, plan)
    assert not matches(planned, StepPlan(chunks=plan.chunks[::-1], adapters=plan.adapters))
    assert not matches(planned, StepPlan(chunks=plan.chunks, adapters=(("other", 1.0),)))
    assert not matches(planned, StepPlan(chunks=plan.chunks, admitted=[a]))
    assert np.array_equal(planned.positions, [3, 4])

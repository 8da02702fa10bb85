"""Tenants' shares of the queue, model-free: the rule (``llamactor.scheduling.queue_shares``) on its
numbers and, property-tested, on any arrivals of any tenants with any weights; the scheduler
refusing beyond a tenant's share while another tenant still gets in; a tenant's job and file
limits; a cancelled choice's tokens counted; a wait for budget ending with its job. The daemon's side:
tests/http/test_tenant_shares.py."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamactor.base.completion import Completion, Timings, Usage
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import BatcherUnavailableError, CancelledError, InvalidRequestError, QueueFullError
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.tenants import Tenant
from llamactor.handles.limits import Limiter, WaitForLimits, used_tokens
from llamactor.jobs.quotas import check_new_file, check_new_job
from llamactor.scheduling.queue_shares import CEILING, Waiting, admission, share
from llamactor.scheduling.sequence import Sequence

from tests.support.scheduling import make_scheduler

pytestmark = pytest.mark.pure


def test_a_lone_tenant_may_fill_the_queue_and_a_newcomer_still_gets_its_share() -> None:
    assert admission("a", 1.0, {"a": Waiting(15, 1.0)}, 16).admitted
    full = admission("a", 1.0, {"a": Waiting(16, 1.0)}, 16)
    assert not full.admitted and "its share of the queue (16: max_queue=16)" in full.reason
    newcomer = admission("b", 1.0, {"a": Waiting(16, 1.0)}, 16)
    assert newcomer.admitted and newcomer.share == 8 and newcomer.total == 16
    # the filler is now over its share (8 of 16, two tenants waiting) and takes no more
    over = admission("a", 1.0, {"a": Waiting(16, 1.0), "b": Waiting(1, 1.0)}, 16)
    assert not over.admitted and "split by weight between the 2 tenants waiting" in over.reason


def test_shares_follow_the_weights_and_are_never_less_than_one() -> None:
    assert share(3.0, 1.0, 16) == 12 and share(1.0, 3.0, 16) == 4
    assert share(1.0, 999.0, 16) == 1  # a light tenant beside heavy ones still queues one
    assert share(1.0, 0.0, 5) == 5


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[int, dict[str, float], list[tuple[str, bool]]]:
    """A queue bound, tenants' weights, and events: a tenant's sequence arrives, or one leaves."""
    max_queue = draw(st.integers(1, 24))
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True))
    weights = {n: draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 10.0])) for n in names}
    events = draw(st.lists(st.tuples(st.sampled_from(names), st.booleans()), max_size=300))
    return max_queue, weights, events


@settings(max_examples=300, deadline=None)
@given(arrivals())
def test_any_arrivals_keep_every_tenant_within_its_share_and_the_queue_bounded(
        case: tuple[int, dict[str, float], list[tuple[str, bool]]]) -> None:
    max_queue, weights, events = case
    held = {n: 0 for n in weights}
    for name, arrives in events:
        waiting = {n: Waiting(c, weights[n]) for n, c in held.items() if c}
        if not arrives:
            held[name] = max(0, held[name] - 1)
            continue
        decision = admission(name, weights[name], waiting, max_queue)
        others = sum(w.weight for n, w in waiting.items() if n != name)
        assert decision.share == share(weights[name], others, max_queue) >= 1
        if held[name] == 0 and sum(held.values()) < CEILING * max_queue:
            assert decision.admitted, "a tenant with nothing waiting is refused"
        if decision.admitted:
            held[name] += 1
            assert held[name] <= decision.share
        else:
            assert decision.reason
        assert sum(held.values()) <= CEILING * max_queue


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.sampled_from([0.5, 1.0, 4.0]), st.sampled_from([0.5, 1.0, 4.0]), st.integers(0, 200))
def test_two_tenants_one_filling_the_queue_never_shuts_out_the_other(
        max_queue: int, w_a: float, w_b: float, a_tries: int) -> None:
    held_a = 0
    for _ in range(a_tries):  # a fills what it may, alone
        if admission("a", w_a, {"a": Waiting(held_a, w_a)}, max_queue).admitted:
            held_a += 1
    assert held_a == min(a_tries, max_queue)
    assert admission("b", w_b, {"a": Waiting(held_a, w_a)}, max_queue).admitted


def seq(tenant: Tenant, rid: str) -> Sequence:
    msg = Generate(request_id=rid, params=SamplingParams(max_tokens=4), reply=ReplyChannel(), submitted_at=0.0,
                   text="x", tenant=tenant)
    return Sequence(request=msg, token_ids=[1, 2], n_prompt=2)


def test_the_scheduler_refuses_a_tenant_over_its_share_and_admits_the_other() -> None:
    s = make_scheduler(n_parallel=2, max_queue=4)
    alice, bob = Tenant("alice"), Tenant("bob", weight=1.0)
    for i in range(6):  # 2 start at the next flush, 4 wait: alice's whole share, alone
        s.add(seq(alice, f"a{i}"))
    with pytest.raises(QueueFullError, match="tenant 'alice' already has 4 sequences waiting"):
        s.add(seq(alice, "a6"))
    s.add(seq(bob, "b0"))  # before the fix: "4 requests already wait" for bob too
    s.add(seq(bob, "b1"))
    s.add(seq(bob, "b2"))  # two of bob's would start at a flush; one waits, under his share of 2
    with pytest.raises(QueueFullError, match="tenant 'alice'"):
        s.add(seq(alice, "a7"))
    heavy = dataclasses.replace(bob, name="carol", weight=3.0)
    s.add(seq(heavy, "c0"))
    assert {sq.tenant for sq in s.pending} == {"alice", "bob", "carol"}


def test_a_tenants_jobs_and_files_are_bounded_by_its_limits() -> None:
    tenant = Tenant("t", max_batch_jobs=2, max_files=2, max_file_bytes=100)
    check_new_job(tenant, 1)
    with pytest.raises(QueueFullError, match="max_batch_jobs=2"):
        check_new_job(tenant, 2)
    check_new_file(tenant, [{"bytes": 60}], 40)
    with pytest.raises(InvalidRequestError, match="max_file_bytes=100"):
        check_new_file(tenant, [{"bytes": 60}], 41)
    with pytest.raises(InvalidRequestError, match="max_files=2"):
        check_new_file(tenant, [{"bytes": 1}, {"bytes": 1}], 1)
    check_new_job(Tenant("free", max_batch_jobs=None), 10_000)  # None: no cap
    with pytest.raises(InvalidRequestError, match="max_files must be a positive integer"):
        Tenant("bad", max_files=0)


def test_a_cancelled_choice_counts_what_it_computed_and_waiting_for_budget_stops_with_its_job() -> None:
    walked_away: concurrent.futures.Future[Completion] = concurrent.futures.Future()
    partial = Completion(request_id="r", text="abc", token_ids=(1, 2, 3), finish_reason="cancelled",
                         usage=Usage(prompt_tokens=50, completion_tokens=3, cached_tokens=0),
                         timings=Timings(0.0, 0.0, 0.0, 0.0))
    walked_away.set_exception(CancelledError("cancelled", partial))
    never_ran: concurrent.futures.Future[Completion] = concurrent.futures.Future()
    never_ran.cancel()
    assert used_tokens([walked_away, never_ran]) == 53  # before: 0, every streamed token refunded

    limiter, tenant, stop = Limiter(), Tenant("t", requests_per_minute=1), threading.Event()
    limiter.reserve(tenant, 1, WaitForLimits(stop))  # the minute's one request
    stop.set()
    waits: list[float] = []
    with pytest.raises(BatcherUnavailableError):
        limiter.reserve(tenant, 1, WaitForLimits(stop, lambda _tenant, seconds: waits.append(seconds)))
    assert 0 < waits[0] <= 60

"""Fair shares between tenants in the pure scheduler: simulated runs (schedule -> pretend decode ->
sample) with seeded random workloads, checking the shares of service, work conservation, the
tenants' caps, and how soon a quiet tenant is served beside a flood."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from llamactor.base.sampling import SamplingParams
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.tenants import Tenant
from llamactor.scheduling.fairness import FairShare
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.prompt_scores import ScoreState
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence

pytestmark = pytest.mark.pure


def seq(tenant: Tenant, n_prompt: int, max_tokens: int, at: float, rid: str, rng: random.Random) -> Sequence:
    msg = Generate(request_id=rid, params=SamplingParams(max_tokens=max_tokens), reply=ReplyChannel(),
                   submitted_at=at, text="x", tenant=tenant)
    return Sequence(request=msg, token_ids=[rng.randint(3, 999) for _ in range(n_prompt)], n_prompt=n_prompt)


def scheduler(n_parallel: int = 8, max_queue: int = 10_000) -> Scheduler:
    return Scheduler(n_parallel=n_parallel, n_batch=256, batch_size=1, batch_timeout_s=0.0, max_queue=max_queue,
                     index=PrefixIndex(n_seq_ids=n_parallel + 4, n_cells=100_000), keep_finished=False)


def step(s: Scheduler, now: float, served: Counter[str], finished: list[Sequence]) -> None:
    """One step: schedule, pretend the decode, sample a token for each sampling chunk, finish what is done."""
    for chunk in s.schedule(now).chunks:
        served[chunk.seq.tenant] += chunk.n_tokens
        samples = chunk.samples
        s.computed(chunk, now)
        if samples:
            chunk.seq.token_ids.append(7)
            if chunk.seq.n_generated >= chunk.seq.request.params.max_tokens:
                s.finish(chunk.seq, now)
                finished.append(chunk.seq)


def backlogged_shares(weights: dict[str, float], seed: int, steps: int = 400) -> dict[str, float]:
    """The share of the tokens each tenant was served while every one kept requests waiting."""
    rng = random.Random(seed)
    tenants = {name: Tenant(name, weight=w) for name, w in weights.items()}
    s, served, finished, now = scheduler(), Counter[str](), [], 0.0
    made = Counter[str]()
    for _ in range(steps):
        for name, tenant in tenants.items():  # every tenant keeps more waiting than it could run
            while sum(1 for x in s.pending if x.tenant == name) < 12:
                made[name] += 1
                s.add(seq(tenant, rng.randint(8, 40), rng.randint(4, 30), now, f"{name}-{made[name]}", rng))
        now += 1.0
        step(s, now, served, finished)
    total = sum(served.values())
    return {name: served[name] / total for name in weights}


@pytest.mark.parametrize("seed", range(6))
def test_backlogged_tenants_are_served_tokens_in_proportion_to_their_weights(seed: int) -> None:
    for weights in ({"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 1.0}, {"a": 1.0, "b": 1.0, "c": 2.0}):
        shares = backlogged_shares(weights, seed)
        for name, w in weights.items():
            want = w / sum(weights.values())
            assert abs(shares[name] - want) <= 0.1 * want, (weights, shares)


@pytest.mark.parametrize("seed", range(4))
def test_sequences_freed_together_are_shared_between_tenants_and_nothing_is_preempted_back(seed: int) -> None:
    rng = random.Random(seed)
    s = Scheduler(n_parallel=8, n_batch=512, batch_size=8, batch_timeout_s=0.0, max_queue=10_000,
                  index=PrefixIndex(n_seq_ids=12, n_cells=8192), keep_finished=True)
    a, b = Tenant("a"), Tenant("b")
    for i in range(48):  # equal answers: every 64 steps all 8 sequences end at once
        s.add(seq(a if i % 2 == 0 else b, rng.randint(12, 18), 64, 0.0, f"r{i}", rng))
    served, finished, now, steps = Counter[str](), [], 0.0, 0
    while s.pending or s.running:
        now, steps = now + 1.0, steps + 1
        step(s, now, served, finished)
        assert abs(sum(1 for x in s.running if x.tenant == "a") - len(s.running) / 2) <= 1
    assert s.n_preemptions == 0 and steps == 48 * 64 // 8


def test_a_tenant_alone_gets_every_sequence_and_its_cap_holds_when_set() -> None:
    rng = random.Random(1)
    for cap, expected in ((None, 8), (3, 3)):
        s, served, finished = scheduler(), Counter[str](), []
        alone = Tenant("alone", max_running=cap)
        for i in range(20):
            s.add(seq(alone, 10, 50, 0.0, f"r{i}", rng))
        step(s, 1.0, served, finished)
        assert len(s.running) == expected
    s, served, finished = scheduler(), Counter[str](), []
    capped, free = Tenant("capped", max_running=2), Tenant("free")
    for i in range(10):
        s.add(seq(capped, 10, 50, 0.0, f"c{i}", rng))
    s.add(seq(free, 10, 50, 0.0, "f0", rng))
    step(s, 1.0, served, finished)
    assert Counter(x.tenant for x in s.running) == {"capped": 2, "free": 1}  # capped, not stopping the others


def test_a_quiet_tenants_request_behind_a_flood_is_admitted_with_the_next_free_sequence() -> None:
    rng = random.Random(2)
    s, served, finished, now = scheduler(n_parallel=4), Counter[str](), [], 0.0
    flood, quiet = Tenant("flood"), Tenant("quiet")
    for i in range(48):
        s.add(seq(flood, 30, 20, now, f"f{i}", rng))
    for _ in range(10):
        now += 1.0
        step(s, now, served, finished)
    question = seq(quiet, 20, 5, now, "q", rng)
    s.add(question)
    waited = 0
    while question.seq_id < 0:  # it takes the first sequence a flood request frees
        now += 1.0
        waited += 1
        step(s, now, served, finished)
    flood_done_meanwhile = sum(1 for x in finished if x.tenant == "flood" and x.admitted_at and x.admitted_at > question.submitted_at)
    assert flood_done_meanwhile == 0 and waited <= 20


def test_a_tenant_back_from_idle_gets_no_banked_credit() -> None:
    fair = FairShare()
    busy, idle = Tenant("busy"), Tenant("idle")
    rng = random.Random(3)
    a, b = seq(busy, 10, 1, 0.0, "a", rng), seq(idle, 10, 1, 0.0, "b", rng)
    fair.activate(a, [])
    fair.charge(a, 10_000)  # busy worked alone for a long time
    fair.activate(b, [a])  # idle arrives: lifted to the least active counter, not left at zero
    assert fair.rank(b)[0] == fair.rank(a)[0]


def test_after_the_engine_was_idle_two_tenants_arriving_one_after_the_other_start_even() -> None:
    fair = FairShare()
    first, second = Tenant("first"), Tenant("second")
    rng = random.Random(5)
    a, b = seq(first, 10, 1, 0.0, "a", rng), seq(second, 10, 1, 0.0, "b", rng)
    fair.activate(b, [])
    fair.charge(b, 5_000)  # second was served more in an earlier busy period; then all went idle
    fair.activate(a, [])
    fair.activate(b, [a])
    assert fair.rank(a) == fair.rank(b) == (0.0,)


def test_young_scoring_gives_its_sequences_to_waiting_generation_and_patient_scoring_keeps_its_turn() -> None:
    rng = random.Random(4)
    for submitted, expected in ((0.0, {"generate": 8}), (-60.0, {"score": 8})):
        s = Scheduler(n_parallel=8, n_batch=256, batch_size=1, batch_timeout_s=0.0, max_queue=1000,
                      index=PrefixIndex(n_seq_ids=16, n_cells=100_000))
        tenant = Tenant("t")
        for i in range(40):  # scoring callers fill every sequence while nothing else waits
            x = seq(tenant, 120, 0, submitted, f"s{i}", rng)
            x.scoring, x.prompt_only = ScoreState(start=1, n_prompt=120, n_top=0), True
            s.add(x)
        s.schedule(1.0)
        assert sum(x.work_class == "score" for x in s.running) == 8
        for i in range(8):
            s.add(seq(tenant, 10, 20, 1.0, f"g{i}", rng))
        for step_no in range(2, 12):  # one scoring sequence a step gives way, while it is young
            plan = s.schedule(float(step_no))
            assert all(x.work_class == "score" for x in plan.preempted) and len(plan.preempted) <= 1
        assert Counter(x.work_class for x in s.running) == expected


def test_work_fallen_far_behind_gets_a_sequence_by_preemption_even_with_one_running() -> None:
    rng = random.Random(6)
    s = Scheduler(n_parallel=2, n_batch=256, batch_size=1, batch_timeout_s=0.0, max_queue=100,
                  index=PrefixIndex(n_seq_ids=8, n_cells=10_000))
    big, small = Tenant("big"), Tenant("small")
    s.add(seq(big, 10, 500, 0.0, "b", rng))
    s.add(seq(small, 10, 500, 0.0, "s1", rng))
    s.schedule(1.0)
    s.fair.charge(s.running[0], 1000)  # big has been served far more than small
    s.add(seq(small, 10, 5, 1.0, "s2", rng))
    plan = s.schedule(2.0)
    assert [x.tenant for x in plan.preempted] == ["big"] and plan.admitted[0].request_id == "s2"
    s.add(seq(big, 10, 5, 2.0, "b2", rng))
    assert s.schedule(3.0).preempted == []  # small is not far behind big: no preemption the other way


def test_a_tenant_with_nothing_running_gets_a_sequence_at_once_by_preempting_a_crowded_one() -> None:
    rng = random.Random(5)
    s = Scheduler(n_parallel=2, n_batch=256, batch_size=1, batch_timeout_s=0.0, max_queue=100,
                  index=PrefixIndex(n_seq_ids=8, n_cells=10_000))
    flood, quiet = Tenant("flood"), Tenant("quiet")
    for i in range(4):
        s.add(seq(flood, 10, 50, 0.0, f"f{i}", rng))
    for chunk in s.schedule(1.0).chunks:
        s.computed(chunk, 1.0)
    asked = seq(quiet, 10, 5, 1.0, "q", rng)
    s.add(asked)
    plan = s.schedule(2.0)
    assert [x.tenant for x in plan.preempted] == ["flood"] and asked in plan.admitted
    assert plan.preempted[0] in s.pending and plan.preempted[0].n_preempted == 1  # it resumes later
    s.add(seq(flood, 10, 50, 2.0, "f9", rng))
    assert s.schedule(3.0).preempted == []  # the flood's own newcomer preempts nobody

"""The order fairness gives waiting work, and whom it preempts for it (pure: no threads, no I/O;
the scheduler calls it on the batcher's thread).

Waiting work is grouped in flows, one per (tenant, class of work); each time, the head (in the
policy's order) of the least served tenant's flows goes first -- equal counters (a tenant just
arrived is lifted to the least) go to the flow with fewer sequences running, then the policy's
place. Within a tenant, scoring younger than ``SCORING_PATIENCE_S`` yields to its generation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from llamactor.scheduling.fairness import GENERATE, PREEMPT_LEAD, SCORE, FairShare
from llamactor.scheduling.sequence import Sequence

# A scoring request younger than this gives way to its tenant's waiting generation; an older one
# takes the next free sequence like any request, so scoring never starves under a generation load.
SCORING_PATIENCE_S = 10.0


def yields_to(seq: Sequence, waiting: Sequence, now: float) -> bool:
    """A tenant's prompt scoring, younger than ``SCORING_PATIENCE_S``, gives up its sequences
    (running or to come) to the tenant's waiting generation. Scoring is throughput work, held to
    ``score_share`` of a step's compute anyway, so a sequence it holds is mostly one that
    interactive generation lacks; patience ran out, it takes its turn (it never starves)."""
    return (seq.work_class == SCORE and waiting.work_class == GENERATE and seq.tenant == waiting.tenant
            and now - seq.submitted_at < SCORING_PATIENCE_S)


def fair_order(ordered: list[Sequence], running: list[Sequence], fair: FairShare,
               now: float) -> Iterator[Sequence]:
    """``ordered`` (waiting work in the policy's order) fairly, among the tenants below their
    ``max_running``. A generator: what the caller admits meanwhile (appended to ``running``)
    changes the counters and the running counts it reads."""
    flows: dict[tuple[str, str], list[Sequence]] = {}
    for seq in ordered:
        flows.setdefault((seq.tenant, seq.work_class), []).append(seq)
    place = {id(s): i for i, s in enumerate(ordered)}
    generating = {q[0].tenant: q[0] for q in flows.values() if q[0].work_class == GENERATE}
    # Counters grow as steps compute; within one admission round, what is handed out counts at
    # once, or a round in which many sequences end together would give every free sequence to
    # the tenant a few tokens behind (and fairness would preempt them back one by one).
    handed_out: dict[str, float] = {}
    while flows:
        counts = Counter(s.tenant for s in running)
        heads = [q[0] for q in flows.values()
                 if (q[0].max_running is None or counts[q[0].tenant] < q[0].max_running)
                 and not (q[0].tenant in generating and yields_to(q[0], generating[q[0].tenant], now))]
        if not heads:
            return
        seq = min(heads, key=lambda s: (fair.rank(s)[0] + handed_out.get(s.tenant, 0.0), counts[s.tenant], place[id(s)]))
        handed_out[seq.tenant] = handed_out.get(seq.tenant, 0.0) + expected_service(seq)
        flow = flows[(seq.tenant, seq.work_class)]
        flow.pop(0)
        if not flow:
            del flows[(seq.tenant, seq.work_class)]
        yield seq


def expected_service(seq: Sequence) -> float:
    """What admitting ``seq`` hands its tenant, in weighted tokens: its prompt still to compute
    and what it may still generate, counted up to ``PREEMPT_LEAD`` (an open-ended answer is then
    as far ahead as fairness lets a tenant get)."""
    limit = seq.request.params.max_tokens
    to_generate = PREEMPT_LEAD if limit is None else min(PREEMPT_LEAD, max(0, limit - seq.n_generated))
    return (seq.n_unprocessed + to_generate) / seq.weight


def ahead_of(head: Sequence, running: list[Sequence], fair: FairShare, now: float) -> list[Sequence]:
    """The running sequences ``head`` (what fairness admits next, every sequence taken) may take
    a sequence from: when its tenant has nothing running, those of tenants running several and
    served as much or more; otherwise its tenant's young scoring (``yields_to``) and the
    sequences of tenants more than ``PREEMPT_LEAD`` weighted tokens ahead."""
    counts = Counter(s.tenant for s in running)
    if counts[head.tenant] == 0:  # (not for work that is itself ahead of them)
        return [s for s in running if counts[s.tenant] >= 2 and fair.lead(s, head) >= 0]
    return [s for s in running if yields_to(s, head, now) or fair.lead(s, head) > PREEMPT_LEAD]

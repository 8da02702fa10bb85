"""Tenants' shares of the queue (pure: no threads, no I/O; the scheduler calls it on the batcher's
thread when a sequence arrives).

``max_queue`` bounds the sequences that wait for a free one. Shared by tenants who do not trust
each other, one tenant must not fill it for everyone: each tenant may hold at most its *share*
of it -- ``max_queue`` split between the tenants that wait (and the one arriving) by their
fair-share weights, never less than 1 -- so a tenant alone may use the whole queue, and when
another arrives it finds room: a tenant under its share is admitted even where the others have
filled ``max_queue`` before it came (they then take no more until they are back under their
shares, which the queue draining brings). So that a stampede of tenants stays bounded too, the
queue as a whole never holds more than ``CEILING`` times ``max_queue``.

The decision is data (``Admission``): the scheduler raises ``QueueFullError`` with its
``reason``, which says whose share was full, how large it is and why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llamactor.scheduling.fairness import Served

# The whole queue's bound, in multiples of max_queue: what tenants arriving at a queue the
# earlier ones filled may add beyond it (with two tenants it is never reached: a lone tenant
# holds at most max_queue, a newcomer at most its share of it).
CEILING = 2


@dataclass(frozen=True, slots=True)
class Waiting:
    """One tenant's sequences waiting for a free sequence, and its fair-share weight."""

    count: int
    weight: float


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether ``tenant``'s next sequence may wait, and the numbers that decided it."""

    tenant: str
    share: int  # the sequences it may hold waiting now
    holds: int  # those it holds already
    total: int  # every tenant's waiting sequences
    n_tenants: int  # tenants waiting, this one included
    max_queue: int

    @property
    def over_share(self) -> bool:
        return self.holds + 1 > self.share

    @property
    def over_ceiling(self) -> bool:
        return self.total + 1 > CEILING * self.max_queue

    @property
    def admitted(self) -> bool:
        return not (self.over_share or self.over_ceiling)

    @property
    def reason(self) -> str:
        """Why it is refused (a ``QueueFullError``'s message), or "" when admitted."""
        if self.over_share:
            shared = (f"max_queue={self.max_queue} split by weight between the {self.n_tenants} tenants waiting"
                      if self.n_tenants > 1 else f"max_queue={self.max_queue}")
            return (f"tenant {self.tenant!r} already has {self.holds} sequences waiting for a free one, its share "
                    f"of the queue ({self.share}: {shared}); each choice (n) of each prompt takes a place: "
                    "retry later or ask for fewer")
        if self.over_ceiling:
            return (f"{self.total} sequences of {self.n_tenants} tenants already wait for a free one "
                    f"(the queue's bound: {CEILING} x max_queue={self.max_queue}); retry later")
        return ""


def share(weight: float, others: float, max_queue: int) -> int:
    """A tenant's share of ``max_queue`` beside waiting tenants of total weight ``others``."""
    return max(1, math.floor(max_queue * weight / (weight + others) + 1e-9))


def admission(tenant: str, weight: float, waiting: Mapping[str, Waiting], max_queue: int) -> Admission:
    """May one more sequence of ``tenant`` wait? ``waiting``: each tenant's waiting sequences (a
    tenant with none may be absent)."""
    holds = waiting[tenant].count if tenant in waiting else 0
    others = {name: w for name, w in waiting.items() if name != tenant and w.count > 0}
    return Admission(tenant=tenant, share=share(weight, sum(w.weight for w in others.values()), max_queue),
                     holds=holds, total=holds + sum(w.count for w in others.values()),
                     n_tenants=len(others) + 1, max_queue=max_queue)


def waiting_by_tenant(pending: Iterable[Served], n_free: int) -> dict[str, Waiting]:
    """Each tenant's sequences waiting for a free sequence, of ``pending`` (the scheduler's, in
    arrival order): those that will start at the next flush (up to ``n_free`` of each tenant's)
    are not queued in this sense."""
    counts: dict[str, int] = {}
    weights: dict[str, float] = {}
    for s in pending:
        counts[s.tenant] = counts.get(s.tenant, 0) + 1
        weights[s.tenant] = s.weight
    return {t: Waiting(max(0, n - n_free), weights[t]) for t, n in counts.items()}

"""Fair shares of the engine between tenants, and between classes of work within a tenant (pure:
no threads, no I/O; the scheduler calls it on the batcher's thread).

Virtual token counters, as in "Fairness in Serving Large Language Models" (Sheng et al., OSDI
2024, VTC): each tenant's counter grows by the tokens the engine serves it -- prompt tokens
computed and tokens generated, counted as the steps compute them -- divided by its weight, and
the backlogged tenant with the least counter goes first: it is admitted first, its prompt chunks
get a step's budget first, and the most served tenant's sequence is preempted first -- also to make
room for work that has fallen ``PREEMPT_LEAD`` tokens behind (or a tenant with nothing running). A tenant that becomes backlogged has its counter
lifted to the least counter of the tenants already active, so nobody banks credit while idle (nor
loses ground by coming back), and a tenant alone gets the whole engine (work-conserving: the order
changes, never the amount of work). Within a tenant the same rule balances its classes of work
(generation and prompt scoring), and within a class the policy's order (priority with aging)
holds. Each tenant's ``max_running`` caps its sequences at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

GENERATE, SCORE = "generate", "score"
# How far behind (weighted tokens) waiting work must be before a running sequence of more served
# work is preempted for it: enough that the two do not trade places every step.
PREEMPT_LEAD = 256.0


class Served(Protocol):
    """What fairness reads of a sequence."""

    @property
    def tenant(self) -> str: ...

    @property
    def work_class(self) -> str: ...

    @property
    def weight(self) -> float: ...


class FairShare:
    """The tenants' and their classes' virtual token counters."""

    def __init__(self) -> None:
        self.tenants: dict[str, float] = {}
        self.classes: dict[tuple[str, str], float] = {}

    def rank(self, seq: Served) -> tuple[float, float]:
        """Sort key: the least served tenant first, then its least served class."""
        return self.tenants.get(seq.tenant, 0.0), self.classes.get((seq.tenant, seq.work_class), 0.0)

    def lead(self, a: Served, b: Served) -> float:
        """How much more ``a``'s work has been served than ``b``'s (weighted tokens): by their
        tenants' counters, or, within one tenant, by their classes'."""
        if a.tenant != b.tenant:
            return self.tenants.get(a.tenant, 0.0) - self.tenants.get(b.tenant, 0.0)
        return self.rank(a)[1] - self.rank(b)[1]

    def charge(self, seq: Served, tokens: int) -> None:
        """The engine served ``seq`` ``tokens`` tokens (computed for its prompt, or generated)."""
        cost = tokens / seq.weight
        self.tenants[seq.tenant] = self.tenants.get(seq.tenant, 0.0) + cost
        flow = (seq.tenant, seq.work_class)
        self.classes[flow] = self.classes.get(flow, 0.0) + cost

    def activate(self, seq: Served, active: Iterable[Served]) -> None:
        """``seq`` arrives; if its tenant (or its class) had no work, lift its counter to the least
        of the active ones'."""
        active = list(active)
        tenants = {s.tenant for s in active}
        if seq.tenant not in tenants:
            self.tenants[seq.tenant] = _lifted(self.tenants.get(seq.tenant, 0.0), [self.tenants.get(t, 0.0) for t in tenants])
        classes = {s.work_class for s in active if s.tenant == seq.tenant}
        if seq.work_class not in classes:
            flow = (seq.tenant, seq.work_class)
            self.classes[flow] = _lifted(self.classes.get(flow, 0.0),
                                         [self.classes.get((seq.tenant, c), 0.0) for c in classes])

    def forget_idle(self, active: Iterable[Served]) -> None:
        """Drop the counters of tenants with no work (bounded memory; ``activate`` lifts a
        returning tenant anyway, so nothing is lost)."""
        keep = {s.tenant for s in active}
        if len(self.tenants) > 2 * max(1, len(keep)) + 64:
            self.tenants = {t: v for t, v in self.tenants.items() if t in keep}
            self.classes = {f: v for f, v in self.classes.items() if f[0] in keep}


def _lifted(own: float, others: list[float]) -> float:
    return max(own, min(others)) if others else own

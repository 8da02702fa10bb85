"""Fair shares of the engine between tenants (pure: no threads, no I/O; the scheduler calls it on
the batcher's thread).

Virtual token counters, as in "Fairness in Serving Large Language Models" (Sheng et al., OSDI
2024, VTC): each tenant's counter grows by the tokens the engine serves it -- prompt tokens
computed and tokens generated, counted as the steps compute them -- divided by its weight, and
the backlogged tenant with the least counter goes first: it is admitted first, its prompt chunks
get a step's budget first, and the most served tenant's sequence is preempted first -- also to
make room for a tenant that has fallen ``PREEMPT_LEAD`` tokens behind, or has nothing running. A
tenant that becomes backlogged has its counter lifted to the least counter of the tenants already
active, so nobody banks credit while idle (nor loses ground by coming back); an idle engine starts
every counter again; and a tenant alone gets the whole engine (work-conserving: the order changes, never the amount of work).

Within a tenant, its classes of work are balanced by the scheduler (``GENERATE`` before
``SCORE`` while young scoring requests wait), and the policy's order (priority with aging) holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

GENERATE, SCORE = "generate", "score"
# How far behind (weighted tokens) a tenant must be before a running sequence of a more served
# tenant is preempted for it: enough that the two do not trade places every step.
PREEMPT_LEAD = 256.0


class Served(Protocol):
    """What fairness reads of a sequence."""

    @property
    def tenant(self) -> str: ...

    @property
    def weight(self) -> float: ...


class FairShare:
    """The tenants' virtual token counters."""

    def __init__(self) -> None:
        self.tenants: dict[str, float] = {}

    def rank(self, seq: Served) -> tuple[float]:
        """Sort key: the least served tenant first."""
        return (self.tenants.get(seq.tenant, 0.0),)

    def lead(self, a: Served, b: Served) -> float:
        """How much more ``a``'s tenant has been served than ``b``'s (weighted tokens)."""
        return self.tenants.get(a.tenant, 0.0) - self.tenants.get(b.tenant, 0.0)

    def charge(self, seq: Served, tokens: int) -> None:
        """The engine served ``seq`` ``tokens`` tokens (computed for its prompt, or generated)."""
        self.tenants[seq.tenant] = self.tenants.get(seq.tenant, 0.0) + tokens / seq.weight

    def activate(self, seq: Served, active: Iterable[Served]) -> None:
        """``seq`` arrives; if its tenant had no work, lift its counter to the least of the active
        tenants'. None active: the engine was idle, and every counter starts again from zero --
        a busy period's history would otherwise put whoever arrives first at an idle engine ahead
        of (or behind) whoever arrives a moment later."""
        tenants = {s.tenant for s in active}
        if not tenants:
            self.tenants.clear()
        elif seq.tenant not in tenants:
            lowest = min(self.tenants.get(t, 0.0) for t in tenants)
            self.tenants[seq.tenant] = max(self.tenants.get(seq.tenant, 0.0), lowest)

    def forget_idle(self, active: Iterable[Served]) -> None:
        """Drop the counters of tenants with no work (bounded memory; ``activate`` lifts a
        returning tenant anyway, so nothing is lost)."""
        keep = {s.tenant for s in active}
        if len(self.tenants) > 2 * max(1, len(keep)) + 64:
            self.tenants = {t: v for t, v in self.tenants.items() if t in keep}

"""Scheduling policies: who is admitted first, whose prompt gets the step's budget first, and
who is preempted first. Pure functions of the sequences and the clock (no threads, no I/O).

Priorities follow seed 001: ``high`` 0, ``normal`` 1, ``low`` 2 (any int; lower runs first),
and a request's *effective* priority improves by ``aging_per_s`` levels per second of waiting
since it was submitted, so a low-priority request overtakes fresh normal ones after ten
seconds at the default 0.1 and nothing starves. Equal effective priorities are first come,
first served.

``fcfs`` ignores priorities. ``priority`` orders by effective priority. ``lpm`` (seed 003's
cache-aware policy, SGLang's "longest prefix match") admits the waiting request with the longest
cached prefix first (in the cells, or in a lower tier where admission would restore it), then by
effective priority; past ``LPM_MAX_WAITING`` waiting requests it
orders by priority alone, since a prefix lookup per waiting request per admission would cost
more than it saves (SGLang does the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from llamactor.base.priority import check_policy

LPM_MAX_WAITING = 64


class Schedulable(Protocol):
    """What a policy reads of a sequence."""

    @property
    def priority(self) -> int: ...

    @property
    def submitted_at(self) -> float: ...


S = TypeVar("S", bound=Schedulable)


def effective_priority(priority: int, submitted_at: float, now: float, aging_per_s: float) -> float:
    """Seed 001's rule: the base priority less ``aging_per_s`` per second waited."""
    return priority - aging_per_s * max(0.0, now - submitted_at)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str = "priority"
    aging_per_s: float = 0.1

    def __post_init__(self) -> None:
        check_policy(self.name, self.aging_per_s)

    def effective(self, seq: Schedulable, now: float) -> float:
        return effective_priority(seq.priority, seq.submitted_at, now, self.aging_per_s)

    def urgency(self, seq: Schedulable, now: float) -> tuple[float, float]:
        """Sort key: lower goes first (admission, prompt budget); the highest is preempted first."""
        if self.name == "fcfs":
            return (0.0, seq.submitted_at)
        return (self.effective(seq, now), seq.submitted_at)

    def order_waiting(self, waiting: Iterable[S], now: float, cached_tokens: Callable[[S], int]) -> list[S]:
        """The waiting sequences in admission order. ``cached_tokens`` (a prefix-index lookup) is
        called only by ``lpm``."""
        items = list(waiting)
        if self.name == "lpm" and 1 < len(items) <= LPM_MAX_WAITING:
            cached = {id(s): cached_tokens(s) for s in items}
            return sorted(items, key=lambda s: (-cached[id(s)], *self.urgency(s, now)))
        return sorted(items, key=lambda s: self.urgency(s, now))

    def preemption_victim(self, running: Iterable[S], now: float,
                          served: Callable[[S], tuple[float, ...]] | None = None) -> S:
        """The running sequence to preempt first: the least urgent (lowest priority, then newest)
        -- of the most ``served`` (a fairness rank: the most served tenant's, first)."""
        return max(running, key=lambda s: ((served(s) if served else ()), self.urgency(s, now)))

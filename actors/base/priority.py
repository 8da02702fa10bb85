"""Priorities as callers give them, and the names of the scheduling policies
(docs/architecture.md, *Scheduling: priorities, preemption, the watchdog*).

The vocabulary only: how priorities order work is ``llamactor.scheduling.policy``.
"""

from __future__ import annotations

from llamactor.base.errors import InvalidRequestError

PRIORITY_LEVELS = {"high": 0, "normal": 1, "low": 2}
DEFAULT_PRIORITY = PRIORITY_LEVELS["normal"]
PRIORITY_RANGE = (-1000, 1000)
POLICIES = ("fcfs", "priority", "lpm")


def parse_priority(value: object) -> int:
    """``"high" | "normal" | "low"`` or an int in ``PRIORITY_RANGE``; ``InvalidRequestError`` else."""
    if isinstance(value, str) and value.lower() in PRIORITY_LEVELS:
        return PRIORITY_LEVELS[value.lower()]
    low, high = PRIORITY_RANGE
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    raise InvalidRequestError(f"priority must be 'high', 'normal', 'low' or an integer in [{low}, {high}] "
                              f"(lower runs first), got {value!r}")


def check_policy(name: str, aging_per_s: float) -> None:
    """``InvalidRequestError`` unless ``name`` is a policy and the aging rate is in range."""
    if name not in POLICIES:
        raise InvalidRequestError(f"schedule_policy must be one of {', '.join(POLICIES)}, got {name!r}")
    if not 0.0 <= aging_per_s <= 1000.0:
        raise InvalidRequestError(f"priority_aging_per_s must be in [0, 1000], got {aging_per_s}")

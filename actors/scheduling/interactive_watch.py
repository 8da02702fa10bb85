"""``InteractiveWatch``: whether callers other than a batch job have work on its model, judged
from the model's published stats (pure; ``llamactor.jobs.runner`` asks it before each round)."""

from __future__ import annotations


class InteractiveWatch:
    """Pure: whether other callers have work on the model, from how many sequences it runs or
    queues beyond the job's own. Published stats may be a decode step old, so a count is believed
    only once it has lasted ``confirm_steps`` decode steps; the answer then holds ``hold_s`` past
    the last such sighting (the next interactive request comes before the job would refill its
    sequences). A line the job saw end (``saw_end``) still counts as the job's in any snapshot as
    old as the one published when it was seen: while lines end every few steps, their step-old
    counts would otherwise add up to "others" that never reach zero, and the job would step aside
    for nobody."""

    def __init__(self, confirm_steps: int = 2, hold_s: float = 3.0) -> None:
        self.confirm_steps, self.hold_s = confirm_steps, hold_s
        self._since: int | None = None  # the step count when others were first seen
        self._until = float("-inf")
        self._ended: list[int] = []  # the published step count when each recently ended line was seen
        self._last_steps = 0

    def saw_end(self, lines: int, steps: int) -> None:
        """``lines`` of the job's ended (or were cancelled) while the published step count was ``steps``."""
        self._ended.extend([steps] * lines)
        self._last_steps = max(self._last_steps, steps)

    def observe(self, others: int, steps: int, now: float) -> bool:
        if steps < self._last_steps:  # a restarted batcher counts its steps from zero
            self._ended.clear()
        self._last_steps = steps
        self._ended = [s for s in self._ended if s >= steps]  # a newer snapshot no longer counts them
        others -= len(self._ended)
        if others <= 0:
            self._since = None
        else:
            self._since = steps if self._since is None else self._since
            if steps - self._since >= self.confirm_steps:
                self._until = now + self.hold_s
        return now <= self._until

"""Pure: the Batch object's life: its statuses, the moves OpenAI's lifecycle allows between them,
which a restarted process picks up again, and a batch's request counts."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
TERMINAL = frozenset({"failed", "completed", "expired", "cancelled"})
# status -> the statuses it may move to (OpenAI's lifecycle)
TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling"}),
    "in_progress": frozenset({"finalizing", "cancelling", "failed"}),  # failed: the job itself crashed
    "finalizing": frozenset({"completed", "failed"}),
    "cancelling": frozenset({"cancelled"}),
    "failed": frozenset(), "completed": frozenset(), "expired": frozenset(), "cancelled": frozenset(),
}
# the Batch timestamp field a status sets when entered
TIMESTAMP_OF = {"in_progress": "in_progress_at", "finalizing": "finalizing_at", "completed": "completed_at",
                "failed": "failed_at", "cancelling": "cancelling_at", "cancelled": "cancelled_at"}


def check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise ValueError(f"a batch cannot go from {old} to {new}")


def resumable(status: str) -> bool:
    """A job a restarted process picks up again: not finished, whatever step it was killed in."""
    return status in ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """A batch's ``request_counts``: its lines, those done and those failed."""

    total: int
    completed: int
    failed: int

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}

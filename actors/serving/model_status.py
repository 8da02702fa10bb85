"""Which of a router's models are loaded, loading or unloaded, and which to unload for another.

Pure code, no threads and no I/O, as llama-server's router mode reports it (``GET /models``:
each model's ``status.value``, and ``failed`` with the reason when its last load failed). The
``Router`` owns one ``StatusMap`` behind its lock and tells it every transition its ``Replicas``
make; ``evictions`` is the ``max_loaded`` decision: the least recently used idle models, never a
pinned one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

UNLOADED, LOADING, LOADED = "unloaded", "loading", "loaded"
STATUSES = (UNLOADED, LOADING, LOADED)


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One model's state. ``error``: why its last load failed (cleared by the next success)."""

    value: str = UNLOADED
    error: str | None = None
    loads: int = 0  # successful loads since the router started

    def to_dict(self) -> dict[str, Any]:
        """llama-server's ``status`` object: ``value``, and ``failed`` + the reason after a failed load."""
        out: dict[str, Any] = {"value": self.value}
        if self.error is not None:
            out.update(failed=True, error=self.error)
        return out


class StatusMap:
    """Model name -> ``ModelStatus``. A transition the lifecycle cannot make is a ``ValueError``:
    a bug in the caller, not a state to report."""

    def __init__(self, names: Iterable[str]) -> None:
        self._status = {name: ModelStatus() for name in names}

    def __getitem__(self, name: str) -> ModelStatus:
        return self._status[name]

    def snapshot(self) -> dict[str, ModelStatus]:
        return dict(self._status)

    def _move(self, name: str, allowed_from: tuple[str, ...], **changes: Any) -> ModelStatus:
        current = self._status[name]
        if current.value not in allowed_from:
            raise ValueError(f"model {name!r}: {current.value} -> {changes.get('value')} is not a transition")
        self._status[name] = replace(current, **changes)
        return self._status[name]

    def loading(self, name: str) -> ModelStatus:
        return self._move(name, (UNLOADED,), value=LOADING)

    def loaded(self, name: str) -> ModelStatus:
        current = self._status[name]
        return self._move(name, (LOADING,), value=LOADED, error=None, loads=current.loads + 1)

    def failed(self, name: str, error: str) -> ModelStatus:
        """The load that was under way failed: unloaded again, with the reason."""
        return self._move(name, (LOADING,), value=UNLOADED, error=error)

    def unloaded(self, name: str) -> ModelStatus:
        return self._move(name, (LOADED, UNLOADED), value=UNLOADED)


@dataclass(frozen=True, slots=True)
class Resident:
    """A loaded model as eviction sees it."""

    name: str
    last_used: float  # monotonic seconds of its last request
    in_flight: int  # requests waiting or running on it
    pinned: bool = False


def evictions(loaded: Sequence[Resident], max_loaded: int | None) -> list[str] | None:
    """The models to unload, least recently used first, so that one more fits under
    ``max_loaded``: as few as that takes, each idle and not pinned. None when not enough of the
    loaded ones may go (they are busy or pinned); [] when there is room already."""
    if max_loaded is None:
        return []
    excess = len(loaded) - max_loaded + 1
    if excess <= 0:
        return []
    idle = sorted((r for r in loaded if r.in_flight == 0 and not r.pinned), key=lambda r: (r.last_used, r.name))
    if len(idle) < excess:
        return None
    return [r.name for r in idle[:excess]]

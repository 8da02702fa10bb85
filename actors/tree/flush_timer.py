"""``FlushTimer``: the batch window of a lone request, as a timer that tells the batcher ``FlushDue``.

A request that arrives alone waits up to ``batch_timeout_ms`` for company; the wait is a
``threading.Timer`` whose thread only ``tell``s the batcher, never a spin. ``start``, ``cancel``
and ``fired`` run on the batcher thread; a ``FlushDue`` from a cancelled window is recognised by
its id and ignored.
"""

from __future__ import annotations

import threading
from typing import Any

import pykka

from llamactor.base.messages import FlushDue
from llamactor.tree.tell import tell_quietly


class FlushTimer:
    def __init__(self, actor_ref: pykka.ActorRef[Any]) -> None:
        self._actor_ref = actor_ref
        self._timer: threading.Timer | None = None
        self._timer_id = 0

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def start(self, delay_s: float) -> None:
        """Arm the window (no-op while one is armed): ``FlushDue`` arrives after ``delay_s``."""
        if self._timer is not None:
            return
        self._timer_id += 1
        self._timer = threading.Timer(max(0.0, delay_s), tell_quietly, (self._actor_ref, FlushDue(self._timer_id)))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_id += 1

    def fired(self, message: FlushDue) -> bool:
        """Whether ``message`` ends the armed window (then disarmed); False for a stale one."""
        if message.timer_id != self._timer_id:
            return False
        self._timer = None
        return True

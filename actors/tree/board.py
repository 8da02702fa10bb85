"""``StatsBoard``: where one actor tree's actors publish their latest stats, for any thread to read.

Health checks and metrics scrapes read the board and never ask an actor, so a scrape neither waits
for the decode step in progress nor delays the supervisor's request forwarding. The supervisor
publishes its own state (and the current batcher's ref) whenever it changes; the batcher publishes
its counters between messages (at most every ``BATCHER_PUBLISH_S``: during one long decode
step, the snapshot is as old as the step) and whenever it goes idle. Each
publication rebinds one attribute to a fresh dict, which readers on other threads see whole.
"""

from __future__ import annotations

from typing import Any

import pykka

BATCHER_PUBLISH_S = 0.05  # while busy, a snapshot is at most this old, or one decode step


class StatsBoard:
    """Written by the supervisor (``supervisor``, ``batcher_ref``) and the batcher (``batcher``)
    threads; read by any thread."""

    __slots__ = ("supervisor", "batcher", "batcher_ref")

    def __init__(self) -> None:
        self.supervisor: dict[str, Any] = {"state": "starting", "restarts": 0, "watchdog_trips": 0, "inflight": 0}
        self.batcher: dict[str, Any] = {}
        self.batcher_ref: pykka.ActorRef[Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        """The latest published stats of the whole tree (the batcher's as of its last publication)."""
        supervisor = self.supervisor
        return {**self.batcher, **supervisor} if supervisor["state"] == "ready" else dict(supervisor)

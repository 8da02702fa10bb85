"""The batcher's watchdog: aborts a decode step that runs longer than a timeout.

SGLang's watchdog crashes the whole server when a forward pass hangs; ours stops just the step,
through llama.cpp's abort callback (``native/abort.py``), so ``llama_decode`` returns 2, the
batcher fails with ``StepAbortedError``, and its supervisor restarts it and replays what it held.

The batcher thread marks each step's start and end (two attribute stores: no lock, no wake-up
per step); the watchdog's own daemon thread looks every ``timeout_s / 4`` (at most 1 s), so a
hung step is aborted between ``timeout_s`` and ``1.25 * timeout_s`` after it began.
docs/architecture.md ("Scheduling: priorities, preemption, the watchdog") tells the whole path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Abortable(Protocol):
    def set(self) -> None: ...

    def clear(self) -> None: ...


class Watchdog:
    def __init__(self, timeout_s: float, flag: Abortable, on_fire: Callable[[int, float, dict[str, Any]], None]) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.timeout_s = timeout_s
        self.flag = flag
        self.on_fire = on_fire  # (step_no, elapsed_s, shape), on the watchdog thread, before the abort
        self._current: tuple[int, float, dict[str, Any]] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="llamactor-watchdog", daemon=True)
        self._thread.start()

    def step_started(self, step_no: int, shape: dict[str, Any]) -> None:
        """Batcher thread, just before ``llama_decode``."""
        self.flag.clear()  # a late abort meant for the previous step must not stop this one
        self._current = (step_no, time.perf_counter(), shape)

    def step_ended(self) -> None:
        """Batcher thread, after ``llama_decode`` returned (or raised)."""
        self._current = None

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        """Watchdog thread."""
        fired_for = -1
        while not self._stopped.wait(min(1.0, self.timeout_s / 4)):
            current = self._current  # one read: the batcher replaces the tuple, never mutates it
            if current is None or current[0] == fired_for:
                continue
            step_no, started, shape = current
            elapsed = time.perf_counter() - started
            if elapsed > self.timeout_s:
                fired_for = step_no
                self.on_fire(step_no, elapsed, shape)
                self.flag.set()


def watched(watchdog: Watchdog | None, step_no: int, shape: dict[str, Any], decode: Callable[[], T]) -> T:
    """Batcher thread: ``decode()`` (one step's decode) under the watchdog's eye, if there is one."""
    if watchdog is not None:
        watchdog.step_started(step_no, shape)
    try:
        return decode()
    finally:
        if watchdog is not None:
            watchdog.step_ended()

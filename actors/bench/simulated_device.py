"""A simulated GPU for the bench: the real batcher on an engine whose decode returns at once and
whose results are ready after a modelled device time (docs/performance.md, *Simulated device*).

The model is a fixed part plus a part per row, taken from the H100 figures in docs/performance.md
(*GPU figures*, Gemma 3 270M, every layer on the GPU, tokens drawn in the graph): one stream
decodes at 412 tok/s (~2.4 ms a step, host included), and a 64-row step's decode takes 16.0 ms
(`stats()["step_ms"]["decode"]`, the in-process 64-stream run). Hence ``FIXED_MS`` = 2.4 and
``ROW_MS`` = (16.0 - 2.4) / 63 = 0.216: 5.9 ms a 16-row step, 16.0 ms at 64, 29.6 ms at 126.

``SimulatedDevice`` is that device: ``start`` queues a step behind the one it is computing (a GPU
stream runs its kernels in order) and ``wait`` blocks until the step is done -- ``time.sleep`` is
the device computing here, not a test's wait; its last ``SPIN_MS`` spin with ``time.sleep(0)``, as
CUDA's synchronise spins or yields on a short wait (a sleeping thread on a loaded host wakes
milliseconds late, which would count against the host loop). It records each step's busy interval, from which
``busy_fraction`` gives the device's busy share of a span of wall time. ``SimulatedEngine`` is
``replay.ReplayEngine`` (the recorded results, no KV) with its decode split across that device,
and it says it decodes asynchronously, so the batcher's default (``Config.overlap_steps`` None)
overlaps on it as it would on a GPU. ``start_simulated_tree`` starts a tree on it.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np

from llamactor.base.config import Config
from llamactor.bench.host import per_step
from llamactor.bench.replay import Recording, ReplayEngine, start_batcher_tree
from llamactor.handles.llm import LLM
from llamactor.tree import batcher as batcher_module
from llamactor.tree.batcher import BatcherActor

FIXED_MS = 2.4  # an H100 step's fixed part (docs/performance.md, GPU figures: 1 stream, 412 tok/s)
ROW_MS = 0.216  # and its part per row ((16.0 ms at 64 rows - FIXED_MS) / 63)
# A sleeping thread on a loaded 2-core host wakes ~2 ms late, which a GPU's synchronise does not
# (CUDA spins or yields while a short wait lasts): the last part of a wait spins, yielding.
SPIN_MS = 2.0


@dataclass(slots=True)
class DeviceStep:
    """One step on the device: busy from ``begin`` to ``ready`` (``time.perf_counter`` seconds)."""

    n_rows: int
    begin: float
    ready: float
    result: Any = None
    collected_at: float | None = None
    index: int = 0  # its place in ``SimulatedDevice.steps`` (a search there would lengthen the host's path)


@dataclass
class SimulatedDevice:
    """The device's queue and its record (batcher thread; ``busy_fraction`` from any thread)."""

    fixed_ms: float = FIXED_MS
    row_ms: float = ROW_MS
    steps: list[DeviceStep] = field(default_factory=list)
    events: list[tuple[str, int]] = field(default_factory=list)  # ("launch" | "collect", step index), in order
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, n_rows: int, result: Any) -> DeviceStep:
        """Queue a step of ``n_rows`` behind the last: it returns at once, as ``llama_decode`` does."""
        now = time.perf_counter()
        begin = max(now, self.steps[-1].ready) if self.steps else now
        with self._lock:
            step = DeviceStep(n_rows, begin, begin + (self.fixed_ms + self.row_ms * n_rows) / 1000, result,
                              index=len(self.steps))
            self.steps.append(step)
            self.events.append(("launch", step.index))
        return step

    def wait(self, step: DeviceStep) -> Any:
        """Block until ``step`` is computed (the device's time: a sleep, then a yielding spin for the
        last ``SPIN_MS``), then hand its result over."""
        if (left := step.ready - time.perf_counter() - SPIN_MS / 1000) > 0:
            time.sleep(left)
        while time.perf_counter() < step.ready:
            time.sleep(0)  # yields the GIL and the core; wakes within microseconds, as a CUDA sync does
        step.collected_at = time.perf_counter()
        self.events.append(("collect", step.index))
        return step.result

    def busy_fraction(self, since: int = 0) -> tuple[float, float, int]:
        """Of the steps from index ``since`` on: busy seconds / the span from the first one's start to
        the last one's collection, that span, and how many steps."""
        with self._lock:
            steps = self.steps[since:]
        if not steps:
            return 0.0, 0.0, 0
        end = max(s.collected_at or s.ready for s in steps)
        span = end - steps[0].begin
        busy = sum(s.ready - s.begin for s in steps)
        return (busy / span if span > 0 else 0.0), span, len(steps)


    def gaps_ms(self, since: int = 0) -> tuple[list[float], list[float]]:
        """The device's idle time between consecutive steps from index ``since`` on, in two parts
        (ms): how late the host saw each step ready (``wait``'s wake), and how long it then took
        to launch the next (its critical path: collect, commit, schedule, enact, launch)."""
        with self._lock:
            steps = self.steps[since:]
        pairs = [(a, b) for a, b in zip(steps, steps[1:]) if a.collected_at is not None]
        return ([(a.collected_at - a.ready) * 1000 for a, _ in pairs],  # type: ignore[operator]
                [(b.begin - a.collected_at) * 1000 for a, b in pairs])  # type: ignore[operator]


def _p50_p90(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values) or [0.0]
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def device_figures(llm: LLM, device: SimulatedDevice, since: int, before: dict[str, Any]) -> dict[str, float]:
    """The device's busy share of its steps from ``since`` on, and the per-step profile of where the
    rest went: the device's mean step, its idle gap between steps split into the host's late wake
    and its path to the next launch (median, 90th percentile), and the batcher's own work per step
    (``before``: its ``stats()`` when the steps began)."""
    busy, span_s, n_steps = device.busy_fraction(since)
    wakes, paths = device.gaps_ms(since)
    after = llm.stats()
    host = per_step(before, after, span_s, 0)
    (wake_p50, wake_p90), (path_p50, path_p90) = _p50_p90(wakes), _p50_p90(paths)
    return {"busy": busy, "span_s": span_s, "steps": n_steps, "device_ms": busy * span_s * 1000 / max(n_steps, 1),
            "wake_p50_ms": wake_p50, "wake_p90_ms": wake_p90, "path_p50_ms": path_p50, "path_p90_ms": path_p90,
            "schedule_ms": host["schedule_ms"], "postprocess_ms": host["host_ms"] - host["schedule_ms"],
            "rows_dropped": after["rows_dropped"] - before["rows_dropped"]}


class SimulatedEngine(ReplayEngine):
    """``ReplayEngine`` whose decodes run on ``device`` (batcher thread)."""

    def __init__(self, recording: Recording, model_path: str, *, device: SimulatedDevice, **options: Any) -> None:
        super().__init__(recording, model_path, **options)
        self.device = device

    @property
    def decodes_async(self) -> bool:
        return True

    def launch(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray) -> Any:
        return self.device.start(len(token), self.recording.replay(int(np.count_nonzero(logits))))

    def collect(self, launched: Any) -> Any:
        return self.device.wait(launched)

    def decode(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray) -> Any:
        return self.collect(self.launch(token, pos, seq_id, logits))


class SimulatedBatcher(BatcherActor):
    """The real batcher, on a ``SimulatedEngine`` made while ``on_start`` makes its engine."""

    def __init__(self, *args: Any, recording: Recording, device: SimulatedDevice, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recording, self.device = recording, device

    def on_start(self) -> None:
        """Batcher thread: start as the real batcher does, on the simulated engine."""
        engine = functools.partial(SimulatedEngine, self.recording, device=self.device)
        with mock.patch.object(batcher_module, "Engine", engine):  # one tree starts at a time in the bench
            super().on_start()
        if not isinstance(self.engine, SimulatedEngine):
            raise RuntimeError("the batcher no longer makes its engine as llamactor.tree.batcher.Engine(...)")


def start_simulated_tree(config: Config, recording: Recording, device: SimulatedDevice) -> LLM:
    """One tree whose batcher decodes on ``device``; blocks until it is ready (caller's thread)."""
    return start_batcher_tree(config, functools.partial(SimulatedBatcher.start, recording=recording, device=device))

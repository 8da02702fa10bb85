"""The ``sim_device`` workload of ``llamactor bench``: how busy the batcher keeps a GPU, serial
steps vs overlapped ones, in-process and over HTTP with SSE (docs/performance.md, *Simulated
device (overlapped steps)*).

The real batcher runs on ``simulated_device.SimulatedEngine``: decodes replayed from a recording
of real ones (``replay.Recording``, taken from a short real burst first), each ready after the
modelled H100 step time. N streams (16, 64, 126), greedy with tokens drawn in the graph (as on a
GPU), new tokens fixed and EOG ignored, go to a tree with ``overlap_steps`` off and one with it on,
each served by the daemon's app as well (``sim_device_http``), both open, after a warm-up burst
each. Four legs, interleaved (the median of the repeats): per loop, the N submitted at once from
this thread (*in-process*), and the same N as streamed chat completions over HTTP (*SSE*, from a
client process). The figure is the device's busy share of the leg's device span (first step's
start to last step's collection): the host time between steps is what is left of it; where the
overlapped loop misses the goal, the report says where a step's time went.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from llamactor.base.config import Config
from llamactor.bench.host import WARM_UP_TOKENS, burst
from llamactor.bench.measure import median_runs
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.replay import Recording, null_config, start_host_tree
from llamactor.bench.settings import BenchSettings
from llamactor.bench.sim_device_http import simulated_daemon, sse_burst
from llamactor.bench.simulated_device import FIXED_MS, ROW_MS, SimulatedDevice, device_figures
from llamactor.handles.llm import LLM

SIZES = (16, 64, 126)
LOOPS = {"serial": False, "overlapped": True}
LEGS = {"": "in-process", "_sse": "SSE"}  # a leg's key suffix, and its name in the report
GOAL_BUSY = 0.95  # the overlapped loop's busy share, every size and leg


def record(model_path: str, n_threads: int) -> Recording:
    """Decode results of a short real burst, for the simulated engine to replay."""
    recording = Recording()
    config = Config(model=model_path, n_threads=n_threads, n_parallel=16, max_restarts=0, sample_in_graph=True)
    with start_host_tree(config, recording, replay=False) as llm:
        burst(llm, uniform_prompts(16), WARM_UP_TOKENS, "greedy")
    return recording


def sim_burst(llm: LLM, device: SimulatedDevice, prompts: list[str], max_tokens: int) -> dict[str, float]:
    """One in-process burst: the device's busy share of it and its profile, and its rate."""
    since, before = len(device.steps), llm.stats()
    measured = burst(llm, prompts, max_tokens, "greedy")
    return {**device_figures(llm, device, since, before), "tokens_per_s": measured["tokens_per_s"]}


def sim_size(model_path: str, recording: Recording, n: int, max_tokens: int, n_threads: int,
             repeats: int, legs: tuple[str, ...] = tuple(LEGS)) -> dict[str, dict[str, float]]:
    """Both loops at ``n`` streams, each on its own device, tree and daemon, their legs interleaved
    (the machine's load moves: each leg's median of ``repeats``)."""
    recording.prepare(n)
    prompts = uniform_prompts(n)
    runs: dict[str, Callable[[], dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        for name, overlap in LOOPS.items():
            device = SimulatedDevice()
            config = null_config(n, model=model_path, n_threads=n_threads, n_ctx=n * (max_tokens + 64),
                                 max_restarts=0, sample_in_graph=True, overlap_steps=overlap)
            llm, url = stack.enter_context(simulated_daemon(model_path, config, recording, device))
            burst(llm, prompts, WARM_UP_TOKENS, "greedy")
            runs[name] = functools.partial(sim_burst, llm, device, prompts, max_tokens)
            runs[f"{name}_sse"] = functools.partial(sse_burst, llm, url, device, n, max_tokens)
        runs = {name: run for name, run in runs.items() if name.removeprefix("serial").removeprefix("overlapped")
                in legs}
        for name in runs:
            if name.endswith("_sse"):
                runs[name]()  # warm-up: the client's imports, the app's first routes
        return median_runs(runs, repeats)


def measure_sim_device(model_path: str, *, max_tokens: int, n_threads: int, sizes: tuple[int, ...] = SIZES,
                       repeats: int = 3, legs: tuple[str, ...] = tuple(LEGS),
                       tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Each size on both loops and every leg; results by ``c<N>`` and ``<loop><leg>`` (what
    ``report_lines`` reads), and the overlapped loop's lowest busy share per leg."""
    recording = record(model_path, n_threads)
    out: dict[str, Any] = {"max_tokens": max_tokens, "fixed_ms": FIXED_MS, "row_ms": ROW_MS, "sizes": {}}
    for n in sizes:
        out["sizes"][f"c{n}"] = sim_size(model_path, recording, n, max_tokens, n_threads, repeats, legs)
        tick()
    for leg in legs:
        out[f"min_busy_overlapped{leg}"] = min(r[f"overlapped{leg}"]["busy"] for r in out["sizes"].values())
    return out


def n_ticks() -> int:
    return len(SIZES)


def bench_sim_device(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    return measure_sim_device(s.model_path, max_tokens=s.max_tokens, n_threads=s.n_threads,
                              repeats=min(s.repeats, 3), tick=tick)


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: per size and leg, the device's busy share with serial and overlapped
    steps against the goal; then, for each row that misses it, where a step's time went."""
    if not (r := results.get("sim_device")):
        return []
    lines = [f"Simulated device: the real batcher on a modelled H100 ({r['fixed_ms']} ms + {r['row_ms']} ms a row "
             f"per step), N greedy streams of {r['max_tokens']} new tokens, in-process and as SSE chat "
             f"completions through the daemon's app; the device's busy share of the burst (goal with overlap: "
             f">= {GOAL_BUSY:.0%}).", "",
             "| streams | leg | serial busy | overlapped busy | goal | serial tok/s | overlapped tok/s | rows dropped |",
             "|---:|---|---:|---:|---|---:|---:|---:|"]
    missed = []
    for size, legs in r["sizes"].items():
        for leg, leg_name in LEGS.items():
            if f"overlapped{leg}" not in legs:
                continue
            s, o = legs[f"serial{leg}"], legs[f"overlapped{leg}"]
            met = o["busy"] >= GOAL_BUSY
            lines.append(f"| {size[1:]} | {leg_name} | {s['busy']:.1%} | {o['busy']:.1%} | "
                         f"{'met' if met else 'missed'} | {s['tokens_per_s']:.0f} | {o['tokens_per_s']:.0f} | "
                         f"{o['rows_dropped']:.0f} |")
            if not met:
                missed.append(profile_line(size[1:], leg_name, s, o))
    return lines + [""] + missed + ([""] if missed else [])


def profile_line(size: str, leg: str, serial: dict[str, float], overlapped: dict[str, float]) -> str:
    """Where a step's time went, for a row whose overlapped busy share missed the goal."""
    def one(m: dict[str, float]) -> str:
        return (f"device {m['device_ms']:.2f} ms a step; idle between steps: the host's late wake "
                f"{m['wake_p50_ms']:.2f} ms median / {m['wake_p90_ms']:.2f} p90, then its path to the next launch "
                f"{m['path_p50_ms']:.2f} / {m['path_p90_ms']:.2f} ms; batcher's work a step: schedule+enact "
                f"{m['schedule_ms']:.2f} ms, postprocess {m['postprocess_ms']:.2f} ms")
    return f"- missed at {size} streams, {leg}: overlapped: {one(overlapped)}; serial: {one(serial)}"

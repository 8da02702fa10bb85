"""The ``sim_device`` workload of ``llamactor bench``: how busy the batcher keeps a GPU, serial
steps vs overlapped ones (docs/performance.md, *Simulated device (overlapped steps)*).

The real batcher runs on ``simulated_device.SimulatedEngine``: decodes replayed from a recording
of real ones (``replay.Recording``, taken from a short real burst first), each ready after the
modelled H100 step time. N streams (16, 64, 126) are submitted at once from this thread, greedy
with tokens drawn in the graph (as on a GPU), new tokens fixed and EOG ignored; each size runs on
a tree with ``overlap_steps`` off and one with it on, both open, their bursts interleaved (the
median of the repeats), after a warm-up burst each. The
figure is the device's busy share of the burst's device span (first step's start to last step's
collection): the host time between steps is what is left of it. In-process only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from llamactor.base.config import Config
from llamactor.bench.host import WARM_UP_TOKENS, burst
from llamactor.bench.measure import median_runs
from llamactor.handles.llm import LLM
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.replay import Recording, null_config, start_host_tree
from llamactor.bench.settings import BenchSettings
from llamactor.bench.simulated_device import FIXED_MS, ROW_MS, SimulatedDevice, start_simulated_tree

SIZES = (16, 64, 126)
LOOPS = {"serial": False, "overlapped": True}


def record(model_path: str, n_threads: int) -> Recording:
    """Decode results of a short real burst, for the simulated engine to replay."""
    recording = Recording()
    config = Config(model=model_path, n_threads=n_threads, n_parallel=16, max_restarts=0, sample_in_graph=True)
    with start_host_tree(config, recording, replay=False) as llm:
        burst(llm, uniform_prompts(16), WARM_UP_TOKENS, "greedy")
    return recording


def sim_burst(llm: LLM, device: SimulatedDevice, prompts: list[str], max_tokens: int) -> dict[str, float]:
    """One burst: the device's busy share of it, and its rate."""
    since = len(device.steps)
    measured = burst(llm, prompts, max_tokens, "greedy")
    busy, span_s, steps = device.busy_fraction(since)
    return {"busy": busy, "span_s": span_s, "steps": steps, "tokens_per_s": measured["tokens_per_s"],
            "rows_dropped": llm.stats()["rows_dropped"]}


def sim_size(model_path: str, recording: Recording, n: int, max_tokens: int, n_threads: int,
             repeats: int) -> dict[str, dict[str, float]]:
    """Both loops at ``n`` streams, each on its own device and tree, their bursts interleaved (the
    machine's load moves: each loop's median of ``repeats``)."""
    recording.prepare(n)
    prompts = uniform_prompts(n)
    with contextlib.ExitStack() as stack:
        trees: dict[str, tuple[LLM, SimulatedDevice]] = {}
        for name, overlap in LOOPS.items():
            device = SimulatedDevice()
            config = null_config(n, model=model_path, n_threads=n_threads, n_ctx=n * (max_tokens + 64),
                                 max_restarts=0, sample_in_graph=True, overlap_steps=overlap)
            trees[name] = (stack.enter_context(start_simulated_tree(config, recording, device)), device)
            burst(trees[name][0], prompts, WARM_UP_TOKENS, "greedy")
        runs: dict[str, Callable[[], dict[str, float]]] = {
            name: functools.partial(sim_burst, llm, device, prompts, max_tokens) for name, (llm, device) in trees.items()}
        return median_runs(runs, repeats)


def measure_sim_device(model_path: str, *, max_tokens: int, n_threads: int, sizes: tuple[int, ...] = SIZES,
                       repeats: int = 3, tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Each size on both loops; results by ``c<N>`` and loop (what ``report_lines`` reads)."""
    recording = record(model_path, n_threads)
    out: dict[str, Any] = {"max_tokens": max_tokens, "fixed_ms": FIXED_MS, "row_ms": ROW_MS, "sizes": {}}
    for n in sizes:
        out["sizes"][f"c{n}"] = sim_size(model_path, recording, n, max_tokens, n_threads, repeats)
        tick()
    out["min_busy_overlapped"] = min(r["overlapped"]["busy"] for r in out["sizes"].values())
    return out


def n_ticks() -> int:
    return len(SIZES)


def bench_sim_device(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    return measure_sim_device(s.model_path, max_tokens=s.max_tokens, n_threads=s.n_threads,
                              repeats=min(s.repeats, 3), tick=tick)


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: per size, the device's busy share with serial and overlapped steps."""
    if not (r := results.get("sim_device")):
        return []
    lines = [f"Simulated device: the real batcher on a modelled H100 ({r['fixed_ms']} ms + {r['row_ms']} ms a row "
             f"per step), N greedy streams of {r['max_tokens']} new tokens, in-process; the device's busy share "
             "of the burst (goal with overlap: >= 95%).", "",
             "| streams | serial busy | overlapped busy | serial tok/s | overlapped tok/s | rows dropped |",
             "|---:|---:|---:|---:|---:|---:|"]
    for size, legs in r["sizes"].items():
        s, o = legs["serial"], legs["overlapped"]
        lines.append(f"| {size[1:]} | {s['busy']:.1%} | {o['busy']:.1%} | {s['tokens_per_s']:.0f} | "
                     f"{o['tokens_per_s']:.0f} | {o['rows_dropped']} |")
    return lines + [""]

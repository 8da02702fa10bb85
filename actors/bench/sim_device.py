"""The ``sim_device`` workload of ``llamactor bench``: how busy the batcher keeps a GPU, serial
steps vs overlapped ones (docs/performance.md, *Simulated device (overlapped steps)*).

The real batcher runs on ``simulated_device.SimulatedEngine``: decodes replayed from a recording
of real ones (``replay.Recording``, taken from a short real burst first), each ready after the
modelled H100 step time. N streams (16, 64, 126) are submitted at once from this thread, greedy
with tokens drawn in the graph (as on a GPU), new tokens fixed and EOG ignored; each size runs on
a tree with ``overlap_steps`` off and one with it on, in one run, after a warm-up burst. The
figure is the device's busy share of the burst's device span (first step's start to last step's
collection): the host time between steps is what is left of it. In-process only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamactor.base.config import Config
from llamactor.bench.host import WARM_UP_TOKENS, burst
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


def sim_leg(model_path: str, recording: Recording, n: int, overlap: bool, max_tokens: int,
            n_threads: int) -> dict[str, float]:
    """One size on one loop: the device's busy share of a burst of ``n`` streams, and its rate."""
    device = SimulatedDevice()
    recording.prepare(n)
    config = null_config(n, model=model_path, n_threads=n_threads, n_ctx=n * (max_tokens + 64), max_restarts=0,
                         sample_in_graph=True, overlap_steps=overlap)
    prompts = uniform_prompts(n)
    with start_simulated_tree(config, recording, device) as llm:
        burst(llm, prompts, WARM_UP_TOKENS, "greedy")
        since = len(device.steps)
        measured = burst(llm, prompts, max_tokens, "greedy")
        busy, span_s, steps = device.busy_fraction(since)
        dropped = llm.stats()["rows_dropped"]
    return {"busy": busy, "span_s": span_s, "steps": steps, "tokens_per_s": measured["tokens_per_s"],
            "rows_dropped": dropped}


def measure_sim_device(model_path: str, *, max_tokens: int, n_threads: int, sizes: tuple[int, ...] = SIZES,
                       tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Each size on both loops; results by ``c<N>`` and loop (what ``report_lines`` reads)."""
    recording = record(model_path, n_threads)
    out: dict[str, Any] = {"max_tokens": max_tokens, "fixed_ms": FIXED_MS, "row_ms": ROW_MS, "sizes": {}}
    for n in sizes:
        out["sizes"][f"c{n}"] = {name: sim_leg(model_path, recording, n, overlap, max_tokens, n_threads)
                                 for name, overlap in LOOPS.items()}
        tick()
    out["min_busy_overlapped"] = min(r["overlapped"]["busy"] for r in out["sizes"].values())
    return out


def n_ticks() -> int:
    return len(SIZES)


def bench_sim_device(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    return measure_sim_device(s.model_path, max_tokens=s.max_tokens, n_threads=s.n_threads, tick=tick)


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

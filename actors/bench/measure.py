"""Measurement helpers the benchmark's workloads share: percentiles, interleaved medians, bursts,
and the report's per-step cell.

``median_runs`` interleaves the legs it compares, so the drift of a shared machine's speed over
minutes hits them alike; ``llamactor_burst`` is the standard load: N threads calling ``ask()`` at once.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench.prompts import uniform_prompts


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else 0.0


def median_ratio(on: list[float], off: list[float]) -> float:
    """An A/B workload's figure: the median of the ``on`` legs over that of the ``off`` legs
    (``percentile``'s median: of two legs, the lower)."""
    return percentile(on, 50) / percentile(off, 50)


def median_runs(runs: dict[str, Callable[[], dict[str, float]]], repeats: int) -> dict[str, dict[str, float]]:
    """Run each named measurement ``repeats`` times, interleaved, and keep each figure's median."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(run())
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in samples.items()}


def llamactor_burst(llm: llamactor.Client, prompts: list[str], max_tokens: int, temperature: float = 0.0,
                    **extra: Any) -> dict[str, float]:
    """``len(prompts)`` threads call ``ask()`` at once; tokens/s over the wall time of the burst."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(lambda p: llm.ask(p, max_tokens=max_tokens, temperature=temperature, ignore_eos=True,
                                               **extra), prompts))
    seconds = time.perf_counter() - start
    ttfts = [c.timings.ttft_ms for c in done]
    return {"tokens_per_s": sum(c.usage.completion_tokens for c in done) / seconds,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99)}


def burst_beside_load(llm: llamactor.Client, max_tokens: int, load: Callable[[int], object],
                      n_loaders: int, n_streams: int = 16) -> tuple[float, int]:
    """An ``n_streams``-prompt generation burst (tokens/s) while ``n_loaders`` threads call ``load(i)`` over and
    over (``i``: how many calls so far plus a per-thread offset); also how many calls they made."""
    stop = threading.Event()

    def keep_loading(worker: int) -> int:
        n = 0
        while not stop.is_set():
            load(worker * 31 + n)
            n += 1
        return n
    with concurrent.futures.ThreadPoolExecutor(n_loaders) as pool:
        loaders = [pool.submit(keep_loading, i) for i in range(n_loaders)]
        try:
            tokens_per_s = llamactor_burst(llm, uniform_prompts(n_streams), max_tokens)["tokens_per_s"]
        finally:
            stop.set()
        return tokens_per_s, sum(f.result() for f in loaders)


def step_ms_cell(ms: dict[str, float]) -> str:
    """The report's "step ms: decode / sample / other" cell from the batcher's per-step counters
    (*other*: scheduling and postprocessing beside the sampling)."""
    return f"{ms['decode']:.1f} / {ms['sample']:.2f} / {ms['schedule'] + ms.get('enact', 0.0) + ms['postprocess'] - ms['sample']:.2f}"

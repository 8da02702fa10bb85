"""The *batch_invariant* leg of ``llamactor bench``: what ``batch_invariant=True`` costs
(docs/performance.md, "Batch-invariant mode").

The uniform workload (8 streams, distinct short prompts, greedy, EOG ignored), the scoring
workload (lm-eval-style choices from 8 callers, ``echo`` + ``logprobs``, ``max_tokens`` 1) and the
uniform workload again in a cache with half the cells it needs (KV pressure: the default mode
preempts, batch-invariant mode flushes the cache, ``packed_kv.py``) in the default mode and in
batch-invariant mode, each in a fresh process of its own
(``python -m llamactor.bench.batch_invariant MODE MODEL THREADS TOKENS``): ggml reads
``GGML_CPU_TILED_MM`` once per process, so the two modes cannot share one. Best of ``repeats``
bursts per figure, the modes alternating, so a shared machine's drift hits both alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench.measure import llamactor_burst
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.scoring import _score_all, lm_eval_requests, questions
from llamactor.bench.settings import BenchSettings

STREAMS = 8
MODES = ("default", "invariant")


def one_mode(mode: str, model: str, n_threads: int, max_tokens: int) -> dict[str, float]:
    """Both workloads in this process (its own), in ``mode``: tokens/s and scored requests/s."""
    with llamactor.start(model, n_parallel=STREAMS, n_threads=n_threads, n_ctx=4096, cache_ram_mib=0,
                         batch_invariant=mode == "invariant") as llm:
        llm.ask("warm up", max_tokens=2)
        uniform = llamactor_burst(llm, uniform_prompts(STREAMS), max_tokens)["tokens_per_s"]
        requests = lm_eval_requests(llm, questions(8))
        start = time.perf_counter()
        _score_all(llm, requests)  # the questions' shared rows come from the score cache after the first
        seconds = time.perf_counter() - start
        figures = {"uniform_tokens_per_s": uniform, "scoring_requests_per_s": len(requests) / seconds,
                   "prompt_tokens": sum(len(r) for r in requests), "n_ubatch": llm.info.n_ubatch}
    return {**figures, **_under_pressure(mode, model, n_threads, max_tokens)}


def _under_pressure(mode: str, model: str, n_threads: int, max_tokens: int) -> dict[str, float]:
    """The uniform burst where the cells hold about half of what the 8 streams reach (the RAM tier
    at its default, so preempted sequences may come back from it rather than be recomputed)."""
    n_ctx = max(256, STREAMS * max_tokens // 2 + 128)
    with llamactor.start(model, n_parallel=STREAMS, n_threads=n_threads, n_ctx=n_ctx,
                         batch_invariant=mode == "invariant") as llm:
        llm.ask("warm up", max_tokens=2)
        tokens_per_s = llamactor_burst(llm, uniform_prompts(STREAMS), max_tokens)["tokens_per_s"]
        stats = llm.stats()
        return {"pressure_tokens_per_s": tokens_per_s, "pressure_n_ctx": n_ctx,
                "pressure_preemptions": stats["preemptions"], "pressure_kv_flushes": stats["kv_flushes"],
                "pressure_tokens_recomputed": stats["tokens_recomputed"],
                "pressure_restored_tokens": stats["cache_ram"]["restored_tokens"]}


def _in_a_process(mode: str, s: BenchSettings) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}  # the mode sets it itself
    run = subprocess.run([sys.executable, "-m", "llamactor.bench.batch_invariant", mode, s.model_path,
                          str(s.n_threads), str(s.max_tokens)], capture_output=True, text=True, env=env, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"{mode} leg failed: {run.stderr[-2000:]}")
    result: dict[str, float] = json.loads(run.stdout.splitlines()[-1])
    return result


def bench_batch_invariant(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(1 if s.quick else 3):
        for mode in MODES:
            runs[mode].append(_in_a_process(mode, s))
        tick()
    best = {m: {k: max(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    return {**best, "streams": STREAMS,
            "uniform_ratio": best["invariant"]["uniform_tokens_per_s"] / best["default"]["uniform_tokens_per_s"],
            "scoring_ratio": best["invariant"]["scoring_requests_per_s"] / best["default"]["scoring_requests_per_s"],
            "pressure_ratio": best["invariant"]["pressure_tokens_per_s"] / best["default"]["pressure_tokens_per_s"]}


if __name__ == "__main__":
    mode_arg, model_arg, threads_arg, tokens_arg = sys.argv[1:5]
    print(json.dumps(one_mode(mode_arg, model_arg, int(threads_arg), int(tokens_arg))))

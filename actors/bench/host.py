"""The ``host`` workload of ``llamactor bench``: the batcher's own work around each ``llama_decode``.

N sequences decode at once (N distinct short prompts submitted together, fixed new tokens, EOG
ignored), greedy and with the default sampler chain (temperature 0.8, top-k 40, top-p 0.95,
min-p 0.05, seeded), and the batcher's counters (``stats()["step_ms"]``, ``StepCounters``) give
per step: *host* = schedule + enact + postprocess, and its parts -- schedule (the scheduler) with
enact (KV ops, preemptions, chains, the adapter switch),
sample (the numpy sampler), mask (grammar masks), score (prompt scoring), and the rest of
postprocess (accepting tokens: detokenizing, stop strings, replies, finishing) -- beside *decode*
(``llama_decode`` and building its batch) and the wall time per step. Two legs:

* *real*: the real engine, at 16 and 64 sequences (a llama.cpp context holds at most 256 sequence
  ids, 128 on a model with sliding-window layers, whose sequences each take a shadow id: 254 or 126
  sequences beside a system prompt). The first real leg's warm-up is recorded (``replay.Recording``).
* *null*: the same batcher with the recorded decode results replayed (``replay.ReplayEngine``):
  zero decode cost, no KV, at 16, 64, 126 and 250 sequences -- the host work alone, what a GPU step
  that takes no time would wait for.

Every figure is a per-step mean over one burst (its prefill steps included), the median of the
repeats; each size runs on a tree of its own, without cache tiers (a tier's copies of evicted KV
would land in the schedule time). ``report_lines`` renders its table in the report.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.base.config import PINNED_SEQ_IDS, Config, max_sequences
from llamactor.bench.measure import median_runs
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.replay import Recording, null_config, start_host_tree
from llamactor.bench.settings import BenchSettings

REAL_SIZES = (16, 64)
NULL_SIZES = (16, 64, 126, 250)  # 126, 250: the most beside a system prompt, with shadow ids and without
SAMPLERS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "default": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}}
WARM_UP_TOKENS = 8  # also what the first real leg records: its first steps with logits rows


def per_step(before: dict[str, Any], after: dict[str, Any], wall_s: float, tokens: int) -> dict[str, float]:
    """Milliseconds per generation step between two ``stats()`` snapshots, by phase; also the wall
    time per step and tokens/s over ``wall_s``."""
    steps = after["steps"] - before["steps"]
    ms = {k: (after["step_ms"][k] - before["step_ms"][k]) / max(steps, 1) for k in after["step_ms"]}
    post, schedule = ms["postprocess"], ms["schedule"] + ms.get("enact", 0.0)  # the table's schedule: with enact
    return {"steps": steps, "host_ms": schedule + post, "schedule_ms": schedule,
            "sample_ms": ms["sample"], "mask_ms": ms["mask"], "score_ms": ms["score"],
            "post_other_ms": post - ms["sample"] - ms["mask"] - ms["score"], "decode_ms": ms["decode"],
            "wall_ms": wall_s * 1000 / max(steps, 1), "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0}


def burst(llm: llamactor.LLM, prompts: list[str], max_tokens: int, sampler: str) -> dict[str, float]:
    """All ``prompts`` submitted at once from this thread (no client threads to compete with the
    batcher); the per-step figures of the steps they took."""
    before = llm.stats()
    start = time.perf_counter()
    futures = [llm.submit(p, max_tokens=max_tokens, ignore_eos=True, seed=i, **SAMPLERS[sampler])
               for i, p in enumerate(prompts)]
    tokens = sum(f.result().usage.completion_tokens for f in futures)
    wall_s = time.perf_counter() - start
    return per_step(before, llm.stats(), wall_s, tokens)


def host_leg(llm: llamactor.LLM, n: int, max_tokens: int, repeats: int) -> dict[str, dict[str, float]]:
    """Greedy and default-sampler bursts of ``n`` sequences, interleaved, after a warm-up burst."""
    prompts = uniform_prompts(n)
    burst(llm, prompts, WARM_UP_TOKENS, "greedy")
    runs: dict[str, Callable[[], dict[str, float]]] = {
        name: functools.partial(burst, llm, prompts, max_tokens, name) for name in SAMPLERS}
    return median_runs(runs, repeats)


def measure_host(model_path: str, *, real_sizes: tuple[int, ...] = REAL_SIZES,
                 null_sizes: tuple[int, ...] = NULL_SIZES, max_tokens: int, repeats: int, n_threads: int,
                 n_ctx: int = 8192, n_gpu_layers: int = 0, tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Both legs; results by leg, ``c<N>`` and sampler (what ``report`` reads)."""
    recording = Recording()
    # the sequences a real leg could run; the first real leg says what its model holds
    out: dict[str, Any] = {"max_tokens": max_tokens, "real": {}, "null": {},
                           "max_real_sequences": max_sequences(sliding_window=False) - PINNED_SEQ_IDS}
    # Sampling in the graph, whatever the default for the device: the host loop it leaves is the measure.
    common: dict[str, Any] = {"model": model_path, "n_threads": n_threads, "max_restarts": 0, "sample_in_graph": True}
    for n in real_sizes:
        config = Config(n_parallel=n, n_ctx=max(n_ctx, n * (max_tokens + 64)), n_gpu_layers=n_gpu_layers, **common)
        with start_host_tree(config, recording, replay=False) as llm:
            out["real"][f"c{n}"] = host_leg(llm, n, max_tokens, repeats)
            out["max_real_sequences"] = max_sequences(llm.info.shadow_ids) - PINNED_SEQ_IDS
        tick()
    out["recorded_rows"] = recording.n_rows
    for n in null_sizes:
        recording.prepare(n)
        with start_host_tree(null_config(n, n_ctx=n * (max_tokens + 64), **common), recording, replay=True) as llm:
            out["null"][f"c{n}"] = host_leg(llm, n, max_tokens, repeats)
        tick()
    return out


def n_ticks() -> int:
    return len(REAL_SIZES) + len(NULL_SIZES)


def bench_host(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    return measure_host(s.model_path, max_tokens=s.max_tokens, repeats=min(s.repeats, 3), n_threads=s.n_threads,
                        n_ctx=s.n_ctx, n_gpu_layers=s.n_gpu_layers, tick=tick)


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: per size, sampler and leg, the host ms per step and its parts."""
    if not (h := results.get("host")):
        return []
    lines = [f"Host work per step: N sequences at once, {h['max_tokens']} new tokens each, greedy and with "
             "the default sampler chain, sampled inside llama.cpp's graph; the batcher's counters per step (host = "
             "schedule + enact + postprocess). *real*: "
             "llama.cpp decodes; *null*: the real batcher replaying recorded logits "
             f"({h['recorded_rows']} distinct rows), no decode, no KV. Beyond {h['max_real_sequences']} sequences "
             "only the null leg runs: a llama.cpp context holds 256 sequence ids, halved by the shadow ids on a "
             "model with sliding-window layers.", "",
             "| sequences | sampler | leg | host ms | schedule | sample | mask + score | other postprocess "
             "| decode ms | wall ms | tok/s |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    sizes = sorted({int(c[1:]) for leg in ("real", "null") for c in h[leg]})
    for n in sizes:
        for sampler in ("greedy", "default"):
            for leg in ("real", "null"):
                if (m := h[leg].get(f"c{n}", {}).get(sampler)) is not None:
                    lines.append(f"| {n} | {sampler} | {leg} | {m['host_ms']:.2f} | {m['schedule_ms']:.2f} | "
                                 f"{m['sample_ms']:.2f} | {m['mask_ms'] + m['score_ms']:.2f} | "
                                 f"{m['post_other_ms']:.2f} | {m['decode_ms']:.2f} | {m['wall_ms']:.2f} | "
                                 f"{m['tokens_per_s']:.0f} |")
    return lines + [""]

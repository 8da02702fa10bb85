"""The scheduling legs of ``llamactor bench``: priorities under saturation, and KV overcommit.

*priorities*: Poisson arrivals, 20% high and 80% low priority, faster than the batcher serves
them, so a queue builds; the same arrivals run under ``fcfs`` and under ``priority`` in the same
run, and each class's TTFT is reported. *overcommit*: more sequences at once than the KV cache
holds at full length, so sequences are preempted and resumed; the same requests on a roomy cache
are the baseline. ``report_lines`` renders both in the report.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench.measure import percentile, step_ms_cell
from llamactor.bench.prompts import ANIMALS, uniform_prompts
from llamactor.bench.settings import BenchSettings


def _arrivals(n: int, rate: float, seed: int = 7) -> list[tuple[float, str, str]]:
    """(gap before it in seconds, priority, prompt) for ``n`` requests, 20% of them high."""
    rng = random.Random(seed)
    return [(rng.expovariate(rate), "high" if rng.random() < 0.2 else "low",
             f"{ANIMALS[i % 16].title()} report {i}: the {ANIMALS[(3 * i) % 16]} said") for i in range(n)]


def _run_arrivals(llm: llamactor.LLM, arrivals: list[tuple[float, str, str]], max_tokens: int) -> dict[str, Any]:
    before = llm.stats()
    start = time.perf_counter()
    due, futures = start, []
    for gap, priority, prompt in arrivals:
        due += gap
        time.sleep(max(0.0, due - time.perf_counter()))  # the arrival process itself, not a wait on work
        futures.append((priority, llm.submit(prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                             priority=priority)))
    done = [(priority, f.result()) for priority, f in futures]
    wall = time.perf_counter() - start
    after = llm.stats()
    steps = max(after["steps"] - before["steps"], 1)
    out: dict[str, Any] = {"wall_s": wall, "tokens_per_s": sum(c.usage.completion_tokens for _, c in done) / wall,
                           "preemptions": after["preemptions"] - before["preemptions"],
                           "step_ms": {k: round((after["step_ms"][k] - before["step_ms"][k]) / steps, 3)
                                       for k in after["step_ms"]}}
    for cls in ("high", "low"):
        ttfts = [c.timings.ttft_ms for p, c in done if p == cls]
        out[cls] = {"requests": len(ttfts), "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99)}
    return out


def bench_priorities(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    # 8 sequences serve about 5 requests of 32 tokens a second on 2 cores: 8/s builds a queue.
    n, rate, n_parallel = (40, 8.0, 8) if s.quick else (120, 8.0, 8)
    arrivals = _arrivals(n, rate)
    out: dict[str, Any] = {"requests": n, "rate_per_s": rate, "n_parallel": n_parallel, "max_tokens": 32}
    for policy in ("fcfs", "priority"):
        with llamactor.start(s.model_path, n_parallel=n_parallel, n_threads=s.n_threads, n_ctx=s.n_ctx,
                             schedule_policy=policy) as llm:
            llm.ask("warm up", max_tokens=2)
            out[policy] = _run_arrivals(llm, arrivals, 32)
        tick()
    out["high_ttft_p99_ratio"] = out["priority"]["high"]["ttft_p99_ms"] / out["fcfs"]["high"]["ttft_p99_ms"]
    out["throughput_ratio"] = out["priority"]["tokens_per_s"] / out["fcfs"]["tokens_per_s"]
    return out


def bench_overcommit(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    # 16 sequences of ~15 + 128 tokens need ~2,300 cells at full length; the tight cache has 1,024.
    n, max_tokens = 16, 64 if s.quick else 128
    prompts = uniform_prompts(n)
    out: dict[str, Any] = {"requests": n, "max_tokens": max_tokens}
    for name, n_ctx in (("tight", 1024), ("roomy", 8192)):
        with llamactor.start(s.model_path, n_parallel=n, n_threads=s.n_threads, n_ctx=n_ctx) as llm:
            llm.ask("warm up", max_tokens=2)
            before = llm.stats()
            start = time.perf_counter()
            futures = [llm.submit(p, max_tokens=max_tokens, temperature=0, ignore_eos=True) for p in prompts]
            failed, tokens = 0, 0
            for f in futures:
                try:
                    tokens += f.result().usage.completion_tokens
                except llamactor.LlamactorError:
                    failed += 1
            wall = time.perf_counter() - start
            after = llm.stats()
        out[name] = {"n_ctx": n_ctx, "failed": failed, "wall_s": wall, "tokens_per_s": tokens / wall,
                     "preemptions": after["preemptions"] - before["preemptions"],
                     "tokens_recomputed": after["tokens_recomputed"] - before["tokens_recomputed"]}
        tick()
    out["throughput_ratio"] = out["tight"]["tokens_per_s"] / out["roomy"]["tokens_per_s"]
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's section: the priorities table (fcfs and priority), then the overcommit line."""
    return _priorities_lines(results.get("priorities")) + _overcommit_lines(results.get("overcommit"))


def _priorities_lines(pr: dict[str, Any] | None) -> list[str]:
    if not pr:
        return []
    lines = [f"Priorities: {pr['requests']} Poisson arrivals at {pr['rate_per_s']:g}/s (20% high, 80% low), "
             f"{pr['max_tokens']} tokens each, {pr['n_parallel']} sequences (a queue builds).", "",
             "| policy | high TTFT p50 / p99 ms | low TTFT p50 / p99 ms | tok/s | step ms: decode / sample / other |",
             "|---|---|---|---:|---|"]
    for policy in ("fcfs", "priority"):
        m = pr[policy]
        lines.append(f"| {policy} | {m['high']['ttft_p50_ms']:.0f} / {m['high']['ttft_p99_ms']:.0f} | "
                     f"{m['low']['ttft_p50_ms']:.0f} / {m['low']['ttft_p99_ms']:.0f} | {m['tokens_per_s']:.1f} | "
                     f"{step_ms_cell(m['step_ms'])} |")
    return lines + [""]


def _overcommit_lines(oc: dict[str, Any] | None) -> list[str]:
    if not oc:
        return []
    t, r = oc["tight"], oc["roomy"]
    return [f"Overcommit: {oc['requests']} sequences × {oc['max_tokens']} tokens at once in {t['n_ctx']} KV cells "
            f"(they need ~{oc['requests'] * (oc['max_tokens'] + 15)} at full length): {t['failed']} failed, "
            f"{t['preemptions']} preemptions, {t['tokens_recomputed']} tokens recomputed, {t['tokens_per_s']:.1f} "
            f"tok/s vs {r['tokens_per_s']:.1f} tok/s in {r['n_ctx']} cells ({oc['throughput_ratio']:.2f}×).", ""]

"""The tenants workload of ``llamactor bench``: fair shares between callers on one engine.

*quiet beside a flood*: a quiet tenant asks short questions one after another, alone, then beside
another tenant's flood of 48 requests on 8 sequences -- as separate tenants (fair shares) and, for
what a single queue gives, as one tenant. *backlogged*: the same requests as one tenant or split
between two (throughput must not drop), and two tenants weighted 2:1 (the tokens each is served
while both wait must follow the weights).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.settings import BenchSettings

N_PARALLEL = 8


def _quiet_latencies(llm: llamactor.LLM, n: int, tenant: str) -> list[float]:
    """Seconds each of ``n`` short questions took, asked one after another."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        llm.ask(f"Question {i}: what is {i} plus {i}?", max_tokens=8, temperature=0, ignore_eos=True, tenant=tenant)
        out.append(time.perf_counter() - t0)
    return out


def _beside_flood(llm: llamactor.LLM, n_quiet: int, n_flood: int, flood_tokens: int, quiet: str) -> dict[str, Any]:
    flood = [llm.submit(p, max_tokens=flood_tokens, temperature=0, ignore_eos=True, tenant="flood")
             for p in uniform_prompts(n_flood)]
    latencies = _quiet_latencies(llm, n_quiet, quiet)
    for f in flood:
        f.result()
    return {"quiet_mean_s": statistics.mean(latencies), "quiet_max_s": max(latencies)}


def _throughput(llm: llamactor.LLM, tenants: list[str], n: int, max_tokens: int) -> float:
    start = time.perf_counter()
    futures = [llm.submit(p, max_tokens=max_tokens, temperature=0, ignore_eos=True, tenant=tenants[i % len(tenants)])
               for i, p in enumerate(uniform_prompts(n))]
    tokens = sum(f.result().usage.completion_tokens for f in futures)
    return tokens / (time.perf_counter() - start)


def _throughput_legs(llm: llamactor.LLM, repeats: int, n: int, max_tokens: int,
                     tick: Callable[[], None]) -> dict[str, Any]:
    """One tenant vs two, interleaved ``repeats`` times (medians), with the preemptions fairness
    made in the two-tenant legs (each costs a resume from the prefix cache)."""
    one, two, preempted = [], [], 0
    for _ in range(repeats):
        one.append(_throughput(llm, ["solo"], n, max_tokens))
        before = llm.stats()["preemptions"]
        two.append(_throughput(llm, ["a", "b"], n, max_tokens))
        preempted += llm.stats()["preemptions"] - before
        tick()
    return {"one_tenant_tokens_per_s": statistics.median(one), "two_tenants_tokens_per_s": statistics.median(two),
            "repeats": repeats, "two_tenant_preemptions": preempted}


def _weighted_shares(llm: llamactor.LLM, n_each: int, max_tokens: int) -> dict[str, float]:
    """Tokens served to each of two tenants (weights 2 and 1) while both were backlogged: until the
    first admitted its last request. A request's tokens count as served evenly over the time it
    spent on them (its prompt from admission to first token, its output from then to its end)."""
    futures = {name: [llm.submit(p, max_tokens=max_tokens, temperature=0, ignore_eos=True, tenant=name)
                      for p in uniform_prompts(n_each)] for name in ("heavy", "light")}
    done = {name: [f.result() for f in fs] for name, fs in futures.items()}
    cutoff = min(max(c.timings.queue_ms for c in cs) for cs in done.values())
    tokens = {name: sum(_served_by(c, cutoff) for c in cs) for name, cs in done.items()}
    total = sum(tokens.values()) or 1.0
    return {name: n / total for name, n in tokens.items()}


def _served_by(c: llamactor.Completion, at_ms: float) -> float:
    def part(start: float, end: float) -> float:
        return min(1.0, max(0.0, (at_ms - start) / (end - start))) if end > start else float(at_ms >= end)
    t = c.timings
    computed = c.usage.prompt_tokens - c.usage.cached_tokens
    return computed * part(t.queue_ms, t.ttft_ms) + c.usage.completion_tokens * part(t.ttft_ms, t.total_ms)


def _repeats(s: BenchSettings) -> int:
    return 1 if s.quick else 3


def n_ticks(s: BenchSettings) -> int:
    """Progress ticks of the workload: the two quiet legs, each throughput repeat, the shares."""
    return 3 + _repeats(s)


def bench_tenants(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n_quiet, n_flood, flood_tokens = (4, 24, 32) if s.quick else (8, 48, 64)
    out: dict[str, Any] = {"n_parallel": N_PARALLEL, "flood_requests": n_flood, "flood_max_tokens": flood_tokens}
    tenants = [{"name": "heavy", "weight": 2.0}, {"name": "light", "weight": 1.0}]
    with llamactor.start(s.model_path, n_parallel=N_PARALLEL, n_threads=s.n_threads, n_ctx=s.n_ctx,
                         tenants=tenants) as llm:
        llm.ask("warm up", max_tokens=2)
        alone = statistics.mean(_quiet_latencies(llm, n_quiet, "quiet"))
        before = llm.stats()
        fair = _beside_flood(llm, n_quiet, n_flood, flood_tokens, "quiet")
        after = llm.stats()
        steps = max(1, after["steps"] - before["steps"])
        fair["step_ms"] = {k: round((after["step_ms"][k] - before["step_ms"].get(k, 0.0)) / steps, 2)
                           for k in after["step_ms"]}  # the per-step profile beside the flood
        tick()
        one_queue = _beside_flood(llm, n_quiet, n_flood, flood_tokens, "flood")  # today's single queue
        out["quiet"] = {"alone_mean_s": alone, "beside_flood_fair": fair, "beside_flood_one_queue": one_queue}
        out["quiet_latency_ratio"] = fair["quiet_mean_s"] / alone
        out["one_queue_latency_ratio"] = one_queue["quiet_mean_s"] / alone
        tick()
        out["throughput"] = _throughput_legs(llm, _repeats(s), n_flood, flood_tokens, tick)
        out["two_tenant_throughput_ratio"] = (out["throughput"]["two_tenants_tokens_per_s"]
                                              / out["throughput"]["one_tenant_tokens_per_s"])
        shares = _weighted_shares(llm, n_flood, flood_tokens)
        out["weighted_shares"] = {"weights": {"heavy": 2.0, "light": 1.0}, "served": shares}
        out["share_error"] = max(abs(shares["heavy"] - 2 / 3) / (2 / 3), abs(shares["light"] - 1 / 3) / (1 / 3))
        tick()
    return out

"""The generation workloads of ``llamactor bench``, measured against the yardsticks in ``baselines``.

*uniform* (distinct short prompts, fixed new tokens, greedy, EOG ignored: sequential vs
llamactor vs the batched-decode ceiling, per concurrency), *shared_prefix* (a configured system
prompt vs the same prompt inlined), *arrivals* (Poisson arrivals, mixed prompt and output
lengths), *single* (one request alone, then the idle CPU use of the started tree) and *sampled*
(16 streams drawn with the default filters -- temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 --
and with 5 alternatives' logprobs, against the same streams greedy: what the sampler costs).
``report_lines`` renders their section of the report (*sampled* has only its goals).
"""

from __future__ import annotations

import random
import resource
import time
from collections.abc import Callable
from typing import Any

import llamactor
from llamactor.bench import baselines
from llamactor.bench.measure import llamactor_burst, median_runs, percentile, step_ms_cell
from llamactor.bench.prompts import ANIMALS, WORDS, uniform_prompts
from llamactor.bench.settings import BenchSettings

SYSTEM_PROMPT = " ".join(
    f"Rule {i}: the assistant of the Sunrise Bakery answers politely, mentions that bread is baked fresh every "
    f"morning at five, that cakes must be ordered {i + 1} days ahead, and never discusses prices by phone."
    for i in range(10)) + "\n"


def bench_uniform(s: BenchSettings, tick: Callable[[], None]) -> list[dict[str, Any]]:
    cs, mt = s.concurrencies, s.max_tokens
    kw: dict[str, Any] = {"n_ctx": s.n_ctx, "n_threads": s.n_threads, "n_gpu_layers": s.n_gpu_layers}
    sequential = baselines.Sequential(s.model_path, **kw)
    rows = []
    try:
        with llamactor.start(s.model_path, n_parallel=max(cs), **kw) as llm:
            llm.ask("warm up", max_tokens=2)
            for c in cs:
                prompts = uniform_prompts(c)
                before = llm.stats()
                m = median_runs({
                    "sequential": lambda: {"tokens_per_s": sequential.run(prompts[:2], mt).tokens_per_s},
                    "ceiling": lambda: {"tokens_per_s": baselines.ceiling(s.model_path, prompts, mt, **kw).tokens_per_s},
                    "ours": lambda: llamactor_burst(llm, prompts, mt)}, s.repeats)
                after = llm.stats()
                steps = after["steps"] - before["steps"]
                breakdown = {k: round((after["step_ms"][k] - before["step_ms"][k]) / max(steps, 1), 3)
                             for k in after["step_ms"]}
                seq, ceil, ours = m["sequential"]["tokens_per_s"], m["ceiling"]["tokens_per_s"], m["ours"]
                rows.append({"concurrency": c, "sequential_tok_s": seq, "ceiling_tok_s": ceil,
                             "llamactor_tok_s": ours["tokens_per_s"], "llamactor_ttft_p50_ms": ours["ttft_p50_ms"],
                             "vs_ceiling": ours["tokens_per_s"] / ceil, "vs_sequential": ours["tokens_per_s"] / seq,
                             "step_ms": breakdown})
                tick()
    finally:
        sequential.close()
    return rows


def bench_shared_prefix(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    c = 16
    turns = [f"Customer {i}: can I order a {ANIMALS[i % 16]}-shaped cake for Friday?" for i in range(c)]
    # The configured system prompt against recomputing it: both without the prefix cache, which
    # would otherwise serve the inlined prompt (and the repeats' identical prompts) from cache too.
    # "cached" is the inlined prompt with the prefix cache on: what a client gets without configuring.
    common: dict[str, Any] = {"n_parallel": c, "n_threads": s.n_threads, "n_ctx": s.n_ctx}
    with llamactor.start(s.model_path, system_prompt=SYSTEM_PROMPT, prefix_cache=False, **common) as shared, \
            llamactor.start(s.model_path, prefix_cache=False, **common) as inline, \
            llamactor.start(s.model_path, **common) as cached:
        inlined = [SYSTEM_PROMPT + t for t in turns]
        shared.ask(turns[0], max_tokens=2)
        inline.ask(inlined[0], max_tokens=2)
        cached.ask(SYSTEM_PROMPT + "Customer: hello", max_tokens=2)
        out: dict[str, Any] = median_runs({"shared": lambda: llamactor_burst(shared, turns, s.max_tokens),
                                           "inlined": lambda: llamactor_burst(inline, inlined, s.max_tokens),
                                           "cached": lambda: llamactor_burst(cached, inlined, s.max_tokens)},
                                          s.repeats)
        out["system_prompt_tokens"] = shared.ask(turns[0], max_tokens=1).usage.cached_tokens
    tick()
    out["concurrency"] = c
    out["ttft_p50_ratio"] = out["shared"]["ttft_p50_ms"] / out["inlined"]["ttft_p50_ms"]
    out["throughput_ratio"] = out["shared"]["tokens_per_s"] / out["inlined"]["tokens_per_s"]
    return out


def bench_arrivals(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    rng = random.Random(42)
    n, rate = (6, 0.5) if s.quick else (24, 0.4)  # about what 2 cores sustain; faster only builds a queue
    requests = [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 512))), rng.randint(16, 256))
                for _ in range(n)]
    gaps = [rng.expovariate(rate) for _ in range(n)]
    with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm:
        llm.ask("warm up", max_tokens=2)
        start = time.perf_counter()
        futures, due = [], start
        for (prompt, max_tokens), gap in zip(requests, gaps):
            due += gap
            time.sleep(max(0.0, due - time.perf_counter()))  # the arrival process itself, not a wait on work
            futures.append(llm.submit(prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True))
        done = [f.result() for f in futures]
        seconds = time.perf_counter() - start
    tick()
    ttfts, totals = [c.timings.ttft_ms for c in done], [c.timings.total_ms for c in done]
    return {"requests": n, "rate_per_s": rate, "tokens_per_s": sum(c.usage.completion_tokens for c in done) / seconds,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99),
            "latency_p50_ms": percentile(totals, 50), "latency_p99_ms": percentile(totals, 99)}


def bench_single(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    # Prompts differ from their first word: Llama.create_completion reuses the KV of a prompt
    # prefix it saw last, which would turn the baseline's TTFT into a cache hit.
    prompts = iter([f"{ANIMALS[i].title()} story {i}: once upon a time" for i in range(2 * s.repeats)])
    sequential = baselines.Sequential(s.model_path, n_ctx=s.n_ctx, n_threads=s.n_threads)
    try:
        with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm:
            llm.ask("warm up", max_tokens=2)

            def ours() -> dict[str, float]:
                c = llm.ask(next(prompts), max_tokens=s.max_tokens, temperature=0, ignore_eos=True)
                return {"ttft_ms": c.timings.ttft_ms, "tok_s": c.usage.completion_tokens / (c.timings.total_ms / 1000)}

            def theirs() -> dict[str, float]:
                r = sequential.run([next(prompts)], s.max_tokens)
                return {"ttft_ms": r.ttft_ms[0], "tok_s": r.tokens_per_s}

            m = median_runs({"sequential": theirs, "llamactor": ours}, s.repeats)
            idle = _idle_cpu(llm)
    finally:
        sequential.close()
    tick()
    seq, own = m["sequential"], m["llamactor"]
    return {"sequential_ttft_ms": seq["ttft_ms"], "sequential_tok_s": seq["tok_s"], "llamactor_ttft_ms": own["ttft_ms"],
            "llamactor_tok_s": own["tok_s"], "ttft_delta_ms": own["ttft_ms"] - seq["ttft_ms"],
            "tok_s_ratio": own["tok_s"] / seq["tok_s"], "idle_cpu_percent": idle}


def bench_sampled(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    prompts = uniform_prompts(16)
    with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm:
        llm.ask("warm up", max_tokens=2, temperature=0.8)
        m = median_runs({
            "greedy": lambda: llamactor_burst(llm, prompts, s.max_tokens),
            "sampled": lambda: llamactor_burst(llm, prompts, s.max_tokens, temperature=0.8, seed=1),
            "logprobs": lambda: llamactor_burst(llm, prompts, s.max_tokens, temperature=0.8, seed=1, top_logprobs=5),
        }, max(1, s.repeats // 2))
    tick()
    out: dict[str, Any] = {kind: r["tokens_per_s"] for kind, r in m.items()}
    out["sampled_ratio"] = out["sampled"] / out["greedy"]
    out["logprobs_ratio"] = out["logprobs"] / out["greedy"]
    return out


def _idle_cpu(llm: llamactor.LLM, seconds: float = 2.0) -> float:
    """CPU used by this whole process (all actor threads) while no request is in flight."""
    assert llm.stats()["running"] == 0
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    time.sleep(seconds)  # measuring idleness: nothing to wait for
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 100 * cpu / (time.perf_counter() - t0)


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's section: the uniform table, then one paragraph of shared prompt, arrivals, single."""
    return _uniform_lines(results.get("uniform")) + _paragraph_lines(results)


def _uniform_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    if rows is None:
        return []
    lines = ["| concurrency | sequential tok/s | ceiling tok/s | llamactor tok/s | vs ceiling | vs sequential "
             "| step ms: decode / sample / other |", "|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['sequential_tok_s']:.1f} | {r['ceiling_tok_s']:.1f} | "
                     f"{r['llamactor_tok_s']:.1f} | {r['vs_ceiling']:.3f} | {r['vs_sequential']:.2f} | "
                     f"{step_ms_cell(r['step_ms'])} |")
    return lines + [""]


def _paragraph_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    if sp := results.get("shared_prefix"):
        lines.append(f"Shared system prompt ({sp['system_prompt_tokens']} tokens), {sp['concurrency']} concurrent: "
                     f"TTFT p50 {sp['shared']['ttft_p50_ms']:.0f} ms shared vs {sp['inlined']['ttft_p50_ms']:.0f} ms "
                     f"inlined ({sp['ttft_p50_ratio']:.2f}×); throughput {sp['shared']['tokens_per_s']:.1f} vs "
                     f"{sp['inlined']['tokens_per_s']:.1f} tok/s ({sp['throughput_ratio']:.2f}×), both without the "
                     f"prefix cache; inlined with the prefix cache: TTFT p50 {sp['cached']['ttft_p50_ms']:.0f} ms, "
                     f"{sp['cached']['tokens_per_s']:.1f} tok/s.")
    if ar := results.get("arrivals"):
        lines.append(f"Arrivals ({ar['requests']} requests, Poisson {ar['rate_per_s']:g}/s, prompts 16–512 words, "
                     f"16–256 new tokens): {ar['tokens_per_s']:.1f} tok/s, TTFT p50/p99 {ar['ttft_p50_ms']:.0f}/"
                     f"{ar['ttft_p99_ms']:.0f} ms, latency p50/p99 {ar['latency_p50_ms']:.0f}/{ar['latency_p99_ms']:.0f} ms.")
    if si := results.get("single"):
        lines.append(f"Single request: TTFT {si['llamactor_ttft_ms']:.1f} ms vs {si['sequential_ttft_ms']:.1f} ms "
                     f"sequential; {si['llamactor_tok_s']:.1f} vs {si['sequential_tok_s']:.1f} tok/s. "
                     f"Idle CPU {si['idle_cpu_percent']:.2f}%.")
    return lines + [""] if lines else []

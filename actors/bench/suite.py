"""``llamactor bench``: llamactor against the sequential baseline and the batched-decode ceiling.

Everything runs in one process, one after the other, on the same model and thread count, so the
ratios compare like with like. Workloads (seed issue 4): *uniform* (distinct short prompts,
fixed new tokens, greedy, EOG ignored), *shared system prompt* (configured vs inlined),
*arrivals* (Poisson arrivals, mixed prompt and output lengths), *single* (one request alone), the
idle CPU use of a started tree, the daemon (``daemon``), the prefix cache's *multiturn* and
*few-shot* workloads (``prefix``), the scheduler's *priorities* and *overcommit* (``scheduling``),
JSON-Schema-constrained vs unconstrained requests (``structured``), packed embeddings
(``embeddings``), two replicas behind the router (``replicas``), and with a llama-server binary the *peer* leg (``peer``).
"""

from __future__ import annotations

import concurrent.futures
import random
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llamactor
from llamactor.bench import baselines

ANIMALS = ["fox", "cat", "dog", "owl", "bee", "elk", "ant", "yak", "cow", "hen", "eel", "bat", "ram", "emu", "gnu", "pig"]
SYSTEM_PROMPT = " ".join(
    f"Rule {i}: the assistant of the Sunrise Bakery answers politely, mentions that bread is baked fresh every "
    f"morning at five, that cakes must be ordered {i + 1} days ahead, and never discusses prices by phone."
    for i in range(10)) + "\n"
WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing near an old stone bridge "
         "under the warm light of a quiet summer evening").split()


@dataclass(slots=True)
class BenchSettings:
    model_path: str
    quick: bool = False
    full: bool = False
    n_threads: int = 2
    n_ctx: int = 8192
    peer_server: str | None = None  # a llama-server binary: adds the "peer" workload
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def concurrencies(self) -> list[int]:
        if self.quick:
            return [1, 4, 16]
        return [1, 2, 4, 8, 16, 32] if self.full else [1, 2, 4, 8, 16]

    @property
    def max_tokens(self) -> int:
        return 32 if self.quick else 64

    @property
    def repeats(self) -> int:
        return 1 if self.quick else 5


def uniform_prompts(n: int) -> list[str]:
    # Distinct from the first word, so no baseline gets a prompt-prefix cache hit.
    return [f"{ANIMALS[i % len(ANIMALS)].title()} story {i}: once upon a time, a {ANIMALS[i % len(ANIMALS)]} "
            f"named {chr(65 + i % 26)}" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else 0.0


def _median_runs(runs: dict[str, Callable[[], dict[str, float]]], repeats: int) -> dict[str, dict[str, float]]:
    """Run each named measurement ``repeats`` times, interleaved, and keep each figure's median."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            samples[name].append(run())
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in samples.items()}


def _llamactor_burst(llm: llamactor.LLM, prompts: list[str], max_tokens: int, **extra: Any) -> dict[str, float]:
    """``len(prompts)`` threads call ``ask()`` at once; tokens/s over the wall time of the burst."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(lambda p: llm.ask(p, max_tokens=max_tokens, temperature=0, ignore_eos=True, **extra),
                             prompts))
    seconds = time.perf_counter() - start
    ttfts = [c.timings.ttft_ms for c in done]
    return {"tokens_per_s": sum(c.usage.completion_tokens for c in done) / seconds,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99)}


def bench_uniform(s: BenchSettings, tick: Callable[[], None]) -> list[dict[str, Any]]:
    cs, mt, kw = s.concurrencies, s.max_tokens, {"n_ctx": s.n_ctx, "n_threads": s.n_threads}
    sequential = baselines.Sequential(s.model_path, **kw)
    rows = []
    try:
        with llamactor.start(s.model_path, n_parallel=max(cs), n_threads=s.n_threads, n_ctx=s.n_ctx) as llm:
            llm.ask("warm up", max_tokens=2)
            for c in cs:
                prompts = uniform_prompts(c)
                before = llm.stats()
                m = _median_runs({
                    "sequential": lambda: {"tokens_per_s": sequential.run(prompts[:2], mt).tokens_per_s},
                    "ceiling": lambda: {"tokens_per_s": baselines.ceiling(s.model_path, prompts, mt, **kw).tokens_per_s},
                    "ours": lambda: _llamactor_burst(llm, prompts, mt)}, s.repeats)
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
    common = {"n_parallel": c, "n_threads": s.n_threads, "n_ctx": s.n_ctx}
    with llamactor.start(s.model_path, system_prompt=SYSTEM_PROMPT, prefix_cache=False, **common) as shared, \
            llamactor.start(s.model_path, prefix_cache=False, **common) as inline, \
            llamactor.start(s.model_path, **common) as cached:
        inlined = [SYSTEM_PROMPT + t for t in turns]
        shared.ask(turns[0], max_tokens=2)
        inline.ask(inlined[0], max_tokens=2)
        cached.ask(SYSTEM_PROMPT + "Customer: hello", max_tokens=2)
        out: dict[str, Any] = _median_runs({"shared": lambda: _llamactor_burst(shared, turns, s.max_tokens),
                                            "inlined": lambda: _llamactor_burst(inline, inlined, s.max_tokens),
                                            "cached": lambda: _llamactor_burst(cached, inlined, s.max_tokens)},
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

            m = _median_runs({"sequential": theirs, "llamactor": ours}, s.repeats)
            idle = _idle_cpu(llm)
    finally:
        sequential.close()
    tick()
    seq, own = m["sequential"], m["llamactor"]
    return {"sequential_ttft_ms": seq["ttft_ms"], "sequential_tok_s": seq["tok_s"], "llamactor_ttft_ms": own["ttft_ms"],
            "llamactor_tok_s": own["tok_s"], "ttft_delta_ms": own["ttft_ms"] - seq["ttft_ms"],
            "tok_s_ratio": own["tok_s"] / seq["tok_s"], "idle_cpu_percent": idle}


def _idle_cpu(llm: llamactor.LLM, seconds: float = 2.0) -> float:
    """CPU used by this whole process (all actor threads) while no request is in flight."""
    assert llm.stats()["running"] == 0
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    time.sleep(seconds)  # measuring idleness: nothing to wait for
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 100 * cpu / (time.perf_counter() - t0)


def bench_daemon(s: BenchSettings, tick: Callable[[], None]) -> list[dict[str, Any]]:
    """Streamed chat completions from N threads: in-process ``stream_chat`` vs the daemon over HTTP."""
    from llamactor.bench.daemon import daemon_streams, idle_cpu_percent, in_process_streams, running_daemon

    cs, rows = ([16] if s.quick else [c for c in s.concurrencies if c <= 16]), []
    with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm, \
            running_daemon(s.model_path, n_threads=s.n_threads, n_ctx=s.n_ctx) as (client, pid):
        llm.ask("warm up", max_tokens=2)
        s.results["daemon_idle"] = {"cpu_percent": idle_cpu_percent(pid)}
        for c in cs:
            m = _median_runs({"local": lambda: in_process_streams(llm, c, s.max_tokens),
                              "remote": lambda: daemon_streams(client, c, s.max_tokens)}, s.repeats)
            local, remote = m["local"], m["remote"]
            rows.append({"concurrency": c, "in_process_tok_s": local["tokens_per_s"],
                         "daemon_tok_s": remote["tokens_per_s"], "in_process_ttft_p50_ms": local["ttft_p50_ms"],
                         "daemon_ttft_p50_ms": remote["ttft_p50_ms"],
                         "daemon_vs_in_process": remote["tokens_per_s"] / local["tokens_per_s"]})
            tick()
    return rows


def workloads(s: BenchSettings) -> dict[str, tuple[int, Callable[[BenchSettings, Callable[[], None]], Any]]]:
    """Every workload by its results key: (progress ticks, function)."""
    from llamactor.bench import embeddings, peer, prefix, replicas, scheduling, structured

    n_daemon = 1 if s.quick else len([c for c in s.concurrencies if c <= 16])
    found: dict[str, tuple[int, Callable[[BenchSettings, Callable[[], None]], Any]]] = {
        "uniform": (len(s.concurrencies), bench_uniform), "shared_prefix": (1, bench_shared_prefix),
        "arrivals": (1, bench_arrivals), "single": (1, bench_single),
        "daemon": (n_daemon, bench_daemon),  # also fills results["daemon_idle"]
        "multiturn": (4, prefix.bench_multiturn), "few_shot": (2, prefix.bench_few_shot),
        "priorities": (2, scheduling.bench_priorities), "overcommit": (2, scheduling.bench_overcommit),
        "structured": (1, structured.bench_structured), "embeddings": (3, embeddings.bench_embeddings),
        "replicas": (3, replicas.bench_replicas)}
    if s.peer_server:
        found["peer"] = (2, peer.bench_peer)
    return found


def run(s: BenchSettings, tick: Callable[[], None], only: list[str] | None = None) -> dict[str, Any]:
    """Run the workloads; one that fails is recorded as ``{"error": ...}`` and the others go on."""
    for name, (_, workload) in workloads(s).items():
        if only is None or name in only:
            try:
                s.results[name] = workload(s, tick)
            except Exception as e:  # noqa: BLE001 - reported in the results, and by the exit code
                s.results[name] = {"error": f"{type(e).__name__}: {e}"}
    return s.results


def failures(results: dict[str, Any]) -> dict[str, str]:
    return {name: r["error"] for name, r in results.items() if isinstance(r, dict) and "error" in r}


def n_ticks(s: BenchSettings, only: list[str] | None = None) -> int:
    return sum(n for name, (n, _) in workloads(s).items() if only is None or name in only)

"""The ``streams`` workload of ``llamactor bench``: N concurrent callers against three servers (for GPUs).

Runs only when a ``llama-server`` binary is given (``--peer-server`` / ``$LLAMACTOR_PEER_SERVER``,
as the peer leg). N callers (1, 2, 4, ..., 128; fewer in ``--quick``) each send ``ROUNDS``
non-streamed ``/v1/completions`` one after the other: a prompt of ``PROMPT_WORDS`` words (about as
many tokens, distinct from its second word so no server reuses another request's KV),
``max_tokens`` new tokens with EOG ignored, greedy and with the default sampler chain
(temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, seeded). Against (a) ``llamactor serve`` with
64 parallel sequences, (b) ``llama-server -np 64 -kvu``, (c) the same with ``-bs`` (sampling in
llama.cpp's graph); same model, n_ctx (room for 64 full requests), threads and GPU layers
(``--n-gpu-layers``). Per N: aggregate completion tokens/s (over the wall time of all N callers)
and p50 request latency; and llamactor / llama-server-with-``-bs`` throughput.

The client is cheap enough for thousands of tokens/s: one ``httpx.Client`` (a connection per
caller, kept alive) shared by N threads, one JSON body per request, no per-token events.
``report_lines`` renders its table in the report.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import httpx

from llamactor.bench.measure import percentile
from llamactor.bench.prompts import WORDS
from llamactor.bench.servers import running_server, serve_command
from llamactor.bench.settings import BenchSettings

N_PARALLEL = 64
SAMPLERS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "default": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}}
SERVERS = ("llamactor", "llama_server", "llama_server_bs")


def concurrencies(quick: bool) -> list[int]:
    return [1, 8, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128]


def sizes(quick: bool) -> dict[str, int]:
    """Prompt words, new tokens and requests per caller of a run."""
    return {"prompt_words": 64, "max_tokens": 32, "rounds": 1} if quick else \
        {"prompt_words": 128, "max_tokens": 128, "rounds": 2}


def prompt(k: int, n_words: int) -> str:
    return f"Request {k}: " + " ".join(WORDS[(k + i) % len(WORDS)] for i in range(n_words))


def summarize(latencies_ms: list[float], tokens: int, wall_s: float) -> dict[str, float]:
    """Aggregate completion tokens/s and latency percentiles of one burst of callers."""
    return {"tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0, "latency_p50_ms": percentile(latencies_ms, 50),
            "latency_p90_ms": percentile(latencies_ms, 90), "requests": len(latencies_ms), "tokens": tokens}


def callers(client: httpx.Client, n: int, size: dict[str, int], sampler: str, base: int) -> dict[str, float]:
    """``n`` threads each send ``size["rounds"]`` completions in turn; their aggregate figures."""
    def one(caller: int) -> list[tuple[float, int]]:
        out = []
        for r in range(size["rounds"]):
            k = base + caller * size["rounds"] + r
            body = {"model": "streams", "prompt": prompt(k, size["prompt_words"]), "max_tokens": size["max_tokens"],
                    "ignore_eos": True, "stream": False, "seed": k, **SAMPLERS[sampler]}
            t0 = time.perf_counter()
            reply = client.post("/v1/completions", json=body)
            reply.raise_for_status()
            out.append(((time.perf_counter() - t0) * 1000, int(reply.json()["usage"]["completion_tokens"])))
        return out
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        done = [r for rs in pool.map(one, range(n)) for r in rs]
    return summarize([ms for ms, _ in done], sum(t for _, t in done), time.perf_counter() - start)


def server_commands(s: BenchSettings, n_ctx: int) -> dict[str, Callable[[int], list[str]]]:
    ours = serve_command(s.model_path, "streams", "--n-parallel", str(N_PARALLEL), "--n-ctx", str(n_ctx),
                         "--n-threads", str(s.n_threads), "--n-gpu-layers", str(s.n_gpu_layers))
    theirs = [s.peer_server or "", "-m", s.model_path, "-np", str(N_PARALLEL), "-kvu", "-c", str(n_ctx),
              "-t", str(s.n_threads), "-tb", str(s.n_threads), "-ngl", str(s.n_gpu_layers), "--host", "127.0.0.1"]
    return {"llamactor": ours, "llama_server": lambda port: [*theirs, "--port", str(port)],
            "llama_server_bs": lambda port: [*theirs, "-bs", "--port", str(port)]}


def measure_server(url: str, ns: list[int], size: dict[str, int]) -> dict[str, dict[str, dict[str, float]]]:
    """Every sampler at every N against one running server: {sampler: {str(N): figures}}."""
    limits = httpx.Limits(max_connections=max(ns) + 8, max_keepalive_connections=max(ns) + 8)
    with httpx.Client(base_url=url, limits=limits, timeout=900) as client:
        callers(client, min(8, max(ns)), {**size, "max_tokens": 8, "rounds": 1}, "greedy", 10**6)  # warm up
        out: dict[str, dict[str, dict[str, float]]] = {}
        base = 0
        for sampler in SAMPLERS:
            out[sampler] = {}
            for n in ns:
                out[sampler][str(n)] = callers(client, n, size, sampler, base)
                base += n * size["rounds"]
        return out


def ratios(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """llamactor / llama-server-with-``-bs`` tokens/s, per sampler and N."""
    ours, theirs = results["llamactor"], results["llama_server_bs"]
    return {sampler: {n: ours[sampler][n]["tokens_per_s"] / theirs[sampler][n]["tokens_per_s"]
                      for n in ours[sampler] if theirs[sampler][n]["tokens_per_s"] > 0} for sampler in ours}


def bench_streams(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    ns, size = concurrencies(s.quick), sizes(s.quick)
    n_ctx = max(s.n_ctx, N_PARALLEL * (size["prompt_words"] + size["max_tokens"] + 32))
    out: dict[str, Any] = {**size, "concurrencies": ns, "n_parallel": N_PARALLEL, "n_ctx": n_ctx,
                           "n_gpu_layers": s.n_gpu_layers}
    for name, command in server_commands(s, n_ctx).items():
        with running_server(command, timeout_s=300) as (url, _pid):
            out[name] = measure_server(url, ns, size)
        tick()
    out["vs_bs"] = ratios(out)
    out["min_ratio_vs_bs"] = min(r for by_n in out["vs_bs"].values() for r in by_n.values())
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: per N and sampler, each server's tok/s (p50 latency) and llamactor / ``-bs``."""
    if not (st := results.get("streams")):
        return []
    lines = [f"Streams: N callers, each {st['rounds']} non-streamed `/v1/completions` of ~{st['prompt_words']} prompt "
             f"tokens and {st['max_tokens']} new (EOG ignored), against `llamactor serve` ({st['n_parallel']} "
             f"sequences) and llama-server `-np {st['n_parallel']} -kvu`, without and with `-bs`; n_ctx {st['n_ctx']}, "
             f"{st['n_gpu_layers']} GPU layers. Aggregate tok/s (p50 latency ms).", "",
             "| N | sampler | llamactor | llama-server | llama-server -bs | llamactor / -bs |",
             "|---:|---|---:|---:|---:|---:|"]
    for sampler, by_n in st["vs_bs"].items():
        for n, ratio in by_n.items():
            cells = [f"{st[name][sampler][n]['tokens_per_s']:.0f} ({st[name][sampler][n]['latency_p50_ms']:.0f})"
                     for name in ("llamactor", "llama_server", "llama_server_bs")]
            lines.append(f"| {n} | {sampler} | {' | '.join(cells)} | {ratio:.3f} |")
    return lines + [""]

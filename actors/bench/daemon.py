"""The *daemon* leg of ``llamactor bench``: ``llamactor serve`` on loopback, N concurrent streaming clients.

The in-process leg runs the same load through ``LLM.stream_chat`` from N threads, in the same
run but not at the same time (both would share the same two cores). Also records the idle CPU
of the started daemon (``results["daemon_idle"]``). ``report_lines`` renders its table in the report.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import openai

import llamactor
from llamactor.bench.measure import median_runs
from llamactor.bench.servers import idle_cpu_percent, running_server, serve_command
from llamactor.bench.settings import BenchSettings

MODEL_ID = "bench-model"


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Customer {i}: tell me a short story about the number {i}."}]


def _summary(ttfts: list[float], tokens: int, seconds: float) -> dict[str, float]:
    ttfts.sort()
    return {"tokens_per_s": tokens / seconds, "ttft_p50_ms": ttfts[len(ttfts) // 2]}


def in_process_streams(llm: llamactor.LLM, n: int, max_tokens: int) -> dict[str, float]:
    def one(i: int) -> tuple[float, int]:
        start = time.perf_counter()
        stream = llm.stream_chat(_messages(i), max_tokens=max_tokens, temperature=0, ignore_eos=True)
        first = None
        for _piece in stream:
            first = first or time.perf_counter()
        return ((first or time.perf_counter()) - start) * 1000, stream.completion.usage.completion_tokens

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    return _summary([r[0] for r in results], sum(r[1] for r in results), time.perf_counter() - start)


def daemon_streams(client: openai.OpenAI, n: int, max_tokens: int) -> dict[str, float]:
    def one(i: int) -> tuple[float, int]:
        start = time.perf_counter()
        first, tokens = None, 0
        for chunk in client.chat.completions.create(
                model=MODEL_ID, messages=cast(Any, _messages(i)), max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return ((first or time.perf_counter()) - start) * 1000, tokens

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    return _summary([r[0] for r in results], sum(r[1] for r in results), time.perf_counter() - start)


@contextlib.contextmanager
def running_daemon(model_path: str, *, n_threads: int, n_ctx: int) -> Iterator[tuple[openai.OpenAI, int]]:
    command = serve_command(model_path, MODEL_ID, "--n-parallel", "16", "--n-threads", str(n_threads),
                            "--n-ctx", str(n_ctx))
    with running_server(command) as (url, pid):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
        _run_warmup(client)
        yield client, pid


def _run_warmup(client: Any) -> None:
    client.chat.completions.create(model=MODEL_ID, messages=_messages(0), max_tokens=2)


def daemon_concurrencies(s: BenchSettings) -> list[int]:
    """The concurrencies the daemon leg runs (one progress tick each)."""
    return [16] if s.quick else [c for c in s.concurrencies if c <= 16]


def bench_daemon(s: BenchSettings, tick: Callable[[], None]) -> list[dict[str, Any]]:
    """Streamed chat completions from N threads: in-process ``stream_chat`` vs the daemon over HTTP."""
    rows = []
    with llamactor.start(s.model_path, n_parallel=16, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm, \
            running_daemon(s.model_path, n_threads=s.n_threads, n_ctx=s.n_ctx) as (client, pid):
        llm.ask("warm up", max_tokens=2)
        s.results["daemon_idle"] = {"cpu_percent": idle_cpu_percent(pid)}
        for c in daemon_concurrencies(s):
            m = median_runs({"local": lambda: in_process_streams(llm, c, s.max_tokens),
                             "remote": lambda: daemon_streams(client, c, s.max_tokens)}, s.repeats)
            local, remote = m["local"], m["remote"]
            rows.append({"concurrency": c, "in_process_tok_s": local["tokens_per_s"],
                         "daemon_tok_s": remote["tokens_per_s"], "in_process_ttft_p50_ms": local["ttft_p50_ms"],
                         "daemon_ttft_p50_ms": remote["ttft_p50_ms"],
                         "daemon_vs_in_process": remote["tokens_per_s"] / local["tokens_per_s"]})
            tick()
    return rows


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: per concurrency, in-process vs daemon tok/s and TTFT."""
    if "daemon" not in results:
        return []
    lines = ["Streamed chat completions, N threads: in-process `stream_chat` vs the daemon over loopback HTTP.", "",
             "| concurrency | in-process tok/s | daemon tok/s | daemon / in-process | TTFT p50 in-process / daemon ms |",
             "|---:|---:|---:|---:|---|"]
    for r in results["daemon"]:
        lines.append(f"| {r['concurrency']} | {r['in_process_tok_s']:.1f} | {r['daemon_tok_s']:.1f} | "
                     f"{r['daemon_vs_in_process']:.3f} | {r['in_process_ttft_p50_ms']:.0f} / {r['daemon_ttft_p50_ms']:.0f} |")
    return lines + [""]

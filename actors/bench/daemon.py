"""The daemon leg of the benchmark: ``llamactor serve`` on loopback, N concurrent streaming clients.

The in-process leg runs the same load through ``LLM.stream_chat`` from N threads, in the same
run but not at the same time (both would share the same two cores).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import httpx
import openai

import llamactor

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
def running_server(command: Callable[[int], list[str]], timeout_s: float = 120) -> Iterator[tuple[str, int]]:
    """Start ``command(port)`` on a free loopback port; once ``/health`` answers 200, yield its URL and pid."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):  # a benchmark, not a test: polling the health check is what a client does
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark server {command(port)[0]} did not become ready")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(60)


def serve_command(model_path: str, model_name: str, *options: str) -> Callable[[int], list[str]]:
    """``llamactor serve`` of ``model_path`` under ``model_name``, for ``running_server``."""
    return lambda port: [sys.executable, "-m", "llamactor.cli", "serve", "--port", str(port), "--model", model_path,
                         "--model-name", model_name, "--log-level", "warning", *options]


@contextlib.contextmanager
def running_daemon(model_path: str, *, n_threads: int, n_ctx: int) -> Iterator[tuple[openai.OpenAI, int]]:
    command = serve_command(model_path, MODEL_ID, "--n-parallel", "16", "--n-threads", str(n_threads),
                            "--n-ctx", str(n_ctx))
    with running_server(command) as (url, pid):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
        _run_warmup(client)
        yield client, pid


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _run_warmup(client: Any) -> None:
    client.chat.completions.create(model=MODEL_ID, messages=_messages(0), max_tokens=2)


def idle_cpu_percent(pid: int, seconds: float = 2.0) -> float:
    """CPU used by process ``pid`` (all its threads) over ``seconds`` with no request in flight."""
    def cpu_seconds() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    before, t0 = cpu_seconds(), time.perf_counter()
    time.sleep(seconds)  # measuring idleness: nothing to wait for
    return 100 * (cpu_seconds() - before) / (time.perf_counter() - t0)

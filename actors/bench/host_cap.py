"""The ``host_cap`` workload of ``llamactor bench``: the token rate the host side carries when the
decode costs nothing -- in-process and through the daemon's HTTP front end.

The tree is the ``host`` workload's null leg (``replay``: the real batcher, llama.cpp's decode
replayed, tokens sampled in the graph as on a GPU), served by the daemon's own app and uvicorn
settings (``http.daemon.uvicorn_config``) in this process, as ``llamactor serve`` runs it. N chat
completions at once (64 and 126 streams; 250 on a model without sliding-window layers, whose
sequences need no shadow ids), EOG ignored, through four legs on the same tree, interleaved:

* *submit*: ``submit_chat`` futures from this thread (the in-process reference);
* *stream*: ``stream_async`` streams on an event loop in this thread;
* *http*: non-streamed ``/v1/chat/completions``; *sse*: the same streamed (SSE, with usage),
  both from a client in a process of its own (``http_load``: raw sockets), so the client never
  takes the server's GIL;
* *http_fp*, *sse_fp*: the same two against the daemon's front end in a process of its own
  (``--frontend-processes 1``; ``split_front``) over the same tree; *http_fpN*, *sse_fpN*: against
  N front-end processes on one socket (``--frontend-processes N``), for each N of
  ``frontend_processes`` above 1 (the bench's ``--frontend-processes``; 1,2 by default).

Per leg: tokens/s, and from the batcher's counters its own work per step (*batcher ms*) beside
the wall time per step: the difference is what each step waited for outside the batcher (the
event loop holding the GIL, the hops between threads). ``host_cap_report`` renders the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import uvicorn

import llamactor
from llamactor.base.config import PINNED_SEQ_IDS, Config, max_sequences
from llamactor.bench.host import WARM_UP_TOKENS, per_step
from llamactor.bench.http_load import MODEL_ID, chat_messages
from llamactor.bench.measure import median_runs
from llamactor.bench.replay import Recording, null_config, start_host_tree
from llamactor.bench.settings import BenchSettings
from llamactor.bench.split_front import processes_cpu_s, split_front_end
from llamactor.http.daemon import uvicorn_config
from llamactor.http.server import create_app
from llamactor.http.state import ServerState
from llamactor.serving import replicas as replicas_module

SIZES = (64, 126, 250)  # 250: only on a model without sliding-window layers
NEW_TOKENS = {64: 128, 126: 96, 250: 64}  # the sizes; a quick run halves them
FRONTEND_PROCESSES = (1, 2)  # the split legs' front-end processes, by default
UVICORN_THREAD = "host-cap-uvicorn"


def record(model_path: str, n_threads: int) -> Recording:
    """A few real steps' decode results (graph sampling, 16 sequences) for the replayed trees."""
    recording = Recording()
    config = Config(model=model_path, n_parallel=16, n_ctx=4096, n_threads=n_threads, max_restarts=0,
                    sample_in_graph=True)
    with start_host_tree(config, recording, replay=False) as llm:
        for future in [llm.submit_chat(chat_messages(i), max_tokens=WARM_UP_TOKENS, temperature=0, ignore_eos=True)
                       for i in range(16)]:
            future.result()
    return recording


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fp_leg(kind: str, count: int) -> str:
    """The split leg of ``kind`` (http, sse) through ``count`` front-end processes."""
    return f"{kind}_fp" if count == 1 else f"{kind}_fp{count}"


@contextlib.contextmanager
def replayed_daemon(model_path: str, config: Config, recording: Recording, frontend_processes: tuple[int, ...] = (1,)
                    ) -> Iterator[tuple[llamactor.LLM, str, dict[int, tuple[str, list[int]]]]]:
    """The daemon's app on uvicorn (a thread of this process) over one replayed tree, and for each
    count of ``frontend_processes`` that many front-end processes over the same tree; yields the
    tree's handle, the server's URL and by count the front ends' (URL, pids)."""
    def start_tree(_config: Config) -> llamactor.LLM:
        return start_host_tree(config, recording, replay=True)

    with mock.patch.object(replicas_module, "start_tree", start_tree):
        router = llamactor.Router([{"name": MODEL_ID, "path": model_path}])
        router.load(MODEL_ID)
    state = ServerState([MODEL_ID], api_key=None, max_body_bytes=1 << 20)
    state.router = router
    port = _free_port()
    server = uvicorn.Server(uvicorn_config(create_app(state), state.transport, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, name=UVICORN_THREAD, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.05)  # uvicorn has no started event to wait on
        with contextlib.ExitStack() as stack:
            specs = [router.model(MODEL_ID).spec]
            splits = {k: stack.enter_context(split_front_end(router, specs, _free_port(), k)) for k in frontend_processes}
            yield router.model(MODEL_ID).replica(0), f"http://127.0.0.1:{port}", splits
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        router.close()


def _submit_leg(llm: llamactor.LLM, n: int, max_tokens: int) -> tuple[int, float]:
    start = time.perf_counter()
    futures = [llm.submit_chat(chat_messages(i), max_tokens=max_tokens, temperature=0, ignore_eos=True)
               for i in range(n)]
    tokens = sum(f.result().usage.completion_tokens for f in futures)
    return tokens, time.perf_counter() - start


def _stream_leg(llm: llamactor.LLM, n: int, max_tokens: int) -> tuple[int, float]:
    async def one(i: int) -> int:
        stream = llm.stream_async(llm.request(messages=chat_messages(i), max_tokens=max_tokens, temperature=0,
                                              ignore_eos=True))[0]
        async for _piece in stream:
            pass
        return stream.completion.usage.completion_tokens

    async def every() -> int:
        return sum(await asyncio.gather(*(one(i) for i in range(n))))

    start = time.perf_counter()
    tokens = asyncio.run(every())
    return tokens, time.perf_counter() - start


def http_client(url: str, n: int, max_tokens: int, stream: bool) -> dict[str, Any]:
    """``http_load`` in a process of its own; its figures (RuntimeError if a response failed)."""
    out = subprocess.run([sys.executable, "-m", "llamactor.bench.http_load", url, str(n), str(max_tokens),
                          "stream" if stream else "plain"], capture_output=True, text=True, timeout=600, check=True)
    figures: dict[str, Any] = json.loads(out.stdout)
    if figures["errors"]:
        raise RuntimeError(f"{figures['errors']} of {n} HTTP responses failed: {out.stderr[-500:]}")
    return figures


def thread_cpu_s(frontend_pids: list[int] | None = None) -> dict[str, float]:
    """CPU seconds each thread of this process has used, by role: ``batcher`` (the batcher
    thread), ``front`` (the event loops: uvicorn's, or this thread's in the *stream* leg; with
    ``frontend_pids``, those front-end processes', all their threads), ``link`` (the engine's end
    of the front ends' links) and ``other``; empty where ``/proc`` has no per-thread figures."""
    out = {"batcher": 0.0, "front": 0.0, "link": 0.0, "other": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return {}
        role = ("batcher" if "Batcher" in thread.name else "link" if thread.name.startswith("frontend-") else
                "front" if frontend_pids is None and thread.name in (UVICORN_THREAD, "MainThread") else "other")
        out[role] += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    if frontend_pids is not None:
        out["front"] = processes_cpu_s(frontend_pids)
    return out


def _measured(llm: llamactor.LLM, leg: Callable[[], tuple[int, float]],
              frontend_pids: list[int] | None = None) -> dict[str, float]:
    """One leg's tokens/s, the batcher's work and wall time per step, and each thread role's CPU
    microseconds per token (what a loaded machine's wall times hide)."""
    before, cpu_before = llm.stats(), thread_cpu_s(frontend_pids)
    tokens, seconds = leg()
    m = per_step(before, llm.stats(), seconds, tokens)
    cpu_after = thread_cpu_s(frontend_pids)
    cpu = {f"{role}_us_per_token": (cpu_after[role] - cpu_before[role]) * 1e6 / max(tokens, 1)
           for role in cpu_after if cpu_before}
    return {"tokens_per_s": m["tokens_per_s"], "batcher_ms": m["host_ms"], "wall_ms": m["wall_ms"],
            "steps": m["steps"], **cpu}


def measure_size(llm: llamactor.LLM, url: str, splits: dict[int, tuple[str, list[int]]], n: int, max_tokens: int,
                 repeats: int) -> dict[str, Any]:
    """Every leg at ``n`` streams, interleaved (median of ``repeats``); ratios against *submit*."""
    def over_http(at: str, stream: bool) -> tuple[int, float]:
        f = http_client(at, n, max_tokens, stream)
        return int(f["tokens"]), float(f["seconds"])

    legs: dict[str, Callable[[], tuple[int, float]]] = {
        "submit": lambda: _submit_leg(llm, n, max_tokens), "stream": lambda: _stream_leg(llm, n, max_tokens),
        "http": lambda: over_http(url, False), "sse": lambda: over_http(url, True)}
    pids: dict[str, list[int] | None] = dict.fromkeys(legs)
    for count, (split_url, split_pids) in splits.items():
        for kind, streamed in (("http", False), ("sse", True)):
            legs[fp_leg(kind, count)] = functools.partial(over_http, split_url, streamed)
            pids[fp_leg(kind, count)] = split_pids
    for leg in legs.values():  # warm-up: the client's imports, the app's first routes
        leg()
    measured: dict[str, Callable[[], dict[str, float]]] = {
        k: functools.partial(_measured, llm, f, pids[k]) for k, f in legs.items()}
    out: dict[str, Any] = {"max_tokens": max_tokens, **median_runs(measured, repeats)}
    for name in list(legs)[1:]:
        out[name]["vs_in_process"] = out[name]["tokens_per_s"] / out["submit"]["tokens_per_s"]
    return out


def measure_host_cap(model_path: str, *, n_threads: int, repeats: int, quick: bool,
                     tick: Callable[[], None] = lambda: None,
                     frontend_processes: tuple[int, ...] = FRONTEND_PROCESSES) -> dict[str, Any]:
    """Every size's legs; the split legs through each count of ``frontend_processes`` (1: *http_fp*,
    *sse_fp*; N: *http_fpN*, *sse_fpN*)."""
    recording = record(model_path, n_threads)
    sliding = recording_has_shadow_ids(model_path, n_threads)
    most = max_sequences(sliding) - PINNED_SEQ_IDS
    out: dict[str, Any] = {"max_sequences": most}
    common: dict[str, Any] = {"model": model_path, "n_threads": n_threads, "max_restarts": 0, "sample_in_graph": True}
    for n in SIZES:
        if n <= most:
            max_tokens = NEW_TOKENS[n] // (2 if quick else 1)
            recording.prepare(n)
            config = null_config(n, n_ctx=n * (max_tokens + 64), **common)
            with replayed_daemon(model_path, config, recording, frontend_processes) as (llm, url, splits):
                out[f"c{n}"] = measure_size(llm, url, splits, n, max_tokens, repeats)
        tick()
    return out


def recording_has_shadow_ids(model_path: str, n_threads: int) -> bool:
    """Whether the model's sequences take shadow ids (sliding-window layers)."""
    with llamactor.start(model_path, n_parallel=1, n_ctx=256, n_threads=n_threads, max_restarts=0) as llm:
        return bool(llm.info.shadow_ids)


def n_ticks() -> int:
    return len(SIZES)


def bench_host_cap(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    return measure_host_cap(s.model_path, n_threads=s.n_threads, repeats=min(s.repeats, 3), quick=s.quick, tick=tick,
                            frontend_processes=s.frontend_processes)

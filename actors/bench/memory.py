"""The memory workloads of ``llamactor bench``: *kv_q8* (a q8_0 KV cache against f16) and *memory*
(the daemon's resident memory against llama-server's at the same settings).

*kv_q8*: KV bytes per token, read from llama.cpp's per-sequence state of a 512-token prompt on a
bare engine of each type, and tokens/s of 16 greedy streams on a tree of each type (interleaved
medians). *memory*: ``llamactor serve`` at 16 sequences and 8k cells answers one request, then
its resident set (``VmRSS``) and peak (``VmHWM``) are read from /proc -- with the sequence-id pool
sized to the configuration (the default) and with the 128 ids every context had before; with a
llama-server binary (``--peer-server``), the same for ``llama-server -np 16 -c 8192 -kvu``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

import llamactor
from llamactor.base.config import max_sequences
from llamactor.bench.measure import llamactor_burst, median_runs
from llamactor.bench.prompts import WORDS, uniform_prompts
from llamactor.bench.servers import running_server, serve_command
from llamactor.bench.settings import BenchSettings
from llamactor.native.engine import Engine

N_STREAMS = 16


def kv_bytes_per_token(model_path: str, kv_type: str, n_threads: int, n_tokens: int = 512) -> float:
    engine = Engine(model_path, n_ctx=2048, n_batch=512, n_ubatch=512, n_seq_max=1, n_threads=n_threads,
                    kv_type=kv_type)
    try:
        text = " ".join(WORDS * 40)
        tokens = engine.tokenizer.tokenize(text)[:n_tokens]
        engine.prefill(0, tokens)
        return engine.seq_state_bytes(0) / len(tokens)
    finally:
        engine.close()


def bench_kv_q8(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    out: dict[str, Any] = {kv: {"kv_bytes_per_token": kv_bytes_per_token(s.model_path, kv, s.n_threads)}
                           for kv in ("f16", "q8_0")}
    tick()
    prompts = uniform_prompts(N_STREAMS)
    trees = {kv: llamactor.start(s.model_path, n_parallel=N_STREAMS, n_ctx=s.n_ctx, n_threads=s.n_threads,
                                 kv_type=kv, prefix_cache=False) for kv in ("f16", "q8_0")}
    try:
        for llm in trees.values():
            llm.ask("warm up", max_tokens=2)
        def burst(llm: llamactor.LLM) -> Callable[[], dict[str, float]]:
            return lambda: llamactor_burst(llm, prompts, s.max_tokens)

        measured = median_runs({kv: burst(llm) for kv, llm in trees.items()}, max(1, s.repeats // 2))
    finally:
        for llm in trees.values():
            llm.close()
    for kv, m in measured.items():
        out[kv]["tokens_per_s"] = m["tokens_per_s"]
    out["kv_bytes_ratio"] = out["q8_0"]["kv_bytes_per_token"] / out["f16"]["kv_bytes_per_token"]
    out["tok_s_ratio"] = out["q8_0"]["tokens_per_s"] / out["f16"]["tokens_per_s"]
    tick()
    return out


def _rss_mib(pid: int) -> dict[str, float]:
    """The resident set now and its peak, MiB (Linux /proc)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return {"rss_mib": round(fields["VmRSS"], 1), "peak_mib": round(fields["VmHWM"], 1)}


def after_one_request(command: Callable[[int], list[str]]) -> dict[str, float]:
    with running_server(command) as (url, pid):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
        client.completions.create(model="memory", prompt="Once upon a time", max_tokens=16, temperature=0.8)
        return _rss_mib(pid)


def bench_memory(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n_ctx, threads = "8192", str(s.n_threads)
    common = ("--n-parallel", str(N_STREAMS), "--n-ctx", n_ctx, "--n-threads", threads)
    out: dict[str, Any] = {"n_parallel": N_STREAMS, "n_ctx": int(n_ctx),
                           "llamactor": after_one_request(serve_command(s.model_path, "memory", *common))}
    tick()
    # 128 ids: the most a model with sliding-window layers holds (Gemma 3), so any model's
    out["llamactor_128_ids"] = after_one_request(serve_command(s.model_path, "memory", *common, "--n-seq-ids",
                                                                str(max_sequences(sliding_window=True))))
    tick()
    if s.peer_server:
        theirs = [s.peer_server, "-m", s.model_path, "-np", str(N_STREAMS), "-c", n_ctx, "-t", threads, "-tb", threads,
                  "-kvu", "--host", "127.0.0.1"]
        out["llama_server"] = after_one_request(lambda port: [*theirs, "--port", str(port)])
        out["rss_ratio"] = out["llamactor"]["rss_mib"] / out["llama_server"]["rss_mib"]
    tick()
    return out

"""The *models* workload of ``llamactor bench``: the throughput and memory legs on both models the
project installs -- the bench's model (by default Gemma 3 270M, base, 262k vocabulary) and
SmolLM2-135M-Instruct (49k vocabulary), the model ``make chat`` opens.

Per model: decode tokens/s of N greedy streams at a few concurrencies (interleaved medians across
the two models, so a shared machine's drift hits both alike), KV bytes per token (a bare engine's
per-sequence state of a 512-token prompt), the logits row one sampled token costs (``n_vocab`` ×
4 bytes: llama.cpp's output buffer holds one per generating sequence, and the host sampler reads
every entry of it), and the daemon's resident memory after one request (16 sequences, 8k cells).
``report_lines`` renders the two models side by side in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import llamactor
from llamactor.base.models import instruct_model_path
from llamactor.bench.measure import llamactor_burst, median_runs
from llamactor.bench.memory import N_STREAMS, after_one_request, kv_bytes_per_token
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.servers import serve_command
from llamactor.bench.settings import BenchSettings

N_TICKS = 3


def concurrencies(s: BenchSettings) -> list[int]:
    return [c for c in s.concurrencies if c <= N_STREAMS]


def bench_models(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    """Both models' figures, by model file name, and the ratios instruct / bench model."""
    paths = {"bench": s.model_path, "instruct": instruct_model_path()}
    out: dict[str, Any] = {role: {"model": Path(path).name} for role, path in paths.items()}
    trees = {role: llamactor.start(path, n_parallel=N_STREAMS, n_ctx=s.n_ctx, n_threads=s.n_threads,
                                   n_gpu_layers=s.n_gpu_layers, prefix_cache=False) for role, path in paths.items()}
    try:
        for role, llm in trees.items():
            llm.ask("warm up", max_tokens=2)
            out[role].update(n_vocab=llm.info.n_vocab, n_params=llm.info.n_params, size_bytes=llm.info.size_bytes,
                             logits_row_bytes=llm.info.n_vocab * 4)
        for c in concurrencies(s):
            prompts = uniform_prompts(c)
            runs = {role: _burst(llm, prompts, s.max_tokens) for role, llm in trees.items()}
            for role, m in median_runs(runs, max(1, s.repeats // 2)).items():
                out[role].setdefault("tokens_per_s", {})[str(c)] = round(m["tokens_per_s"], 1)
    finally:
        for llm in trees.values():
            llm.close()
    tick()
    for role, path in paths.items():
        out[role]["kv_bytes_per_token"] = round(kv_bytes_per_token(path, "f16", s.n_threads), 1)
    tick()
    common = ("--n-parallel", str(N_STREAMS), "--n-ctx", "8192", "--n-threads", str(s.n_threads))
    for role, path in paths.items():
        out[role]["daemon"] = after_one_request(serve_command(path, "memory", *common))
    out["ratios"] = _ratios(out["instruct"], out["bench"])
    tick()
    return out


def _burst(llm: llamactor.LLM, prompts: list[str], max_tokens: int) -> Callable[[], dict[str, float]]:
    return lambda: llamactor_burst(llm, prompts, max_tokens)


def _ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Instruct / bench model, figure by figure."""
    out = {f"tok_s_c{c}": a["tokens_per_s"][c] / b["tokens_per_s"][c] for c in a["tokens_per_s"]}
    out.update(kv_bytes_per_token=a["kv_bytes_per_token"] / b["kv_bytes_per_token"],
               logits_row_bytes=a["logits_row_bytes"] / b["logits_row_bytes"],
               daemon_rss=a["daemon"]["rss_mib"] / b["daemon"]["rss_mib"])
    return {k: round(v, 3) for k, v in out.items()}


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table of the two models (nothing if the workload did not run)."""
    r = results.get("models")
    if not isinstance(r, dict) or "bench" not in r:
        return []
    roles = ("bench", "instruct")
    cs = list(r["bench"]["tokens_per_s"])
    lines = ["Two models (the bench's, and SmolLM2-135M-Instruct, the REPL's default):", "",
             "| | " + " | ".join(r[k]["model"] for k in roles) + " |", "|---|---:|---:|",
             _row("vocabulary", [f"{r[k]['n_vocab']:,}" for k in roles]),
             _row("logits row (bytes per sampled token)", [f"{r[k]['logits_row_bytes']:,}" for k in roles]),
             _row("KV bytes per token (f16)", [f"{r[k]['kv_bytes_per_token']:,.0f}" for k in roles]),
             _row("daemon RSS after one request, MiB", [f"{r[k]['daemon']['rss_mib']}" for k in roles])]
    lines += [_row(f"tok/s at {c} streams", [f"{r[k]['tokens_per_s'][c]}" for k in roles]) for c in cs]
    return lines + [""]


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"

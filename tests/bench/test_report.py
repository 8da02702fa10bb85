"""The benchmark's report (``llamactor.bench.report``), model-free: every workload module renders its
own section, the frame puts them in order, lists the failed workloads and ends with the goals."""

from __future__ import annotations

from typing import Any

import pytest

from llamactor.bench import report

pytestmark = pytest.mark.pure


class Figures(float):
    """A recorded result that answers every key with a number (each key its own): enough for a
    section's prose and tables, whatever figures it reads."""

    def __new__(cls, value: float = 1.5) -> Figures:
        return float.__new__(cls, value)

    def __getitem__(self, key: str) -> Figures:
        return Figures(2.25 + len(str(key)) / 7)

    def get(self, key: str, default: Any = None) -> Figures:
        return self[key]


M = Figures  # short: the table below uses it often
FIGURE = {"tokens_per_s": 100.0, "latency_p50_ms": 50.0}
BY_SAMPLER = {s: {"1": FIGURE, "64": FIGURE} for s in ("greedy", "default")}
LEG = {"model": "x.gguf", "n_vocab": 1000, "logits_row_bytes": 4000, "kv_bytes_per_token": 10.0,
       "daemon": {"rss_mib": 5.0}, "tokens_per_s": {"1": 3.0, "16": 4.0}}
RESULTS = {
    "uniform": [{"concurrency": c, **{k: M(c + 0.25) for k in ("sequential_tok_s", "ceiling_tok_s", "llamactor_tok_s",
                                                                "vs_ceiling", "vs_sequential")}, "step_ms": M()}
                for c in (1, 4, 16)],
    "shared_prefix": M(), "arrivals": M(), "single": M(), "sampled": M(),
    "daemon": [{"concurrency": 16, **{k: M() for k in ("in_process_tok_s", "daemon_tok_s", "daemon_vs_in_process",
                                                       "in_process_ttft_p50_ms", "daemon_ttft_p50_ms")}}],
    "daemon_idle": {"cpu_percent": 0.5},
    "multiturn": [{"users": 4, "turns": 3, "n_parallel": 4, "n_ctx": 8192, "cache_on": M(), "cache_off": M(1.7),
                   "ttft_later_p50_ratio": 0.3, "wall_ratio": 0.5, "computed_vs_new": 1.2}],
    "few_shot": M(), "many_users": M(), "one_off": M(), "kept_cells": M(), "warm_restart": M(), "priorities": M(), "overcommit": M(), "structured": M(),
    "embeddings": M(), "replicas": M(), "scoring": M(), "batch": M(), "crash_streams": M(), "kv_q8": M(),
    "memory": M(), "tenants": M(), "adapters": M(), "batch_invariant": M(),
    "host": {"max_tokens": 32, "recorded_rows": 7, "max_real_sequences": 64,
             "real": {"c16": {"greedy": M(), "default": M(1.9)}},
             "null": {"c16": {"greedy": M(), "default": M()}, "c256": {"greedy": M(1.1), "default": M()}}},
    "streams": {"rounds": 1, "prompt_words": 64, "max_tokens": 32, "n_parallel": 64, "n_ctx": 8192,
                "n_gpu_layers": 99, **{n: BY_SAMPLER for n in ("llamactor", "llama_server", "llama_server_bs")},
                "vs_bs": {s: {"1": 1.0, "64": 1.0} for s in ("greedy", "default")}, "min_ratio_vs_bs": 1.0},
    "peer": M(),
    "models": {"bench": LEG, "instruct": {**LEG, "model": "y.gguf"}},
    "broken": {"error": "RuntimeError: boom"},
}
META = {"timestamp": "t", "machine": "m", "model": "g", "settings": {"n_threads": 2, "max_tokens": 32, "quick": True}}
# The first words of each section, in the report's order.
ORDER = ["| concurrency |", "Shared system prompt", "Arrivals", "Single request", "Streamed chat completions",
         "Multi-turn chat", "Few-shot", "Many users", "One-off requests", "Warm restart", "Against llama.cpp's llama-server", "Priorities",
         "Overcommit", "Structured", "Embeddings", "Replicas", "Host work per step", "Streams:", "Two models",
         "**broken failed**", "| target | value | goal | met |"]


def test_each_workload_renders_its_section_in_the_reports_order() -> None:
    table = report.markdown(RESULTS, META)
    places = [table.index(words) for words in ORDER]
    assert places == sorted(places)
    assert table.startswith("Run t on m, model g, 2 threads, 32 new tokens per request (quick run).")
    assert "| uniform c=16: llamactor / ceiling | 16.250 | >= 0.93 | yes |" in table


def test_a_failed_or_missing_workload_has_no_section_and_no_goal_row() -> None:
    table = report.markdown({"few_shot": {"error": "OSError: gone"}, "single": RESULTS["single"]}, META)
    assert "Few-shot:" not in table and "**few_shot failed**: OSError: gone" in table
    assert "Single request:" in table and "| concurrency |" not in table and "uniform c=16" not in table

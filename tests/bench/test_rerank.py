"""The benchmark's *rerank* workload (``llamactor.bench.rerank`` and ``rerank_quality``): its ratios,
goals and report lines from a recorded result, the yardstick's yes/no share by hand, the quick
run's sizes (all model-free)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from llamactor.bench import baselines, rerank, rerank_quality, report
from llamactor.bench.settings import BenchSettings

def leg(seconds: float, computed: int, docs: int = 64) -> dict[str, Any]:
    return {"seconds": seconds, "documents_per_s": docs / seconds, "prompt_tokens_computed": computed,
            "label_rows": docs, "steps": 12.0, "step_ms": {"decode": 80.0, "sample": 0.1, "schedule": 0.5,
                                                           "postprocess": 0.6}}


def quality(model: str, top1: int, diff: float, exact: float) -> dict[str, Any]:
    return {"model": model, "cases": 20, "top1": top1, "max_score_diff": diff, "nearest_tie": 0.0012,
            "exact_cases": 3, "exact_max_score_diff": exact}


def recorded() -> dict[str, Any]:
    out: dict[str, Any] = {
        "documents": 64, "mean_document_tokens": 61.3,
        "sizes": {"repeats": 3, "callers": 8, "chat_streams": 8, "chat_tokens": 64},
        "llamactor": leg(2.0, 4200), "no_prefix_sharing": leg(5.0, 14000), "one_at_a_time":
            {"seconds": 16.0, "documents_per_s": 4.0, "prompt_tokens": 15000},
        "max_score_diff_vs_one_at_a_time": 0.02,
        "beside_chat": {"alone_tokens_per_s": 100.0, "beside_reranks_tokens_per_s": 85.0, "reranks_meanwhile": 9},
        "quality": {"bench": quality("gemma.gguf", 13, 0.03, 0.002), "other": quality("smol.gguf", 14, 0.0004, 0.0)}}
    return {**out, **rerank.ratios(out)}


@pytest.mark.pure
def test_the_ratios_are_measured_against_the_baselines_of_the_same_run() -> None:
    r = recorded()
    assert r["throughput_ratio"] == pytest.approx(8.0) and r["prefix_sharing_speedup"] == pytest.approx(2.5)
    assert r["prefix_sharing_tokens_ratio"] == pytest.approx(0.3) and r["chat_ratio"] == pytest.approx(0.85)
    assert r["quality_top1_min"] == pytest.approx(0.65) and r["quality_max_score_diff"] == 0.03
    assert r["quality_exact_max_score_diff"] == 0.002
    quick = {k: v for k, v in r.items() if k not in ("beside_chat", "quality")}  # the quick run's legs
    assert set(rerank.ratios(quick)) == {"throughput_ratio", "prefix_sharing_speedup", "prefix_sharing_tokens_ratio"}


@pytest.mark.pure
def test_the_goals_read_the_workload_and_a_missed_goal_shows_with_the_per_step_profile() -> None:
    met = {v["target"]: v["met"] for v in report.verdicts({"rerank": recorded()}) if v["target"].startswith("rerank")}
    assert len(met) == 5 and met.pop("rerank quality: max |score - llama-cpp-python's P(yes) / (P(yes) + P(no))|, "
                                     "both models, the same kernels (batch-invariant mode's)") is False
    assert all(met.values())
    meta = {"timestamp": "t", "machine": "m", "model": "gemma.gguf", "settings": {"n_threads": 2, "max_tokens": 64,
                                                                                "quick": False}}
    text = report.markdown({"rerank": recorded()}, meta)
    assert "step ms decode / sample / other 80.0 / 0.10 / 1.00" in text and "(8.00×;" in text
    assert "| rerank: documents/s, one request / Llama(logits_all=True) one judging prompt at a time | 8.000 |" in text


@pytest.mark.pure
def test_the_report_has_each_leg_that_ran_and_nothing_when_the_workload_did_not() -> None:
    lines = rerank.report_lines({"rerank": recorded()})
    assert lines[0].startswith("Rerank: 64 documents of 61 tokens against one query") and "5.00 s, 14000" in lines[0]
    assert "85.0 tok/s while 8 callers rerank 64 documents each (0.85×; 9 reranks meanwhile)" in lines[1]
    assert lines[2].startswith("Rerank quality, gemma.gguf: top-1 13/20") and "0.0004 apart" in lines[3]
    assert lines[2].endswith("in batch-invariant mode against llama-cpp-python with the same kernels (3 cases) at most "
                             "0.002 apart.") and lines[3].endswith("(3 cases) at most 0 apart.")
    quick = {k: v for k, v in recorded().items() if k not in ("beside_chat", "quality")}
    assert len(rerank.report_lines({"rerank": quick})) == 2
    assert rerank.report_lines({}) == []


@pytest.mark.pure
def test_the_yardstick_reads_each_groups_share_of_the_probability_mass() -> None:
    row = np.full(10, -5.0, dtype=np.float32)
    row[[1, 2, 7]] = [2.0, 1.0, 0.5]
    yes, no = math.exp(2.0) + math.exp(1.0), math.exp(0.5) + math.exp(-5.0)
    assert baselines.group_share(row, ((1, 2), (7, 9))) == pytest.approx(yes / (yes + no), rel=1e-12)
    row[:] = 1e4  # large logits overflow exp without the shift
    assert baselines.group_share(row, ((0,), (1, 2, 3))) == pytest.approx(0.25)


@pytest.mark.pure
def test_a_quick_run_keeps_the_rerank_case_small() -> None:
    quick = rerank.sizes(BenchSettings(model_path="m.gguf", quick=True))
    assert quick.documents <= 16 and quick.repeats == 1 and quick.callers == 0 and quick.quality_cases == 0
    assert rerank.sizes(BenchSettings(model_path="m.gguf")) == rerank.Sizes()
    docs = rerank.documents(64)
    assert len(set(docs)) == 64 and all(45 <= len(d.split()) <= 55 for d in docs)


@pytest.mark.timeout(300)  # two processes, each loading a model: 25 s alone on 2 cores, 120+ beside other work
def test_with_the_same_kernels_on_both_sides_the_scores_are_llama_cpp_pythons(instruct_path: str,
                                                                             model_path: str) -> None:
    """The quality leg's exact comparison, one labelled case, in a process of its own: batch-invariant
    mode's scores against llama-cpp-python's with the same kernels (the default configuration's
    drift is llama.cpp's kernel choice; this is what the scoring itself adds: nothing), on both
    models (Gemma's Q4_K weights are repacked unless told not to be)."""
    assert rerank_quality._exact_in_a_process(instruct_path, 2, 1) == 0.0
    assert rerank_quality._exact_in_a_process(model_path, 2, 1) == 0.0

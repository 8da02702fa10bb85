"""The benchmark's *models* workload (``llamactor.bench.two_models``): its report table and ratios,
model-free, from a recorded result (the workload itself runs both models for a minute: bench only)."""

from __future__ import annotations

import pytest

from llamactor.bench.report import markdown
from llamactor.bench.two_models import _ratios, report_lines

pytestmark = pytest.mark.pure


def leg(name: str, vocab: int, kv: float, rss: float, tok_s: dict[str, float]) -> dict:
    return {"model": name, "n_vocab": vocab, "logits_row_bytes": vocab * 4, "kv_bytes_per_token": kv,
            "daemon": {"rss_mib": rss, "peak_mib": rss}, "tokens_per_s": tok_s}


RESULT = {"bench": leg("gemma.gguf", 262144, 18457.0, 553.3, {"1": 25.9, "16": 70.8}),
          "instruct": leg("smol.gguf", 49152, 23054.0, 405.4, {"1": 41.0, "16": 73.4})}


def test_the_ratios_are_instruct_over_the_bench_model_figure_by_figure() -> None:
    ratios = _ratios(RESULT["instruct"], RESULT["bench"])
    assert ratios["logits_row_bytes"] == 0.188 and ratios["tok_s_c16"] == round(73.4 / 70.8, 3)
    assert ratios["daemon_rss"] == round(405.4 / 553.3, 3) and ratios["kv_bytes_per_token"] > 1


def test_the_report_renders_both_models_side_by_side_and_nothing_when_the_leg_did_not_run() -> None:
    lines = report_lines({"models": RESULT})
    assert "| vocabulary | 262,144 | 49,152 |" in lines and "| tok/s at 16 streams | 70.8 | 73.4 |" in lines
    assert report_lines({}) == [] and report_lines({"models": {"error": "x"}}) == []
    meta = {"timestamp": "t", "machine": "m", "model": "gemma.gguf", "settings": {"n_threads": 2, "max_tokens": 32,
                                                                                "quick": True}}
    assert "| logits row (bytes per sampled token) | 1,048,576 | 196,608 |" in markdown({"models": RESULT}, meta)

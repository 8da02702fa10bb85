"""The *speculation* workload's pure parts (``llamactor.bench.speculation``), model-free: its
requests (a distinct block per stream, the block as the prediction, a base model's prompt vs a
chat), the goals' figures over both models, the report's table and the per-step profile of a row
below its goal, its place in the registry and the goals table. The workload itself runs the real
models in ``llamactor bench --only speculation``."""

from __future__ import annotations

from typing import Any

import pytest

from llamactor.bench import report, speculation, suite
from llamactor.bench.settings import BenchSettings
from llamactor.bench.speculation_texts import code_block, report_text

pytestmark = pytest.mark.pure

PROFILE = {"decode": 20.0, "sample": 0.5, "schedule": 0.25, "postprocess": 1.0}


def side(tok_s: float, accepted: int = 0) -> dict[str, Any]:
    return {"tokens_per_s": tok_s, "tokens": 300, "accepted": accepted, "rejected": 3, "steps": 40,
            "step_ms": PROFILE}


def row(off: float, on: float, streams: int = 1, identical: int | None = 1) -> dict[str, Any]:
    out = {"streams": streams, "off": side(off), "on": side(on, accepted=250), "ratio": on / off,
           "decode_ratio": on / off + 0.5}  # without the prefill both sides pay
    if identical is not None:
        out.update(identical=identical, near_tie=streams - identical, unexplained=0)
    return out


def legs(model: str, edit_c1: float, edit_c4: float, copy: float, uniform: float) -> dict[str, Any]:
    return {"model": model, "edit": {"1": row(10.0, 10.0 * edit_c1), "4": row(20.0, 20.0 * edit_c4, 4, 3)},
            "copy": row(10.0, 10.0 * copy), "uniform": {"1": row(10.0, 10.0 * uniform, identical=None),
                                                        "16": row(50.0, 50.0, 16, identical=None)}}


MODELS = {"bench": legs("g.gguf", 2.5, 1.1, 1.4, 1.0), "instruct": legs("s.gguf", 3.0, 0.9, 1.3, 0.98)}


def test_each_stream_edits_its_own_block_and_predicts_it() -> None:
    requests, predictions = speculation.edit_requests(4, base=False)
    assert len(set(predictions)) == 4 and predictions[0] == code_block(0)
    assert all(p in r["messages"][0]["content"] for r, p in zip(requests, predictions))
    assert "retries: int = 3" in predictions[0] and 900 < len(predictions[0]) < 1800  # ~300 tokens of code
    base, _ = speculation.edit_requests(1, base=True)
    assert base[0]["prompt"].endswith("```python\n") and base[0]["stop"] == ["```"]  # the code follows at once
    assert report_text(0) in speculation.copy_request(base=True)["prompt"]
    assert report_text(0) in speculation.copy_request(base=False)["messages"][0]["content"]


def test_the_goals_read_the_lowest_ratio_over_both_models() -> None:
    figures = speculation.summary(MODELS)
    assert figures["edit_c1_ratio"] == pytest.approx(2.5) and figures["edit_min_ratio"] == pytest.approx(0.9)
    assert figures["copy_ratio"] == pytest.approx(1.3) and figures["uniform_min_ratio"] == pytest.approx(0.98)
    assert figures["parted"] == 2 and figures["unexplained"] == 0  # one near-tie per model at 4 streams
    verdicts = {v["target"]: v["met"] for v in report.verdicts({"speculation": {"models": MODELS, **figures}})}
    assert verdicts["speculation edit c=1: tok/s, with the prediction / without"] is True
    assert verdicts["speculation edit c=1..16: tok/s, with the prediction / without, lowest"] is False
    assert verdicts["speculation copy c=1: tok/s, n-gram drafts / none"] is True


def test_the_report_tables_every_leg_and_profiles_the_rows_below_their_goal() -> None:
    results = {"speculation": {"rounds": 2, "models": MODELS, **speculation.summary(MODELS)}}
    lines = report.markdown(results, {"timestamp": "t", "machine": "m", "model": "g", "settings": {
        "n_threads": 2, "max_tokens": 32, "quick": True}}).splitlines()
    assert "| g.gguf | edit | 1 | 10.0 | 25.0 | 2.50 | 3.00 | 250 / 3 | 1/1 |" in lines
    assert "| s.gguf | uniform | 16 | 50.0 | 50.0 | 1.00 | 1.50 | 250 / 3 | - |" in lines
    below = [line for line in lines if line.startswith("- ")]
    assert below == [f"- s.gguf edit at 4: 0.90× (goal 0.97×); step ms decode / sample / other, off: "
                     f"20.0 / 0.50 / 0.75 (40 steps), on: 20.0 / 0.50 / 0.75 (40 steps)"]
    assert speculation.report_lines({"speculation": {"error": "RuntimeError: boom"}}) == []
    assert speculation.report_lines({}) == []


def test_the_step_profile_is_the_average_step_between_two_stats() -> None:
    before = {"steps": 10, "step_ms": {"decode": 100.0, "sample": 5.0}}
    after = {"steps": 14, "step_ms": {"decode": 180.0, "sample": 7.0, "mask": 1.0}}
    assert speculation.step_profile(before, after) == {"steps": 4, "step_ms": {"decode": 20.0, "sample": 0.5,
                                                                               "mask": 0.25}}


def test_the_workload_is_registered_outside_the_smoke_set() -> None:
    s = BenchSettings(model_path="m.gguf", quick=True)
    assert suite.workloads(s)["speculation"] == (3, speculation.bench_speculation)  # the bench's model only
    assert list(speculation.model_paths(s)) == ["bench"]
    assert "speculation" not in suite.selected(s) and suite.selected(s, ["speculation"]) == ["speculation"]
    assert speculation.rounds(s) == 1 and speculation.rounds(BenchSettings(model_path="m.gguf", full=True)) == 3

"""Batch-invariant mode (``batch_invariant=True``, issue 30): the same logits in any company, so
token ids, logprobs and prompt scores are compared with ``==``, never with the near-tie rule.

The in-process scenarios run in a fresh process (tests/support/batch_invariant_worker.py) because ggml
reads ``GGML_CPU_TILED_MM`` once per process and this one loaded models long before; there
``llamactor.start(batch_invariant=True)`` sets it itself, as a user's fresh process would. Setting
it for the whole test process instead would change the kernels every other test runs on. lm-eval
runs against ``llamactor serve --batch-invariant`` daemons, each its own process too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import llamactor
from llamactor.base.config import Config
from llamactor.base.errors import BatchInvarianceError, InvalidRequestError
from llamactor.native import invariance

from tests.support.daemon import API_KEY, MODEL_ID, start_daemon
from tests.support.scoring import TASK, run_lm_eval

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["model_path", "instruct_path"])
def scenarios(request: pytest.FixtureRequest) -> dict[str, Any]:
    path = request.getfixturevalue(request.param)
    run = subprocess.run([sys.executable, "-m", "tests.support.batch_invariant_worker", path], capture_output=True,
                         text=True, timeout=600, cwd=ROOT, env={k: v for k, v in os.environ.items()
                                                                if k != invariance.TILED_MM_VAR})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def assert_pairs_equal(pairs: list[list[Any]]) -> None:
    for got, expected in pairs:
        assert got["token_ids"] == expected["token_ids"]
        assert got["logprobs"] == expected["logprobs"]
        assert got["prompt_logprobs"] == expected["prompt_logprobs"]


@pytest.mark.timeout(600)
def test_requests_in_a_batch_of_eight_get_the_very_numbers_they_get_alone(scenarios: dict[str, Any]) -> None:
    assert scenarios["mode_reported"] == [True, True]  # info and the batcher's stats say so
    assert len(scenarios["batched_vs_alone"]) == 8
    assert_pairs_equal(scenarios["batched_vs_alone"])


def test_a_prompt_after_a_prefix_cache_hit_gets_the_numbers_of_one_computed_cold(scenarios: dict[str, Any]) -> None:
    assert scenarios["cached_tokens"] > 0
    assert_pairs_equal(scenarios["cached_vs_recomputed"])


def test_a_stream_resumed_after_a_batcher_crash_gets_the_numbers_of_an_uninterrupted_one(
        scenarios: dict[str, Any]) -> None:
    assert scenarios["restarts"] == 1
    assert_pairs_equal(scenarios["across_a_crash"])


def test_sequences_preempted_for_kv_cells_get_the_numbers_of_unpressured_ones(scenarios: dict[str, Any]) -> None:
    """8 x 40 tokens in 256 cells: the cache is flushed (packed_kv.py) and the sequences resume from
    the RAM tier, or recompute without one, with the very numbers they get with room to spare."""
    tiered, recomputed = scenarios["preempted_vs_not_stats"], scenarios["preempted_recomputed_vs_not_stats"]
    assert tiered["kv_flushes"] > 0 and tiered["restored"] > 0
    assert recomputed["kv_flushes"] > 0 and recomputed["preemptions"] > 0 and recomputed["restored"] == 0
    assert_pairs_equal(scenarios["preempted_vs_not"])
    assert_pairs_equal(scenarios["preempted_recomputed_vs_not"])


def test_a_prompt_restored_from_the_disk_tier_after_a_restart_gets_the_numbers_of_one_computed_cold(
        scenarios: dict[str, Any]) -> None:
    assert scenarios["disk_restored"] == 1
    assert_pairs_equal(scenarios["disk_restore_vs_recomputed"])


def test_sequences_flushed_for_a_seq_id_while_they_run_get_the_numbers_they_get_alone(
        scenarios: dict[str, Any]) -> None:
    """8 requests on 4 sequences and 3 seq_ids for cached prefixes: admissions flush the cache
    while others run, and those resume with the very numbers they get alone."""
    assert scenarios["seq_id_pressure_flushes"] > 0
    assert_pairs_equal(scenarios["seq_id_pressure_vs_alone"])


def lm_eval_loglikelihoods(tmp_path: Path, num_concurrent: int) -> list[list[Any]]:
    """Each choice's (log-likelihood, is_greedy) from lm-eval's ``local-completions`` on a fresh
    ``llamactor serve --batch-invariant``."""
    daemon = start_daemon("--n-parallel", "8", "--api-key", API_KEY, "--batch-invariant")
    try:
        health = httpx.get(f"{daemon.url}/health", headers={"Authorization": f"Bearer {API_KEY}"}).json()
        assert [r["batch_invariant"] for m in health["models"].values() for r in m["replicas"]] == [True]
        docs = run_lm_eval(daemon.url, MODEL_ID, API_KEY, tmp_path / f"run{num_concurrent}", num_concurrent)
    finally:
        assert daemon.stop() == 0
    return [d["resps"] for d in docs]


@pytest.mark.timeout(900)
def test_lm_eval_log_likelihoods_with_eight_concurrent_requests_equal_those_one_at_a_time(tmp_path: Path) -> None:
    eight, one = lm_eval_loglikelihoods(tmp_path, 8), lm_eval_loglikelihoods(tmp_path, 1)
    assert len(eight) == len(TASK.read_text().splitlines())
    assert eight == one


@pytest.mark.pure
def test_the_mode_refuses_settings_it_cannot_make_invariant_with_a_clear_error() -> None:
    for options, words in [({"flash_attn": "off"}, "flash attention"), ({"n_ubatch": 64}, "n_ubatch <= 32"),
                           ({"n_gpu_layers": -1}, "CPU only"), ({"sample_in_graph": True}, "sample_in_graph"),
                           ({"kv_type": "q8_0"}, "f16 KV cache"), ({"loras": {"a": "a.gguf"}}, "LoRA")]:
        with pytest.raises(InvalidRequestError, match=words):
            Config(batch_invariant=True, **options)
    config = Config(batch_invariant=True, flash_attn="on", n_gpu_layers=0)
    assert config.n_ubatch == 32 and Config().n_ubatch == 512


@pytest.mark.pure
def test_asking_for_the_mode_after_a_model_was_loaded_without_the_variable_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(invariance.TILED_MM_VAR, "1")  # tiled on; undone after the test
    monkeypatch.setattr(invariance, "_model_loaded", True)
    with pytest.raises(BatchInvarianceError, match="GGML_CPU_TILED_MM=0"):
        llamactor.start(batch_invariant=True)  # refused before anything loads
    monkeypatch.setenv(invariance.TILED_MM_VAR, "0")  # in the environment from the start: fine
    invariance.claim_tiled_mm_off()


@pytest.mark.pure
def test_the_first_load_in_a_process_sets_the_variable_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(invariance.TILED_MM_VAR, "1")  # tiled on; undone after the test
    monkeypatch.setattr(invariance, "_model_loaded", False)
    invariance.claim_tiled_mm_off()
    assert os.environ[invariance.TILED_MM_VAR] == "0"

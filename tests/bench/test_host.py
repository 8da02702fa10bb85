"""The benchmark's issue-28 workloads: ``host`` (real and replayed decodes) and ``streams`` (N callers
over HTTP), end to end at a tiny size on the real model, and their pure helpers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from llamactor.base.config import MAX_SEQUENCES
from llamactor.bench import baselines, report, streams
from llamactor.bench.host import measure_host, per_step
from llamactor.bench.prompts import uniform_prompts
from llamactor.base.config import Config
from llamactor.bench.replay import Recording, null_config, start_host_tree
from llamactor.native.engine import Engine
from llamactor.bench.servers import running_server, serve_command

HOST_FIGURES = {"steps", "host_ms", "schedule_ms", "sample_ms", "mask_ms", "score_ms", "post_other_ms", "decode_ms",
                "wall_ms", "tokens_per_s"}


@dataclass(slots=True)
class FutureDecodeResult:
    """A decode result as the engine may return it once sampling runs in llama.cpp's graph."""

    logits: np.ndarray
    failed_seq_ids: frozenset[int]
    tokens: np.ndarray | None


@pytest.mark.pure
def test_per_step_divides_the_counters_deltas_by_the_steps_taken() -> None:
    before = {"steps": 10, "step_ms": {"schedule": 1.0, "decode": 100.0, "mask": 0.0, "sample": 2.0, "score": 0.0,
                                       "postprocess": 5.0, "embed": 0.0}}
    after = {"steps": 14, "step_ms": {"schedule": 3.0, "decode": 500.0, "mask": 0.4, "sample": 6.0, "score": 0.0,
                                      "postprocess": 13.0, "embed": 0.0}}
    m = per_step(before, after, wall_s=0.5, tokens=64)
    assert m["steps"] == 4 and m["host_ms"] == pytest.approx(2.5) and m["schedule_ms"] == pytest.approx(0.5)
    assert m["sample_ms"] == pytest.approx(1.0) and m["mask_ms"] == pytest.approx(0.1)
    assert m["post_other_ms"] == pytest.approx(2.0 - 1.0 - 0.1) and m["decode_ms"] == pytest.approx(100.0)
    assert m["wall_ms"] == pytest.approx(125.0) and m["tokens_per_s"] == pytest.approx(128.0)


@pytest.mark.pure
def test_a_recording_replays_every_per_row_field_cyclically_and_keeps_the_others() -> None:
    rec = Recording(max_steps=2, rows_per_step=3)
    logits = np.arange(4 * 5, dtype=np.float32).reshape(4, 5)
    rec.offer(FutureDecodeResult(logits, frozenset({7}), np.array([10, 11, 12, 13])))
    logits[:] = -1  # the engine's buffer is overwritten by the next decode: the recording kept a copy
    rec.offer(FutureDecodeResult(np.zeros((0, 5), np.float32), frozenset(), None))  # no rows: not kept
    rec.offer(FutureDecodeResult(np.full((2, 5), 100, np.float32), frozenset(), np.array([20, 21])))
    rec.offer(FutureDecodeResult(np.full((1, 5), 200, np.float32), frozenset(), np.array([30])))  # full already
    assert rec.full and rec.n_rows == 5
    first, second = rec.replay(4), rec.replay(4)
    assert isinstance(first, FutureDecodeResult) and first.failed_seq_ids == frozenset()
    assert first.tokens.tolist() == [10, 11, 12, 20] and second.tokens.tolist() == [21, 10, 11, 12]
    assert first.logits[0, 1] == 1 and first.logits[3, 0] == 100 and second.logits.shape == (4, 5)
    assert rec.replay(12).tokens.tolist() == [20, 21, 10, 11, 12, 20, 21, 10, 11, 12, 20, 21]


@pytest.mark.pure
def test_a_replayed_field_that_is_none_stays_none() -> None:
    rec = Recording(max_steps=1)
    rec.offer(FutureDecodeResult(np.ones((2, 3), np.float32), frozenset(), None))
    replayed = rec.replay(3)
    assert replayed.tokens is None and replayed.logits.shape == (3, 3)


@pytest.mark.pure
def test_the_null_config_goes_past_the_sequences_a_llama_context_holds_only_when_asked() -> None:
    assert null_config(64).n_parallel == 64 and null_config(64).seq_ids <= MAX_SEQUENCES
    assert null_config(250).n_parallel == 250 and null_config(250).seq_ids == MAX_SEQUENCES  # a real context's
    big = null_config(300, n_ctx=300 * 100)
    assert big.n_parallel == 300 and big.n_seq_ids >= 2 * 300 and big.n_batch >= 300 and big.max_queue >= 300


@pytest.mark.pure
def test_streams_prompts_share_no_more_than_their_first_word_and_ratios_are_per_n() -> None:
    a, b = streams.prompt(3, 16), streams.prompt(4, 16)
    assert a.split()[0] == b.split()[0] and a.split()[1] != b.split()[1] and len(a.split()) == len(b.split()) == 18
    assert streams.summarize([10.0, 30.0, 20.0], 60, 2.0) == {
        "tokens_per_s": 30.0, "latency_p50_ms": 20.0, "latency_p90_ms": 30.0, "requests": 3, "tokens": 60}
    fig = {"greedy": {"1": {"tokens_per_s": 50.0}, "2": {"tokens_per_s": 90.0}}}
    theirs = {"greedy": {"1": {"tokens_per_s": 100.0}, "2": {"tokens_per_s": 90.0}}}
    assert streams.ratios({"llamactor": fig, "llama_server_bs": theirs}) == {"greedy": {"1": 0.5, "2": 1.0}}


@pytest.mark.pure
def test_the_report_renders_the_streams_table_and_reads_its_target() -> None:
    figure = {"tokens_per_s": 100.0, "latency_p50_ms": 50.0}
    by_sampler = {s: {"1": figure, "64": figure} for s in streams.SAMPLERS}
    results = {"streams": {"rounds": 1, "prompt_words": 64, "max_tokens": 32, "n_parallel": 64, "n_ctx": 8192,
                           "n_gpu_layers": 99, **{name: by_sampler for name in streams.SERVERS},
                           "vs_bs": {s: {"1": 1.0, "64": 1.0} for s in streams.SAMPLERS}, "min_ratio_vs_bs": 1.0}}
    table = report.markdown(results, {"timestamp": "t", "machine": "m", "model": "g",
                                      "settings": {"n_threads": 2, "max_tokens": 32, "quick": True}})
    assert "| 64 | default | 100 (50) | 100 (50) | 100 (50) | 1.000 |" in table
    assert "| streams: tok/s, llamactor / llama-server -bs, lowest over N and samplers | 1.000 | >= 1 | yes |" in table


def test_the_host_workload_runs_both_legs_end_to_end_and_reports_them(model_path: str) -> None:
    r = measure_host(model_path, real_sizes=(4,), null_sizes=(4, 8), max_tokens=4, repeats=1, n_threads=2,
                     n_ctx=1024)
    assert set(r["real"]) == {"c4"} and set(r["null"]) == {"c4", "c8"} and r["recorded_rows"] > 0
    for leg in (r["real"]["c4"], r["null"]["c4"], r["null"]["c8"]):
        assert set(leg) == {"greedy", "default"}
        for m in leg.values():
            assert set(m) == HOST_FIGURES and m["steps"] >= 4 and m["host_ms"] > 0
    assert r["null"]["c8"]["greedy"]["tokens_per_s"] > r["real"]["c4"]["greedy"]["tokens_per_s"]  # no decode
    table = report.markdown({"host": r}, {"timestamp": "t", "machine": "m", "model": "g",
                                          "settings": {"n_threads": 2, "max_tokens": 4, "quick": True}})
    assert "| 8 | default | null |" in table and "| 4 | greedy | real |" in table


@pytest.mark.parametrize("runs_ahead", [False, True])
def test_a_recording_keeps_the_steps_of_either_loop(model_path: str, runs_ahead: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU build's batcher runs the overlapped loop (launch, then collect), which never calls
    ``Engine.decode``: its steps are recorded too (the host_cap and sim_device workloads replay them)."""
    monkeypatch.setattr(Engine, "decodes_async", property(lambda self: runs_ahead))
    recording = Recording()
    config = Config(model=model_path, n_parallel=4, n_ctx=1024, n_threads=2, max_restarts=0, sample_in_graph=True)
    with start_host_tree(config, recording, replay=False) as llm:
        for future in [llm.submit(p, max_tokens=4, temperature=0, ignore_eos=True) for p in uniform_prompts(4)]:
            future.result()
    assert recording.kept and recording.n_rows > 0


def test_the_ceiling_prefills_in_chunks_of_n_batch(model_path: str) -> None:
    r = baselines.ceiling(model_path, uniform_prompts(4), 2, n_ctx=512, n_threads=2, n_batch=16)  # ~60 prompt tokens
    assert (r.n_requests, r.n_tokens) == (4, 8)


def test_the_streams_callers_get_completions_from_llamactor_serve(model_path: str) -> None:
    command = serve_command(model_path, "streams", "--n-parallel", "4", "--n-ctx", "1024", "--n-threads", "2")
    with running_server(command) as (url, _pid):
        out = streams.measure_server(url, [1, 2], {"prompt_words": 8, "max_tokens": 3, "rounds": 1})
    assert set(out) == set(streams.SAMPLERS)
    for by_n in out.values():
        assert by_n["1"]["tokens"] == 3 and by_n["2"]["tokens"] == 6 and by_n["2"]["requests"] == 2

"""The engine layer on the real model: decode, KV operations, split-on-full, sampling, tokenizer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from llamactor.native import devices
from llamactor.native.engine import Engine
from llamactor.native.sampling import RowSpec, sample

from tests.conftest import NEAR_TIE, decode_prompt


@pytest.fixture(scope="module")
def engine(model_path: str) -> Iterator[Engine]:
    e = Engine(model_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=4, n_threads=2)
    yield e
    e.close()


def spec(**kw: object) -> RowSpec:
    base = dict(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, presence_penalty=0.0,
                frequency_penalty=0.0, rng=np.random.default_rng(0), recent_tokens=(), want_logprob=False)
    base.update(kw)
    return RowSpec(**base)  # type: ignore[arg-type]


def test_a_q8_0_kv_cache_holds_a_token_in_about_half_the_bytes_and_predicts_the_same_next_token(
        engine: Engine, model_path: str) -> None:
    tokens = engine.tokenizer.tokenize("The lighthouse keeper climbed the stairs every night to light the lamp, and")
    engine.clear()
    f16_logits = decode_prompt(engine, 0, tokens)
    f16_bytes = engine.seq_state_bytes(0)
    engine.clear()
    q8 = Engine(model_path, n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=4, n_threads=2, kv_type="q8_0")
    try:
        assert q8.info.kv_type == "q8_0"
        q8_logits = decode_prompt(q8, 0, tokens)
        assert q8.seq_state_bytes(0) <= 0.55 * f16_bytes  # 34 bytes per 32 values instead of 64
        top2 = np.sort(f16_logits)[-2:]
        assert np.argmax(q8_logits) == np.argmax(f16_logits) or top2[1] - top2[0] < NEAR_TIE
    finally:
        q8.close()


def test_the_engine_reports_the_context_it_really_allocated(engine: Engine) -> None:
    info = engine.info
    assert info.n_ctx >= 1024 and info.n_seq_max == 4 and info.n_batch == 256
    assert info.n_vocab == 262144 and info.n_ctx_train == 32768


def test_tokenize_then_detokenize_round_trips_text(engine: Engine) -> None:
    text = "Grüße aus Köln — 東京 🚀"
    ids = engine.tokenizer.tokenize(text, add_special=False)
    assert engine.tokenizer.detokenize(ids) == text
    assert engine.tokenizer.tokenize(text)[0] == engine.tokenizer.bos_id


def test_a_prefix_copied_with_seq_cp_gives_the_same_logits_as_recomputing_it(engine: Engine) -> None:
    engine.clear()
    prefix = engine.tokenizer.tokenize("You are a terse assistant who answers in one word.")
    suffix = engine.tokenizer.tokenize(" Question: what colour is the sky?", add_special=False)
    recomputed = decode_prompt(engine, 0, prefix + suffix)
    engine.prefill(3, prefix)
    engine.seq_cp(3, 1, 0, len(prefix))
    attached = decode_prompt(engine, 1, suffix, n_past=len(prefix))
    assert engine.seq_pos_max(1) == len(prefix + suffix) - 1
    # other batch shapes, so slightly other logits: the same best token unless the two best nearly tie
    top2 = np.sort(recomputed)[-2:]
    assert np.argmax(attached) == np.argmax(recomputed) or top2[1] - top2[0] < NEAR_TIE
    np.testing.assert_allclose(attached, recomputed, atol=0.05)
    engine.clear()


def test_a_step_that_does_not_fit_the_kv_cache_fails_only_the_sequences_that_do_not_fit(model_path: str) -> None:
    small = Engine(model_path, n_ctx=256, n_batch=256, n_ubatch=256, n_seq_max=2, n_threads=2)
    try:
        assert small.info.n_ctx == 256
        small.prefill(0, [2] + [100] * 200)
        n = 100  # sequence 0 holds 201 cells; 100 more for sequence 1 cannot all fit
        result = small.decode(np.full(n, 100, np.int32), np.arange(n, dtype=np.int32), np.full(n, 1, np.int32),
                              np.array([0] * (n - 1) + [1], np.int8))
        assert result.failed_seq_ids == frozenset({1})
        assert small.seq_pos_max(0) == 200
    finally:
        small.close()


@pytest.mark.pure
def test_greedy_rows_cost_one_argmax_and_match_numpy() -> None:
    logits = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float32)
    result = sample(logits, [spec(), spec(), spec()])
    assert result.tokens == list(np.argmax(logits, axis=1)) and result.logprobs == [None] * 3


@pytest.mark.pure
def test_seeded_sampling_repeats_and_top_k_one_is_greedy() -> None:
    logits = np.random.default_rng(2).standard_normal((2, 5000)).astype(np.float32)
    draws_a = sample(logits, [spec(temperature=1.0, rng=np.random.default_rng(7))] * 2).tokens
    draws_b = sample(logits, [spec(temperature=1.0, rng=np.random.default_rng(7))] * 2).tokens
    assert draws_a == draws_b
    greedy_by_top_k = sample(logits, [spec(temperature=1.5, top_k=1), spec(temperature=0.7, top_k=1)]).tokens
    assert greedy_by_top_k == list(np.argmax(logits, axis=1))


@pytest.mark.pure
def test_top_p_and_min_p_never_draw_outside_the_nucleus() -> None:
    logits = np.full((1, 1000), -10.0, np.float32)
    logits[0, [3, 4, 5]] = [5.0, 4.9, 4.8]
    rng = np.random.default_rng(3)
    drawn = {sample(logits, [spec(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0, rng=rng)]).tokens[0] for _ in range(50)}
    assert drawn <= {3, 4, 5} and len(drawn) > 1
    drawn = {sample(logits, [spec(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, rng=rng)]).tokens[0] for _ in range(50)}
    assert drawn <= {3, 4, 5}


@pytest.mark.pure
def test_penalties_push_down_recent_tokens_and_logprobs_are_from_the_raw_distribution() -> None:
    logits = np.zeros((1, 10), np.float32)
    logits[0, 2], logits[0, 3] = 2.0, 1.9
    result = sample(logits.copy(), [spec(repeat_penalty=1.5, recent_tokens=[2], want_logprob=True, top_logprobs=2)])
    assert result.tokens == [3]
    raw = logits[0] - np.log(np.exp(logits[0]).sum())
    assert result.logprobs[0] == pytest.approx(float(raw[3]), abs=1e-5)
    # the alternatives are the raw distribution's most likely tokens, best first
    assert [t for t, _ in result.top[0]] == [2, 3]
    assert result.top[0][0][1] == pytest.approx(float(raw[2]), abs=1e-5)


def test_decode_batch_takes_one_entry_per_sequence_and_matches_the_mixed_form(engine: Engine) -> None:
    engine.clear()
    prompts = [engine.tokenizer.tokenize(t) for t in ("The sky is", "Two plus two is")]
    for seq_id, tokens in enumerate(prompts):
        engine.prefill(seq_id, tokens[:-1])
    per_sequence = engine.decode_batch([(s, t[-1], len(t) - 1) for s, t in enumerate(prompts)]).logits.copy()
    for seq_id, tokens in enumerate(prompts):
        engine.seq_rm(seq_id, len(tokens) - 1, -1)
    mixed = engine.decode(np.array([t[-1] for t in prompts], np.int32), np.array([len(t) - 1 for t in prompts], np.int32),
                          np.array([0, 1], np.int32), np.ones(2, np.int8)).logits
    np.testing.assert_array_equal(per_sequence, mixed)
    engine.clear()


def test_logits_rows_given_back_to_the_kernel_are_written_afresh_by_the_next_decode(engine: Engine) -> None:
    engine.clear()
    tokens = engine.tokenizer.tokenize("The capital of France is")
    wants = np.ones(len(tokens), np.int8)  # every row an output: rows past the usual ones are written
    def every_row() -> np.ndarray:
        return engine.decode(np.array(tokens, np.int32), np.arange(len(tokens), dtype=np.int32),
                             np.zeros(len(tokens), np.int32), wants).logits.copy()
    first = every_row()
    engine.rows.release(keep=0)
    engine.seq_rm(0)
    again = every_row()
    np.testing.assert_array_equal(first, again)
    assert np.isfinite(again).all() and again.any(axis=1).all()
    engine.clear()


def _packed(allowed: list[int], n_vocab: int) -> np.ndarray:
    bits = np.zeros(((n_vocab + 31) // 32) * 32, np.uint8)
    bits[allowed] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


@pytest.mark.pure
def test_a_grammar_mask_limits_only_its_own_row_greedy_or_sampled() -> None:
    logits = np.zeros((3, 40), np.float32)
    logits[:, 5] = 10.0  # every row's favourite
    mask = _packed([7, 9], 40)
    result = sample(logits.copy(), [spec(allowed=mask), spec(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                                              allowed=mask, rng=np.random.default_rng(1)), spec()])
    assert result.tokens[0] in (7, 9) and result.tokens[1] in (7, 9)
    assert result.tokens[2] == 5  # the unconstrained row in the same step is untouched


@pytest.mark.pure
def test_logit_bias_forces_or_bans_a_token_and_logprobs_stay_raw() -> None:
    logits = np.zeros((2, 10), np.float32)
    logits[:, 2] = 3.0
    result = sample(logits.copy(), [spec(logit_bias=((2, -100.0),), want_logprob=True), spec(logit_bias=((8, 100.0),))])
    assert result.tokens[0] != 2 and result.tokens[1] == 8
    raw = logits[0] - np.log(np.exp(logits[0]).sum())
    assert result.logprobs[0] == pytest.approx(float(raw[result.tokens[0]]), abs=1e-5)


def test_the_engine_reports_the_builds_devices_and_resolves_the_offload_to_it(engine: Engine) -> None:
    info = engine.info
    cpus = [d for d in info.devices if d.type == "cpu"]
    assert len(cpus) == 1 and cpus[0].name == "CPU" and cpus[0].memory_total > 0
    assert 0 <= cpus[0].memory_free <= cpus[0].memory_total
    assert info.gpu_offload == devices.gpu_offload() == any(d.is_gpu for d in info.devices)
    assert info.n_gpu_layers == (-1 if info.gpu_offload else 0)  # Engine(n_gpu_layers=None): the build's default
    assert devices.recent_devices()[-1].name == "CPU"  # ggml lists the CPU last

"""The host-RAM cache tier on the real model: a restored sequence equals a recomputed one (beyond
the sliding window), evicted conversations come back warm, and so do they after a batcher crash."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

import llamactor
from llamactor.native.engine import Engine
from llamactor.scheduling import cell_rent

from tests.conftest import NEAR_TIE, assert_equal_up_to_near_tie, audit_kv, batcher_ref, decode_prompt
from tests.support.chat_prompts import PERSONA, chat_tokens

# The same KV in other cells changes the order of llama.cpp's attention sums, and a prefix
# computed in other chunks has other KV (NEAR_TIE): next-token logits measured here moved by a
# mean of 0.16 (max 0.93) for the first, 0.3 for both. Missing sliding-window cells move them by
# a mean of 1.3 (700 positions) to 3.6 (300 positions), max 7 to 20.
MEAN_LOGIT_DRIFT = 0.5


@pytest.fixture(scope="module", params=["f16", "q8_0"])
def engine(model_path: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """A bare engine with each KV type: the tests below run unchanged under both."""
    e = Engine(model_path, n_ctx=4096, n_batch=512, n_ubatch=512, n_seq_max=4, n_threads=2, kv_type=request.param)
    yield e
    e.close()


def long_tokens(engine: Engine) -> list[int]:
    tokens = engine.tokenizer.tokenize(PERSONA + PERSONA)
    assert len(tokens) > 1200  # beyond two sliding windows of 512
    return tokens


def recomputed_logits(engine: Engine, tokens: list[int], n: int) -> np.ndarray:
    """Next-token logits after ``tokens[:n + 1]`` computed from scratch on sequence 0."""
    engine.clear()
    engine.prefill(0, tokens[:n])
    return decode_prompt(engine, 0, tokens[n:n + 1], n_past=n)


def assert_same_next_token_logits(restored: np.ndarray, recomputed: np.ndarray) -> None:
    assert float(np.abs(restored - recomputed).mean()) < MEAN_LOGIT_DRIFT
    top = np.sort(recomputed)[-2:]
    if top[1] - top[0] >= NEAR_TIE:
        assert int(np.argmax(restored)) == int(np.argmax(recomputed))


@pytest.mark.parametrize("n_keep", [1200, 700, 300], ids=lambda n: f"trimmed_to_{n}")
def test_a_restored_sequence_gives_the_logits_of_recomputation_at_any_length_beyond_the_window(
        engine: Engine, n_keep: int) -> None:
    tokens = long_tokens(engine)
    n = 1200
    engine.clear()
    engine.prefill(0, tokens[:n])
    state = engine.save_seq(0, n)
    assert engine.seq_pos_min(0) == 0 and engine.seq_pos_max(0) == n - 1  # saving left it whole
    assert len(state.windows) == 2  # positions 0..687 of the sliding-window layers, in two windows
    engine.seq_rm(0)
    engine.prefill(2, tokens[:50])  # other cells in use: the restore lands elsewhere
    assert engine.restore_seq(1, state, scratch_id=3)
    assert (engine.seq_pos_min(1), engine.seq_pos_max(1)) == (0, n - 1)  # window cells included
    assert engine.seq_pos_max(3) == -1  # the scratch sequence is empty again
    engine.seq_rm(1, n_keep, -1)
    restored = decode_prompt(engine, 1, tokens[n_keep:n_keep + 1], n_past=n_keep)
    assert_same_next_token_logits(restored, recomputed_logits(engine, tokens, n_keep))


def test_a_saved_restored_and_saved_again_sequence_has_the_same_bytes(engine: Engine) -> None:
    tokens = long_tokens(engine)
    engine.clear()
    engine.prefill(0, tokens[:1200])
    state = engine.save_seq(0, 1200)
    with pytest.raises(RuntimeError, match="holds positions 0..1199"):
        engine.save_seq(0, 1000)  # a caller out of step with the cells saves nothing
    engine.clear()
    engine.prefill(2, tokens[:50])  # other cells in use: the restore lands elsewhere
    assert engine.restore_seq(0, state, scratch_id=3)
    assert engine.save_seq(0, 1200) == state  # every position, key and value, in every layer


def test_without_its_older_window_cells_a_restored_sequence_would_be_wrong(engine: Engine) -> None:
    """The contrast that shows the logits test can fail: llama.cpp's state call alone."""
    tokens = long_tokens(engine)
    engine.clear()
    engine.prefill(0, tokens[:1200])
    state = dataclasses.replace(engine.save_seq(0, 1200), windows=())
    engine.clear()
    assert engine.restore_seq(1, state, scratch_id=3)
    assert engine.seq_pos_min(1) > 0  # the sliding-window layers lost positions
    engine.seq_rm(1, 300, -1)
    restored = decode_prompt(engine, 1, tokens[300:301], n_past=300)
    assert float(np.abs(restored - recomputed_logits(engine, tokens, 300)).mean()) > 2 * MEAN_LOGIT_DRIFT


def conversation() -> list[dict[str, str]]:
    return [{"role": "system", "content": PERSONA}, {"role": "user", "content": "Which ship did you sail in 1853?"}]


def crowd_out(llm: llamactor.LLM, n: int) -> None:
    """Requests whose KV needs every cell of a 2048-cell context: the cached entries are evicted."""
    for i in range(n):
        llm.ask(f"Filler {i}: " + "the weather at sea was calm and grey and " * 40, max_tokens=8)


def test_an_evicted_conversation_comes_back_from_host_ram_and_answers_as_recomputed(
        start_llm, reference_engine: Engine) -> None:
    llm = start_llm(n_parallel=2, n_ctx=2048, batch_timeout_ms=5)
    turn1 = conversation()
    first = llm.chat(turn1, max_tokens=24, temperature=0)
    crowd_out(llm, 4)
    stats = llm.stats()
    assert stats["prefix_cache"]["evicted_cells"] > 0 and stats["cache_ram"]["saved"] >= 1
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And what did it carry?"}]
    second = llm.chat(turn2, max_tokens=24, temperature=0)
    assert second.usage.cached_tokens >= first.usage.prompt_tokens  # the history, from RAM
    ram = llm.stats()["cache_ram"]
    assert ram["restored"] == 1 and ram["restored_tokens"] == second.usage.cached_tokens
    assert audit_kv(llm) == []
    uncached = start_llm(n_parallel=1, n_ctx=2048, prefix_cache=False).chat(turn2, max_tokens=24, temperature=0)
    assert_equal_up_to_near_tie(reference_engine, chat_tokens(reference_engine, turn2), second, uncached)


def test_idle_cached_prefixes_leave_the_cells_while_others_compute_and_come_back_from_ram(
        start_llm, reference_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept cells pay rent (``cell_rent``; docs/performance.md, *Kept cells pay rent*): while a lone
    stream computes, the idle conversation leaves the cells (saved: that pays), and its next turn
    finds its history in RAM. The rate is made steep and left unfitted here, so that when it goes
    depends on the rows computed, not on this machine's step times."""
    monkeypatch.setattr(cell_rent, "PRIOR_CELL_TOKEN_RATIO", 1.0)
    monkeypatch.setattr(cell_rent, "MIN_CELLS_SPREAD", float("inf"))
    llm = start_llm(n_parallel=2, n_ctx=2048, batch_timeout_ms=5, prefix_cache_rent=True)
    turn1 = conversation()
    first = llm.chat(turn1, max_tokens=24, temperature=0)
    kept = llm.stats()["prefix_cache"]["cells"]
    assert kept >= first.usage.prompt_tokens
    llm.ask("Count slowly:", max_tokens=3 * cell_rent.CHECK_EVERY, ignore_eos=True)
    stats = llm.stats()
    assert stats["cache_ram"]["rent"]["let_go"] >= 1 and not stats["cache_ram"]["rent"]["fitted"]
    assert stats["prefix_cache"]["cells"] < kept - 100 and stats["cache_ram"]["saved"] >= 1
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And what did it carry?"}]
    second = llm.chat(turn2, max_tokens=24, temperature=0)
    assert second.usage.cached_tokens >= first.usage.prompt_tokens  # the history, from RAM
    assert llm.stats()["cache_ram"]["restored"] == 1
    assert audit_kv(llm) == []
    uncached = start_llm(n_parallel=1, n_ctx=2048, prefix_cache=False).chat(turn2, max_tokens=24, temperature=0)
    assert_equal_up_to_near_tie(reference_engine, chat_tokens(reference_engine, turn2), second, uncached)


def test_without_the_ram_tier_the_evicted_conversation_is_recomputed(start_llm) -> None:
    llm = start_llm(n_parallel=2, n_ctx=2048, batch_timeout_ms=5, cache_ram_mib=0)
    first = llm.chat(conversation(), max_tokens=24, temperature=0)
    crowd_out(llm, 4)
    turn2 = conversation() + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    # the cells kept the start of the history at most (its entry was trimmed or dropped)
    assert llm.chat(turn2, max_tokens=8, temperature=0).usage.cached_tokens < first.usage.prompt_tokens - 100
    assert "cache_ram" not in llm.stats()


def test_after_a_batcher_crash_the_next_turn_finds_its_history_warm(start_llm) -> None:
    llm = start_llm(n_parallel=2, n_ctx=2048, batch_timeout_ms=5)
    first = llm.chat(conversation(), max_tokens=24, temperature=0)
    batcher_ref(llm).tell(object())  # an unknown message: the batcher crashes
    turn2 = conversation() + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    second = llm.chat(turn2, max_tokens=8, temperature=0)  # waits for the restarted batcher
    stats = llm.stats()
    assert stats["restarts"] == 1 and stats["generation"] == 2
    assert second.usage.cached_tokens >= first.usage.prompt_tokens
    assert stats["cache_ram"]["restored"] == 1
    assert audit_kv(llm) == []


def one_off(llm: llamactor.LLM, first: int, n: int) -> None:
    """``n`` short requests, 4 at a time, none sharing more than a few tokens with another."""
    prompts = [f"Note {i}: item{i * 31}" for i in range(first, first + n)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: llm.ask(p, max_tokens=1), prompts))


@pytest.mark.timeout(300)  # 88 requests and a conversation: ~50 s on 2 busy cores
def test_one_off_requests_stop_being_saved_while_a_conversation_that_came_back_is_saved_and_restored(
        start_llm) -> None:
    """The tier's cost model (docs/performance.md, *Tiering that pays for itself*): every admission
    evicts an entry (6 seq_ids for 4 sequences); one-off prompts never come back, so after a few
    dozen evictions saving them stops; a conversation whose history was reused is still saved.
    (Without the model, every eviction is saved.)"""
    llm = start_llm(n_parallel=4, n_seq_ids=6, n_ctx=2048, batch_timeout_ms=5)
    one_off(llm, 0, 64)
    before = llm.stats()["cache_ram"]
    one_off(llm, 64, 16)
    after = llm.stats()["cache_ram"]
    assert after["saved"] == before["saved"] < 64  # none of the last 16 evictions was saved
    assert after["save_cost"]["saves_skipped"] >= 16 and after["save_cost"]["p_reuse_fresh"] < 0.01

    turn1 = conversation()
    first = llm.chat(turn1, max_tokens=8, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And what did it carry?"}]
    second = llm.chat(turn2, max_tokens=8, temperature=0)
    assert second.usage.cached_tokens >= first.usage.prompt_tokens  # turn 1's cells: a prefix reused
    one_off(llm, 80, 8)  # its entry is evicted: a returning one, saved
    assert llm.stats()["cache_ram"]["saved"] == after["saved"] + 1
    turn3 = turn2 + [{"role": "assistant", "content": second.text}, {"role": "user", "content": "And then?"}]
    third = llm.chat(turn3, max_tokens=8, temperature=0)
    assert third.usage.cached_tokens >= second.usage.prompt_tokens  # the history, from RAM
    assert llm.stats()["cache_ram"]["restored"] == 1
    assert audit_kv(llm) == []

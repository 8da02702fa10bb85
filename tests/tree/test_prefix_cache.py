"""The prefix cache on the real model: reuse across requests, n choices, eviction, sliding window, crashes.

The default model attends over a 512-token window in most layers, so the conversations here are
longer than that: a cached prefix is only right if the window before its end is still in KV.
"""

from __future__ import annotations

import concurrent.futures

import pytest

import llamactor

from tests.conftest import assert_equal_up_to_near_tie, audit_kv, batcher_ref, cancel_a_story_after_its_first_piece
from tests.support.chat_prompts import PERSONA, chat_tokens

# The cache's reuse, sliding window and eviction hold for a quantized KV cache too (kv_type q8_0:
# attached and recomputed cells hold the same quantized values; near-ties read on a q8_0 reference).
# A quantized cache decodes through flash attention, slower on the CPU: a longer timeout.
KV_TYPES = pytest.mark.parametrize("kv_type", ["f16", pytest.param("q8_0", marks=pytest.mark.timeout(360))])


@KV_TYPES
def test_the_next_chat_turn_computes_only_its_new_tokens_and_answers_as_without_the_cache(
        start_llm, reference_engines, kv_type: str) -> None:
    reference_engine = reference_engines[kv_type]
    llm = start_llm(n_parallel=2, n_ctx=4096, kv_type=kv_type)
    turn1 = [{"role": "system", "content": PERSONA}, {"role": "user", "content": "Which ship did you sail in 1853?"}]
    first = llm.chat(turn1, max_tokens=24, temperature=0)
    assert first.usage.prompt_tokens > 600  # longer than the sliding window
    turn2 = turn1 + [{"role": "assistant", "content": first.text},
                     {"role": "user", "content": "And what did it carry?"}]
    before = llm.stats()["prompt_tokens_computed"]
    second = llm.chat(turn2, max_tokens=24, temperature=0)
    computed = second.usage.prompt_tokens - second.usage.cached_tokens
    assert llm.stats()["prompt_tokens_computed"] - before == computed
    history = first.usage.prompt_tokens + first.usage.completion_tokens  # what turn 1 left in KV, less one token
    assert second.usage.cached_tokens >= first.usage.prompt_tokens
    assert computed <= (second.usage.prompt_tokens - history) + 4  # the new message and a few boundary tokens
    assert audit_kv(llm) == []

    plain = start_llm(n_parallel=2, n_ctx=4096, prefix_cache=False, kv_type=kv_type)
    uncached = plain.chat(turn2, max_tokens=24, temperature=0)
    assert uncached.usage.cached_tokens == 0
    assert_equal_up_to_near_tie(reference_engine, chat_tokens(reference_engine, turn2), second, uncached)


@KV_TYPES
def test_a_prefix_shorter_than_a_long_cached_entry_still_has_its_sliding_window(
        start_llm, reference_engines, kv_type: str) -> None:
    reference_engine = reference_engines[kv_type]
    llm = start_llm(n_parallel=4, n_ctx=1024, kv_type=kv_type)
    long_entry = llm.ask(PERSONA + " Now tell me about the Petrel.", max_tokens=64, temperature=0, ignore_eos=True)
    # The traffic after it does not fit beside it: llama.cpp's KV head wraps around over the cells
    # the entry's window left behind, which the sliding-window cache would recycle if the entry
    # were their only owner (it must instead give up cells by eviction, from its end).
    for f in [llm.submit(f"Filler {i}: the weather at sea was", max_tokens=48, ignore_eos=True) for i in range(6)]:
        f.result()
    branch = PERSONA[:len(PERSONA) * 3 // 4] + " Which port is the most beautiful?"
    shorter = llm.ask(branch, max_tokens=16, temperature=0)
    assert 500 < shorter.usage.cached_tokens < long_entry.usage.prompt_tokens - 100
    assert audit_kv(llm) == []  # every cached sequence still holds all its positions, window included
    uncached = start_llm(n_parallel=1, n_ctx=4096, prefix_cache=False, kv_type=kv_type).ask(
        branch, max_tokens=16, temperature=0)
    assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(branch), shorter, uncached)


def test_n_choices_compute_their_prompt_once_and_share_it(start_llm) -> None:
    llm = start_llm(n_parallel=4)
    prompt = "Once upon a time in a small village by the sea there lived an old fisherman who"
    choices = llm.ask(prompt, n=4, max_tokens=8, temperature=0.9, seed=11, ignore_eos=True)
    assert len(choices) == 4 and len({c.request_id for c in choices}) == 4
    n_prompt = choices[0].usage.prompt_tokens
    assert sorted(c.usage.cached_tokens for c in choices) == [0] + [n_prompt - 1] * 3
    assert llm.stats()["prompt_tokens_computed"] == n_prompt + 3  # once, plus each sibling's last token
    assert all(c.usage.completion_tokens == 8 for c in choices)
    assert len({c.text for c in choices}) > 1  # seeds seed+i: different draws
    with pytest.raises(llamactor.InvalidRequestError, match="n must be"):
        llm.ask(prompt, n=0)


@KV_TYPES
def test_eviction_under_a_small_kv_cache_keeps_every_running_request_correct(
        start_llm, reference_engines, kv_type: str) -> None:
    reference_engine = reference_engines[kv_type]
    prompts = [f"Report {i}: the {word} harbour master counted the boats and wrote that"
               for i, word in enumerate(["north", "south", "east", "west", "old", "new", "busy", "quiet", "small",
                                         "large", "windy", "foggy"])]

    def run(llm: llamactor.LLM) -> list[llamactor.Completion]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda p: llm.ask(p, max_tokens=40, temperature=0, ignore_eos=True), prompts))

    cached = start_llm(n_parallel=4, n_ctx=512, batch_timeout_ms=5, kv_type=kv_type)  # 12 x ~60 cells cannot all stay
    with_cache = run(cached)
    stats = cached.stats()
    assert stats["prefix_cache"]["evicted_cells"] > 0 and stats["kv_used"] <= stats["kv_size"]
    assert audit_kv(cached) == []
    without = run(start_llm(n_parallel=4, n_ctx=512, batch_timeout_ms=5, prefix_cache=False, kv_type=kv_type))
    assert all(c.usage.completion_tokens == 40 and c.finish_reason == "length" for c in with_cache)
    for prompt, a, b in zip(prompts, with_cache, without):
        assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(prompt), a, b)


def test_the_cell_budget_bounds_what_cached_prefixes_hold(start_llm) -> None:
    llm = start_llm(n_parallel=2, prefix_cache_cells=40)
    for i in range(4):
        llm.ask(f"Budget test {i}: a long enough prompt about ships and the sea and the wind", max_tokens=20,
                ignore_eos=True)
    cache = llm.stats()["prefix_cache"]
    assert 0 < cache["cells"] <= 40 and cache["evicted_cells"] > 0
    assert audit_kv(llm) == []


def test_cancelled_and_preempted_requests_leave_the_index_consistent(start_llm) -> None:
    llm = start_llm(n_parallel=2, n_ctx=256, batch_timeout_ms=5)
    cancel_a_story_after_its_first_piece(llm)
    assert audit_kv(llm) == []
    # Two sequences that together outgrow the 256 cells: the newer is preempted, then resumed.
    futures = [llm.submit(f"Story {i}:", max_tokens=200, temperature=0, ignore_eos=True) for i in range(2)]
    assert [f.result(timeout=120).usage.completion_tokens for f in futures] == [200, 200]
    assert llm.stats()["preemptions"] >= 1
    assert audit_kv(llm) == []


def test_a_restarted_batcher_starts_with_empty_cells_and_replays_its_requests(start_llm) -> None:
    # Without the host-RAM tier, which would give the restarted batcher its predecessor's entries
    # (test_cache_tiers.py).
    llm = start_llm(n_parallel=2, batch_size=8, batch_timeout_ms=300, cache_ram_mib=0)
    llm.ask("Cached before the crash", max_tokens=4)
    assert llm.stats()["prefix_cache"]["entries"] == 1
    queued = llm.submit("Cached before the crash, and more", max_tokens=4, ignore_eos=True)  # waits for its window
    batcher_ref(llm).tell(object())  # an unknown message: the batcher crashes
    replayed = queued.result(timeout=60)
    assert replayed.usage.completion_tokens == 4 and replayed.usage.cached_tokens == 0
    stats = llm.stats()
    assert stats["restarts"] == 1 and stats["prefix_cache"]["entries"] == 1 and stats["prefix_cache"]["hits"] == 0
    assert audit_kv(llm) == []

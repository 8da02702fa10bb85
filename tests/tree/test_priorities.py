"""Priorities, policies, preemption and the watchdog on the real engine and model.

tests/scheduling/test_policy.py checks the same rules as pure scheduling logic."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest

import llamactor
from llamactor.base.errors import StepAbortedError
from llamactor.native.engine import Engine

from tests.conftest import assert_equal_up_to_near_tie, audit_kv


def completion_order(futures: dict[str, concurrent.futures.Future]) -> list[str]:
    """Names of ``futures`` in the order they complete (recorded by done callbacks)."""
    order: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> None:
        with lock:
            order.append(name)

    for name, future in futures.items():
        future.add_done_callback(lambda _f, n=name: record(n))
    concurrent.futures.wait(list(futures.values()), timeout=300)
    assert all(f.exception() is None for f in futures.values())
    return order


def hold_the_only_sequence(llm: llamactor.LLM) -> tuple[object, object]:
    """Start a long low-priority stream and wait until it runs (holding the single seq_id)."""
    stream = llm.stream("Once upon a time", max_tokens=24, temperature=0, ignore_eos=True, priority="low")
    pieces = iter(stream)
    next(pieces)
    return stream, pieces


def test_a_high_priority_request_takes_the_first_free_sequence_ahead_of_a_low_priority_flood(start_llm) -> None:
    llm = start_llm(n_parallel=1, batch_timeout_ms=1)
    stream, pieces = hold_the_only_sequence(llm)
    futures = {f"low{i}": llm.submit(f"Low {i}:", max_tokens=4, ignore_eos=True, priority="low") for i in range(5)}
    futures["high"] = llm.submit("High:", max_tokens=4, ignore_eos=True, priority="high")
    list(pieces)
    assert completion_order(futures)[0] == "high"
    assert [f.result().usage.completion_tokens for f in futures.values()] == [4] * 6


def test_an_aged_low_priority_request_overtakes_fresh_normal_ones(start_llm) -> None:
    # 1000 levels per second: a low-priority request is ahead of normal ones submitted 1 ms later.
    llm = start_llm(n_parallel=1, batch_timeout_ms=1, priority_aging_per_s=1000)
    stream, pieces = hold_the_only_sequence(llm)
    futures = {"low": llm.submit("Low:", max_tokens=3, ignore_eos=True, priority="low")}
    next(pieces)  # at least one decode step later
    futures.update({f"normal{i}": llm.submit(f"Normal {i}:", max_tokens=3, ignore_eos=True) for i in range(3)})
    list(pieces)
    assert completion_order(futures)[0] == "low"


def test_lpm_admits_the_request_with_the_longest_cached_prefix_first(start_llm) -> None:
    llm = start_llm(n_parallel=1, batch_timeout_ms=1, schedule_policy="lpm")
    history = "User: Tell me about lighthouses and the keepers who lived in them.\nAssistant:"
    llm.ask(history, max_tokens=8, temperature=0)
    stream, pieces = hold_the_only_sequence(llm)
    futures = {"new_topic": llm.submit("User: What is a good name for a cat?\nAssistant:", max_tokens=3),
               "next_turn": llm.submit(history + " They kept the lamp lit.\nUser: Why?\nAssistant:", max_tokens=3)}
    list(pieces)
    assert completion_order(futures)[0] == "next_turn"
    assert futures["next_turn"].result().usage.cached_tokens > futures["new_topic"].result().usage.cached_tokens


PRESSURE_PROMPTS = [f"Story {i}: the old ship" for i in range(4)]


def test_sequences_outgrowing_the_kv_cache_are_preempted_and_all_complete_with_the_same_greedy_text(
        start_llm, llm, reference_engine) -> None:
    unpressured = [f.result(timeout=120) for f in
                   [llm.submit(p, max_tokens=100, temperature=0, ignore_eos=True) for p in PRESSURE_PROMPTS]]
    tight = start_llm(n_parallel=4, n_ctx=256, batch_timeout_ms=50)  # 4 x ~107 tokens > 256 cells
    pieces: list[str] = []
    stream = tight.stream(PRESSURE_PROMPTS[0], max_tokens=100, temperature=0, ignore_eos=True)
    others = [tight.submit(p, max_tokens=100, temperature=0, ignore_eos=True) for p in PRESSURE_PROMPTS[1:]]
    pieces.extend(stream)
    pressured = [stream.completion] + [f.result(timeout=300) for f in others]
    stats = tight.stats()
    assert stats["preemptions"] > 0 and stats["tokens_recomputed"] > 0
    assert [c.usage.completion_tokens for c in pressured] == [100] * 4
    assert "".join(pieces) == pressured[0].text  # each streamed piece exactly once
    for prompt, a, b in zip(PRESSURE_PROMPTS, pressured, unpressured):
        assert_equal_up_to_near_tie(reference_engine, reference_engine.tokenizer.tokenize(prompt), a, b)
    assert audit_kv(tight) == []


def test_a_request_too_large_to_fit_even_alone_fails_with_context_full_and_disturbs_nothing_else(start_llm) -> None:
    system = " ".join(["Always answer briefly and politely, in plain English."] * 6)  # both pinned forms: ~130 cells
    llm = start_llm(n_parallel=2, n_ctx=256, system_prompt=system, batch_timeout_ms=50)
    too_big = llm.submit("Write forever:", max_tokens=None, ignore_eos=True)
    small = llm.submit("Hello", max_tokens=10, ignore_eos=True)
    with pytest.raises(llamactor.ContextFullError, match="even alone"):
        too_big.result(timeout=300)
    assert small.result(timeout=60).usage.completion_tokens == 10
    assert llm.ask("After", max_tokens=5, ignore_eos=True).usage.completion_tokens == 5
    assert audit_kv(llm) == []


def test_a_hung_step_is_aborted_by_the_watchdog_and_the_restarted_batcher_completes_the_requests(start_llm) -> None:
    llm = start_llm(n_parallel=2, watchdog_timeout_s=0.5, watchdog_test_hang=True, batch_timeout_ms=50)
    futures = [llm.submit(f"Question {i}:", max_tokens=5, ignore_eos=True) for i in range(3)]
    assert [f.result(timeout=120).usage.completion_tokens for f in futures] == [5, 5, 5]
    stats = llm.stats()
    assert (stats["restarts"], stats["watchdog_trips"], stats["generation"]) == (1, 1, 2)


def test_the_abort_flag_stops_a_decode_inside_llama_cpp(model_path) -> None:
    engine = Engine(model_path, n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=2)
    try:
        tokens = np.arange(10, 42, dtype=np.int32)
        args = (np.arange(32, dtype=np.int32), np.zeros(32, np.int32), np.zeros(32, np.int8))
        assert not engine.abort_flag.read_as_llama_cpp_does()
        engine.abort_flag.set()
        assert engine.abort_flag.read_as_llama_cpp_does()
        with pytest.raises(StepAbortedError):
            engine.decode(tokens, *args)
        engine.abort_flag.clear()
        engine.clear()
        assert engine.decode(tokens, *args).failed_seq_ids == frozenset()
    finally:
        engine.close()

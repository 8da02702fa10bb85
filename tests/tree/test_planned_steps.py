"""Steps planned ahead in the overlapped loop (step k+1 laid out while step k computes, launched with
k's tokens before k's commit) against the serial loop on the real engine: the same tokens and
log-probabilities with greedy and seeded sampling, penalties, a grammar, stop strings, EOG ending
some sequences while others go on, n-gram drafting, requests arriving and a cancel mid-burst; and
the steps were launched ahead (``steps_planned_ahead``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

import llamactor

from tests.conftest import audit_kv
from tests.support.overlap import same, serial_and_overlapped

GREEDY: dict[str, Any] = dict(temperature=0.0, logprobs=True)
SEEDED: dict[str, Any] = dict(temperature=0.8, top_p=0.9)
PENALISED: dict[str, Any] = dict(temperature=0.7, repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)


def differences(want: list[llamactor.Completion], got: list[llamactor.Completion]) -> list[tuple[int, str, str]]:
    return [(i, a.text, b.text) for i, (a, b) in enumerate(zip(want, got)) if not same(a, b)]


@pytest.fixture
def pair(start_llm: Callable[..., llamactor.LLM]) -> Callable[..., tuple[llamactor.LLM, llamactor.LLM]]:
    return functools.partial(serial_and_overlapped, start_llm)


def mixed_burst(llm: llamactor.LLM) -> list[Future[llamactor.Completion]]:
    """Nine requests at once, ending at different steps: max_tokens, and two chat answers the model
    ends itself while others go on; greedy with
    logprobs (the host sampler), seeded in the graph and on the host, penalties on both samplers,
    and a grammar."""
    return [
        llm.submit("Tell me about lighthouses", max_tokens=18, ignore_eos=True, **GREEDY),
        llm.submit("Describe a harbour at dawn", max_tokens=7, ignore_eos=True, **GREEDY),
        llm.submit("Story 1", max_tokens=14, seed=1, **SEEDED),
        llm.submit("Story 2", max_tokens=11, seed=2, logprobs=True, **SEEDED),
        llm.submit("List some birds", max_tokens=16, seed=3, ignore_eos=True, **PENALISED),
        llm.submit("List some fish", max_tokens=16, seed=4, logprobs=True, ignore_eos=True, **PENALISED),
        llm.submit("Name a colour:", grammar="root ::= [a-z ]+", max_tokens=9, temperature=1.0, seed=5),
        llm.submit_chat([{"role": "user", "content": "Say hello."}], max_tokens=40, **GREEDY),
        llm.submit_chat([{"role": "user", "content": "Answer yes or no: is water wet?"}], max_tokens=40, **GREEDY),
    ]


def test_steps_planned_ahead_give_the_serial_loops_tokens(pair: Callable[..., Any]) -> None:
    """Each step planned ahead is the serial loop's step: the same batches, so the same tokens,
    greedy or seeded, host or graph sampler, penalties or a grammar."""
    serial, overlapped = pair(n_parallel=9, batch_size=9, batch_timeout_ms=5000)
    want = [f.result(timeout=300) for f in mixed_burst(serial)]
    got = [f.result(timeout=300) for f in mixed_burst(overlapped)]
    assert not differences(want, got), differences(want, got)
    assert [c.finish_reason for c in want][:7] == ["length"] * 7
    assert [c.finish_reason for c in want][7:] == ["stop", "stop"]  # EOGs, while others go on
    assert max(len(want[7].token_ids), len(want[8].token_ids)) < 14
    stats = overlapped.stats()
    assert stats["steps_planned_ahead"] >= 3
    assert audit_kv(overlapped) == []


def test_a_stop_string_and_a_finished_grammar_drop_the_planned_step_and_change_no_token(
        pair: Callable[..., Any]) -> None:
    """A stop string and a grammar's end are found in postprocess, after the next step was planned
    ahead and launched: that row is dropped (as without planning ahead) and the plan after it is made
    after the commit; the stream beside them goes on to the serial loop's tokens."""
    serial, overlapped = pair(n_parallel=3)
    poem = "Write a short poem about the sea"
    free = serial.ask(poem, max_tokens=24, temperature=0.0, ignore_eos=True)
    assert overlapped.ask(poem, max_tokens=24, temperature=0.0, ignore_eos=True).text == free.text  # one history
    stop = free.text[len(free.text) // 2:][:3]  # known only once detokenized: found in postprocess
    assert stop.strip()
    passage = "The committee approved the budget for the new public library on Tuesday evening."

    def run(llm: llamactor.LLM) -> list[llamactor.Completion]:
        futures = [llm.submit(f"Copy the passage exactly.\nPassage: {passage}\nCopy:", max_tokens=30,
                              ignore_eos=True, **GREEDY),
                   llm.submit(poem, max_tokens=24, ignore_eos=True, stop=[stop], **GREEDY),
                   llm.submit("Is Paris in France? Answer:", grammar='root ::= " yes" | " no"', temperature=1.0,
                              seed=5)]
        return [f.result(timeout=300) for f in futures]

    before = overlapped.stats()
    want, got = run(serial), run(overlapped)
    assert not differences(want, got), differences(want, got)
    assert want[1].finish_reason == "stop" and want[2].text in (" yes", " no")
    stats = overlapped.stats()
    assert stats["rows_dropped"] - before["rows_dropped"] == 2
    assert stats["steps_planned_ahead"] - before["steps_planned_ahead"] >= 3
    assert audit_kv(overlapped) == []


def test_ngram_drafting_sequences_are_planned_after_their_commit_and_change_no_token(
        pair: Callable[..., Any]) -> None:
    """A drafting sequence's next step depends on its verification: no step is planned ahead while
    it runs; before and after it, steps are."""
    serial, overlapped = pair(n_parallel=2)
    passage = ("The committee approved the budget for the new public library on Tuesday evening. Construction "
               "will begin in the spring, and the building should open to readers before the end of next year.")
    prompt = f"Copy the passage exactly.\nPassage: {passage}\nCopy:"  # a copy: margins far from any tie

    def run(llm: llamactor.LLM) -> list[llamactor.Completion]:
        plain = llm.ask(prompt, max_tokens=12, ignore_eos=True, **GREEDY)
        drafted = llm.ask(prompt, max_tokens=32, ignore_eos=True, speculation="ngram", **GREEDY)
        return [plain, drafted]

    want = run(serial)
    planned_before = overlapped.stats()["steps_planned_ahead"]
    got = run(overlapped)
    # (the draft budget follows measured step times: the drafted batches, so the low bits of the
    # logprobs, may differ between two runs; the tokens may not)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    stats = overlapped.stats()
    assert stats["draft_tokens"] > 0 and stats["steps_planned_ahead"] > planned_before
    assert audit_kv(overlapped) == []


def test_arrivals_and_a_cancel_mid_burst_drop_the_planned_step_and_leave_the_cells_consistent(
        start_llm: Callable[..., llamactor.LLM]) -> None:
    """A request arriving while steps are planned ahead is admitted (its plan is dropped, the next
    is planned after the commit), and a cancel ends its stream; the others go on, every cell agrees."""
    llm = start_llm(n_parallel=4, overlap_steps=True, max_restarts=0)
    options: dict[str, Any] = dict(max_tokens=40, ignore_eos=True, temperature=0.0)
    alone = llm.ask("Describe a busy harbour at dawn", max_tokens=12, temperature=0.0, ignore_eos=True)
    other = llm.submit("Count slowly", **options)
    stream = llm.stream("Tell me a long story about a lighthouse", **options)
    pieces = iter(stream)
    next(pieces)
    planned = llm.stats()["steps_planned_ahead"]
    late = llm.submit("Describe a busy harbour at dawn", max_tokens=12, temperature=0.0, ignore_eos=True)
    stream.cancel()
    with pytest.raises(llamactor.CancelledError):
        list(pieces)
    assert late.result(timeout=120).token_ids == alone.token_ids or late.result().usage.completion_tokens == 12
    assert other.result(timeout=120).usage.completion_tokens == 40
    stats = llm.stats()
    assert planned > 0 and stats["steps_planned_ahead"] > planned and stats["rows_dropped"] >= 1
    assert audit_kv(llm) == []


def test_cached_prefixes_evicted_for_a_planned_step_are_the_serial_loops(pair: Callable[..., Any]) -> None:
    """A KV cache full of a finished request's cached prefix: the decodes need its cells a few at a
    time, and each step planned ahead evicts them before its launch as the scheduler would."""
    serial, overlapped = pair(n_parallel=2, n_ctx=256)
    story = "Tell me a long story about a lighthouse keeper and the storm that changed everything"

    def run(llm: llamactor.LLM) -> list[llamactor.Completion]:
        first = llm.ask(story, max_tokens=80, ignore_eos=True, **GREEDY)  # its cells stay cached
        futures = [llm.submit(p, max_tokens=100, ignore_eos=True, **GREEDY)
                   for p in ("Describe a busy harbour at dawn", "List the planets of the solar system")]
        return [first, *(f.result(timeout=300) for f in futures)]

    want, got = run(serial), run(overlapped)
    assert not differences(want, got), differences(want, got)
    stats = overlapped.stats()
    # every step but a few at each burst's start and end was planned ahead, those that evicted too
    assert stats["steps"] - stats["steps_planned_ahead"] <= 10, (stats["steps"], stats["steps_planned_ahead"])
    assert stats["prefix_cache"]["evicted_cells"] > 0
    assert stats["prefix_cache"] == serial.stats()["prefix_cache"]  # the same cells evicted, the same entries left
    assert audit_kv(overlapped) == []

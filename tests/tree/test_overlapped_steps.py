"""The overlapped step loop forced on (on CPU) against the serial one on the real engine: the same
tokens and log-probabilities, greedy and seeded, for streams of different lengths that end at
different steps while others are admitted; a stop string and a cancel drop one in-flight row and
leave the index and llama.cpp's cells in agreement."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import llamactor

from tests.conftest import audit_kv, cancel_a_story_after_its_first_piece
from tests.support.overlap import same, serial_and_overlapped

MAX_TOKENS = (5, 9, 14, 20, 3, 12)


def run_mixed(llm: llamactor.LLM) -> list[llamactor.Completion]:
    """Six greedy streams of different lengths and three seeded ones, more than run at once: they
    end mid-batch, and the waiting ones are admitted as others end."""
    futures = [llm.submit(f"Tell me about number {i}", max_tokens=n, temperature=0.0, logprobs=True)
               for i, n in enumerate(MAX_TOKENS)]
    futures += [llm.submit(f"Story {i}", max_tokens=10, temperature=0.8, seed=i, logprobs=True) for i in range(3)]
    return [f.result(timeout=300) for f in futures]


@pytest.fixture
def pair(start_llm: Callable[..., llamactor.LLM]) -> Callable[..., tuple[llamactor.LLM, llamactor.LLM]]:
    return functools.partial(serial_and_overlapped, start_llm)


def test_overlapped_steps_give_the_serial_loops_tokens_greedy_and_seeded(pair: Callable[..., Any]) -> None:
    # one flush of all nine (batch_timeout), six at once: three wait for the first to end
    serial, overlapped = pair(n_parallel=6, batch_size=9, batch_timeout_ms=5000)
    want, got = run_mixed(serial), run_mixed(overlapped)
    assert [len(c.token_ids) for c in got] == [*MAX_TOKENS, 10, 10, 10]
    assert all(same(a, b) for a, b in zip(want, got)), [(a.text, b.text) for a, b in zip(want, got) if not same(a, b)]
    # max_tokens is known before the next launch: no row was wasted, the cells are the serial loop's
    assert overlapped.stats()["rows_dropped"] == 0
    assert audit_kv(overlapped) == []


def test_a_stop_string_ends_the_stream_as_in_the_serial_loop_and_drops_its_next_row(pair: Callable[..., Any]) -> None:
    serial, overlapped = pair(n_parallel=2)
    prompt = "Write a short poem about the sea"
    free = serial.ask(prompt, max_tokens=24, temperature=0.0, ignore_eos=True)
    stop = free.text[len(free.text) // 2:][:3]  # known only once detokenized: found in postprocess
    assert stop.strip()
    want = serial.ask(prompt, max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    got = overlapped.ask(prompt, max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    assert want.finish_reason == "stop" and same(want, got)
    assert overlapped.stats()["rows_dropped"] == 1  # its row of the step in flight when it stopped
    assert audit_kv(overlapped) == []
    # the dropped row's cell is gone: the next request on the same cells decodes as the serial loop's
    assert same(serial.ask(prompt, max_tokens=12, temperature=0.0), overlapped.ask(prompt, max_tokens=12, temperature=0.0))


def test_a_cancel_takes_effect_and_leaves_the_cells_consistent(start_llm: Callable[..., llamactor.LLM]) -> None:
    llm = start_llm(n_parallel=2, overlap_steps=True, max_restarts=0)
    other = llm.submit("Count slowly", max_tokens=40, temperature=0.0, ignore_eos=True)
    cancel_a_story_after_its_first_piece(llm)
    assert other.result(timeout=120).usage.completion_tokens == 40
    assert llm.stats()["rows_dropped"] >= 1
    assert audit_kv(llm) == []


def test_drafted_steps_run_serially_in_the_overlapped_loop_and_change_no_token(pair: Callable[..., Any]) -> None:
    """A step with drafted rows is postprocessed before the next launch (its verification reads
    those rows and removes rejected cells first); the steps around it still overlap."""
    serial, overlapped = pair(n_parallel=2)
    passage = ("The committee approved the budget for the new public library on Tuesday evening. Construction "
               "will begin in the spring, and the building should open to readers before the end of next year.")
    prompt = f"Copy the passage exactly.\nPassage: {passage}\nCopy:"  # a copy: margins far from any tie
    plain = serial.ask(prompt, max_tokens=32, temperature=0.0, ignore_eos=True)
    drafted = overlapped.ask(prompt, max_tokens=32, temperature=0.0, ignore_eos=True, prediction=plain.text)
    assert drafted.token_ids == plain.token_ids and drafted.usage.accepted_prediction_tokens > 0
    assert overlapped.stats()["draft_tokens"] > 0
    assert audit_kv(overlapped) == []


def test_an_audit_between_steps_settles_the_step_in_flight_and_the_streams_go_on_unchanged(
        pair: Callable[..., Any]) -> None:
    """A step is in flight whenever a message other than ``Step`` arrives mid-stream (its Step
    message ended after launching it): the audit collects, commits and postprocesses it first, and
    the streams then go on to the serial loop's tokens."""
    serial, overlapped = pair(n_parallel=2)
    prompts = ["Tell me a long story about a lighthouse", "Describe a busy harbour at dawn"]

    def run(llm: llamactor.LLM, audit: bool) -> list[llamactor.Completion]:
        options: dict[str, Any] = dict(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=True)
        other = llm.submit(prompts[1], **options)
        stream = llm.stream(prompts[0], **options)
        pieces = iter(stream)
        next(pieces)
        if audit:  # mid-stream: the index and the cells agree once the step in flight is settled
            assert audit_kv(llm) == []
        list(pieces)
        return [stream.completion, other.result(timeout=120)]

    want, got = run(serial, False), run(overlapped, True)
    assert all(same(a, b) for a, b in zip(want, got)), [(a.text, b.text) for a, b in zip(want, got)]
    assert audit_kv(overlapped) == []

"""A request's failure is the request's: a poison request fails alone and the batcher goes on (no
restart); one that crashes the batcher twice is quarantined, never replayed a third time, and the
requests that shared its steps finish. On the real model.

The poisons are built by hand and sent through the tree's handle (``LLM.send``), past any
validation at the edge: what is tested is the batcher's and the supervisor's own defence, which
must hold for whatever poison the edge does not know yet.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

import llamactor
from llamactor.base.config import SamplingParams
from llamactor.base.errors import BatcherUnavailableError, EngineError, LlamactorError, PoisonRequestError, \
    RequestFailedError
from llamactor.base.messages import Generate, ReplyChannel, Tokenize
from llamactor.base.tools import Tools
from llamactor.batcher import BatcherActor
from llamactor.requests import RequestState


def params(**bypassing_validation: Any) -> SamplingParams:
    """Greedy, 4 tokens, with fields set after validation (what no edge check would let through)."""
    p = SamplingParams(max_tokens=4, temperature=0.7)
    for name, value in bypassing_validation.items():
        object.__setattr__(p, name, value)
    return p


def generate(request_id: str, sampling: SamplingParams | None = None, **prompt: Any) -> Generate:
    prompt = prompt or {"text": "The sea is"}
    return Generate(request_id=request_id, params=sampling or params(), reply=ReplyChannel(),
                    submitted_at=time.perf_counter(), **prompt)


def error_of(future: Future[Any]) -> BaseException | None:
    return future.exception(timeout=60)


def assert_failed_alone(llm: llamactor.LLM, poison: Future[Any], error: type[LlamactorError]) -> LlamactorError:
    failure = error_of(poison)
    assert isinstance(failure, error) and not isinstance(failure, BatcherUnavailableError), repr(failure)
    return failure


@pytest.fixture
def steady(start_llm) -> llamactor.LLM:
    return start_llm(n_parallel=4, batch_timeout_ms=5, max_restarts=2)


def test_seed_minus_one_past_validation_fails_that_request_with_a_500_naming_it_and_nothing_restarts(steady) -> None:
    llm = steady
    beside = llm.stream("Once upon a time", max_tokens=24, temperature=0, ignore_eos=True)
    pieces = iter(beside)
    first = next(pieces)  # running: the poison arrives between its steps
    poison = llm.send(generate("poison-seed", params(seed=-1)))
    failure = assert_failed_alone(llm, poison, RequestFailedError)
    assert failure.http_status == 500 and "poison-seed" in str(failure)
    assert first + "".join(pieces) == beside.completion.text and beside.completion.usage.completion_tokens == 24
    stats = llm.stats()
    assert stats["generation"] == 1 and stats["restarts"] == 0 and stats["state"] == "ready"
    assert llm.ask("After the poison", max_tokens=3).usage.completion_tokens == 3


@pytest.mark.parametrize("poison", [
    pytest.param(lambda: generate("poison-text", text="tell me \ud800 more"), id="lone-surrogate-prompt"),
    pytest.param(lambda: generate("poison-chat", messages=({"role": "user", "content": "hi \ud800"},)),
                 id="lone-surrogate-chat"),
    pytest.param(lambda: Tokenize("poison-tokenize", ReplyChannel(), text="\ud800"), id="lone-surrogate-tokenize"),
    pytest.param(lambda: generate("poison-tools", tools=Tools.from_openai([{"type": "function", "function": {"name": "f"}}]),
                                  messages=({"role": "user", "content": "hi"},
                                            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function"}]},
                                            {"role": "user", "content": "again"})),
                 id="tool-call-without-function"),
])
def test_a_poison_message_fails_alone_while_another_request_finishes(steady, poison) -> None:
    llm = steady
    beside = llm.submit("The capital of France is", max_tokens=16, temperature=0, ignore_eos=True)
    failure = error_of(llm.send(poison()))
    # Its own typed error: a 400 if a check knows it, else a 500 -- never the model going away.
    assert isinstance(failure, LlamactorError) and not isinstance(failure, BatcherUnavailableError), repr(failure)
    assert beside.result(timeout=60).usage.completion_tokens == 16
    stats = llm.stats()
    assert stats["generation"] == 1 and stats["restarts"] == 0


def test_a_failure_accepting_one_sequences_token_ends_that_sequence_alone(steady, monkeypatch) -> None:
    llm = steady
    accept = RequestState.accept

    def poisoned_accept(self: RequestState, seq: Any, *args: Any) -> str | None:
        if seq.request_id == "poison-accept" and self.n_generated == 2:
            raise KeyError("a bug met while accepting this sequence's third token")
        return accept(self, seq, *args)

    monkeypatch.setattr(RequestState, "accept", poisoned_accept)
    beside = llm.stream("Once upon a time", max_tokens=24, temperature=0, ignore_eos=True)
    poison = llm.send(generate("poison-accept", params(max_tokens=12, ignore_eos=True)))
    failure = assert_failed_alone(llm, poison, RequestFailedError)
    assert "poison-accept" in str(failure)
    assert beside.completion.usage.completion_tokens == 24
    stats = llm.stats()
    assert stats["generation"] == 1 and stats["restarts"] == 0 and stats["running"] == 0


def test_a_request_in_two_crashing_steps_is_quarantined_and_the_streams_beside_it_finish(steady, monkeypatch) -> None:
    """A poison that kills the shared step (here: its decode fails whenever it is in the batch)
    crashes the batcher with everything in that step. The suspects are replayed one at a time, so
    the second crash has only the poison in it: quarantined, never replayed a third time; the
    streams it shared the first step with finish with their full text."""
    llm = steady
    run, crashes = BatcherActor._run, []

    def decode_unless_poisoned(self: BatcherActor, plan: Any) -> Any:
        if any(chunk.seq.request_id == "poison-step" for chunk in plan.chunks):
            crashes.append([chunk.seq.request_id for chunk in plan.chunks])
            raise EngineError("llama_decode failed (a poison in the batch)")
        return run(self, plan)

    monkeypatch.setattr(BatcherActor, "_run", decode_unless_poisoned)
    streams = [llm.stream(f"Story number {i}:", max_tokens=20, temperature=0, ignore_eos=True) for i in range(2)]
    iters = [iter(s) for s in streams]
    firsts = [next(it) for it in iters]  # both running: the poison joins their next step
    poison = llm.send(generate("poison-step"))
    failure = assert_failed_alone(llm, poison, PoisonRequestError)
    assert failure.http_status == 422 and "poison-step" in str(failure)
    for first, it, stream in zip(firsts, iters, streams):
        assert first + "".join(it) == stream.completion.text and stream.completion.usage.completion_tokens == 20
    assert len(crashes) == 2 and len(crashes[0]) == 3 and crashes[1] == ["poison-step"]
    assert llm.ask("After the quarantine", max_tokens=3).usage.completion_tokens == 3
    stats = llm.stats()
    assert stats["restarts"] == 2 and stats["quarantined"] == 1 and stats["state"] == "ready"

"""A request's failure is the request's: a poison request fails alone and the batcher goes on (no
restart); one that crashes the batcher twice is quarantined, never replayed a third time, and the
requests that shared its steps finish. On the real model.

The poisons are built by hand and sent through the tree's handle (``LLM.send``), past any
validation at the edge: what is tested is the batcher's and the supervisor's own defence, which
must hold for whatever poison the edge does not know yet.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest

import llamactor
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import BatcherUnavailableError, CancelledError, EngineError, LlamactorError, \
    PoisonRequestError, RequestFailedError
from llamactor.base.messages import BatcherFailed, Cancel, Embed, Generate, ReplyChannel, Tokenize
from llamactor.tree.tell import tell_quietly
from llamactor.base.tools import Tools
from llamactor.tree.generation_steps import GenerationSteps
from llamactor.tree.request_state import RequestState
from llamactor.tree.supervisor import SupervisorActor

from tests.support.stub_tree import TIMEOUT, Answer, Batchers, HoldingBoard, Received, StubBatcher, Tree, generated


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
    return future.exception(timeout=240)  # a bound only a failing test reaches (restarts load the model)


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
    pytest.param(lambda: Embed("poison-embed", ("fine", "not \ud800 fine"), ReplyChannel(), time.perf_counter()),
                 id="lone-surrogate-embedding"),
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
    assert beside.result(timeout=240).usage.completion_tokens == 16  # a bound: the machine may be loaded
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


@pytest.mark.timeout(300)  # two restarts, each loading the model
def test_a_request_in_two_crashing_steps_is_quarantined_and_the_streams_beside_it_finish(steady, monkeypatch) -> None:
    """A poison that kills the shared step (here: its decode fails whenever it is in the batch)
    crashes the batcher with everything in that step. The suspects are replayed one at a time, so
    the second crash has only the poison in it: quarantined, never replayed a third time; the
    streams it shared the first step with finish with their full text."""
    llm = steady
    run, crashes = GenerationSteps.run, []

    def decode_unless_poisoned(self: GenerationSteps, plan: Any) -> Any:
        if any(chunk.seq.request_id == "poison-step" for chunk in plan.chunks):
            crashes.append([chunk.seq.request_id for chunk in plan.chunks])
            raise EngineError("llama_decode failed (a poison in the batch)")
        return run(self, plan)

    monkeypatch.setattr(GenerationSteps, "run", decode_unless_poisoned)
    streams = [llm.stream(f"Story number {i}:", max_tokens=12, temperature=0, ignore_eos=True) for i in range(2)]
    iters = [iter(s) for s in streams]
    firsts = [next(it) for it in iters]  # both running: the poison joins their next step
    poison = llm.send(generate("poison-step"))
    failure = assert_failed_alone(llm, poison, PoisonRequestError)
    assert failure.http_status == 422 and "poison-step" in str(failure)
    for first, it, stream in zip(firsts, iters, streams):
        assert first + "".join(it) == stream.completion.text and stream.completion.usage.completion_tokens == 12
    assert len(crashes) == 2 and len(crashes[0]) == 3 and crashes[1] == ["poison-step"]
    assert llm.ask("After the quarantine", max_tokens=3).usage.completion_tokens == 3
    stats = llm.stats()
    assert stats["restarts"] == 2 and stats["quarantined"] == 1 and stats["state"] == "ready"


# -- the supervisor's quarantine, on stub batchers (model-free) ------------------------------

@dataclass(frozen=True)
class CrashWith:
    """Test -> stub batcher: fail as a step with these requests in it would."""

    suspects: tuple[str, ...]


class SuspectingStub(StubBatcher):
    """A stub batcher that names its suspects when it dies, as the real one does."""

    suspects: tuple[str, ...] = ()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, CrashWith):
            self.suspects = message.suspects
            raise RuntimeError(f"a step with {message.suspects} failed")
        return super().on_receive(message)

    def on_failure(self, exception_type: Any, exception_value: BaseException | None, traceback: Any) -> None:
        tell_quietly(self.supervisor, BatcherFailed(self.generation, repr(exception_value), suspects=self.suspects))


class SuspectingBatchers(Batchers):
    def __call__(self, config: Config, model_path: str, supervisor: Any, generation: int, *rest: Any) -> Any:
        return SuspectingStub.start(self, supervisor, generation)


@pytest.fixture
def stub_tree() -> Iterator[Tree]:
    batchers, board = SuspectingBatchers(), HoldingBoard()
    tree = Tree(SupervisorActor.start(Config(max_restarts=5), "stub.gguf", start_batcher=batchers, board=board),
                batchers, board)
    yield tree
    tree.supervisor.stop(block=True)


def crash_with(tree: Tree, generation: int, *suspects: str) -> None:
    tree.batcher(generation)
    tree.settle()
    tree.batcher(generation).tell(CrashWith(suspects))


def answered(tree: Tree, generation: int, request_id: str) -> list[str]:
    """Answer ``request_id`` on batcher ``generation``; what that batcher was told once the
    supervisor has heard the request is done."""
    tree.batcher(generation).tell(Answer(request_id))
    tree.batcher(generation).ask(Received(), timeout=TIMEOUT)  # handled: its Forget is on its way
    return generated(tree.told(generation))


@pytest.mark.pure
def test_suspects_are_replayed_one_at_a_time_and_one_suspected_of_two_crashes_is_quarantined(stub_tree) -> None:
    tree = stub_tree
    sent = {r: tree.submit(r) for r in ("r0", "r1", "r2", "r3")}
    crash_with(tree, 1, "r1", "r2")
    assert generated(tree.told(2)) == ["r0", "r3", "r1"]  # the others at once, then one suspect alone
    assert answered(tree, 2, "r1") == ["r0", "r3", "r1", "r2"]  # the next suspect once it is done
    crash_with(tree, 2, "r2", "r3")  # r2 again, on probation: a poison; r3 shared its step
    with pytest.raises(PoisonRequestError, match="r2"):
        sent["r2"].reply.future.result(timeout=TIMEOUT)
    assert generated(tree.told(3)) == ["r0", "r3"]  # r3 suspected once: on probation, not quarantined
    assert tree.board.supervisor["quarantined"] == 1 and tree.board.supervisor["restarts"] == 2
    assert answered(tree, 3, "r3") == ["r0", "r3"] and sent["r3"].reply.future.result(timeout=TIMEOUT)


@pytest.mark.pure
def test_a_crash_naming_no_suspect_quarantines_nothing_and_a_held_back_suspect_is_cancelled_here(stub_tree) -> None:
    tree = stub_tree
    sent = {r: tree.submit(r) for r in ("r0", "r1")}
    for generation in (1, 2):  # an injected crash, a failed decode of no one request: all replayed
        crash_with(tree, generation)
    assert generated(tree.told(3)) == ["r0", "r1"]
    crash_with(tree, 3, "r0", "r1")
    assert generated(tree.told(4)) == ["r0"]
    tree.supervisor.tell(Cancel("r1"))  # held back: no batcher has it to answer, so the supervisor does
    with pytest.raises(CancelledError):
        sent["r1"].reply.future.result(timeout=TIMEOUT)
    assert answered(tree, 4, "r0") == ["r0"] and tree.board.supervisor["quarantined"] == 0

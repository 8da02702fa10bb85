"""A supervisor on stub batchers, as pykka's own tests keep their actors small: a stub batcher
says it is ready, records what it is told, holds each request until the test has it answered,
and crashes on demand, reporting ``BatcherFailed`` from ``on_failure`` as the real batcher does.
Used by tests/tree/test_supervisor_stub.py and tests/tree/test_poison.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pykka

from llamactor.base.completion import Completion, FinishReason, Timings, Usage
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import CancelledError
from llamactor.base.messages import BatcherFailed, BatcherReady, Cancel, Generate, ReplyChannel
from llamactor.tree.board import StatsBoard
from llamactor.tree.tell import tell_quietly

TIMEOUT = 5.0  # bounds a wait that should end at once: only a failing test ever reaches it

INFO = EngineInfo(model_path="stub.gguf", description="a stub batcher", n_params=0, size_bytes=0, n_vocab=16,
                  n_embd=4, embedding_pooling="mean", n_ctx_train=64, n_ctx=64, n_ctx_seq=64, n_batch=8,
                  n_ubatch=8, n_seq_max=1, n_threads=1, kv_type="f16", chat_template="transcript",
                  looks_like_base_model=True)


def completion(request_id: str, finish_reason: FinishReason = "stop") -> Completion:
    return Completion(request_id=request_id, text=f"the answer to {request_id}", token_ids=(1,),
                      finish_reason=finish_reason, usage=Usage(prompt_tokens=1, completion_tokens=1, cached_tokens=0),
                      timings=Timings(queue_ms=0.0, ttft_ms=0.0, total_ms=0.0, decode_tokens_per_s=0.0))


# -- the stub batcher and what a test tells it ------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """Test -> stub batcher: resolve the held request ``request_id``."""

    request_id: str


@dataclass(frozen=True)
class Crash:
    """Test -> stub batcher: raise, as a bug in a batcher would; once ``release`` is set, if given."""

    release: threading.Event | None = None


class Received:
    """Asked of a stub batcher: what it was told so far (all of it handled, as the answer comes after)."""


class StubBatcher(pykka.ThreadingActor):
    def __init__(self, batchers: Batchers, supervisor: pykka.ActorRef[Any], generation: int) -> None:
        super().__init__()
        self.batchers = batchers
        self.supervisor = supervisor
        self.generation = generation
        self.told = batchers.told[generation]
        self.held: dict[str, Generate] = {}

    def on_start(self) -> None:
        tell_quietly(self.supervisor, BatcherReady(self.generation, INFO))
        self.batchers.refs[self.generation] = self.actor_ref
        self.batchers.started[self.generation].set()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Received):
            return list(self.told)
        self.told.append(message)
        if isinstance(message, Generate):
            self.held[message.request_id] = message
        elif isinstance(message, Answer):
            self.held.pop(message.request_id).reply.resolve(completion(message.request_id))
        elif isinstance(message, Cancel):  # as the batcher does: fail it with what it generated so far
            req = self.held.pop(message.request_id, None)
            if req is not None:
                req.reply.fail(CancelledError(f"request {message.request_id} was cancelled",
                                              completion(message.request_id, "cancelled")))
        elif isinstance(message, Crash):
            if message.release is not None:
                assert message.release.wait(TIMEOUT)
            raise RuntimeError(f"stub batcher {self.generation} crashed on purpose")
        return None

    def on_failure(self, exception_type: Any, exception_value: BaseException | None, traceback: Any) -> None:
        tell_quietly(self.supervisor, BatcherFailed(self.generation, repr(exception_value)))


class Batchers:
    """The factory a supervisor starts its stub batchers with, and what became of each generation."""

    def __init__(self) -> None:
        self.refs: dict[int, pykka.ActorRef[Any]] = {}
        self.started = {generation: threading.Event() for generation in range(1, 10)}
        self.told: dict[int, list[Any]] = {generation: [] for generation in range(1, 10)}

    def __call__(self, config: Config, model_path: str, supervisor: pykka.ActorRef[Any], generation: int,
                 watchdog_trips: int, board: StatsBoard, tiers: Any) -> pykka.ActorRef[Any]:
        return StubBatcher.start(self, supervisor, generation)


class HoldingBoard(StatsBoard):
    """A ``StatsBoard`` that holds the supervisor's thread where it first publishes ``hold_at``, so
    that a test acts while the supervisor is provably there. Held at "restarting", the supervisor
    has dropped the dead batcher but not yet started its back-off timer: whatever the test tells it
    then is handled before ``RestartBatcher``, however long the back-off."""

    def __init__(self) -> None:
        self.hold_at: str | None = None
        self.holding = threading.Event()
        self.release = threading.Event()
        super().__init__()

    @property  # type: ignore[override]
    def supervisor(self) -> dict[str, Any]:
        return StatsBoard.supervisor.__get__(self)  # type: ignore[attr-defined,no-any-return]

    @supervisor.setter
    def supervisor(self, value: dict[str, Any]) -> None:
        StatsBoard.supervisor.__set__(self, value)  # type: ignore[attr-defined]
        if value["state"] == self.hold_at and not self.holding.is_set():
            self.holding.set()
            assert self.release.wait(TIMEOUT)


@dataclass
class Tree:
    """A supervisor started with stub batchers, and the means to drive it."""

    supervisor: pykka.ActorRef[Any]
    batchers: Batchers
    board: HoldingBoard
    releases: list[threading.Event] = field(default_factory=list)

    def submit(self, request_id: str) -> Generate:
        msg = Generate(request_id=request_id, params=SamplingParams(), reply=ReplyChannel(),
                       submitted_at=time.perf_counter(), text="x")
        self.supervisor.tell(msg)
        return msg

    def settle(self) -> None:
        """Return once the supervisor has handled all it was told before (a restart's replays too)."""
        self.supervisor.proxy().generation.get(timeout=TIMEOUT)

    def batcher(self, generation: int) -> pykka.ActorRef[Any]:
        assert self.batchers.started[generation].wait(TIMEOUT), f"batcher {generation} never started"
        return self.batchers.refs[generation]

    def told(self, generation: int) -> list[Any]:
        """What batcher ``generation`` (alive) was told, once it has all the supervisor sent it so far."""
        ref = self.batcher(generation)
        self.settle()
        return ref.ask(Received(), timeout=TIMEOUT)  # type: ignore[no-any-return]

    def crash(self, generation: int, *, hold: bool = False) -> threading.Event:
        """Crash batcher ``generation`` after what the supervisor sent it so far; with ``hold``, only
        once the returned event is set (it stays alive, its inbox filling, until then)."""
        ref = self.batcher(generation)
        self.settle()
        release = threading.Event()
        if not hold:
            release.set()
        self.releases.append(release)
        ref.tell(Crash(release))
        return release


def generated(messages: list[Any]) -> list[str]:
    return [m.request_id for m in messages if isinstance(m, Generate)]

"""The supervisor with stub batchers: restarts, replays, giving up and cancels, in seconds, no model.

As in pykka's own tests, the actors a test needs are defined here and kept small: a stub batcher
says it is ready, records what it is told, holds each request until the test has it answered, and
crashes on demand, reporting ``BatcherFailed`` from ``on_failure`` as the real batcher does. Every
wait is on an event, a future or a round trip through an actor's inbox; none is a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pykka
import pytest

from llamactor.base.completion import Completion, FinishReason, Timings, Usage
from llamactor.base.config import Config, SamplingParams
from llamactor.base.engine_info import EngineInfo
from llamactor.base.errors import BatcherUnavailableError, CancelledError
from llamactor.base.messages import BatcherFailed, BatcherReady, Cancel, Generate, ReplyChannel
from llamactor.tree.board import StatsBoard
from llamactor.tree.supervisor import SupervisorActor
from llamactor.tree.tell import tell_quietly

pytestmark = pytest.mark.pure

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


@pytest.fixture
def start_tree() -> Iterator[Callable[..., Tree]]:
    """Start a supervisor on stub batchers; afterwards every actor the test started is stopped."""
    before = set(pykka.ActorRegistry.get_all())
    trees: list[Tree] = []

    def start(**config: Any) -> Tree:
        batchers, board = Batchers(), HoldingBoard()
        supervisor = SupervisorActor.start(Config(**config), "stub.gguf", start_batcher=batchers, board=board)
        trees.append(Tree(supervisor, batchers, board))
        return trees[-1]

    yield start
    for tree in trees:  # a failed test may have left a thread held
        tree.board.release.set()
        for release in tree.releases:
            release.set()
        tree.supervisor.stop(block=True)  # stops its batcher too
    for ref in set(pykka.ActorRegistry.get_all()) - before:
        ref.stop()


# -- the tests --------------------------------------------------------------------------------

def test_a_crashed_batcher_is_restarted_and_the_next_receives_every_request_in_flight_in_submission_order(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    sent = [tree.submit(f"r{i}") for i in range(4)]
    assert generated(tree.told(1)) == ["r0", "r1", "r2", "r3"]
    tree.crash(1)
    replayed = [m for m in tree.told(2) if isinstance(m, Generate)]
    assert [m.request_id for m in replayed] == ["r0", "r1", "r2", "r3"]
    assert all(r is s for r, s in zip(replayed, sent))  # the same messages: their reply channels go on
    board = tree.board.supervisor
    assert board["state"] == "ready" and board["restarts"] == 1 and board["inflight"] == 4
    ref = tree.board.batcher_ref
    assert ref is not None and ref.actor_urn == tree.batcher(2).actor_urn


def test_a_request_whose_future_completed_before_the_crash_is_not_replayed(start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    done, held = tree.submit("done"), tree.submit("held")
    assert generated(tree.told(1)) == ["done", "held"]
    tree.batcher(1).tell(Answer("done"))
    assert done.reply.future.result(timeout=TIMEOUT) == completion("done")
    tree.crash(1)  # its Forget("done") reached the supervisor first: it was told from the same thread
    assert generated(tree.told(2)) == ["held"]
    assert tree.board.supervisor["inflight"] == 1
    assert not held.reply.future.done()


def test_a_request_held_across_a_crash_is_resolved_by_the_restarted_batcher(start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    held = tree.submit("held")
    tree.crash(1)
    assert generated(tree.told(2)) == ["held"]
    assert not held.reply.future.done()
    tree.batcher(2).tell(Answer("held"))
    assert held.reply.future.result(timeout=TIMEOUT) == completion("held")


def test_more_than_max_restarts_within_the_window_and_the_supervisor_gives_up_failing_every_request(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=2, restart_window_s=60.0)  # back-offs 0.05 s, 0.1 s, then it gives up
    held = tree.submit("held")
    for generation in (1, 2, 3):
        assert generated(tree.told(generation)) == ["held"]  # replayed on each restart
        tree.crash(generation)
    with pytest.raises(BatcherUnavailableError, match="failed 3 times in 60s"):
        held.reply.future.result(timeout=TIMEOUT)
    assert tree.board.supervisor["state"] == "failed"  # published before any caller heard of it
    assert tree.board.supervisor["restarts"] == 2 and tree.board.batcher_ref is None
    later = tree.submit("later")
    tree.settle()
    assert later.reply.future.done()  # failed at once, by the supervisor itself
    with pytest.raises(BatcherUnavailableError, match="not running"):
        later.reply.future.result(timeout=0)
    assert not tree.batchers.started[4].is_set()


def test_a_cancel_during_the_restart_back_off_fails_the_request_and_the_next_batcher_never_sees_it(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    cancelled, kept = tree.submit("cancelled"), tree.submit("kept")
    tree.board.hold_at = "restarting"
    tree.crash(1)
    assert tree.board.holding.wait(TIMEOUT)  # batcher 1 is gone, the back-off timer not yet started
    tree.supervisor.tell(Cancel("cancelled"))  # so this is handled before RestartBatcher
    tree.board.release.set()
    with pytest.raises(CancelledError, match="cancelled") as error:
        cancelled.reply.future.result(timeout=TIMEOUT)
    assert error.value.completion is None  # what it generated died with batcher 1
    told = tree.told(2)
    assert generated(told) == ["kept"] and not any(isinstance(m, Cancel) for m in told)
    assert tree.board.supervisor["inflight"] == 1
    tree.batcher(2).tell(Answer("kept"))
    assert kept.reply.future.result(timeout=TIMEOUT) == completion("kept")


def test_a_cancel_forwarded_to_a_batcher_that_dies_before_handling_it_is_not_replayed(
        start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    cancelled, kept = tree.submit("cancelled"), tree.submit("kept")
    release = tree.crash(1, hold=True)  # batcher 1 is busy crashing: what it is told now, it never handles
    tree.supervisor.tell(Cancel("cancelled"))
    tree.settle()  # the Cancel went to batcher 1's inbox
    release.set()
    with pytest.raises(CancelledError) as error:
        cancelled.reply.future.result(timeout=TIMEOUT)
    assert error.value.completion is None  # answered by the supervisor, not by a batcher
    assert generated(tree.told(2)) == ["kept"]


def test_a_cancel_while_a_batcher_runs_is_forwarded_to_it(start_tree: Callable[..., Tree]) -> None:
    tree = start_tree(max_restarts=5, restart_window_s=60.0)
    req = tree.submit("r")
    tree.supervisor.tell(Cancel("r"))
    with pytest.raises(CancelledError) as error:
        req.reply.future.result(timeout=TIMEOUT)
    assert error.value.completion == completion("r", "cancelled")  # the batcher's partial completion
    told = tree.told(1)
    assert generated(told) == ["r"] and told[1:] == [Cancel("r")]
    assert tree.board.supervisor["state"] == "ready" and tree.board.supervisor["restarts"] == 0

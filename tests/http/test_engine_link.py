"""The link between the engine's process and a front-end process, both ends in this process over a
``socketpair``, on a stub model (the real daemon's tests: tests/http/test_frontend_process.py):
each message's replies reach its own channel, a step's pieces cross in one frame, pieces keep
their parts and logprobs, a cancelled future cancels the request there, a front end that goes
away cancels what it left running."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from typing import Any

import pytest

from llamactor.base.completion import Parts, Piece, TokenLogprob
from llamactor.base.config import Config
from llamactor.base.errors import BatcherUnavailableError, QueueFullError
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.sampling import SamplingParams
from llamactor.http import link_frames
from llamactor.http.engine_link import EngineLink
from llamactor.http.link_client import EngineConnection, LinkRouter
from llamactor.serving.model_specs import ModelSpec
from tests.support.stub_tree import INFO, completion

pytestmark = pytest.mark.pure
TIMEOUT = 5.0


class StubModel:
    """Keeps what it is sent; the test answers on the channels (as a batcher would)."""

    loaded = True
    info = INFO

    def __init__(self) -> None:
        self.sent: list[Generate] = []
        self.cancelled: list[str] = []
        self.arrived = threading.Semaphore(0)
        self.cancel_seen = threading.Event()

    def send(self, msg: Generate) -> concurrent.futures.Future[Any]:
        self.sent.append(msg)
        self.arrived.release()
        return msg.reply.future

    def send_n(self, msgs: list[Generate]) -> list[concurrent.futures.Future[Any]]:
        return [self.send(m) for m in msgs]

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        self.cancel_seen.set()

    def replica_stats(self, *, exact: bool = False) -> list[dict[str, Any]]:
        return [{"state": "ready", "exact": exact}]


class StubRouter:
    names = ["m"]

    def __init__(self) -> None:
        self.stub = StubModel()
        self.status_listeners: list[Any] = []

    def model(self, name: str | None = None) -> StubModel:
        return self.stub


def generate(request_id: str, on_piece: Any = None) -> Generate:
    return Generate(request_id=request_id, params=SamplingParams(), reply=ReplyChannel(on_piece=on_piece),
                    submitted_at=0.0, text="hi")


@pytest.fixture(params=["loop", "thread"])
def linked(request: pytest.FixtureRequest) -> Any:
    """Both ends; the front end reads on an event loop (as a front-end process does) or a thread."""
    ours, theirs = socket.socketpair()
    router, ready = StubRouter(), threading.Event()
    engine = EngineLink(ours, "frontend-test")
    connection = EngineConnection(theirs, lambda views: ready.set(), lambda: None)
    loop = asyncio.new_event_loop()
    if request.param == "loop":
        threading.Thread(target=loop.run_forever, daemon=True).start()
        loop.call_soon_threadsafe(connection.read_on_loop, loop)
    else:
        connection.read_in_thread()
    engine.serve(router)
    assert ready.wait(TIMEOUT)
    front = LinkRouter([ModelSpec(name="m", config=Config())], connection)
    yield engine, router.stub, front, theirs
    loop.call_soon_threadsafe(loop.stop)
    theirs.close()


def sent(stub: StubModel, n: int) -> list[Generate]:
    for _ in range(n):
        assert stub.arrived.acquire(timeout=TIMEOUT)
    return stub.sent[-n:]


def test_each_message_gets_its_own_replies_in_order(linked: Any) -> None:
    _, stub, front, _ = linked
    pieces: dict[str, list[Piece]] = {"a": [], "b": []}
    model = front.model("m")
    futures = [model.send(generate(rid, pieces[rid].append)) for rid in ("a", "b")]
    a, b = sent(stub, 2)
    assert model.loaded and model.info == INFO
    rich = Piece("x", (TokenLogprob(3, "x", -0.5),), Parts(reasoning="x"))
    for reply, piece in ((a.reply, Piece("one")), (b.reply, rich), (a.reply, Piece("two", (), Parts(content="two")))):
        reply.send_piece(piece.text, piece.logprobs, piece.parts)
    b.reply.fail(QueueFullError("full"))
    a.reply.resolve(completion("a"))
    assert futures[0].result(TIMEOUT).text == "the answer to a"
    with pytest.raises(QueueFullError):
        futures[1].result(TIMEOUT)
    assert pieces["a"] == [Piece("one"), Piece("two", (), Parts(content="two"))] and pieces["b"] == [rich]


def test_a_cancelled_future_cancels_the_request_in_the_engine(linked: Any) -> None:
    _, stub, front, _ = linked
    future = front.model("m").send(generate("c"))
    sent(stub, 1)
    future.cancel()
    assert stub.cancel_seen.wait(TIMEOUT) and stub.cancelled == ["c"]


def test_a_front_end_that_goes_away_cancels_what_it_left_running(linked: Any) -> None:
    engine, stub, front, theirs = linked
    front.model("m").send(generate("left"))
    done = front.model("m").send(generate("done"))
    left_msg, done_msg = sent(stub, 2)
    done_msg.reply.resolve(completion("done"))
    done.result(TIMEOUT)
    theirs.shutdown(socket.SHUT_RDWR)  # as the process's exit closes it (its reader's file holds the fd here)
    assert engine.closed.wait(TIMEOUT) and stub.cancelled == ["left"]


def test_blocking_calls_answer_and_a_lost_engine_fails_what_waits(linked: Any) -> None:
    engine, stub, front, _ = linked
    assert front.model("m").replica_stats(exact=True) == [{"state": "ready", "exact": True}]
    waiting = front.model("m").send(generate("w"))
    sent(stub, 1)
    engine._sock.shutdown(socket.SHUT_RDWR)  # the engine's process gone
    with pytest.raises(BatcherUnavailableError):
        waiting.result(TIMEOUT)


def test_a_text_piece_travels_as_its_text_alone() -> None:
    for piece, kind in ((Piece("a"), link_frames.TEXT), (Piece("b", (), Parts(content="b")), link_frames.CONTENT),
                        (Piece("c", (), Parts(reasoning="c")), link_frames.PIECE)):
        token, got_kind, value = link_frames.piece_event(7, piece)
        assert (token, got_kind) == (7, kind) and link_frames.event_piece(got_kind, value) == piece
    assert isinstance(link_frames.piece_event(0, Piece("a"))[2], str)

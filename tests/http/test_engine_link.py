"""The link between the engine's process and a front-end process, both ends in this process over a
``socketpair``, on a stub model (the real daemon's tests: tests/http/test_frontend_process.py):
each message's replies reach its own channel, a step's pieces cross in one frame, pieces keep
their parts and logprobs, a cancelled future cancels the request there, a front end that goes
away cancels what it left running. What the front ends share there: tests/http/test_link_state.py."""

from __future__ import annotations

import asyncio
import pickle
import socket
import threading
from typing import Any

import pytest

from llamactor.base.completion import Parts, Piece, TokenLogprob
from llamactor.base.config import Config
from llamactor.base.errors import BatcherUnavailableError, QueueFullError
from llamactor.base.messages import ReplyChannel
from llamactor.http import link_frames
from llamactor.http.engine_link import EngineLink
from llamactor.http.link_client import EngineConnection, LinkRouter
from llamactor.serving.model_specs import ModelSpec
from tests.support.link_stubs import TIMEOUT, StubRouter, generate, sent
from tests.support.stub_tree import INFO, completion

pytestmark = pytest.mark.pure


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


def test_a_last_piece_of_logprobs_alone_crosses_the_link(linked: Any) -> None:
    """The tokens of a stop string never become text; their logprobs go with the request's last
    piece, which has no text of its own: the front end hands it on as the engine sent it."""
    _, stub, front, _ = linked
    pieces: list[Piece] = []
    future = front.model("m").send(generate("l", pieces.append))
    (msg,) = sent(stub, 1)
    held = (TokenLogprob(",", -0.1), TokenLogprob(" six", -0.2))
    msg.reply.send_piece(" five", (TokenLogprob(" five", -0.3),))
    assert msg.reply.send_piece("", held, last=True)
    msg.reply.resolve(completion("l"))
    future.result(TIMEOUT)
    assert [p.text for p in pieces] == [" five", ""] and pieces[1].logprobs == held


def test_frames_that_arrive_in_one_read_are_handled_in_order_and_a_partial_one_waits() -> None:
    """The loop reads what the socket holds at once: several frames, and the start of the next,
    which is handled once the rest of it comes."""
    ours, theirs = socket.socketpair()
    connection = EngineConnection(theirs, lambda views: None, lambda: None)
    got: list[str] = []
    every_piece: list[asyncio.Event] = []  # the loop's, made in ``run``: set when the 12th arrives

    def arrived(piece: Piece) -> None:  # the loop's thread: the link's pieces are handed on in place
        got.append(piece.text)
        if len(got) == 12:
            every_piece[0].set()
    replies = [ReplyChannel(on_piece=arrived) for _ in range(3)]
    connection._replies.update(enumerate(replies))  # noqa: SLF001 - as ``send`` registers them

    def frame(events: list[tuple[int, int, Any]]) -> bytes:
        data = pickle.dumps((link_frames.EVENTS, events))
        return link_frames.HEADER.pack(len(data)) + data
    whole = b"".join(frame([(t, link_frames.TEXT, f"{step}.{t}") for t in range(3)]) for step in range(4))
    last = frame([(t, link_frames.OK, completion(f"{t}")) for t in range(3)])

    async def run() -> None:
        every_piece.append(asyncio.Event())
        connection.read_on_loop(asyncio.get_running_loop())
        ours.sendall(whole + last[:7])
        await every_piece[0].wait()
        assert not any(r.future.done() for r in replies)  # the last frame has not all come
        ours.sendall(last[7:])
        await asyncio.gather(*(asyncio.wrap_future(r.future) for r in replies))
    try:
        asyncio.run(asyncio.wait_for(run(), TIMEOUT))
    finally:
        ours.close()
        theirs.close()
    assert got == [f"{step}.{t}" for step in range(4) for t in range(3)]
    assert not connection._unread  # noqa: SLF001 - every frame read was dropped


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
    held = Piece(" ", (), Parts())  # what a chat's splitter holds back: no Parts pickled per token either
    rich = Piece("d", (TokenLogprob("d", -0.5),), Parts(content="d"))
    for piece, kind in ((Piece("a"), link_frames.TEXT), (Piece("b", (), Parts(content="b")), link_frames.CONTENT),
                        (Piece("c", (), Parts(reasoning="c")), link_frames.PARTS), (held, link_frames.PARTS),
                        (rich, link_frames.PIECE)):
        token, got_kind, value = link_frames.piece_event(7, piece)
        assert (token, got_kind) == (7, kind) and link_frames.event_piece(got_kind, value) == piece
        assert got_kind >= link_frames.PIECE  # what the front end's reader asks first
    assert isinstance(link_frames.piece_event(0, Piece("a"))[2], str)
    assert not isinstance(link_frames.piece_event(0, held)[2], Piece)

"""The link between the engine's process and a front-end process, both ends in this process over a
``socketpair``, on a stub model (the real daemon's tests: tests/http/test_frontend_process.py):
each message's replies reach its own channel, a step's pieces cross in one frame, pieces keep
their parts and logprobs, a cancelled future cancels the request there, a front end that goes
away cancels what it left running; what front ends share there -- a tenant's limits counted once
(refused before anything is queued, settled with what was used, a batch line waiting on its own
thread), the stored responses per tenant."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import pickle
import socket
import threading
from typing import Any

import pytest

from llamactor.base.completion import Parts, Piece, TokenLogprob, Usage
from llamactor.base.config import Config
from llamactor.base.errors import BatcherUnavailableError, InvalidRequestError, QueueFullError, RateLimitError
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.sampling import SamplingParams
from llamactor.base.tenants import Tenant
from llamactor.handles.limits import WaitForLimits
from llamactor.http import link_frames
from llamactor.http.engine_link import EngineLink
from llamactor.http.engine_state import EngineState
from llamactor.http.link_client import EngineConnection, LinkRouter
from llamactor.http.link_state import LinkLimiter, LinkResponses
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


# -- what the front ends share in the engine: the tenants' limits, the stored responses ----------

LIMITED_TENANT = Tenant("limited", requests_per_minute=2, tokens_per_minute=100)


@pytest.fixture
def two_front_ends() -> Any:
    """Two front ends' links to one engine (one ``EngineState``), each read on a thread of its own."""
    state, router, ends = EngineState(), StubRouter(), []
    for i in range(2):
        ours, theirs = socket.socketpair()
        ready = threading.Event()
        engine = EngineLink(ours, f"frontend-{i}", state)
        connection = EngineConnection(theirs, lambda views, ready=ready: ready.set(), lambda: None)
        connection.read_in_thread()
        engine.serve(router)
        assert ready.wait(TIMEOUT)
        ends.append((connection, LinkRouter([ModelSpec(name="m", config=Config())], connection)))
    yield state, router.stub, ends
    for connection, _ in ends:
        connection._sock.close()


def limited_send(front: LinkRouter, rid: str, tokens: int = 40, tenant: Tenant = LIMITED_TENANT) -> Any:
    """One request of ``tenant`` through the front end's ``LinkLimiter``: (its reply channel
    there, what the tenant has left)."""
    msg = generate(rid)
    submitted = LinkLimiter(front.model("m")._link).submit(tenant, tokens, lambda: [front.model("m").send(msg)])
    assert submitted.sent == [msg.reply.future]
    return msg.reply, submitted.limits


class Settlements:
    """The tokens each settlement in the engine's limiter charged, as they come."""

    def __init__(self, state: EngineState) -> None:
        self.used: list[int] = []
        self._arrived = threading.Condition()
        self._settle = state.limiter.settle
        state.limiter.settle = self._recorded  # type: ignore[method-assign]

    def _recorded(self, reservation: Any, used: int) -> None:
        self._settle(reservation, used)
        with self._arrived:
            self.used.append(used)
            self._arrived.notify_all()

    def wait(self, n: int) -> list[int]:
        """Once ``n`` have come (a front end's SETTLE crosses its link on its own): all so far."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.used) >= n, TIMEOUT)
        return self.used


def test_a_tenants_limits_are_counted_once_across_front_ends_and_settled_with_what_was_used(two_front_ends: Any) -> None:
    state, stub, ((_, front_a), (_, front_b)) = two_front_ends
    settled = Settlements(state)
    first, first_left = limited_send(front_a, "a")
    [a] = sent(stub, 1)
    a.reply.mark_queued()
    assert first.queued.result(TIMEOUT) is None
    # what the tenant has left arrived before the message's first reply (the x-ratelimit-* headers)
    assert first_left.headers()["x-ratelimit-remaining-requests"] == "1"
    assert first_left.headers()["x-ratelimit-remaining-tokens"] == "60"
    a.reply.resolve(completion("a"))  # 2 tokens used: the estimate's 40 given back, 2 taken
    assert first.future.result(TIMEOUT).text == "the answer to a"
    assert settled.wait(1) == [2]
    second, second_left = limited_send(front_b, "b")  # the other front end: the same buckets
    [b] = sent(stub, 1)
    b.reply.mark_queued()
    assert second.queued.result(TIMEOUT) is None
    assert second_left.headers()["x-ratelimit-remaining-requests"] == "0"
    assert second_left.headers()["x-ratelimit-remaining-tokens"] == "58"
    third, third_left = limited_send(front_a, "c")
    with pytest.raises(RateLimitError) as refused:  # before anything is queued: the model never saw it
        third.queued.result(TIMEOUT)
    assert refused.value.retry_after >= 1 and refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RateLimitError):
        third.future.result(TIMEOUT)
    assert [m.request_id for m in stub.sent] == ["a", "b"] and third_left.headers() == {}
    free, _ = limited_send(front_b, "free", tenant=Tenant("free"))  # a tenant without limits is never counted
    sent(stub, 1)[0].reply.resolve(completion("free"))
    assert free.future.result(TIMEOUT).text == "the answer to free"
    b.reply.resolve(completion("b"))
    assert settled.wait(2) == [2, 2]  # the refused one and the free one settle nothing


def test_a_request_is_settled_when_what_its_send_answered_ends_later_requests_and_all(two_front_ends: Any) -> None:
    """As a rerank: its first message sent within the limits, the answer a future of its own that
    ends after later work; settled with what that answer reports, once it ends."""
    state, stub, ((connection, front), _) = two_front_ends
    settled = Settlements(state)
    answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
    submitted = LinkLimiter(connection).submit(LIMITED_TENANT, 40, lambda: [front.model("m").send(generate("r")),
                                                                             answer][1:])
    sent(stub, 1)[0].reply.resolve(completion("r"))
    answer.set_result(dataclasses.replace(completion("r"), usage=Usage(prompt_tokens=30, completion_tokens=5,
                                                                        cached_tokens=0)))
    assert submitted.sent == [answer] and settled.wait(1) == [35]


def test_a_request_that_could_never_fit_the_tenants_tokens_is_a_bad_request(two_front_ends: Any) -> None:
    _, stub, ((_, front), _) = two_front_ends
    reply, _ = limited_send(front, "huge", tokens=101)
    with pytest.raises(InvalidRequestError, match="could never run"):
        reply.future.result(TIMEOUT)
    assert stub.sent == []


def test_a_front_ends_limiter_never_waits_for_the_limits(two_front_ends: Any) -> None:
    """Batch lines, the only callers that wait for their tenant's limits, run in the engine's
    process (``http/engine_jobs``): a front end asked to wait refuses before sending anything."""
    _, stub, ((connection, front), _) = two_front_ends
    line = WaitForLimits(threading.Event())
    with pytest.raises(TypeError, match="never waits"):
        LinkLimiter(connection).submit(Tenant("batch", requests_per_minute=1), 1,
                                       lambda: [front.model("m").send(generate("line-1"))], line)
    assert stub.sent == []


def test_stored_responses_are_one_store_per_tenant_whichever_front_end_asks(two_front_ends: Any) -> None:
    state, _, ((a, _), (b, _)) = two_front_ends
    at_a, at_b = LinkResponses(a), LinkResponses(b)
    first_turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]

    async def conversation() -> None:
        await at_a.put("alice", {"id": "resp_1"}, first_turn)
        stored = await at_b.get("alice", "resp_1")
        assert stored is not None and list(stored.messages) == first_turn and stored.response == {"id": "resp_1"}
        assert await at_b.get("bob", "resp_1") is None  # another tenant's id is not found
        second_turn = [*stored.messages, {"role": "user", "content": "and?"}, {"role": "assistant", "content": "so"}]
        await at_b.put("alice", {"id": "resp_2"}, second_turn, ("resp_1", 2))
        again = await at_a.get("alice", "resp_2")
        assert again is not None and list(again.messages) == second_turn
        assert not await at_a.delete("bob", "resp_1") and await at_a.delete("alice", "resp_1")
        assert await at_b.get("alice", "resp_1") is None
        # the previous turn gone: the whole conversation is sent instead of what follows it
        await at_a.put("alice", {"id": "resp_3"}, [*second_turn, {"role": "user", "content": "x"}], ("resp_1", 2))
        third = await at_b.get("alice", "resp_3")
        assert third is not None and len(third.messages) == 5

    asyncio.run(conversation())
    # in the engine, a turn shares the earlier turns' messages instead of holding copies of them
    held = state.responses
    assert state.response_put("alice", {"id": "resp_4"}, [{"role": "user", "content": "y"}], ("resp_2", 4))
    assert held.get("alice", "resp_4").messages[0] is held.get("alice", "resp_2").messages[0]  # type: ignore[union-attr]


def test_a_rate_limit_error_crosses_the_link_whole() -> None:
    error = pickle.loads(pickle.dumps(RateLimitError("over", retry_after=7, headers={"x-ratelimit-limit-requests": "2"})))
    assert (str(error), error.retry_after, error.headers) == ("over", 7, {"x-ratelimit-limit-requests": "2"})


def test_a_message_sent_later_from_a_context_copied_during_the_send_goes_out_alone(two_front_ends: Any) -> None:
    """A callback that copied the context while the request's messages were collected (an event
    loop's handle does) and sends after the frame is gone: not lost in it."""
    _, stub, ((connection, front), _) = two_front_ends
    copied: list[contextvars.Context] = []

    def send() -> list[Any]:
        copied.append(contextvars.copy_context())
        return [front.model("m").send(generate("first"))]

    LinkLimiter(connection).submit(LIMITED_TENANT, 1, send)
    late = copied[0].run(front.model("m").send, generate("late"))
    assert [m.request_id for m in sent(stub, 2)] == ["first", "late"]
    stub.sent[1].reply.resolve(completion("late"))
    assert late.result(TIMEOUT).text == "the answer to late"

"""What the front ends share in the engine's process, over their links (``http.link_state``,
``http.engine_state``), two front ends' links to one engine in this process on a stub model: a
tenant's limits counted once (refused before anything is queued, settled with what was used, a
batch line waiting on its own thread), the stored responses per tenant."""

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

from llamactor.base.completion import Usage
from llamactor.base.config import Config
from llamactor.base.errors import InvalidRequestError, RateLimitError
from llamactor.base.tenants import Tenant
from llamactor.handles.limits import WaitForLimits
from llamactor.http.engine_link import EngineLink
from llamactor.http.engine_state import EngineState
from llamactor.http.link_client import EngineConnection, LinkRouter
from llamactor.http.link_state import LinkLimiter, LinkResponses
from llamactor.serving.model_specs import ModelSpec
from tests.support.link_stubs import TIMEOUT, StubRouter, generate, sent
from tests.support.stub_tree import completion

pytestmark = pytest.mark.pure

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

"""What a stream writes, model-free: the frames ready at once go out in one write, the chunks go
to the server past the app's middleware (its start through it), and the OpenAI chunks made from
prepared templates are the chunks the dicts would have been."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from fastapi.dependencies import utils as fastapi_dependencies
from starlette.requests import Request
from starlette.routing import Route

from llamactor.base.completion import Piece
from llamactor.dialects.openai.events import chat_events, completion_events
from llamactor.dialects.openai.call import chat_call, completions_call
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.http.body_limit import Message
from llamactor.http.framing import OPENAI_SSE, frames, stream_response
from llamactor.http.server import create_app
from llamactor.http.state import ServerState

from tests.support.dialects import CTX, completion, sse_data

pytestmark = pytest.mark.pure

# text a template must encode as JSON does: quotes, backslashes, control characters, non-ASCII
AWKWARD = ['He said "hi"', "a\\b", "tab\tnew\nline\x00", "café ☕ 日本", "</script>", ""]


def _written(events: AsyncGenerator[Any, None], ready: list[bool]) -> list[bytes]:
    """The writes of ``frames``, with ``buffered`` answering from ``ready`` (then False)."""
    answers = iter(ready)

    async def run() -> list[bytes]:
        return [chunk async for chunk in frames(events, OPENAI_SSE, lambda e: [], buffered=lambda: next(answers, False))]
    return asyncio.run(run())


async def _dicts(n: int) -> AsyncGenerator[dict[str, Any], None]:
    for i in range(n):
        yield {"i": i}


def test_frames_ready_together_go_out_in_one_write_and_each_stays_its_own_event() -> None:
    writes = _written(_dicts(5), [True, True, False, True, False])  # pieces waited behind the 1st, 2nd and 4th
    assert writes == [b'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\n', b'data: {"i":3}\n\ndata: {"i":4}\n\n',
                      b"data: [DONE]\n\n"]
    assert len(_written(_dicts(3), [])) == 4  # nothing buffered: a write per event, as before


# each middleware's send wrapper (the app's own, Starlette's error and exception layers)
MIDDLEWARE_SENDS = {"RequestLog.__call__.<locals>.send_with_headers", "ServerErrorMiddleware.__call__.<locals>._send",
                    "wrap_app_handling_exceptions.<locals>.wrapped_app.<locals>.sender"}


def _sent_through(app_path: str) -> list[tuple[Message, set[str]]]:
    """Each message the server gets for a GET of ``app_path`` on the daemon's app, with the
    middleware send wrappers it came through (the functions on the stack when it arrived)."""
    sent: list[tuple[Message, set[str]]] = []

    async def server_send(message: Message) -> None:
        frame, names = sys._getframe(1), set()
        while frame is not None:
            names.add(frame.f_code.co_qualname)
            frame = frame.f_back
        sent.append((message, names & MIDDLEWARE_SENDS))

    requests = iter([{"type": "http.request", "body": b"", "more_body": False}])

    async def receive() -> Message:
        if (request := next(requests, None)) is not None:
            return request
        await asyncio.Event().wait()  # the client stays: cancelled when the answer is over
        return {"type": "http.disconnect"}

    async def streamed(request: Request) -> Any:
        return stream_response(_dicts(3), OPENAI_SSE, lambda e: [])

    app = create_app(ServerState(["m"], api_key=None, max_body_bytes=1024))
    app.router.routes.insert(0, Route(app_path, streamed))
    scope = {"type": "http", "method": "GET", "path": app_path, "raw_path": app_path.encode(), "query_string": b"",
             "headers": [(b"host", b"127.0.0.1")], "asgi": {"version": "3.0", "spec_version": "2.3"}}
    asyncio.run(app(scope, receive, server_send))
    return sent


def test_a_streams_chunks_go_past_the_middleware_and_its_start_and_end_through_it() -> None:
    sent = _sent_through("/test/stream")
    (start, start_through), *chunks, (end, end_through) = sent
    assert start["type"] == "http.response.start" and start_through == MIDDLEWARE_SENDS
    assert any(name == b"x-request-id" for name, _ in start["headers"])  # RequestLog still wrote its headers
    assert b"".join(m["body"] for m, _ in chunks) == b'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\ndata: [DONE]\n\n'
    assert all(through == set() for _, through in chunks)  # straight to the server: no wrapper per chunk
    assert end == {"type": "http.response.body", "body": b"", "more_body": False} and end_through == MIDDLEWARE_SENDS


def test_the_apps_state_is_found_on_the_loop_without_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every route's ``State`` dependency: as a plain function FastAPI would run it on a worker
    thread, a hop there and back per request (docs/performance.md, *A streamed token's cost in
    the front end*)."""
    hops: list[Any] = []

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return func(*args, **kwargs)
    monkeypatch.setattr(fastapi_dependencies, "run_in_threadpool", counted)
    sent: list[Message] = []

    async def server_send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}
    app = create_app(ServerState(["m"], api_key=None, max_body_bytes=1024))
    scope = {"type": "http", "method": "GET", "path": "/health", "raw_path": b"/health", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1")], "asgi": {"version": "3.0", "spec_version": "2.3"}}
    asyncio.run(app(scope, receive, server_send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503  # /health answered: no router yet
    assert hops == []


async def _updates(texts: list[str]) -> AsyncGenerator[Any, None]:
    for text in texts:
        yield 0, Piece(text)
    yield 0, completion("".join(texts), "length")


def _chunks(events: AsyncGenerator[Any, None]) -> list[dict[str, Any]]:
    async def run() -> list[bytes]:
        return [chunk async for chunk in frames(events, OPENAI_SSE, lambda e: [])]
    return [d for d in sse_data(b"".join(asyncio.run(run())).decode()) if d != "[DONE]"]


def test_a_chat_streams_text_chunks_from_a_template_that_are_the_chunks_json_makes() -> None:
    call = chat_call(ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "stream": True}), CTX)
    chunks = _chunks(chat_events(call, _updates(AWKWARD)))
    head = {"id": call.id, "object": "chat.completion.chunk", "created": call.created, "model": call.model}
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]][1:]  # after the role's
    assert content == [{**head, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}
                       for t in AWKWARD if t]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_completion_streams_text_chunks_from_a_template_and_logprobs_still_as_dicts() -> None:
    call = completions_call(CompletionRequest.model_validate({"prompt": "x", "stream": True}), CTX)
    chunks = _chunks(completion_events(call, _updates(AWKWARD)))
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == AWKWARD
    assert all(set(c) == {"id", "object", "created", "model", "choices"} for c in chunks)
    raw = json.dumps(chunks[0]["choices"][0])
    assert json.loads(raw) == {"index": 0, "text": AWKWARD[0], "finish_reason": None}

"""Streamed responses: one framing for server-sent events and NDJSON, one error policy (uvicorn's
event loop).

A dialect gives the events (``llamactor.dialects``: dicts, or an event's JSON already made from a
prepared template: bytes) and what a failure becomes; this module writes them as frames, and
writes every frame that is ready at once: while the streams under the events hold pieces not read
yet (``buffered``), their frames join the same write (one ASGI message, one socket write, where
the per-write cost would be paid per token per stream). Every failure after the first byte -- a typed llamactor error, or anything
unexpected (logged here, never shown but as "internal server error") -- becomes the dialect's own
error event, and the stream then closes properly, with ``[DONE]`` where the dialect has one. A
keepalive event goes out whenever a while passes without one (Anthropic's ``ping``, during a long
prefill). When the client disconnects Starlette cancels the body; closing the event iterator then
closes the pieces under it, which cancels the requests and frees their sequences.

A stream's body chunks skip the middleware (``DirectStreamingResponse``): the response's start and
its end go through every middleware's ``send`` (the status, the headers they add), each chunk
between them straight to the server's own ``send`` (``SERVER_SEND`` in the scope, put there by
``server.App``): no middleware of the app changes a response body, and five ``async`` wrappers
per token per stream were about a fifth of the loop's cost of a chunk (docs/performance.md,
*Host cap (front end)*, "The front end's cost per chunk").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import Receive, Scope, Send

from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger

log = get_logger("llamactor.http")
Event = dict[str, Any] | bytes  # bytes: the event's JSON, made by the dialect from a template
OnError = Callable[[BaseException], Sequence[Event]]  # Sequence: a dialect's list of dicts is one
Buffered = Callable[[], bool]
SERVER_SEND = "llamactor.server_send"  # the scope's key of the server's own send (``server.App``)


@dataclass(frozen=True, slots=True)
class Framing:
    """How one dialect's events are written."""

    media_type: str
    named: bool = False  # SSE: an ``event: <type>`` line before each ``data:`` (Anthropic, Responses)
    done: bool = False  # SSE: ``data: [DONE]`` last (OpenAI)
    ndjson: bool = False  # one compact JSON object per line (Ollama)
    keepalive: Event | None = None  # sent when ``keepalive_s`` pass without an event
    keepalive_s: float = 10.0

    def frame(self, event: Event) -> bytes:
        if isinstance(event, bytes):
            data = event
        elif self.named:  # Anthropic's and the Responses API's streams space their JSON out
            data = json.dumps(event, ensure_ascii=False).encode()
        else:  # OpenAI's and Ollama's are compact
            data = orjson.dumps(event)
        if self.ndjson:
            return data + b"\n"
        if self.named:
            kind = orjson.loads(data)["type"] if isinstance(event, bytes) else event["type"]
            return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"
        return b"data: " + data + b"\n\n"

    def end(self) -> bytes:
        return b"data: [DONE]\n\n" if self.done else b""


OPENAI_SSE = Framing("text/event-stream", done=True)
NAMED_SSE = Framing("text/event-stream", named=True)
NDJSON = Framing("application/x-ndjson", ndjson=True)


def stream_response(events: AsyncGenerator[Event, None], framing: Framing, on_error: OnError,
                    pieces: AsyncGenerator[Any, None] | None = None,
                    background: BackgroundTask | None = None, buffered: Buffered = lambda: False) -> StreamingResponse:
    """The streamed 200 of ``events`` (the request was accepted before it is made). ``pieces``:
    what the events are made of, closed with them (which ends the requests still running);
    ``buffered``: whether pieces wait under the events (their frames then join this write)."""
    headers = {"Cache-Control": "no-cache"} if not framing.ndjson else None
    return DirectStreamingResponse(frames(events, framing, on_error, pieces, buffered),
                                   media_type=framing.media_type, headers=headers, background=background)


class DirectStreamingResponse(StreamingResponse):
    """Starlette's streamed response whose body chunks go to the server's own ``send`` when the
    scope has one (``SERVER_SEND``); its start and its last, empty message still go through the
    middleware's (uvicorn's event loop)."""

    server_send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.server_send = scope.get(SERVER_SEND)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        body_send = self.server_send or send
        async for chunk in self.body_iterator:  # bytes: ``frames`` makes nothing else
            await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def frames(events: AsyncGenerator[Event, None], framing: Framing, on_error: OnError,
                 pieces: AsyncGenerator[Any, None] | None = None,
                 buffered: Buffered = lambda: False) -> AsyncIterator[bytes]:
    """The frames of ``events``, joined into one write while ``buffered()`` says more are ready."""
    keepalive = framing.keepalive
    source = with_keepalive(events, framing.keepalive_s) if keepalive is not None else events
    ready: list[bytes] = []
    try:
        async with contextlib.aclosing(source) as items:
            async for event in items:
                ready.append(framing.frame(event if event is not None else keepalive or {}))
                if not buffered():
                    yield b"".join(ready)
                    ready.clear()
        if ready:  # the events ended with pieces left unread (a choice failed): what was made of them
            yield b"".join(ready)
    except Exception as e:  # noqa: BLE001 - the 200 is sent: a failure can only be an event now
        if not isinstance(e, LlamactorError):
            log.error("http_stream_error", error=repr(e))
        yield b"".join(ready + [framing.frame(event) for event in on_error(e)])
    finally:
        if pieces is not None:  # now, not when collected: a client that left frees its sequences at once
            await pieces.aclose()
    if end := framing.end():
        yield end


async def with_keepalive(events: AsyncGenerator[Event, None], every_s: float) -> AsyncGenerator[Event | None, None]:
    """The events, and None each time ``every_s`` pass without one. Closing this closes
    ``events`` (which cancels its requests), whatever it was waiting for."""
    pending: asyncio.Future[Event] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:  # closed while an event was awaited: stop that wait first
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await events.aclose()

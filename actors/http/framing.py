"""Streamed responses: one framing for server-sent events and NDJSON, one error policy (uvicorn's
event loop).

A dialect gives the events (``llamactor.dialects``: dicts) and what a failure becomes; this module
writes them as frames. Every failure after the first byte -- a typed llamactor error, or anything
unexpected (logged here, never shown but as "internal server error") -- becomes the dialect's own
error event, and the stream then closes properly, with ``[DONE]`` where the dialect has one. A
keepalive event goes out whenever a while passes without one (Anthropic's ``ping``, during a long
prefill). When the client disconnects Starlette cancels the body; closing the event iterator then
closes the pieces under it, which cancels the requests and frees their sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger

log = get_logger("llamactor.http")
Event = dict[str, Any]
OnError = Callable[[BaseException], list[Event]]


@dataclass(frozen=True, slots=True)
class Framing:
    """How one dialect's events are written."""

    media_type: str
    named: bool = False  # SSE: an ``event: <type>`` line before each ``data:`` (Anthropic, Responses)
    done: bool = False  # SSE: ``data: [DONE]`` last (OpenAI)
    ndjson: bool = False  # one compact JSON object per line (Ollama)
    keepalive: Event | None = None  # sent when ``keepalive_s`` pass without an event
    keepalive_s: float = 10.0

    def frame(self, event: Event) -> str:
        if self.ndjson:
            return json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n"
        data = json.dumps(event, ensure_ascii=False)
        return f"event: {event['type']}\ndata: {data}\n\n" if self.named else f"data: {data}\n\n"

    def end(self) -> str:
        return "data: [DONE]\n\n" if self.done else ""


OPENAI_SSE = Framing("text/event-stream", done=True)
NAMED_SSE = Framing("text/event-stream", named=True)
NDJSON = Framing("application/x-ndjson", ndjson=True)


def stream_response(events: AsyncGenerator[Event, None], framing: Framing, on_error: OnError,
                    pieces: AsyncGenerator[Any, None] | None = None,
                    background: BackgroundTask | None = None) -> StreamingResponse:
    """The streamed 200 of ``events`` (the request was accepted before it is made). ``pieces``:
    what the events are made of, closed with them (which ends the requests still running)."""
    headers = {"Cache-Control": "no-cache"} if not framing.ndjson else None
    return StreamingResponse(frames(events, framing, on_error, pieces), media_type=framing.media_type,
                             headers=headers, background=background)


async def frames(events: AsyncGenerator[Event, None], framing: Framing, on_error: OnError,
                 pieces: AsyncGenerator[Any, None] | None = None) -> AsyncIterator[str]:
    keepalive = framing.keepalive
    source = with_keepalive(events, framing.keepalive_s) if keepalive is not None else events
    try:
        async with contextlib.aclosing(source) as items:
            async for event in items:
                yield framing.frame(event if event is not None else keepalive or {})
    except Exception as e:  # noqa: BLE001 - the 200 is sent: a failure can only be an event now
        if not isinstance(e, LlamactorError):
            log.error("http_stream_error", error=repr(e))
        for event in on_error(e):
            yield framing.frame(event)
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

"""Anthropic's server-sent events for one streamed message (uvicorn's event loop).

Every frame is ``event: <type>`` + ``data: <json>``: the SDK drops frames without an event name.
Order: ``message_start``, ``ping``, then content blocks strictly one after another, indexed 0, 1,
2 ... in start order (``content_block_start`` / ``_delta`` / ``_stop``): thinking first, text,
then one ``tool_use`` block per call, its arguments sent whole in one ``input_json_delta`` once the
call's block closes (``llamactor.base.tools.ToolCallStream``). Then ``message_delta`` (stop
reason, cumulative usage) and ``message_stop``. An error after the 200 is an ``error`` event,
and the stream ends there. A ping also goes out whenever ``PING_EVERY_S`` pass without a piece
(a long prefill), so that proxies and clients do not time out an idle connection.

Leaving early (the client disconnects: Starlette cancels the response) closes the piece
generator, which cancels the request and frees its sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from llamactor.base.completion import Completion, Piece
from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger
from llamactor.base.reasoning import ReasoningSplitter
from llamactor.base.tools import ToolCall, ToolCallStream, Tools
from llamactor.handles.streams import AsyncTextStream
from llamactor.http.anthropic_message import SIGNATURE, tool_input, tool_use_id, usage
from llamactor.http.errors import error_body

log = get_logger("llamactor.http")
PING_EVERY_S = 10.0
# (stop_reason, stop_sequence) of a finished completion; the bool: tool_use blocks were sent
Ending = Callable[[Completion, bool], Awaitable[tuple[str, str | None]]]


def sse_response(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        except LlamactorError as e:  # the 200 is already sent: an error can only be an event
            yield _error(e.http_status, str(e))
        except Exception as e:  # noqa: BLE001 - anything else still ends the stream in its shape
            log.error("http_stream_error", error=repr(e))
            yield _error(500, "internal server error")
    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _error(status: int, message: str) -> str:
    return f"event: error\ndata: {json.dumps(error_body('anthropic', status, message, ''), ensure_ascii=False)}\n\n"


class Blocks:
    """The content block events of one message, blocks opened and closed in order."""

    def __init__(self, show_thinking: bool = True) -> None:
        self.index = -1  # of the latest block started
        self.open: str | None = None  # the type of the block now open
        self.tool_uses = 0
        self.show_thinking = show_thinking

    def thinking(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        events = self._start({"type": "thinking", "thinking": "", "signature": ""}) if self.open != "thinking" else []
        return events + ([self._delta({"type": "thinking_delta", "thinking": text})] if self.show_thinking else [])

    def text(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        events = self._start({"type": "text", "text": ""}) if self.open != "text" else []
        return events + [self._delta({"type": "text_delta", "text": text})]

    def tool_use(self, call: ToolCall) -> list[dict[str, Any]]:
        """A whole call: ``input: {}`` at the start (without it the SDK leaves a call with no
        arguments at None), its arguments in one delta."""
        self.tool_uses += 1
        events = self._start({"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}})
        arguments = json.dumps(tool_input(call.arguments), ensure_ascii=False)
        return events + [self._delta({"type": "input_json_delta", "partial_json": arguments}), *self.close()]

    def finish(self) -> list[dict[str, Any]]:
        """Close the last block; a message with no block gets an empty text block (clients read
        ``content[0].text``)."""
        return (self._start({"type": "text", "text": ""}) if self.index < 0 else []) + self.close()

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        events = [self._delta({"type": "signature_delta", "signature": SIGNATURE})] if self.open == "thinking" else []
        self.open = None
        return events + [{"type": "content_block_stop", "index": self.index}]

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self.index += 1
        self.open = block["type"]
        return events + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}


async def message_events(stream: AsyncTextStream, head: dict[str, Any], tools: Tools | None,
                         observe: Callable[[Completion], None], ending: Ending,
                         show_thinking: bool = True) -> AsyncIterator[dict[str, Any]]:
    """The events of one message. ``head``: its id, type, role and model; ``tools``: the answer
    is parsed for calls. The prompt's token counts are known only at the end: ``message_start``
    says 0 and ``message_delta`` carries them (the SDK takes the delta's counts when present)."""
    zero = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    yield {"type": "message_start", "message": {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                                "usage": zero}}
    yield {"type": "ping"}
    blocks, splitter = Blocks(show_thinking), ReasoningSplitter()
    calls = ToolCallStream(tools) if tools is not None else None

    def content(text: str) -> list[dict[str, Any]]:
        if calls is None:
            return blocks.text(text)
        text, done = calls.feed(text)
        return blocks.text(text) + [e for call in done for e in blocks.tool_use(call)]

    async with contextlib.aclosing(with_pings(stream.pieces(), PING_EVERY_S)) as pieces:
        async for piece in pieces:
            if piece is None:
                yield {"type": "ping"}
                continue
            reasoning, text = splitter.feed(piece.text)
            for event in blocks.thinking(reasoning) + content(text):
                yield event
    reasoning, text = splitter.finish()
    events = blocks.thinking(reasoning) + content(text)
    for event in events + blocks.text(calls.finish() if calls is not None else "") + blocks.finish():
        yield event
    completion = stream.completion
    observe(completion)
    reason, stop_sequence = await ending(completion, blocks.tool_uses > 0)
    yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
           "usage": usage(completion)}
    yield {"type": "message_stop"}


async def with_pings(pieces: AsyncGenerator[Piece, None], every_s: float) -> AsyncGenerator[Piece | None, None]:
    """The pieces, and None each time ``every_s`` pass without one. Closing this closes
    ``pieces`` (which cancels its request), whatever it was waiting for."""
    pending: asyncio.Future[Piece] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(pieces))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                piece = finished.result()
            except StopAsyncIteration:
                return
            yield piece
    finally:
        if pending is not None:  # closed while a piece was awaited: stop that wait first
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await pieces.aclose()

"""The Responses API's server-sent events (``stream: true``), on uvicorn's event loop.

One answer is a sequence of output items, each opened (``output_item.added``), written and
closed (``output_item.done``) before the next: a reasoning item while the model thinks, a
message while it writes text, a ``function_call`` item per tool call (sent whole once its block
closes, as the chat stream does). The order of events is the one OpenAI sends and the openai
SDK's ``responses.stream()`` accumulator checks: ``response.created`` first, one ``response.id``
throughout, ``content_part.added`` before any delta, ``output_item.done`` with the identity of its
``added``, then ``response.completed`` or ``response.incomplete``. Each frame has an ``event:``
line (OpenAI's SDK ignores it; other clients route on it) and ``sequence_number`` counts from 0.

When the client disconnects Starlette cancels the generator; closing the piece iterator then
cancels the request. An engine failure after the 200 is a ``response.failed`` event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from llamactor.base.completion import Completion
from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger
from llamactor.base.reasoning import ReasoningSplitter
from llamactor.base.tools import ToolCall, Tools, ToolCallStream
from llamactor.handles.streams import AsyncTextStream
from llamactor.http.responses_output import (
    Item,
    Shell,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    status_of,
    text_part,
    usage,
)

log = get_logger("llamactor.http")
Event = dict[str, Any]


class StreamedOutput:
    """The items of one streamed answer and the events that open, fill and close them."""

    def __init__(self) -> None:
        self.items: list[Item] = []  # closed items, in output order
        self._open: Item | None = None  # the reasoning or message item being written
        self._text = ""

    @property
    def index(self) -> int:
        """``output_index`` of the open item (or of the next one)."""
        return len(self.items)

    def reasoning(self, delta: str) -> list[Event]:
        return self._write("reasoning", delta)

    def message(self, delta: str) -> list[Event]:
        return self._write("message", delta)

    def call(self, call: ToolCall) -> list[Event]:
        events = self.close("completed")
        i, item_id = self.index, new_id("fc")
        done = call_item(item_id, call, "completed")
        self.items.append(done)
        return events + [
            {"type": "response.output_item.added", "output_index": i,
             "item": call_item(item_id, call, "in_progress", arguments="")},
            {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": i,
             "delta": call.arguments},
            {"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": i,
             "name": call.name, "arguments": call.arguments},
            {"type": "response.output_item.done", "output_index": i, "item": done}]

    def close(self, status: str) -> list[Event]:
        """Close the open item; ``status`` is the message's (``incomplete`` when cut short)."""
        item, self._open = self._open, None
        if item is None:
            return []
        text, self._text = self._text, ""
        i, where = self.index, {"item_id": item["id"], "output_index": self.index, "content_index": 0}
        if item["type"] == "reasoning":
            done = reasoning_item(item["id"], text, "completed")
            finished: Event = {"type": "response.reasoning_text.done", **where, "text": text}
        else:
            done = message_item(item["id"], text, status)
            finished = {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
        self.items.append(done)
        return [finished, {"type": "response.content_part.done", **where, "part": done["content"][0]},
                {"type": "response.output_item.done", "output_index": i, "item": done}]

    def finish(self, status: str) -> list[Event]:
        """Close what is open; an answer with neither text nor calls still has its (empty) message,
        as the non-streamed answer does."""
        events = self.close(status)
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            events += self._write("message", "", force=True) + self.close(status)
        return events

    def _write(self, kind: str, delta: str, force: bool = False) -> list[Event]:
        if not delta and not force:
            return []
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self.close("completed")
            item_id = new_id("rs" if kind == "reasoning" else "msg")
            self._open = (reasoning_item(item_id, None, "in_progress") if kind == "reasoning"
                          else message_item(item_id, None, "in_progress"))
            part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else text_part("")
            events += [{"type": "response.output_item.added", "output_index": self.index, "item": self._open},
                       {"type": "response.content_part.added", "item_id": item_id, "output_index": self.index,
                        "content_index": 0, "part": part}]
        if delta:
            self._text += delta
            where = {"item_id": self._open["id"], "output_index": self.index, "content_index": 0}
            events.append({"type": "response.reasoning_text.delta", **where, "delta": delta} if kind == "reasoning"
                          else {"type": "response.output_text.delta", **where, "delta": delta, "logprobs": []})
        return events


async def response_events(stream: AsyncTextStream, shell: Shell, tools: Tools | None,
                          observe: Callable[[Completion], None],
                          finished: Callable[[dict[str, Any]], None]) -> AsyncIterator[Event]:
    """The events of one streamed response. ``tools``: parse the answer for calls (None: all text).
    ``finished``: called with the final response object (to store it) before the last event."""
    yield {"type": "response.created", "response": shell.response("in_progress", [])}
    yield {"type": "response.in_progress", "response": shell.response("in_progress", [])}
    out, splitter = StreamedOutput(), ReasoningSplitter()
    parser = ToolCallStream(tools) if tools is not None else None

    def feed(reasoning: str, content: str) -> list[Event]:
        events = out.reasoning(reasoning)
        content, calls = parser.feed(content) if parser is not None and content else (content, [])
        events += out.message(content)
        for call in calls:
            events += out.call(call)
        return events

    pieces = stream.pieces()
    try:
        async for piece in pieces:
            for event in feed(*splitter.feed(piece.text)):
                yield event
        completion = stream.completion
    except LlamactorError as e:  # the 200 is sent: the failure can only be an event
        log.warning("responses_stream_failed", response_id=shell.id, error=str(e))
        yield {"type": "response.failed", "response": shell.response(
            "failed", out.items, error={"code": "server_error", "message": str(e)})}
        return
    finally:
        await pieces.aclose()  # now, not when collected: leaving early cancels the request
    events = feed(*splitter.finish())
    if parser is not None:
        events += out.message(parser.finish())
    observe(completion)
    status = status_of(completion)
    for event in events + out.finish(status):
        yield event
    final = shell.response(status, out.items, usage(completion))
    finished(final)
    yield {"type": f"response.{status}", "response": final}


def sse_events(events: AsyncIterator[Event]) -> StreamingResponse:
    """``event: <type>`` / ``data: <json>`` frames, numbered; no ``[DONE]`` (OpenAI sends none)."""
    async def body() -> AsyncIterator[str]:
        seq = 0
        try:
            async for event in events:
                event["sequence_number"] = seq
                seq += 1
                yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        except Exception as e:  # noqa: BLE001 - a bug here: the 200 is sent, say so in-band
            log.error("responses_stream_error", error=repr(e))
            error = {"type": "error", "code": "server_error", "message": "internal server error", "param": None,
                     "sequence_number": seq}
            yield f"event: error\ndata: {json.dumps(error)}\n\n"
    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

"""The Responses API's events (``stream: true``), over the merged pieces of its one choice (pure).

One answer is a sequence of output items, each opened (``output_item.added``), written and
closed (``output_item.done``) before the next: a reasoning item while the model thinks, a
message while it writes text, a ``function_call`` item per tool call (sent whole once its block
closes, as the chat stream does). The order of events is the one OpenAI sends and the openai
SDK's ``responses.stream()`` accumulator checks: ``response.created`` first, one ``response.id``
throughout, ``content_part.added`` before any delta, ``output_item.done`` with the identity of its
``added``, then ``response.completed`` or ``response.incomplete``. Each frame has an ``event:``
line (OpenAI's SDK ignores it; other clients route on it: the transport writes it) and
``sequence_number`` counts from 0. A failure after the first event is a ``response.failed`` event
holding the output items closed so far (``ResponseEvents.failed``); there is no ``[DONE]``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from llamactor.base.completion import ChoiceUpdate, Piece
from llamactor.base.tools import ToolCall
from llamactor.base.answer import Parts
from llamactor.dialects.errors import ErrorInfo
from llamactor.dialects.responses.call import ResponsesCall
from llamactor.dialects.responses.output_items import (Item, call_item, message_item, new_id, reasoning_item, status_of,
                                                       text_part, usage)

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


class ResponseEvents:
    """The numbered events of one streamed response. ``finished``: called with the final response
    object (to store it) before the last event, and awaited if it returns an awaitable."""

    def __init__(self, call: ResponsesCall, finished: Callable[[dict[str, Any]], object]) -> None:
        self.call, self.finished = call, finished
        self.out = StreamedOutput()
        self._seq = 0

    async def events(self, updates: AsyncIterator[ChoiceUpdate]) -> AsyncGenerator[Event, None]:
        shell = self.call.shell
        yield self._numbered({"type": "response.created", "response": shell.response("in_progress", [])})
        yield self._numbered({"type": "response.in_progress", "response": shell.response("in_progress", [])})
        async for _, item in updates:
            if isinstance(item, Piece):
                for event in self._write(item.split):
                    yield self._numbered(event)
                continue
            status = status_of(item)
            for event in self._write(item.last_parts or Parts()) + self.out.finish(status):
                yield self._numbered(event)
            final = shell.response(status, self.out.items, usage(item))
            if inspect.isawaitable(kept := self.finished(final)):  # stored (over a link) before the client hears
                await kept
            yield self._numbered({"type": f"response.{status}", "response": final})

    def failed(self, e: BaseException) -> list[Event]:
        """The ``response.failed`` event a failure after the first event becomes."""
        error = ErrorInfo.of(e)
        return [self._numbered({"type": "response.failed", "response": self.call.shell.response(
            "failed", self.out.items, error={"code": "server_error", "message": error.message})})]

    def _write(self, parts: Parts) -> list[Event]:
        events = self.out.reasoning(parts.reasoning) + self.out.message(parts.content)
        for call in parts.calls:
            events += self.out.call(call)
        return events

    def _numbered(self, event: Event) -> Event:
        event["sequence_number"] = self._seq
        self._seq += 1
        return event

"""Anthropic's events for one streamed message (pure), over the merged pieces of its one choice.

Order: ``message_start``, ``ping``, then content blocks strictly one after another, indexed 0, 1,
2 ... in start order (``content_block_start`` / ``_delta`` / ``_stop``): thinking first, text,
then one ``tool_use`` block per call, its arguments sent whole in one ``input_json_delta`` once the
call's block closes. Then ``message_delta`` (stop reason, cumulative usage) and ``message_stop``.
Every frame is ``event: <type>`` + ``data: <json>`` (the SDK drops frames without an event name:
the transport writes them), a ``ping`` goes out whenever a while passes without a piece (a long
prefill: ``PING``, the transport's keepalive), and a failure after the first event is an
``error`` event (``stream_error``), with which the stream ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from llamactor.base.completion import ChoiceUpdate, Piece
from llamactor.base.tools import ToolCall
from llamactor.dialects.anthropic.call import MessagesCall
from llamactor.dialects.anthropic.message import SIGNATURE, stop_reason, stop_sequence, tool_input, tool_use_id, usage
from llamactor.base.answer import Parts
from llamactor.dialects.errors import ErrorInfo

Event = dict[str, Any]
PING: Event = {"type": "ping"}
PING_EVERY_S = 10.0  # so that proxies and clients do not time out an idle connection


def stream_error(e: BaseException) -> list[Event]:
    return [ErrorInfo.of(e).body("anthropic")]


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

    def parts(self, parts: Parts) -> list[dict[str, Any]]:
        """Reasoning, then text, then each whole call."""
        return self.thinking(parts.reasoning) + self.text(parts.content) + [
            e for call in parts.calls for e in self.tool_use(call)]

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


async def message_events(call: MessagesCall, updates: AsyncIterator[ChoiceUpdate]) -> AsyncGenerator[Event, None]:
    """The events of one message. The prompt's token counts are known only at the end:
    ``message_start`` says 0 and ``message_delta`` carries them (the SDK takes the delta's counts)."""
    zero = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    head = {"id": call.id, "type": "message", "role": "assistant", "model": call.model}
    yield {"type": "message_start", "message": {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                                "usage": zero}}
    yield PING
    blocks = Blocks(call.show_thinking)
    async for _, item in updates:
        if isinstance(item, Piece):
            for event in blocks.parts(item.split):
                yield event
            continue
        for event in blocks.parts(item.last_parts or Parts()) + blocks.finish():
            yield event
        yield {"type": "message_delta", "usage": usage(item),
               "delta": {"stop_reason": stop_reason(call, item, blocks.tool_uses > 0),
                         "stop_sequence": stop_sequence(call, item)}}
        yield {"type": "message_stop"}

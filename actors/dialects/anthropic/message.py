"""The response side of the Anthropic dialect: the Message object built from a ``Completion``,
its stop reason and usage (pure; the route and the event stream both use them)."""

from __future__ import annotations

import json
from typing import Any

from llamactor.base.completion import Completion
from llamactor.dialects.anthropic.call import MessagesCall

# A thinking block's signature: the SDK's type needs a string; replayed blocks' are not checked.
SIGNATURE = "llamactor"
STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
               "context_full": "model_context_window_exceeded", "cancelled": "end_turn"}


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` ids for llamactor's ``call_`` ones."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object ``input`` must be ({} if they are not one: the SDK
    needs an object; constrained calls always are)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage(c: Completion) -> dict[str, int]:
    """Anthropic counts cached prompt tokens apart: input + cache_read is the whole prompt."""
    return {"input_tokens": c.usage.prompt_tokens - c.usage.cached_tokens, "output_tokens": c.usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": c.usage.cached_tokens}


def stop_sequence(call: MessagesCall, c: Completion) -> str | None:
    """Which of the caller's ``stop_sequences`` ended the answer; None for an end of turn (the
    chat format's own stop strings included)."""
    return c.stop_sequence if c.finish_reason == "stop" and c.stop_sequence in call.stop_sequences else None


def stop_reason(call: MessagesCall, c: Completion, sent_tool_uses: bool = True) -> str:
    """Anthropic's stop reason; running out of a ``max_tokens`` the engine clamped to the room left
    in the context is the context window's doing. ``sent_tool_uses`` False: calls that a stream
    could not parse out (text came first) went out as text, so the turn simply ended."""
    if stop_sequence(call, c) is not None:
        return "stop_sequence"
    if c.finish_reason == "length" and c.clamped_max_tokens is not None:
        return "model_context_window_exceeded"
    if c.finish_reason == "tool_calls" and not sent_tool_uses:
        return "end_turn"
    return STOP_REASON[c.finish_reason]


def content_blocks(c: Completion, show_thinking: bool = True) -> list[dict[str, Any]]:
    """A thinking block (if the model reasoned), the text, then one tool_use block per call."""
    answer = c.split
    blocks: list[dict[str, Any]] = []
    if answer.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": answer.reasoning if show_thinking else "",
                       "signature": SIGNATURE})
    if answer.content or not answer.calls:
        blocks.append({"type": "text", "text": answer.content})
    blocks += [{"type": "tool_use", "id": tool_use_id(t.id), "name": t.name, "input": tool_input(t.arguments)}
               for t in answer.calls]
    return blocks


def message(call: MessagesCall, c: Completion) -> dict[str, Any]:
    """The Message object of a finished answer."""
    return {"id": call.id, "type": "message", "role": "assistant", "model": call.model,
            "content": content_blocks(c, call.show_thinking), "stop_reason": stop_reason(call, c),
            "stop_sequence": stop_sequence(call, c), "usage": usage(c)}

"""The response side of the Anthropic dialect: the Message object built from a ``Completion``,
its stop reason and usage (pure; the route handlers and the event stream call it on uvicorn's
event loop)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llamactor.base.completion import Completion
from llamactor.base.reasoning import split_reasoning

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


def stop_reason(finish_reason: str, stop_sequence: str | None, clamped: bool) -> str:
    """``clamped``: max_tokens was cut to the room left in the context, so running out of it is
    the context window's doing."""
    if stop_sequence is not None:
        return "stop_sequence"
    if finish_reason == "length" and clamped:
        return "model_context_window_exceeded"
    return STOP_REASON[finish_reason]


def matched_stop(text: str, generated: str, stops: Sequence[str]) -> str | None:
    """Which of the request's ``stops`` ended an answer, or None (end of turn, or a stop string of
    the chat format's own). ``text``: the answer, cut just before the stop string; ``generated``:
    all its tokens decoded, through the one that completed the match. The cut is where the first
    stop string began, so the one that matched starts the rest (the first such one in ``stops``)."""
    tail = generated[len(text):] if generated.startswith(text) else ""
    return next((s for s in stops if s and tail.startswith(s)), None)


def content_blocks(c: Completion, show_thinking: bool = True) -> list[dict[str, Any]]:
    """A thinking block (if the model reasoned), the text, then one tool_use block per call."""
    reasoning, text = split_reasoning(c.text)
    blocks: list[dict[str, Any]] = []
    if reasoning is not None:
        blocks.append({"type": "thinking", "thinking": reasoning if show_thinking else "", "signature": SIGNATURE})
    if text or not c.tool_calls:
        blocks.append({"type": "text", "text": text})
    blocks += [{"type": "tool_use", "id": tool_use_id(t.id), "name": t.name, "input": tool_input(t.arguments)}
               for t in c.tool_calls]
    return blocks


def message(head: dict[str, Any], c: Completion, stop_sequence: str | None, clamped: bool,
            show_thinking: bool = True) -> dict[str, Any]:
    """The Message object; ``head``: its id, type, role and model."""
    return {**head, "content": content_blocks(c, show_thinking),
            "stop_reason": stop_reason(c.finish_reason, stop_sequence, clamped), "stop_sequence": stop_sequence,
            "usage": usage(c)}

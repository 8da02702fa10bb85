"""The Responses API's response object and output items (pure). Shapes follow the ``openai`` SDK's ``Response`` model, every field present (strict
clients in other languages need them), nothing the SDK would misread (no message ``phase``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from llamactor.base.completion import Completion
from llamactor.base.tools import ToolCall
from llamactor.dialects.responses.schema import ResponsesRequest

Item = dict[str, Any]
INCOMPLETE = ("length", "context_full")  # the answer was cut: by max_output_tokens, or by the context


def new_id(prefix: str) -> str:
    """``resp_``, ``msg_``, ``fc_``, ``rs_`` ids (``call_`` ids come with the parsed ``ToolCall``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def status_of(c: Completion) -> str:
    return "incomplete" if c.finish_reason in INCOMPLETE else "completed"


def text_part(text: str) -> Item:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> Item:
    """``text`` None: the item as first announced, before its content part."""
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [text_part(text)]}


def reasoning_item(item_id: str, text: str | None, status: str) -> Item:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def call_item(item_id: str, call: ToolCall, status: str, arguments: str | None = None) -> Item:
    # call_id (the model's call, answered by function_call_output) differs from the item's id
    return {"type": "function_call", "id": item_id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if arguments is None else arguments, "status": status}


def output_items(c: Completion) -> list[Item]:
    """A finished answer's items: its reasoning, its text (the message; left out when the answer
    is only tool calls), its calls."""
    answer = c.split
    status = status_of(c)
    items = [reasoning_item(new_id("rs"), answer.reasoning, "completed")] if answer.reasoning else []
    if answer.content or not answer.calls:
        items.append(message_item(new_id("msg"), answer.content, status))
    return items + [call_item(new_id("fc"), call, "completed") for call in answer.calls]


def usage(c: Completion) -> dict[str, Any]:
    """``input_tokens`` includes the cached ones (OpenAI's convention); nothing is ever written to
    a paid cache; reasoning tokens are counted in ``output_tokens``, not apart (0)."""
    prompt, generated = c.usage.prompt_tokens, c.usage.completion_tokens
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": c.usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated}


@dataclass(frozen=True)
class Shell:
    """The fields of one response that do not change while it is generated (echoes of the request)."""

    body: ResponsesRequest
    id: str
    model: str
    created_at: int

    def response(self, status: str, output: list[Item], usage: dict[str, Any] | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": self.model,
            "output": output,
            # llamactor makes one call per answer unless asked for more (llamactor.base.tools)
            "parallel_tool_calls": bool(b.parallel_tool_calls),
            "previous_response_id": b.previous_response_id,
            "reasoning": b.reasoning or {"effort": None, "summary": None},
            "store": b.store is not False, "temperature": b.temperature, "top_p": b.top_p,
            "text": b.text or {"format": {"type": "text"}}, "tool_choice": b.tool_choice or "auto",
            "tools": b.tools or [], "truncation": b.truncation or "disabled", "usage": usage,
            "user": b.user, "metadata": b.metadata or {}, "background": False,
            "service_tier": b.service_tier, "prompt_cache_key": b.prompt_cache_key,
            "safety_identifier": b.safety_identifier, "top_logprobs": b.top_logprobs,
            "max_tool_calls": b.max_tool_calls,
        }


def response_reply(shell: Shell, c: Completion) -> dict[str, Any]:
    """The response object of a finished answer (a route's, a batch line's)."""
    return shell.response(status_of(c), output_items(c), usage(c))

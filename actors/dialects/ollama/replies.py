"""The answers of ``/api/chat`` and ``/api/generate`` (pure): whole replies and the lines of a
stream, from a call and its finished (or streaming) answer.

An answer's text is split into Ollama's parts (``llamactor.base.answer``): ``thinking`` (a
``<think>`` block, when thinking is parsed), ``content`` (``response`` for generate) and whole
tool calls (a call is sent once its block closes, arguments as an object). A stream is strict
NDJSON, which the ``ollama`` client parses line by line: one compact JSON object per line (the
transport frames them). An error after the first line (a replica lost mid-answer) is one more
line, ``{"error": "..."}``, as Ollama sends it (``stream_error``).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any

from llamactor.base.completion import ChoiceUpdate, Completion, Piece, TokenLogprob
from llamactor.base.tools import ToolCall
from llamactor.base.answer import Parts
from llamactor.dialects.errors import ErrorInfo
from llamactor.dialects.ollama.call import OllamaCall

# (content, thinking, Ollama tool calls) -> the body fields of one chunk: chat's message, generate's response
Shape = Callable[[str, str, list[dict[str, Any]]], dict[str, Any]]
# llamactor's finish reasons as Ollama's done_reason (a tool call ends a turn: "stop" in Ollama)
DONE_REASON = {"stop": "stop", "length": "length", "context_full": "length", "cancelled": "stop", "tool_calls": "stop"}


def stream_error(e: BaseException) -> list[dict[str, Any]]:
    return [ErrorInfo.of(e).body("ollama")]


def tool_calls(calls: list[ToolCall] | tuple[ToolCall, ...], first_index: int = 0) -> list[dict[str, Any]]:
    """llamactor's calls in Ollama's shape: ``arguments`` an object (its clients refuse text)."""
    out = []
    for k, call in enumerate(calls):
        try:
            args: Any = json.loads(call.arguments)
        except json.JSONDecodeError:
            args = call.arguments
        out.append({"id": call.id, "function": {"index": first_index + k, "name": call.name,
                                                "arguments": args if isinstance(args, dict) else {"value": args}}})
    return out


def logprobs(tokens: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]]:
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return [{**entry(t.token, t.logprob), **({"top_logprobs": [entry(a, v) for a, v in t.top]} if t.top else {})}
            for t in tokens or ()]


def created_at() -> str:
    """Now, as Ollama writes ``created_at``: RFC 3339 in UTC with a Z."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def done_fields(c: Completion, load_ns: int) -> dict[str, Any]:
    """The final chunk's fields: why it ended, token counts, durations in nanoseconds (prompt
    evaluation: admitted to first token; evaluation: first token to last)."""
    t = c.timings

    def ns(ms: float) -> int:
        return max(0, math.floor(ms * 1e6))
    return {"done": True, "done_reason": DONE_REASON[c.finish_reason], "total_duration": ns(t.total_ms) + load_ns,
            "load_duration": load_ns, "prompt_eval_count": c.usage.prompt_tokens,
            "prompt_eval_duration": ns(t.ttft_ms - t.queue_ms), "eval_count": c.usage.completion_tokens,
            "eval_duration": ns(t.total_ms - t.ttft_ms)}


def chat_shape(content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat's answer fields: a message."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return {"message": message}


def generate_shape(content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Generate's answer fields: the response (a raw prompt has no tool calls)."""
    return {"response": content, **({"thinking": thinking} if thinking else {})}


def shape_of(call: OllamaCall) -> Shape:
    return chat_shape if call.kind == "chat" else generate_shape


def head(call: OllamaCall) -> dict[str, Any]:
    """The fields every line starts with: the model as named, and now."""
    return {"model": call.model, "created_at": created_at()}


def loaded_reply(model: str, kind: str, reason: str) -> dict[str, Any]:
    """The one object an empty request answers with: the model loaded, or unloaded (``reason``)."""
    shape = chat_shape("", "", []) if kind == "chat" else {"response": ""}
    return {"model": model, "created_at": created_at(), **shape, "done": True, "done_reason": reason}


def whole_answer(call: OllamaCall, c: Completion, load_ns: int) -> dict[str, Any]:
    """A non-streamed reply. Tool calls are the engine's (parsed from the finished answer)."""
    answer = c.split
    thinking = answer.reasoning or "" if call.keep_thinking else ""
    out = {**head(call), **shape_of(call)(answer.content, thinking, tool_calls(answer.calls)), **done_fields(c, load_ns)}
    if call.logprobs:
        out["logprobs"] = logprobs(c.logprobs)
    return out


async def answer_lines(call: OllamaCall, updates: AsyncIterator[ChoiceUpdate],
                       load_ns: int) -> AsyncGenerator[dict[str, Any], None]:
    """A streamed answer's lines: parts as they arrive, then the final one (``done``, counts,
    durations) with empty content, as Ollama ends its streams."""
    shape = shape_of(call)
    n_calls = 0

    def line(parts: Parts, tokens: Any = None) -> dict[str, Any] | None:
        nonlocal n_calls
        lp = logprobs(tokens) if call.logprobs else []
        thinking = parts.reasoning if call.keep_thinking else ""
        if not (thinking or parts.content or parts.calls or lp):
            return None
        out = {**head(call), **shape(parts.content, thinking, tool_calls(parts.calls, n_calls)), "done": False}
        n_calls += len(parts.calls)
        return {**out, "logprobs": lp} if lp else out

    async for _, item in updates:
        if isinstance(item, Piece):
            if (out := line(item.split, item.logprobs)) is not None:
                yield out
            continue
        if (out := line(item.last_parts or Parts())) is not None:
            yield out
        yield {**head(call), **shape("", "", []), **done_fields(item, load_ns)}

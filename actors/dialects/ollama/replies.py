"""The answers of ``/api/chat`` and ``/api/generate``: NDJSON streams and whole replies (uvicorn's
event loop).

An answer's text is split into Ollama's parts: ``thinking`` (a ``<think>`` block, when thinking
is parsed), ``content`` (``response`` for generate) and whole tool calls (a call is sent once its
block closes, arguments as an object). A stream is strict NDJSON, which the ``ollama`` client
parses line by line: one compact JSON object per line, no blank lines, no SSE ``data:``. An error
after the 200 (a replica lost mid-answer) is one more line, ``{"error": "..."}``, as Ollama sends
it. When the client disconnects Starlette cancels the body generator; leaving ``pieces()`` early
cancels the request and frees its sequence.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from llamactor.base.completion import Completion, TokenLogprob
from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger
from llamactor.base.reasoning import ReasoningSplitter
from llamactor.base.tools import ToolCall, Tools, ToolCallStream
from llamactor.handles.streams import AsyncTextStream

log = get_logger("llamactor.http")
# (content, thinking, Ollama tool calls) -> the body fields of one chunk: chat's message, generate's response
Shape = Callable[[str, str, list[dict[str, Any]]], dict[str, Any]]
Head = Callable[[], dict[str, Any]]  # model and created_at, fresh for each line
# llamactor's finish reasons as Ollama's done_reason (a tool call ends a turn: "stop" in Ollama)
DONE_REASON = {"stop": "stop", "length": "length", "context_full": "length", "cancelled": "stop", "tool_calls": "stop"}


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
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return {"message": message}


def generate_shape(content: str, thinking: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"response": content, **({"thinking": thinking} if thinking else {})}


class AnswerParts:
    """Splits an answer, piece by piece, into (thinking, content, tool calls). ``think`` False:
    the reasoning is dropped (the client asked for none); ``parse_thinking`` False: all text is
    content (a raw prompt's answer is returned as the model wrote it)."""

    def __init__(self, tools: Tools | None, think: bool | str | None, parse_thinking: bool = True) -> None:
        self._reasoning = ReasoningSplitter() if parse_thinking else None
        self._calls = ToolCallStream(tools) if tools is not None else None
        self._keep_thinking = think is not False

    def feed(self, text: str) -> tuple[str, str, list[ToolCall]]:
        thinking, content = self._reasoning.feed(text) if self._reasoning is not None else ("", text)
        calls: list[ToolCall] = []
        if self._calls is not None and content:
            content, calls = self._calls.feed(content)
        return (thinking if self._keep_thinking else ""), content, calls

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        """What was held back (a possible tag or call block) when the answer ends."""
        thinking, content = self._reasoning.finish() if self._reasoning is not None else ("", "")
        calls: list[ToolCall] = []
        if self._calls is not None:
            if content:
                content, calls = self._calls.feed(content)
            content += self._calls.finish()
        return (thinking if self._keep_thinking else ""), content, calls


def whole_answer(c: Completion, head: Head, shape: Shape, parts: AnswerParts, want_logprobs: bool,
                 load_ns: int) -> dict[str, Any]:
    """A non-streamed reply. Tool calls are the engine's (parsed from the finished answer);
    the text around them is split like a stream's."""
    thinking, content, _ = parts.feed(c.text)
    more_thinking, more_content, _ = parts.finish()
    out = {**head(), **shape(content + more_content, thinking + more_thinking, tool_calls(c.tool_calls)),
           **done_fields(c, load_ns)}
    if want_logprobs:
        out["logprobs"] = logprobs(c.logprobs)
    return out


async def answer_lines(stream: AsyncTextStream, head: Head, shape: Shape, parts: AnswerParts,
                       observe: Callable[[Completion], None], want_logprobs: bool,
                       load_ns: int) -> AsyncIterator[dict[str, Any]]:
    """A streamed answer's chunks: parts as they arrive, then the final one (``done``, counts,
    durations) with empty content, as Ollama ends its streams. Runs as the response body."""
    n_calls = n_logprobs = 0

    def chunk(thinking: str, content: str, calls: list[ToolCall], tokens: Any = None) -> dict[str, Any] | None:
        nonlocal n_calls, n_logprobs
        lp = logprobs(tokens) if want_logprobs else []
        if not (thinking or content or calls or lp):
            return None
        out = {**head(), **shape(content, thinking, tool_calls(calls, n_calls)), "done": False}
        n_calls += len(calls)
        n_logprobs += len(lp)
        return {**out, "logprobs": lp} if lp else out

    pieces = stream.pieces()
    try:
        async for piece in pieces:
            if (line := chunk(*parts.feed(piece.text), piece.logprobs)) is not None:
                yield line
    finally:
        await pieces.aclose()
    if (line := chunk(*parts.finish())) is not None:
        yield line
    c = stream.completion
    observe(c)
    last = {**head(), **shape("", "", []), **done_fields(c, load_ns)}
    # Tokens whose text never became a piece (a stop string, held back, then cut) still had their
    # logprobs: they come with the last line, so the stream reports every token once, as a whole reply does.
    rest = logprobs(c.logprobs)[n_logprobs:] if want_logprobs else []
    yield {**last, "logprobs": rest} if rest else last


def ndjson_response(lines: AsyncIterator[dict[str, Any]],
                    background: BackgroundTask | None = None) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        try:
            async for line in lines:
                yield json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
        except LlamactorError as e:  # the 200 is already sent: an error can only be a line
            yield json.dumps({"error": str(e)}, ensure_ascii=False) + "\n"
        except Exception as e:  # noqa: BLE001 - nothing else can tell the client; no stack trace to it
            log.error("http_unexpected_error", error=repr(e))
            yield json.dumps({"error": "internal server error"}) + "\n"
    return StreamingResponse(body(), media_type="application/x-ndjson", background=background)

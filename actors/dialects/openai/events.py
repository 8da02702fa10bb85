"""Server-sent event streams of the OpenAI endpoints: one or ``n`` choices, pieces as decoded.

Runs on uvicorn's event loop. With ``n`` > 1 the choices' streams are merged as their pieces
arrive, each chunk naming its choice ``index``. When the client disconnects, Starlette cancels
the response generator; cancelling the pump tasks ends each ``AsyncTextStream`` early, which
cancels its request and frees its sequence.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from openai.types.chat import ChatCompletionChunk

from llamactor.base.completion import Completion, Piece
from llamactor.base.errors import LlamactorError
from llamactor.http.errors import error_body
from llamactor.http.openai_schema import FINISH_REASON, chat_logprobs, completion_logprobs
from llamactor.handles.streams import AsyncTextStream
from llamactor.base.reasoning import ReasoningSplitter
from llamactor.base.tools import ToolCall, Tools, ToolCallStream

Envelope = Callable[[], dict[str, Any]]
Observe = Callable[[Completion], None]


def sse_response(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        except LlamactorError as e:  # the 200 is already sent: an error can only be an event
            yield f"data: {json.dumps(error_body('openai', e.http_status, str(e), e.code, e.code, **e.details))}\n\n"
        yield "data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def merged(streams: list[AsyncTextStream]) -> AsyncIterator[tuple[int, Piece | None, Completion | None]]:
    """``(index, piece, None)`` as pieces arrive, then ``(index, None, completion)`` per choice."""
    queue: asyncio.Queue[tuple[int, Piece | None, Completion | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncTextStream) -> None:
        try:
            async for piece in stream.pieces():
                queue.put_nowait((index, piece, None))
            queue.put_nowait((index, None, stream.completion))
        except LlamactorError as e:
            queue.put_nowait((index, None, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(streams)):
            while True:
                index, piece, end = await queue.get()
                if isinstance(end, BaseException):
                    raise end
                yield index, piece, end
                if end is not None:
                    break
    finally:
        for task in tasks:
            task.cancel()


def usage(done: list[Completion]) -> dict[str, Any]:
    """OpenAI's usage object for the choices of one prompt: its tokens count once, and the cached
    ones are those no choice had to compute (``n`` choices share the prompt's KV)."""
    prompt, completion = done[0].usage.prompt_tokens, sum(c.usage.completion_tokens for c in done)
    cached = min(c.usage.cached_tokens for c in done)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def completion_chunks(streams: list[AsyncTextStream], envelope: Envelope, observe: Observe,
                            n_top: int | None, echoed: list[str] | None = None) -> AsyncIterator[dict[str, Any]]:
    """``n_top``: the request's ``logprobs`` (None: not asked); each chunk carries its tokens'.
    ``echoed``: each choice's prompt, sent first (``echo: true``)."""
    done: list[Completion] = []
    offsets = [0] * len(streams)
    for index, prompt in enumerate(echoed or []):
        offsets[index] = len(prompt)
        yield {**envelope(), "choices": [{"index": index, "text": prompt, "finish_reason": None}]}
    async for index, piece, end in merged(streams):
        if piece is not None:
            logprobs = completion_logprobs(piece.logprobs, n_top, offsets[index]) if n_top is not None else None
            offsets[index] += len(piece.text)
            yield {**envelope(), "choices": [{"index": index, "text": piece.text, "finish_reason": None,
                                              **({"logprobs": logprobs} if logprobs else {})}]}
            continue
        assert end is not None
        observe(end)
        done.append(end)
        last = len(done) == len(streams)
        yield {**envelope(), "choices": [{"index": index, "text": "", "finish_reason": FINISH_REASON[end.finish_reason]}],
               **({"usage": usage(done)} if last else {})}


async def chat_chunks(streams: list[AsyncTextStream], envelope: Envelope, observe: Observe,
                      include_usage: bool, logprobs: bool, tools: Tools | None) -> AsyncIterator[dict[str, Any]]:
    """``tools``: the answer is parsed for tool calls; each call is sent whole in one
    ``delta.tool_calls`` entry once its block closes, other text as content. A reasoning model's
    ``<think>`` block streams as ``delta.reasoning_content``."""
    parsers = [ToolCallStream(tools) for _ in streams] if tools is not None else None
    thinking = [ReasoningSplitter() for _ in streams]
    n_calls = [0] * len(streams)

    def delta(index: int, content: str, calls: list[ToolCall], piece_logprobs: Any = None,
              reasoning: str = "") -> dict[str, Any]:
        d: dict[str, Any] = {"content": content} if content else {}
        if reasoning:
            d["reasoning_content"] = reasoning
        if calls:
            d["tool_calls"] = [{"index": n_calls[index] + k, **call.to_openai()} for k, call in enumerate(calls)]
            n_calls[index] += len(calls)
        return {**envelope(), "choices": [{"index": index, "delta": d, "finish_reason": None,
                                           **({"logprobs": chat_logprobs(piece_logprobs)} if logprobs else {})}]}

    for index in range(len(streams)):
        yield {**envelope(), "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]}
    done: list[Completion] = []
    async for index, piece, end in merged(streams):
        if piece is not None:
            reasoning, answer = thinking[index].feed(piece.text)
            content, calls = parsers[index].feed(answer) if parsers else (answer, [])
            if content or calls or reasoning or logprobs:
                yield delta(index, content, calls, piece.logprobs, reasoning)
            continue
        assert end is not None
        reasoning, answer = thinking[index].finish()
        content, calls = parsers[index].feed(answer) if parsers else (answer, [])
        rest = content + (parsers[index].finish() if parsers else "")
        if rest or reasoning or calls:
            yield delta(index, rest, calls, None, reasoning)
        observe(end)
        done.append(end)
        yield ChatCompletionChunk.model_validate({**envelope(), "choices": [
            {"index": index, "delta": {}, "finish_reason": FINISH_REASON[end.finish_reason]}]}).model_dump(exclude_none=True)
    if include_usage:
        yield {**envelope(), "choices": [], "usage": usage(done)}

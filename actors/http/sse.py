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

from llamactor.completion import Completion
from llamactor.errors import LlamactorError
from llamactor.http.openai_schema import FINISH_REASON, error_body
from llamactor.streams import AsyncTextStream

Envelope = Callable[[], dict[str, Any]]
Observe = Callable[[Completion], None]


def sse_response(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        except LlamactorError as e:  # the 200 is already sent: an error can only be an event
            yield f"data: {json.dumps(error_body(str(e), e.code, e.code))}\n\n"
        yield "data: [DONE]\n\n"
    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def merged(streams: list[AsyncTextStream]) -> AsyncIterator[tuple[int, str | None, Completion | None]]:
    """``(index, piece, None)`` as pieces arrive, then ``(index, None, completion)`` per choice."""
    queue: asyncio.Queue[tuple[int, str | None, Completion | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncTextStream) -> None:
        try:
            async for piece in stream:
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


async def completion_chunks(streams: list[AsyncTextStream], envelope: Envelope,
                            observe: Observe) -> AsyncIterator[dict[str, Any]]:
    done: list[Completion] = []
    async for index, piece, end in merged(streams):
        if end is None:
            yield {**envelope(), "choices": [{"index": index, "text": piece, "finish_reason": None}]}
            continue
        observe(end)
        done.append(end)
        last = len(done) == len(streams)
        yield {**envelope(), "choices": [{"index": index, "text": "", "finish_reason": FINISH_REASON[end.finish_reason]}],
               **({"usage": usage(done)} if last else {})}


async def chat_chunks(streams: list[AsyncTextStream], envelope: Envelope, observe: Observe,
                      include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    for index in range(len(streams)):
        yield {**envelope(), "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]}
    done: list[Completion] = []
    async for index, piece, end in merged(streams):
        if end is None:
            yield {**envelope(), "choices": [{"index": index, "delta": {"content": piece}, "finish_reason": None}]}
            continue
        observe(end)
        done.append(end)
        yield ChatCompletionChunk.model_validate({**envelope(), "choices": [
            {"index": index, "delta": {}, "finish_reason": FINISH_REASON[end.finish_reason]}]}).model_dump(exclude_none=True)
    if include_usage:
        yield {**envelope(), "choices": [], "usage": usage(done)}

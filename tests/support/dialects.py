"""Driving a dialect's event sequence without a model: its pieces and finished completion as the
merged ``ChoiceUpdate``s a stream yields, and the frames the transport writes of its events."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from llamactor.base.answer import Answer, AnswerSplitter
from llamactor.base.completion import ChoiceUpdate, Completion, Piece, Timings, Usage
from llamactor.base.sampling import SamplingParams
from llamactor.base.request import GenerationRequest
from llamactor.dialects.context import RequestContext
from llamactor.http.framing import Framing, frames

CTX = RequestContext("test", "m", SamplingParams(), created=0)


def completion(text: str, finish: str = "stop", calls: tuple[Any, ...] = (), prompt: int = 20, cached: int = 8,
               generated: int = 5, **fields: Any) -> Completion:
    return Completion("r", text, tuple(range(generated)), finish, Usage(prompt, generated, cached),  # type: ignore[arg-type]
                      Timings(0, 0, 0, 0), tool_calls=calls, **fields)


def answered(c: Completion) -> Completion:
    """``c`` as the batcher finishes a chat's answer: split (``Completion.answer``), its calls as given."""
    splitter = AnswerSplitter(None)
    splitter.feed(c.text)
    split = splitter.whole(c.text, calls_count=False).answer
    return dataclasses.replace(c, answer=Answer(split.reasoning, split.content, tuple(c.tool_calls)))


async def updates(pieces: list[str], done: Completion | BaseException, request: GenerationRequest | None = None,
                  index: int = 0) -> AsyncGenerator[ChoiceUpdate, None]:
    """One choice's pieces, then its completion -- or, as an engine failure reaches a stream, its
    error. With ``request``: split as the batcher splits its answer (``Piece.parts``, ``last_parts``)."""
    splitter = AnswerSplitter.of(request.parsed_tools, request.splits_reasoning) if request is not None else None
    for text in pieces:
        yield index, Piece(text, parts=splitter.feed(text) if splitter is not None else None)
    if isinstance(done, BaseException):
        raise done
    yield index, dataclasses.replace(done, last_parts=splitter.finish()) if splitter is not None else done


def collect(events: AsyncIterator[dict[str, Any] | bytes]) -> list[dict[str, Any]]:
    """The events as dicts (a dialect's prepared events are their JSON already)."""
    async def run() -> list[dict[str, Any]]:
        return [json.loads(e) if isinstance(e, bytes) else e async for e in events]
    return asyncio.run(run())


def framed(events: AsyncGenerator[dict[str, Any], None], framing: Framing,
           on_error: Callable[[BaseException], list[dict[str, Any]]]) -> str:
    """What the transport writes of ``events`` (the one error policy included)."""
    async def run() -> str:
        return b"".join([chunk async for chunk in frames(events, framing, on_error)]).decode()
    return asyncio.run(run())


def sse_data(body: str) -> list[Any]:
    """The JSON of each ``data:`` line of an SSE body (``[DONE]`` as the string)."""
    out = []
    for frame in body.split("\n\n"):
        for line in frame.splitlines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                out.append(data if data == "[DONE]" else json.loads(data))
    return out

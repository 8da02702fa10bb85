"""Driving a dialect's event sequence without a model: its pieces and finished completion as the
merged ``ChoiceUpdate``s a stream yields, and the frames the transport writes of its events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from llamactor.base.completion import ChoiceUpdate, Completion, Piece, Timings, Usage
from llamactor.base.config import SamplingParams
from llamactor.dialects.context import RequestContext
from llamactor.http.framing import Framing, frames

CTX = RequestContext("test", "m", SamplingParams(), created=0)


def completion(text: str, finish: str = "stop", calls: tuple[Any, ...] = (), prompt: int = 20, cached: int = 8,
               generated: int = 5, **fields: Any) -> Completion:
    return Completion("r", text, tuple(range(generated)), finish, Usage(prompt, generated, cached),  # type: ignore[arg-type]
                      Timings(0, 0, 0, 0), tool_calls=calls, **fields)


async def updates(pieces: list[str], done: Completion | BaseException, index: int = 0) -> AsyncGenerator[ChoiceUpdate, None]:
    """One choice's pieces, then its completion -- or, as an engine failure reaches a stream, its error."""
    for text in pieces:
        yield index, Piece(text)
    if isinstance(done, BaseException):
        raise done
    yield index, done


def collect(events: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return [e async for e in events]
    return asyncio.run(run())


def framed(events: AsyncGenerator[dict[str, Any], None], framing: Framing,
           on_error: Callable[[BaseException], list[dict[str, Any]]]) -> str:
    """What the transport writes of ``events`` (the one error policy included)."""
    async def run() -> str:
        return "".join([chunk async for chunk in frames(events, framing, on_error)])
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

"""What a stream writes, model-free: the frames ready at once go out in one write, and the
OpenAI chunks made from prepared templates are the chunks the dicts would have been."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from llamactor.base.completion import Piece
from llamactor.dialects.openai.events import chat_events, completion_events
from llamactor.dialects.openai.call import chat_call, completions_call
from llamactor.dialects.openai.schema import ChatRequest, CompletionRequest
from llamactor.http.framing import OPENAI_SSE, frames

from tests.support.dialects import CTX, completion, sse_data

pytestmark = pytest.mark.pure

# text a template must encode as JSON does: quotes, backslashes, control characters, non-ASCII
AWKWARD = ['He said "hi"', "a\\b", "tab\tnew\nline\x00", "café ☕ 日本", "</script>", ""]


def _written(events: AsyncGenerator[Any, None], ready: list[bool]) -> list[bytes]:
    """The writes of ``frames``, with ``buffered`` answering from ``ready`` (then False)."""
    answers = iter(ready)

    async def run() -> list[bytes]:
        return [chunk async for chunk in frames(events, OPENAI_SSE, lambda e: [], buffered=lambda: next(answers, False))]
    return asyncio.run(run())


async def _dicts(n: int) -> AsyncGenerator[dict[str, Any], None]:
    for i in range(n):
        yield {"i": i}


def test_frames_ready_together_go_out_in_one_write_and_each_stays_its_own_event() -> None:
    writes = _written(_dicts(5), [True, True, False, True, False])  # pieces waited behind the 1st, 2nd and 4th
    assert writes == [b'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\n', b'data: {"i":3}\n\ndata: {"i":4}\n\n',
                      b"data: [DONE]\n\n"]
    assert len(_written(_dicts(3), [])) == 4  # nothing buffered: a write per event, as before


async def _updates(texts: list[str]) -> AsyncGenerator[Any, None]:
    for text in texts:
        yield 0, Piece(text)
    yield 0, completion("".join(texts), "length")


def _chunks(events: AsyncGenerator[Any, None]) -> list[dict[str, Any]]:
    async def run() -> list[bytes]:
        return [chunk async for chunk in frames(events, OPENAI_SSE, lambda e: [])]
    return [d for d in sse_data(b"".join(asyncio.run(run())).decode()) if d != "[DONE]"]


def test_a_chat_streams_text_chunks_from_a_template_that_are_the_chunks_json_makes() -> None:
    call = chat_call(ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "stream": True}), CTX)
    chunks = _chunks(chat_events(call, _updates(AWKWARD)))
    head = {"id": call.id, "object": "chat.completion.chunk", "created": call.created, "model": call.model}
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]][1:]  # after the role's
    assert content == [{**head, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}
                       for t in AWKWARD if t]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_completion_streams_text_chunks_from_a_template_and_logprobs_still_as_dicts() -> None:
    call = completions_call(CompletionRequest.model_validate({"prompt": "x", "stream": True}), CTX)
    chunks = _chunks(completion_events(call, _updates(AWKWARD)))
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == AWKWARD
    assert all(set(c) == {"id", "object", "created", "model", "choices"} for c in chunks)
    raw = json.dumps(chunks[0]["choices"][0])
    assert json.loads(raw) == {"index": 0, "text": AWKWARD[0], "finish_reason": None}

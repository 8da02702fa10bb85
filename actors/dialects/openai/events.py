"""The chunk sequences of streamed OpenAI chat and completion requests (pure), over the merged
pieces of their choices (``ChoiceUpdate``: each chunk names its choice ``index``).

Chat: a role chunk per choice, then content (a reasoning model's ``<think>`` block as
``delta.reasoning_content``; with tools, each call whole in one ``delta.tool_calls`` entry once
its block closes), a finish chunk per choice, and with ``include_usage`` a last chunk of its own
with ``choices: []`` and the usage. Completions: the echoed prompts first (``echo``), text pieces
with their tokens' logprobs, a finish chunk per choice, and the usage chunk the same way. The
framing (``data:`` lines, ``[DONE]``) is the transport's; a failure after the first chunk becomes
``stream_error``'s event.

The chunks a stream sends most -- one piece of text, nothing else -- are the JSON of a template
made once per choice with only the text encoded per piece (``TextChunks``: bytes, which the
framing writes as they are); every other chunk is a dict (docs/performance.md, *Host cap (front end)*).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from openai.types.chat import ChatCompletionChunk

from llamactor.base.completion import ChoiceUpdate, Completion, Piece
from llamactor.base.answer import Parts
from llamactor.dialects.errors import ErrorInfo
from llamactor.dialects.openai.call import ChatCall, CompletionsCall
from llamactor.dialects.openai.logprobs import chat_logprobs, completion_logprobs
from llamactor.dialects.openai.replies import FINISH_REASON, envelope, usage

Event = dict[str, Any] | bytes
_TEXT = "\x00text\x00"  # where a template's text goes: no piece's JSON holds its encoding


class TextChunks:
    """A stream's text-only chunks: per choice, the chunk's JSON around its text, made once."""

    def __init__(self, make: Any) -> None:
        self._make = make  # (index, text) -> the chunk as a dict
        self._templates: dict[int, tuple[bytes, bytes]] = {}

    def __call__(self, index: int, text: str) -> bytes:
        if (template := self._templates.get(index)) is None:
            before, _, after = orjson.dumps(self._make(index, _TEXT)).partition(orjson.dumps(_TEXT))
            template = self._templates[index] = (before, after)
        return template[0] + orjson.dumps(text) + template[1]


def stream_error(e: BaseException) -> list[Event]:
    """The error event of an OpenAI stream (the SDK raises ``APIError`` on it)."""
    return [ErrorInfo.of(e).body("openai")]


async def completion_events(call: CompletionsCall, updates: AsyncIterator[ChoiceUpdate]) -> AsyncGenerator[Event, None]:
    head = envelope(call.id, "text_completion", call.model, call.created)
    n_choices = len(call.requests) * call.n
    offsets = [0] * n_choices  # where each choice's text is, for text_offset
    if call.echo:
        for index in range(n_choices):
            prompt = str(call.prompts[index // call.n])
            offsets[index] = len(prompt)
            yield {**head, "choices": [{"index": index, "text": prompt, "finish_reason": None}]}
    done: list[Completion] = []
    text_chunk = TextChunks(lambda index, text: {**head, "choices": [{"index": index, "text": text,
                                                                       "finish_reason": None}]})
    async for index, item in updates:
        if isinstance(item, Piece) and call.logprobs is None:
            offsets[index] += len(item.text)
            yield text_chunk(index, item.text)
            continue
        if isinstance(item, Piece):
            logprobs = completion_logprobs(item.logprobs, call.logprobs, offsets[index]) \
                if call.logprobs is not None else None
            offsets[index] += len(item.text)
            yield {**head, "choices": [{"index": index, "text": item.text, "finish_reason": None,
                                        **({"logprobs": logprobs} if logprobs else {})}]}
            continue
        done.append(item)
        yield {**head, "choices": [{"index": index, "text": "", "finish_reason": FINISH_REASON[item.finish_reason]}]}
    if call.include_usage:
        yield {**head, "choices": [], "usage": usage(done)}


async def chat_events(call: ChatCall, updates: AsyncIterator[ChoiceUpdate]) -> AsyncGenerator[Event, None]:
    head = envelope(call.id, "chat.completion.chunk", call.model, call.created)
    n = call.request.n
    n_calls = [0] * n  # tool calls sent so far per choice: their delta index

    def delta(index: int, parts: Parts, logprobs: Any = None) -> Event:
        d: dict[str, Any] = {"content": parts.content} if parts.content else {}
        if parts.reasoning:
            d["reasoning_content"] = parts.reasoning
        if parts.calls:
            d["tool_calls"] = [{"index": n_calls[index] + k, **tool_call.to_openai()} for k, tool_call in enumerate(parts.calls)]
            n_calls[index] += len(parts.calls)
        return {**head, "choices": [{"index": index, "delta": d, "finish_reason": None,
                                     **({"logprobs": chat_logprobs(logprobs)} if call.logprobs else {})}]}

    for index in range(n):
        yield {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]}
    done: list[Completion] = []
    content_chunk = TextChunks(lambda index, text: {**head, "choices": [{"index": index, "delta": {"content": text},
                                                                          "finish_reason": None}]})
    async for index, item in updates:
        if isinstance(item, Piece):
            parts = item.split
            if parts.content and not (parts.reasoning or parts.calls or call.logprobs):
                yield content_chunk(index, parts.content)
            elif parts or call.logprobs:
                yield delta(index, parts, item.logprobs)
            continue
        if item.last_parts:
            yield delta(index, item.last_parts)
        done.append(item)
        yield ChatCompletionChunk.model_validate({**head, "choices": [
            {"index": index, "delta": {}, "finish_reason": FINISH_REASON[item.finish_reason]}]}).model_dump(exclude_none=True)
    if call.include_usage:
        yield {**head, "choices": [], "usage": usage(done)}

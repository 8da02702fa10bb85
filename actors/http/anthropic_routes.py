"""The Anthropic dialect: ``POST /v1/messages`` (streamed or not) and ``/v1/messages/count_tokens``.

Handlers run on uvicorn's event loop over ``llamactor.http.request_path``; bodies and their
translation are ``anthropic_schema``, the Message object ``anthropic_message``, the event stream
``anthropic_stream``. Errors (the app's handlers, chosen by path) take Anthropic's shape
``{"type": "error", "error": {"type", "message"}}``.

Two things the engine does not tell directly:
- ``max_tokens`` is required by Anthropic's API and clients send large values (Claude Code asks
  for 32000). As llama-server and Ollama treat it, it is an upper bound: when the prompt plus
  ``max_tokens`` does not fit in a sequence's context, the request is sent again with the room
  that is left (an info line says so), and running out of it is ``model_context_window_exceeded``.
  A prompt that alone fills the context is a 400 ("prompt is too long: N tokens > M maximum",
  the words Anthropic's API and its clients use).
- Which stop sequence ended an answer: a completion's text ends just before the stop string and
  its finish reason is "stop" for an end of turn too. The answer's tokens, decoded (one tokenizer
  call, only when ``stop_sequences`` were given and the answer stopped), run through the stop
  string; the one the rest of the text starts with matched (``anthropic_message.matched_stop``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request

from llamactor.base.completion import Completion
from llamactor.base.errors import ContextExceededError
from llamactor.base.logging import get_logger
from llamactor.handles.model import ModelClient
from llamactor.http.anthropic_message import matched_stop, message, stop_reason
from llamactor.http.anthropic_schema import Conversation, MessagesRequest
from llamactor.http.anthropic_stream import message_events, sse_response
from llamactor.http.request_path import all_queued, complete, ready_model
from llamactor.http.state import ServerState

DIALECT = "anthropic"
log = get_logger("llamactor.http")
T = TypeVar("T")


def register(app: FastAPI, state: ServerState) -> None:
    """Add this dialect's routes to ``app``."""

    async def messages(body: MessagesRequest, request: Request) -> Any:
        llm = await ready_model(state, body.model)
        body.check()
        rid = f"msg_{request.state.request_id}"
        if ignored := body.ignored():
            log.warning("request_fields_ignored", dialect=DIALECT, fields=ignored, request_id=rid)
        observe = state.metrics.observer(llm.name, DIALECT)
        chat = body.chat_messages()
        head = {"id": rid, "type": "message", "role": "assistant", "model": llm.name}
        stops = body.stop_sequences or []

        async def stop_sequence(c: Completion) -> str | None:
            if not stops or c.finish_reason != "stop":
                return None
            generated = await llm.tokenize_async(list(c.token_ids))
            return matched_stop(c.text, generated.text, stops)

        if body.stream:
            streams, clamped = await with_room(body.sampling(), rid, lambda sampling, request_id: all_queued(
                [functools.partial(llm.stream_chat_n_async, chat, 1, request_id=request_id, **sampling)]))

            async def ending(c: Completion, sent_tool_uses: bool) -> tuple[str, str | None]:
                # calls the stream did not parse out (text came first) went out as text
                finish = "stop" if c.finish_reason == "tool_calls" and not sent_tool_uses else c.finish_reason
                matched = await stop_sequence(c)
                return stop_reason(finish, matched, clamped), matched

            return sse_response(message_events(streams[0], head, body.parsed_tools, observe, ending,
                                               body.show_thinking))
        done, clamped = await with_room(body.sampling(), rid, lambda sampling, request_id: complete(
            request, observe, lambda: llm.submit_chat_n(chat, 1, request_id=request_id, **sampling)))
        return message(head, done[0], await stop_sequence(done[0]), clamped, body.show_thinking)

    async def count_tokens(body: Conversation) -> dict[str, int]:
        """Exact: the conversation rendered as the model sees it (system, tools), tokenized."""
        llm = await ready_model(state, body.model)
        body.check()
        return {"input_tokens": await count(llm, body)}

    app.post("/v1/messages", response_model=None)(messages)
    app.post("/v1/messages/count_tokens", response_model=None)(count_tokens)


async def count(llm: ModelClient, body: Conversation) -> int:
    tokenized = await llm.tokenize_async(body.chat_messages(), **body.template_options())
    return len(tokenized.token_ids)


async def with_room(sampling: dict[str, Any], rid: str,
                    attempt: Callable[[dict[str, Any], str], Awaitable[T]]) -> tuple[T, bool]:
    """``attempt(sampling, request_id)``, and, if the prompt fits but not with ``max_tokens``
    after it, once more with the room left (a new request id: the refused one may still be
    being cancelled). Returns the result and whether ``max_tokens`` was cut."""
    try:
        return await attempt(sampling, rid), False
    except ContextExceededError as e:
        n_prompt, n_ctx = e.details.get("n_prompt_tokens"), e.details.get("n_ctx")
        if not isinstance(n_prompt, int) or not isinstance(n_ctx, int):
            raise
        if n_prompt >= n_ctx:
            raise ContextExceededError(f"prompt is too long: {n_prompt} tokens > {n_ctx - 1} maximum",
                                       **e.details) from e
        room = n_ctx - n_prompt
        log.info("max_tokens_clamped", dialect=DIALECT, request_id=rid, max_tokens=sampling.get("max_tokens"),
                 to=room, n_prompt=n_prompt, n_ctx=n_ctx)
    return await attempt({**sampling, "max_tokens": room}, f"{rid}-clamped"), True

"""The Anthropic dialect's routes: ``POST /v1/messages`` (streamed or not) and
``/v1/messages/count_tokens`` (uvicorn's event loop). What a body means is
``llamactor.dialects.anthropic``; errors (the app's handlers, chosen by path) take Anthropic's
shape ``{"type": "error", "error": {"type", "message"}}``. A streamed message pings while the
prompt is computed (``PING_EVERY_S``), so proxies keep the connection.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request

from llamactor.dialects.anthropic import events
from llamactor.dialects.anthropic.call import DIALECT, messages_call, rendering_of
from llamactor.dialects.anthropic.message import message
from llamactor.dialects.anthropic.schema import Conversation, MessagesRequest
from llamactor.http.framing import NAMED_SSE
from llamactor.http.request_path import planned, ready_model, respond, tokenize, warn_ignored
from llamactor.http.state import State

ANTHROPIC_SSE = dataclasses.replace(NAMED_SSE, keepalive=events.PING, keepalive_s=events.PING_EVERY_S)
router = APIRouter()


@router.post("/v1/messages", response_model=None)
async def messages(body: MessagesRequest, request: Request, state: State) -> Any:
    call = await planned(state, request, body.model, DIALECT, lambda ctx: messages_call(body, ctx))
    warn_ignored(DIALECT, call.plan.ignored, call.plan.id)
    return await respond(request, call, body.stream, events.message_events, ANTHROPIC_SSE, events.stream_error,
                         lambda asked, done: message(asked, done[0]))


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_tokens(body: Conversation, request: Request, state: State) -> dict[str, int]:
    """Exact: the conversation rendered as the model sees it (system, tools), tokenized -- the
    tenant's request, under its requests and tokens per minute."""
    rendering = rendering_of(body)
    llm = await ready_model(state, request, body.model)
    tokenized = await tokenize(state, request, llm, rendering.messages, tools=rendering.tools,
                               chat_template_kwargs=rendering.chat_template_kwargs)
    return {"input_tokens": len(tokenized.token_ids)}

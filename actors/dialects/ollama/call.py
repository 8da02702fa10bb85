"""What an Ollama ``/api/chat`` or ``/api/generate`` body means (pure): its messages (or prompt,
raw or through the chat template) and options as one ``GenerationRequest``, and how its answer
is split and shaped (thinking, content or response, tool calls, logprobs).

Responses echo the request's model string, as Ollama does. Ollama has no ``tool_choice``: tools
are offered (``auto``). ``think`` reaches thinking templates as their variables; ``think: false``
drops the reasoning from the answer; a raw prompt's answer is returned as the model wrote it
(its thinking parsed only when asked for).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.request import GenerationRequest
from llamactor.dialects.context import OneRequest, RequestContext
from llamactor.dialects.ollama.schema import ChatRequest, GenerateRequest, Message, ModelRequest

DIALECT = "ollama"


@dataclass(frozen=True, slots=True)
class OllamaCall(OneRequest):
    """One ``/api/chat`` or ``/api/generate`` call: its ``GenerationRequest`` and how its answer is shaped."""

    model: str  # as the request named it (echoed)
    request: GenerationRequest
    kind: Literal["chat", "generate"]  # the answer's field: chat's message, generate's response
    think: bool | str | None
    logprobs: bool
    streamed: bool

    @property
    def keep_thinking(self) -> bool:
        return self.think is not False


def chat_call(body: ChatRequest, ctx: RequestContext, n_ctx: int) -> OllamaCall | None:
    """None: no messages, so nothing to answer (the request loads or unloads the model)."""
    if not body.messages:
        return None
    messages = chat_messages(body.messages, body.model)
    request = GenerationRequest.build(ctx.defaults, messages=messages, request_id=ctx.id("ollama-"),
                                      tools=body.tools or None, tool_format=ctx.tool_format,
                                      **_options(body, n_ctx, ctx), **_template_kwargs(body), **ctx.lora())
    return OllamaCall(body.model, request, "chat", body.think, _logprobs(body), body.streamed)


def generate_call(body: GenerateRequest, ctx: RequestContext, n_ctx: int) -> OllamaCall | None:
    """None: an empty prompt, so nothing to answer (the request loads or unloads the model)."""
    body.check()
    if not body.prompt:
        return None
    rid, options = ctx.id("ollama-"), {**_options(body, n_ctx, ctx), **ctx.lora()}
    if body.raw:  # the prompt as is; the answer as the model wrote it (thinking parsed only when asked)
        request = GenerationRequest.build(ctx.defaults, prompt=body.prompt, request_id=rid,
                                          split_reasoning=bool(body.think),
                                          parse_special=body.options.parse_special is not False, **options)
        return OllamaCall(body.model, request, "generate", body.think, _logprobs(body), body.streamed)
    messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
        {"role": "user", "content": body.prompt}]
    request = GenerationRequest.build(ctx.defaults, messages=messages, request_id=rid, **options,
                                      **_template_kwargs(body))
    return OllamaCall(body.model, request, "generate", body.think, _logprobs(body), body.streamed)


def _options(body: ModelRequest, n_ctx: int, ctx: RequestContext) -> dict[str, Any]:
    """The body's sampling options (without ``num_predict``: the operator's limit, if any),
    ``format`` and logprobs."""
    out = body.options.sampling(n_ctx)
    if body.options.num_predict is None:
        out["max_tokens"] = ctx.max_tokens(None)
    if body.format == "json":
        out["grammar"] = Grammar.json_object()
    elif isinstance(body.format, dict):
        out["json_schema"] = body.format
    if body.logprobs or body.top_logprobs:
        out.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    return out


def _logprobs(body: ModelRequest) -> bool:
    return bool(body.logprobs or body.top_logprobs)


def _template_kwargs(body: ModelRequest) -> dict[str, Any]:
    """``think`` as the chat-template variables that thinking templates read (Qwen3's
    ``enable_thinking``, gpt-oss's ``reasoning_effort``); none when it is not given."""
    if body.think is None:
        return {}
    if isinstance(body.think, str):
        return {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": body.think}}
    return {"chat_template_kwargs": {"enable_thinking": body.think}}


def chat_messages(messages: list[Message], model: str) -> list[dict[str, Any]]:
    """Ollama messages as llamactor's (OpenAI's) chat dicts: tool-call arguments as JSON text,
    and each tool result tied to the call it answers (by ``tool_call_id``, else by ``tool_name``
    to the earliest unanswered call of that tool, as templates that render results need an id)."""
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (tool name, call id), oldest first
    for m in messages:
        if m.images:
            raise InvalidRequestError(f"{model} does not support images")
        d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.role == "assistant" and m.tool_calls:
            calls = []
            for c in m.tool_calls:
                call_id = c.id or new_call_id()
                args = c.function.arguments
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": c.function.name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
                unanswered.append((c.function.name, call_id))
            d["tool_calls"] = calls
        elif m.role == "tool":
            call_id = m.tool_call_id or _answered_call(unanswered, m.tool_name)
            unanswered = [(n, i) for n, i in unanswered if i != call_id]
            d["tool_call_id"] = call_id
            if m.tool_name:
                d["name"] = m.tool_name
        out.append(d)
    return out


def _answered_call(unanswered: list[tuple[str, str]], tool_name: str | None) -> str:
    """The id of the call a result without ``tool_call_id`` answers: the earliest unanswered call
    of its tool (or of any tool when it names none); a fresh id when there is none."""
    for name, call_id in unanswered:
        if tool_name is None or name == tool_name:
            return call_id
    return new_call_id()


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:8]}"  # Ollama's form: call_ and 8 characters

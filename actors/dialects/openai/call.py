"""What an OpenAI chat or completions body means: the typed requests it makes and what its
answer needs (pure). Every 400 of the body itself is raised here, before anything is queued:
the checks pydantic cannot make, the constraint and the tools (compiled once for all choices).

A completions body may hold a batch of prompts: one request per prompt, each with ``best_of``
(else ``n``) choices, numbered ``prompt * n + choice`` in the answer as OpenAI numbers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.request import GenerationRequest
from llamactor.dialects.context import OneRequest, RequestContext
from llamactor.dialects.openai.schema import MAX_PROMPTS, ChatRequest, CompletionRequest, OpenAIRequest

DIALECT = "openai"


@dataclass(frozen=True, slots=True)
class ChatCall(OneRequest):
    """One chat completions call: its ``GenerationRequest`` (``n`` choices) and what its reply and chunks need."""

    id: str  # chatcmpl-...
    model: str
    created: int
    request: GenerationRequest
    logprobs: bool
    include_usage: bool
    ignored: list[str]  # fields given that change nothing here (for the warning)


@dataclass(frozen=True, slots=True)
class CompletionsCall:
    """One completions call: a ``GenerationRequest`` per prompt and what its reply and chunks need."""

    id: str  # cmpl-...
    model: str
    created: int
    requests: list[GenerationRequest]  # one per prompt, ``n_generated`` choices each
    prompts: list[str | list[int]]
    n: int  # choices returned per prompt
    n_generated: int  # choices generated per prompt (best_of: the n best are returned)
    echo: bool
    logprobs: int | None  # the body's logprobs (None: not asked)
    prompt_logprobs: int | None  # vLLM's
    include_usage: bool
    ignored: list[str]


def chat_call(body: ChatRequest, ctx: RequestContext) -> ChatCall:
    if body.echo or body.prompt_logprobs is not None:
        raise InvalidRequestError("prompt log-probabilities (echo, prompt_logprobs) are not available on "
                                  "/v1/chat/completions: use /v1/completions with echo: true and logprobs: k")
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true")
    sampling = _sampling(body, ctx.max_tokens(body.max_completion_tokens if body.max_completion_tokens is not None
                                              else body.max_tokens))
    if body.logprobs:
        sampling.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    request = GenerationRequest.build(
        ctx.defaults, messages=body.message_dicts(), n=body.n, request_id=ctx.id("chatcmpl-"), grammar=constraint(body),
        tool_format=ctx.tool_format,
        tools=body.tools or None, tool_choice=body.tool_choice, parallel_tool_calls=body.parallel_tool_calls,
        **_lora(body, ctx), **sampling)
    return ChatCall(ctx.id("chatcmpl-"), ctx.model, ctx.created, request, body.logprobs, _include_usage(body),
                    body.ignored_fields())


def completions_call(body: CompletionRequest, ctx: RequestContext) -> CompletionsCall:
    prompts = body.prompts()
    _check_completions(body, prompts)
    sampling = _sampling(body, ctx.max_tokens(body.max_tokens))
    if body.logprobs is not None:
        sampling.update(logprobs=True, top_logprobs=body.logprobs)
    elif body.n_generated > body.n:
        sampling["logprobs"] = True  # best_of ranks the choices by their mean log-probability
    if body.scores_prompt:
        sampling["prompt_logprobs"] = max(body.prompt_logprobs or 0, body.logprobs if body.echo and body.logprobs else 0)
    rid, grammar = ctx.id("cmpl-"), constraint(body)  # compiled once for every prompt and choice
    lora = _lora(body, ctx)
    requests = [GenerationRequest.build(ctx.defaults, prompt=prompt, n=body.n_generated, grammar=grammar,
                                        request_id=rid if len(prompts) == 1 else f"{rid}-p{p}",
                                        # token ids echo as text: the answer brings it
                                        echo_prompt=body.echo and not isinstance(prompt, str) and not body.scores_prompt,
                                        parse_special=body.parse_special, **lora, **sampling)
                for p, prompt in enumerate(prompts)]
    return CompletionsCall(rid, ctx.model, ctx.created, requests, prompts, body.n, body.n_generated, body.echo,
                           body.logprobs, body.prompt_logprobs, _include_usage(body), body.ignored_fields())


def _check_completions(body: CompletionRequest, prompts: list[str | list[int]]) -> None:
    if body.best_of is not None and body.best_of < body.n:
        raise InvalidRequestError(f"best_of ({body.best_of}) must be >= n ({body.n})")
    if body.best_of is not None and body.best_of > body.n and body.stream:
        raise InvalidRequestError("best_of cannot be streamed")
    if body.stream and body.scores_prompt:
        raise InvalidRequestError("prompt log-probabilities (echo with logprobs, prompt_logprobs) are not "
                                  "streamed: send stream: false")
    if body.stream and body.echo and any(not isinstance(p, str) for p in prompts):
        raise InvalidRequestError("echo of token-id prompts is not streamed: send stream: false")
    if body.max_tokens == 0 and body.n_generated > body.n:
        raise InvalidRequestError("best_of needs max_tokens >= 1 (it ranks generated text)")
    if body.suffix:
        raise InvalidRequestError("suffix (insertion) is not supported")
    if not 1 <= len(prompts) <= MAX_PROMPTS:
        raise InvalidRequestError(f"prompt must hold 1 to {MAX_PROMPTS} prompts")


def _sampling(body: OpenAIRequest, max_tokens: int | None) -> dict[str, Any]:
    """The body's sampling options (and ``priority``, ``chat_template_kwargs``). Without
    max_tokens (and none set by the operator: ``RequestContext.max_tokens``) a request runs to EOG,
    a stop, or the end of its context (as OpenAI's chat API and vLLM do): never refused because an
    implicit default does not fit."""
    out: dict[str, Any] = {k: v for k, v in {
        "temperature": body.temperature, "top_p": body.top_p, "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty, "top_k": body.top_k, "min_p": body.min_p,
        "repeat_penalty": body.repeat_penalty, "seed": body.seed, "priority": body.priority,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop,
    }.items() if v is not None}
    out["max_tokens"] = max_tokens
    if body.ignore_eos:
        out["ignore_eos"] = True
    if body.logit_bias:
        out["logit_bias"] = body.logit_bias
    if body.prediction is not None:
        out["prediction"] = body.prediction.content
    if body.speculation is not None:
        out["speculation"] = body.speculation
    out.update(body.peer_sampling(body.repeat_penalty, body.chat))
    return out


def constraint(body: OpenAIRequest) -> Grammar | None:
    """The body's one constraint: ``response_format``, llama-server's ``grammar`` / ``json_schema``,
    or vLLM's ``guided_*``."""
    fmt = body.response_format
    peer = body.peer_constraint()
    given = [k for k, v in (("response_format", fmt is not None and fmt.type != "text"),
                            ("grammar", body.grammar is not None), ("json_schema", body.json_schema is not None),
                            (peer[0] if peer else "", peer is not None)) if v]
    if len(given) > 1:
        raise InvalidRequestError(f"pass at most one of response_format, grammar, json_schema (got {', '.join(given)})")
    if peer is not None:
        return peer[1]
    if body.grammar is not None:
        return Grammar.gbnf(body.grammar)
    if body.json_schema is not None:
        return Grammar.json_schema(body.json_schema)
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Grammar.json_object()
    if fmt.json_schema is None:
        raise InvalidRequestError("response_format.json_schema is required when type is json_schema")
    return Grammar.json_schema(fmt.json_schema.schema_ or {"type": "object"}, strict=bool(fmt.json_schema.strict))


def _lora(body: OpenAIRequest, ctx: RequestContext) -> dict[str, Any]:
    """The LoRA adapters of the body's ``model`` name (vLLM) and ``lora`` ids (llama-server)."""
    return ctx.lora([e.model_dump() for e in body.lora] if body.lora else None)


def _include_usage(body: ChatRequest | CompletionRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)

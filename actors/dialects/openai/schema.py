"""OpenAI-compatible request bodies (validated, unknown fields refused) and their mapping to llamactor.

Responses use the ``openai`` package's own pydantic types, so what we send is what its client
parses. Requests are our own models: ``extra="forbid"`` turns an unknown or misspelt parameter
into a 400 instead of silently ignoring it, and llama.cpp-style extras (``top_k``, ``min_p``,
``repeat_penalty``, ``ignore_eos``) are accepted as llama.cpp's server does.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from llamactor.base.completion import Completion, TokenLogprob
from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.reasoning import split_reasoning
from llamactor.base.tools import Tools, pop_tools
from llamactor.http.peer_extras import PeerExtras


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: text, JSON mode, or structured outputs (a JSON Schema)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Request(PeerExtras):
    """Fields of both OpenAI endpoints; the peers' extras come from ``PeerExtras``."""

    chat: ClassVar[bool] = False

    model: str | None = None  # may be left out: the first (default) model
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    # Documented OpenAI fields that change nothing here: accepted, ignored.
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # llama.cpp server extras
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # llama.cpp server extras: a GBNF (or Lark) grammar, or a bare JSON Schema
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # llamactor extra: "high" | "normal" | "low" or an int, lower first (llamactor.scheduling.policy)
    priority: Literal["high", "normal", "low"] | int | None = None
    _grammar: Grammar | None = PrivateAttr(default=None)

    def sampling(self) -> dict[str, Any]:
        """llamactor sampling options (with ``n`` > 1 the client seeds choice ``i`` ``seed + i``)."""
        out: dict[str, Any] = {k: v for k, v in {
            "temperature": self.temperature, "top_p": self.top_p,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "top_k": self.top_k, "min_p": self.min_p, "repeat_penalty": self.repeat_penalty,
        }.items() if v is not None}
        # Without max_tokens a request runs to EOG, a stop, or the end of its context (as OpenAI's
        # chat API, vLLM and llama-server do): never refused because an implicit default does not fit.
        out["max_tokens"] = self.max_output_tokens()
        if self.seed is not None:
            out["seed"] = self.seed
        if self.stop is not None:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.priority is not None:
            out["priority"] = self.priority
        if self.logit_bias:
            out["logit_bias"] = self.logit_bias
        if self._grammar is not None:
            out["grammar"] = self._grammar
        out.update(self.peer_sampling(out["max_tokens"], self.repeat_penalty, self.chat))
        return out

    def max_output_tokens(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        """What pydantic cannot check; compiles the constraint once for all choices (400 if bad)."""
        self._grammar = self.constraint()

    def constraint(self) -> Grammar | None:
        fmt = self.response_format
        peer = self.peer_constraint()
        given = [k for k, v in (("response_format", fmt is not None and fmt.type != "text"),
                                ("grammar", self.grammar is not None), ("json_schema", self.json_schema is not None),
                                (peer[0] if peer else "", peer is not None)) if v]
        if len(given) > 1:
            raise InvalidRequestError(f"pass at most one of response_format, grammar, json_schema (got {', '.join(given)})")
        if peer is not None:
            return peer[1]
        if self.grammar is not None:
            return Grammar.gbnf(self.grammar)
        if self.json_schema is not None:
            return Grammar.json_schema(self.json_schema)
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return Grammar.json_object()
        if fmt.json_schema is None:
            raise InvalidRequestError("response_format.json_schema is required when type is json_schema")
        return Grammar.json_schema(fmt.json_schema.schema_ or {"type": "object"}, strict=bool(fmt.json_schema.strict))


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")  # include_obfuscation, vLLM's continuous_usage_stats: no effect here
    include_usage: bool = False


MAX_PROMPTS = 64  # prompts in one /v1/completions request


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: the prompt alone (echo, scoring)
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)  # OpenAI allows 5; vLLM, as here, 20
    echo: bool = False
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's extra
    stream_options: StreamOptions | None = None
    best_of: int | None = Field(default=None, ge=1, le=16)

    @property
    def n_generated(self) -> int:
        """Choices to generate: ``best_of`` of them (the ``n`` best are returned), else ``n``."""
        return self.best_of or self.n

    def check(self) -> None:
        super().check()
        if self.best_of is not None and self.best_of < self.n:
            raise InvalidRequestError(f"best_of ({self.best_of}) must be >= n ({self.n})")
        if self.best_of is not None and self.best_of > self.n and self.stream:
            raise InvalidRequestError("best_of cannot be streamed")
        if self.stream and self.scores_prompt:
            raise InvalidRequestError("prompt log-probabilities (echo with logprobs, prompt_logprobs) are not "
                                      "streamed: send stream: false")
        if self.stream and self.echo and any(not isinstance(p, str) for p in self.prompts()):
            raise InvalidRequestError("echo of token-id prompts is not streamed: send stream: false")
        if self.max_tokens == 0 and self.n_generated > self.n:
            raise InvalidRequestError("best_of needs max_tokens >= 1 (it ranks generated text)")
        if self.suffix:
            raise InvalidRequestError("suffix (insertion) is not supported")
        if not 1 <= len(self.prompts()) <= MAX_PROMPTS:
            raise InvalidRequestError(f"prompt must hold 1 to {MAX_PROMPTS} prompts")

    def sampling(self) -> dict[str, Any]:
        out = super().sampling()
        if self.logprobs is not None:
            out.update(logprobs=True, top_logprobs=self.logprobs)
        elif self.n_generated > self.n:
            out["logprobs"] = True  # best_of ranks the choices by their mean log-probability
        if self.scores_prompt:
            out["prompt_logprobs"] = max(self.prompt_logprobs or 0, self.logprobs if self.echo and self.logprobs else 0)
        return out

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt tokens' log-probabilities are computed: echo with logprobs, or vLLM's
        prompt_logprobs."""
        return self.prompt_logprobs is not None or (self.echo and self.logprobs is not None)

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request: one string or token list, or a list of either (a batch)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send name, refusal, audio ...; the template needs none
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise InvalidRequestError(f"content parts of type {part.get('type')!r} are not supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatRequest(_Request):
    chat: ClassVar[bool] = True
    messages: list[ChatMessage] = Field(min_length=1)
    _tools: Tools | None = PrivateAttr(default=None)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # default off, as in llama.cpp's server (llamactor.base.tools)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream_options: StreamOptions | None = None
    # Named only to be refused clearly: OpenAI's chat API has no prompt log-probabilities.
    echo: bool | None = None
    prompt_logprobs: int | None = None

    def check(self) -> None:
        super().check()
        if self.echo or self.prompt_logprobs is not None:
            raise InvalidRequestError("prompt log-probabilities (echo, prompt_logprobs) are not available on "
                                      "/v1/chat/completions: use /v1/completions with echo: true and logprobs: k")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true")
        # the API's own rules (llamactor.base.tools), once here: the tools are also needed to parse streams
        self._tools = pop_tools({"tools": self.tools or None, "tool_choice": self.tool_choice,
                                 "parallel_tool_calls": self.parallel_tool_calls, "grammar": self._grammar}, chat=True)

    @property
    def parsed_tools(self) -> Tools | None:
        """The request's tools when its answers are parsed for calls (not ``tool_choice: none``)."""
        return self._tools if self._tools is not None and self._tools.parses else None

    def max_output_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def sampling(self) -> dict[str, Any]:
        out = super().sampling()
        if self.logprobs:
            out.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if self._tools is not None:
            out["tools"] = self._tools
        return out

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in self.messages]


def best_of(done: list[Completion], n: int) -> list[Completion]:
    """The ``n`` choices with the highest mean token log-probability, in their original order."""
    def mean_logprob(c: Completion) -> float:
        return sum(t.logprob for t in c.logprobs) / len(c.logprobs) if c.logprobs else float("-inf")
    ranked = sorted(range(len(done)), key=lambda i: mean_logprob(done[i]), reverse=True)[:n]
    return [done[i] for i in sorted(ranked)]


def chat_logprobs(logprobs: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """A chat choice's (or streamed delta's) ``logprobs`` object, as OpenAI shapes it."""
    if logprobs is None:
        return None

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {"content": [{**entry(t.token, t.logprob), "top_logprobs": [entry(a, v) for a, v in t.top]}
                        for t in logprobs]}


def completion_logprobs(logprobs: tuple[TokenLogprob, ...] | None, n_top: int, offset: int = 0) -> dict[str, Any] | None:
    """A legacy completion choice's (or streamed chunk's) ``logprobs`` object: tokens,
    token_logprobs, top_logprobs, and text offsets counted from ``offset``."""
    if logprobs is None:
        return None
    offsets, at = [], offset
    for t in logprobs:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in logprobs], "token_logprobs": [t.logprob for t in logprobs],
            "top_logprobs": [dict(t.top) for t in logprobs] if n_top else None, "text_offset": offsets}


FINISH_REASON = {"stop": "stop", "length": "length", "cancelled": "stop", "context_full": "length",
                 "tool_calls": "tool_calls"}


def chat_message(c: Completion) -> dict[str, Any]:
    """A chat choice's ``message``: its text, or its tool calls and whatever text surrounds them; a
    reasoning model's ``<think>`` block as ``reasoning_content`` (llama-server's and vLLM's field)."""
    reasoning, text = split_reasoning(c.text)
    message: dict[str, Any] = {"role": "assistant", "content": text or None if c.tool_calls else text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if c.tool_calls:
        message["tool_calls"] = [t.to_openai() for t in c.tool_calls]
    return message

"""OpenAI-compatible request bodies (validated, unknown fields refused) and their mapping to llamactor.

Responses use the ``openai`` package's own pydantic types, so what we send is what its client
parses. Requests are our own models: ``extra="forbid"`` turns an unknown or misspelt parameter
into a 400 instead of silently ignoring it, and llama.cpp-style extras (``top_k``, ``min_p``,
``repeat_penalty``, ``ignore_eos``) are accepted as llama.cpp's server does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llamactor.completion import Completion
from llamactor.errors import InvalidRequestError


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # may be left out: this server serves one model
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
    # llamactor extra: "high" | "normal" | "low" or an int, lower first (llamactor.policy)
    priority: Literal["high", "normal", "low"] | int | None = None

    def sampling(self, *, index: int = 0) -> dict[str, Any]:
        """llamactor sampling options; with ``n`` > 1 each choice gets its own seed."""
        out: dict[str, Any] = {k: v for k, v in {
            "temperature": self.temperature, "top_p": self.top_p,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "top_k": self.top_k, "min_p": self.min_p, "repeat_penalty": self.repeat_penalty,
        }.items() if v is not None}
        # Without max_tokens a request runs to EOG, a stop, or the end of its context (as OpenAI's
        # chat API, vLLM and llama-server do): never refused because an implicit default does not fit.
        out["max_tokens"] = self.max_tokens
        if self.seed is not None:
            out["seed"] = self.seed + index
        if self.stop is not None:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else self.stop
        if self.ignore_eos:
            out["ignore_eos"] = True
        if self.priority is not None:
            out["priority"] = self.priority
        return out

    def check(self) -> None:
        if self.stream and self.wants_logprobs():
            raise InvalidRequestError("logprobs are not supported together with stream: true")

    def wants_logprobs(self) -> bool:
        return False


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


MAX_PROMPTS = 64  # prompts in one /v1/completions request


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
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
        if self.echo:
            raise InvalidRequestError("echo is not supported")
        if self.suffix:
            raise InvalidRequestError("suffix (insertion) is not supported")
        if not 1 <= len(self.prompts()) <= MAX_PROMPTS:
            raise InvalidRequestError(f"prompt must hold 1 to {MAX_PROMPTS} prompts")

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def sampling(self, *, index: int = 0) -> dict[str, Any]:
        out = super().sampling(index=index)
        if self.logprobs is not None:
            out.update(logprobs=True, top_logprobs=self.logprobs)
        elif self.n_generated > self.n:
            out["logprobs"] = True  # best_of ranks the choices by their mean log-probability
        return out

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request: one string or token list, or a list of either (a batch)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send name, tool_call_id ...; the template needs neither
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

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
    messages: list[ChatMessage] = Field(min_length=1)
    parallel_tool_calls: bool | None = None  # accepted; tools are not served yet
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream_options: StreamOptions | None = None

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true")

    def sampling(self, *, index: int = 0) -> dict[str, Any]:
        out = super().sampling(index=index)
        if self.max_completion_tokens is not None:
            out["max_tokens"] = self.max_completion_tokens
        if self.logprobs:
            out.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        return out

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


def best_of(done: list[Completion], n: int) -> list[Completion]:
    """The ``n`` choices with the highest mean token log-probability, in their original order."""
    def mean_logprob(c: Completion) -> float:
        return sum(t.logprob for t in c.logprobs) / len(c.logprobs) if c.logprobs else float("-inf")
    ranked = sorted(range(len(done)), key=lambda i: mean_logprob(done[i]), reverse=True)[:n]
    return [done[i] for i in sorted(ranked)]


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def chat_logprobs(c: Completion) -> dict[str, Any] | None:
    """A chat choice's ``logprobs`` object, as OpenAI shapes it."""
    if c.logprobs is None:
        return None

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {"content": [{**entry(t.token, t.logprob), "top_logprobs": [entry(a, v) for a, v in t.top]}
                        for t in c.logprobs]}


def completion_logprobs(c: Completion, n_top: int) -> dict[str, Any] | None:
    """A legacy completion choice's ``logprobs`` object (tokens, token_logprobs, top, offsets)."""
    if c.logprobs is None:
        return None
    offsets, at = [], 0
    for t in c.logprobs:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in c.logprobs], "token_logprobs": [t.logprob for t in c.logprobs],
            "top_logprobs": [dict(t.top) for t in c.logprobs] if n_top else None, "text_offset": offsets}


FINISH_REASON = {"stop": "stop", "length": "length", "cancelled": "stop", "context_full": "length"}

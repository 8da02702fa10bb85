"""OpenAI-compatible request bodies of ``/v1/chat/completions`` and ``/v1/completions`` (pure).

Requests are our own pydantic models: an unknown or misspelt parameter is a 400 instead of being
silently ignored (``extras``: the fields of the peers, llama-server and vLLM, that clients send),
and llama.cpp-style extras (``top_k``, ``min_p``, ``repeat_penalty``, ``ignore_eos``) are
accepted as llama.cpp's server does. What a body means is ``call``; replies use the ``openai``
package's own types (``replies``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from llamactor.base.errors import InvalidRequestError
from llamactor.dialects.openai.extras import PeerExtras


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


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: ``{"type": "content", "content": "..."}`` (or the content as text
    parts). Its text is drafted from and every drafted token verified in the batched step, so the
    answer is the one the model gives without it (docs/architecture.md, *Speculation*). A malformed
    one is a 400 here, before anything is queued or streamed."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_of_parts(cls, content: Any) -> Any:
        """The text parts' texts joined (OpenAI's ``[{"type": "text", "text": ...}]``); any other part refused."""
        if not isinstance(content, list):
            return content
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                raise ValueError(f"part {i} must be {{'type': 'text', 'text': str}} (a prediction is text), "
                                 f"got {kind!r:.40}")
            texts.append(part["text"])
        return "".join(texts)


class LoraEntry(BaseModel):
    """One entry of llama-server's per-request ``lora``: ``{"id": 0, "scale": 0.5}``."""

    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=0)
    scale: float = 1.0


class OpenAIRequest(PeerExtras):
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
    # llama.cpp server extra: the LoRA adapters to run under, by id (the order of --lora), each
    # with its scale; adapters not listed are off
    lora: list[LoraEntry] | None = None
    # OpenAI's Predicted Outputs (chat; here on completions too): text the answer is expected to repeat
    prediction: Prediction | None = None
    # llamactor extra: n-gram drafts from the sequence's own prompt and output ("ngram") or none
    # ("off"); absent: the operator's default (docs/architecture.md, *Speculation*)
    speculation: Literal["off", "ngram"] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")  # include_obfuscation, vLLM's continuous_usage_stats: no effect here
    include_usage: bool = False


MAX_PROMPTS = 64  # prompts in one /v1/completions request


class CompletionRequest(OpenAIRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: the prompt alone (echo, scoring)
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)  # OpenAI allows 5; vLLM, as here, 20
    echo: bool = False
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM's extra
    stream_options: StreamOptions | None = None
    best_of: int | None = Field(default=None, ge=1, le=16)
    # llamactor extra: special-token text in the prompt read as those tokens (llama-server's and
    # llama-cpp-python's reading); false: as plain text
    parse_special: StrictBool = True

    @property
    def n_generated(self) -> int:
        """Choices to generate: ``best_of`` of them (the ``n`` best are returned), else ``n``."""
        return self.best_of or self.n

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


class ChatRequest(OpenAIRequest):
    chat: ClassVar[bool] = True
    messages: list[ChatMessage] = Field(min_length=1)
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

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in self.messages]

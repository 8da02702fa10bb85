"""OpenAI Responses request bodies (``POST /v1/responses``) (pure).

Unknown top-level fields are accepted and named in a warning log line (``extra="allow"``), as
vLLM and llama-server accept them: the Responses API grows new fields every few SDK releases
(``context_management``, ``moderation``, ``access_programs`` ...) and an SDK upgrade must not turn
every request into a 400. Fields the API documents that change nothing here are accepted, echoed
where the response object has them, and named in the same warning (``ignored_fields``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llamactor.base.errors import InvalidRequestError

# Documented fields accepted but not acted on (sent by Codex & co on every request): named in a warning.
IGNORED = ("reasoning", "include", "top_logprobs", "service_tier", "prompt_cache_key", "prompt_cache_retention",
           "prompt_cache_options", "max_tool_calls", "stream_options", "context_management", "moderation",
           "access_programs", "image", "background_options")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None  # may be left out: the default model (as /v1/chat/completions)
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None  # OpenAI's default is true
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Not supported: a 400 rather than an answer that silently is not what was asked.
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    # Accepted, ignored (see IGNORED)
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    max_tool_calls: int | None = None
    stream_options: dict[str, Any] | None = None
    context_management: Any = None
    moderation: Any = None
    access_programs: Any = None
    image: Any = None
    background_options: Any = None
    # llama-server extras (it copies the body onto its chat request): honoured
    seed: int | None = None
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    stop: str | list[str] | None = None
    priority: Literal["high", "normal", "low"] | int | None = None

    def ignored_fields(self) -> list[str]:
        """The fields given that change nothing (for the warning), unknown ones included."""
        names = [k for k in IGNORED if getattr(self, k) is not None]
        if self.truncation == "auto":
            names.append("truncation")  # we never drop input: an overflow is a 400, as "disabled"
        if self.text and self.text.get("verbosity") is not None:
            names.append("text.verbosity")
        return names + sorted(self.model_extra or {})

    def check_supported(self) -> None:
        for name in ("background", "conversation", "prompt"):
            if getattr(self, name):
                raise InvalidRequestError(f"{name} is not supported by this server", param=name)

"""Anthropic Messages request bodies: ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (pure).

Unknown top-level fields are refused (400), as Anthropic's API does; documented fields that
change nothing here are accepted and named in a warning (``ignored``). What a body means is
``call``. The ``anthropic`` package is a test dependency only: nothing here imports it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Documented request fields a local model does not honour: accepted, named in a warning.
IGNORED = ("service_tier", "container", "diagnostics", "inference_geo", "speed", "context_management")
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1)
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant", "system"]  # SDK 2.x also types system-role entries
    content: str | list[dict[str, Any]]


class Conversation(BaseModel):
    """What both endpoints take: the conversation, its tools, and how to render it."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's name for output_config.format
    cache_control: dict[str, Any] | None = None  # prefix caching is automatic: already honoured
    # bookkeeping that changes no answer (not even Anthropic's): accepted, no warning
    metadata: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None
    # IGNORED: accepted, named in a warning
    service_tier: Any = None
    container: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    speed: Any = None
    context_management: Any = None
    mcp_servers: list[Any] | None = None  # remote MCP tools: refused (nothing here calls them)

    def ignored(self) -> list[str]:
        """The fields given that are accepted but not honoured (for the warning)."""
        names = [name for name in IGNORED if getattr(self, name) is not None]
        if self.output_config is not None and self.output_config.effort is not None:
            names.append("output_config.effort")
        if self.thinking is not None and self.thinking.budget_tokens is not None:
            names.append("thinking.budget_tokens")  # reasoning runs until the model closes it
        return names

    @property
    def show_thinking(self) -> bool:
        return self.thinking is None or self.thinking.display != "omitted"


class MessagesRequest(Conversation):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False

"""Anthropic Messages request bodies and their mapping to llamactor (pure).

The route handlers (uvicorn's event loop) validate a body here and turn its ``system`` and
content blocks into llamactor's OpenAI-style chat messages, its fields into sampling options
(the response side is ``anthropic_message``). Unknown top-level fields are refused (400), as
Anthropic's API does; documented fields that change nothing here are accepted and named in a
warning (``ignored``). The ``anthropic`` package is a test dependency only: nothing here imports it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.tools import Tools

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
    _tools: Tools | None = PrivateAttr(default=None)
    _grammar: Grammar | None = PrivateAttr(default=None)

    def check(self) -> None:
        """What pydantic cannot check: tools, tool_choice, the output schema (400 if bad);
        compiles them once."""
        if self.mcp_servers:
            raise InvalidRequestError("mcp_servers are not supported: nothing here calls remote tools")
        self._tools = anthropic_tools(self.tools, self.tool_choice)
        fmt = self.output_format
        if self.output_config is not None and self.output_config.format is not None:
            if fmt is not None:
                raise InvalidRequestError("give output_config.format or output_format, not both")
            fmt = self.output_config.format
        if fmt is not None:
            if self._tools is not None and self._tools.choice not in ("none", "auto"):
                raise InvalidRequestError('output_config.format cannot be combined with tool_choice "any" or "tool"')
            # Anthropic's structured outputs always comply: strict (objects closed unless they say not)
            self._grammar = Grammar.json_schema(fmt.schema_, strict=True)

    @property
    def parsed_tools(self) -> Tools | None:
        """The tools when answers are parsed for calls (not ``tool_choice: none``)."""
        return self._tools if self._tools is not None and self._tools.parses else None

    def ignored(self) -> list[str]:
        """The fields given that are accepted but not honoured (for the warning)."""
        names = [name for name in IGNORED if getattr(self, name) is not None]
        if self.output_config is not None and self.output_config.effort is not None:
            names.append("output_config.effort")
        if self.thinking is not None and self.thinking.budget_tokens is not None:
            names.append("thinking.budget_tokens")  # reasoning runs until the model closes it
        return names

    def template_options(self) -> dict[str, Any]:
        """``tools`` and ``chat_template_kwargs``: what renders the prompt (tokenize takes both)."""
        out: dict[str, Any] = {"tools": self._tools} if self._tools is not None else {}
        if self.thinking is not None:  # Qwen3-style templates read enable_thinking; others ignore it
            out["chat_template_kwargs"] = {"enable_thinking": self.thinking.type != "disabled"}
        return out

    @property
    def show_thinking(self) -> bool:
        return self.thinking is None or self.thinking.display != "omitted"

    def chat_messages(self) -> list[dict[str, Any]]:
        return chat_messages(self.system, self.messages)


class MessagesRequest(Conversation):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False

    def sampling(self) -> dict[str, Any]:
        out: dict[str, Any] = {"max_tokens": self.max_tokens, **self.template_options()}
        out.update({k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p),
                                      ("top_k", self.top_k)) if v is not None})
        if self.stop_sequences:
            out["stop"] = list(self.stop_sequences)
        if self._grammar is not None:
            out["grammar"] = self._grammar
        return out


# -- the conversation ---------------------------------------------------------------------------

def chat_messages(system: str | list[dict[str, Any]] | None, messages: Sequence[InputMessage]) -> list[dict[str, Any]]:
    """Anthropic's system and turns as llamactor's chat messages: one leading system message (the
    ``system`` field, then any system-role entries, hoisted); a user turn's ``tool_result`` blocks
    as tool messages *before* its text (they answer the assistant turn just before); an assistant
    turn's ``tool_use`` blocks as ``tool_calls`` and its ``thinking`` as ``reasoning_content``."""
    systems = [system if isinstance(system, str) else _texts(system, "system")] if system else []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if m.role == "system":
            systems.append(m.content if isinstance(m.content, str) else _texts(m.content, f"{where}.content"))
        elif isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "user":
            out += _user_turn(m.content, where)
        else:
            out.append(_assistant_turn(m.content, where))
    if not out:
        raise InvalidRequestError("messages: at least one user or assistant message is required")
    return ([{"role": "system", "content": "\n".join(systems)}] if systems else []) + out


def _user_turn(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    results, texts = [], []
    for j, b in enumerate(blocks):
        at, kind = f"{where}.content.{j}", b.get("type")
        if kind == "text":
            texts.append(_field(b, "text", str, at))
        elif kind == "tool_result":
            content = b.get("content", "")
            text = content if isinstance(content, str) else _texts(content, f"{at}.content")
            results.append({"role": "tool", "tool_call_id": _field(b, "tool_use_id", str, at),
                            "content": f"Error: {text}" if b.get("is_error") else text})
        else:
            raise _unsupported(kind, at, "user")
    # Without text the turn is its tool results alone; an empty turn stays an (empty) user message.
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls, reasoning = [], [], []
    for j, b in enumerate(blocks):
        at, kind = f"{where}.content.{j}", b.get("type")
        if kind == "text":
            texts.append(_field(b, "text", str, at))
        elif kind == "tool_use":
            calls.append({"id": _field(b, "id", str, at), "type": "function",
                          "function": {"name": _field(b, "name", str, at),
                                       "arguments": json.dumps(_field(b, "input", dict, at), ensure_ascii=False)}})
        elif kind == "thinking":
            reasoning.append(_field(b, "thinking", str, at))
        elif kind != "redacted_thinking":  # opaque: nothing a local model could read
            raise _unsupported(kind, at, "assistant")
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    return out


def _texts(blocks: list[dict[str, Any]], where: str) -> str:
    """Text blocks (system, tool results) joined by newlines; anything else is refused."""
    texts = []
    for j, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text":
            raise InvalidRequestError(f"{where}.{j}: only text blocks are supported here")
        texts.append(_field(b, "text", str, f"{where}.{j}"))
    return "\n".join(texts)


def _field(block: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = block.get(key)
    if not isinstance(value, kind):
        raise InvalidRequestError(f"{where}.{key}: a {'JSON object' if kind is dict else 'string'} is required")
    return value


def _unsupported(kind: Any, where: str, role: str) -> InvalidRequestError:
    if kind in ("image", "document", "search_result"):
        return InvalidRequestError(f"{where}: {kind} blocks are not supported (this server's models read text only)")
    return InvalidRequestError(f"{where}: content blocks of type {kind!r} are not supported in a {role} turn")


def anthropic_tools(tools: list[dict[str, Any]] | None, choice: ToolChoice | None) -> Tools | None:
    """Custom tools (``name``, ``description``, ``input_schema``) and ``tool_choice`` as llamactor's
    ``Tools``: auto -> auto, any -> required, tool -> that function, none -> none;
    ``disable_parallel_tool_use`` -> ``parallel_tool_calls`` false (given false: true). Server tools
    (web search, bash, ...) are refused: nothing here runs them."""
    if not tools:
        if choice is not None and choice.type in ("any", "tool"):
            raise InvalidRequestError(f'tool_choice "{choice.type}" needs tools')
        return None
    functions = []
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom"):
            raise InvalidRequestError(f"tools.{i}: server tools ({t.get('type')}) are not supported; give custom "
                                      "tools: {name, description, input_schema}")
        if not isinstance(t.get("input_schema"), dict):
            raise InvalidRequestError(f"tools.{i}.input_schema: a JSON Schema object is required")
        functions.append({"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description"), "parameters": t["input_schema"],
            "strict": t.get("strict")}})
    oa_choice: Any = None
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequestError('tool_choice.name is required when its type is "tool"')
            oa_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            oa_choice = _TOOL_CHOICE[choice.type]
    # Not given: llamactor's default (one call per answer: small models repeat calls when allowed more).
    disable = choice.disable_parallel_tool_use if choice is not None else None
    return Tools.from_openai(functions, oa_choice, None if disable is None else not disable)

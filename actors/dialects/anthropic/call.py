"""What an Anthropic Messages body means (pure): its ``system`` and content blocks as llamactor's
OpenAI-style chat messages, its custom tools and ``tool_choice`` as ``Tools``, its output format
as a strict constraint, its fields as sampling options -- one ``GenerationRequest`` on the chat
path (``message`` is the reply, ``events`` the stream).

``max_tokens`` is required by Anthropic's API and clients send large values (Claude Code asks for
32000). As llama-server and Ollama treat it, it is an upper bound: the request asks the engine
to clamp it to the room the prompt leaves (``clamp_max_tokens``); running out of that room is
``model_context_window_exceeded``, and a prompt that alone fills the context is a 400 ("prompt is
too long: N tokens > M maximum", the words Anthropic's API and its clients use).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.request import GenerationRequest
from llamactor.base.request_checks import check_messages
from llamactor.base.tools import Tools
from llamactor.dialects.anthropic.schema import Conversation, InputMessage, MessagesRequest, ToolChoice
from llamactor.dialects.context import OneRequest, RequestContext

DIALECT = "anthropic"
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


@dataclass(frozen=True, slots=True)
class MessagesCall(OneRequest):
    """One ``POST /v1/messages`` call: its ``GenerationRequest`` and what its Message and events need."""

    id: str  # msg_...
    model: str
    request: GenerationRequest
    stop_sequences: tuple[str, ...]  # which of the answer's stop strings are the caller's own
    show_thinking: bool
    ignored: list[str]  # fields given that change nothing here (for the warning)


@dataclass(frozen=True, slots=True)
class Rendering:
    """What renders a conversation as the model sees it (``count_tokens`` tokenizes it)."""

    messages: list[dict[str, Any]]
    tools: Tools | None
    chat_template_kwargs: dict[str, Any] | None
    grammar: Grammar | None  # the output format (checked here too: count_tokens refuses a bad one alike)


def rendering_of(body: Conversation) -> Rendering:
    """The conversation, its tools and template variables; every 400 of the body itself."""
    if body.mcp_servers:
        raise InvalidRequestError("mcp_servers are not supported: nothing here calls remote tools")
    tools = anthropic_tools(body.tools, body.tool_choice)
    # Qwen3-style templates read enable_thinking; others ignore it
    kwargs = {"enable_thinking": body.thinking.type != "disabled"} if body.thinking is not None else None
    messages = chat_messages(body.system, body.messages)
    check_messages(messages)  # count_tokens renders them without a GenerationRequest: checked as one is
    return Rendering(messages, tools, kwargs, _output_format(body, tools))


def messages_call(body: MessagesRequest, ctx: RequestContext) -> MessagesCall:
    rendering = rendering_of(body)
    sampling: dict[str, Any] = {k: v for k, v in (("temperature", body.temperature), ("top_p", body.top_p), ("top_k", body.top_k),
                                  ("stop", body.stop_sequences or None)) if v is not None}
    request = GenerationRequest.build(
        ctx.defaults, messages=rendering.messages, request_id=ctx.id("msg_"), tools=rendering.tools,
        tool_format=ctx.tool_format,
        chat_template_kwargs=rendering.chat_template_kwargs, grammar=rendering.grammar, max_tokens=body.max_tokens,
        clamp_max_tokens=True, **ctx.lora(), **sampling)
    return MessagesCall(ctx.id("msg_"), ctx.model, request, tuple(body.stop_sequences or ()), body.show_thinking,
                        body.ignored())


def _output_format(body: Conversation, tools: Tools | None) -> Grammar | None:
    """``output_config.format`` (or the beta's ``output_format``) as a strict JSON Schema constraint."""
    fmt = body.output_format
    if body.output_config is not None and body.output_config.format is not None:
        if fmt is not None:
            raise InvalidRequestError("give output_config.format or output_format, not both")
        fmt = body.output_config.format
    if fmt is None:
        return None
    if tools is not None and tools.choice not in ("none", "auto"):
        raise InvalidRequestError('output_config.format cannot be combined with tool_choice "any" or "tool"')
    # Anthropic's structured outputs always comply: strict (objects closed unless they say not)
    return Grammar.json_schema(fmt.schema_, strict=True)


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

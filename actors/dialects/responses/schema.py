"""OpenAI Responses requests (``POST /v1/responses``) translated onto the chat path (pure; any
thread, in practice uvicorn's event loop).

The translation is stateless, as llama-server's: ``instructions`` + (the stored conversation of
``previous_response_id``) + ``input`` become OpenAI chat messages, flat function tools become
chat tools, ``text.format`` a constraint. What is stored between turns is decided in
``responses.py`` / ``responses_store.py``.

Unknown top-level fields are accepted and named in a warning log line (``extra="allow"``), as
vLLM and llama-server accept them: the Responses API grows new fields every few SDK releases
(``context_management``, ``moderation``, ``access_programs`` ...) and an SDK upgrade must not turn
every request into a 400. Fields the API documents that change nothing here are accepted, echoed
where the response object has them, and named in the same warning (``ignored_fields``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.tools import Tools, pop_tools

TEXT_PARTS = ("input_text", "output_text", "text")  # assistant replays may carry either (llama.cpp)
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


@dataclass
class Plan:
    """What one request becomes: the chat, its sampling options, and its tools (for parsing)."""

    history: list[dict[str, Any]]  # earlier turns + this input, without instructions (what is stored)
    messages: list[dict[str, Any]]  # what the model sees: instructions first
    sampling: dict[str, Any] = field(default_factory=dict)
    tools: Tools | None = None

    @property
    def parsed_tools(self) -> Tools | None:
        return self.tools if self.tools is not None and self.tools.parses else None


def plan(body: ResponsesRequest, earlier: Sequence[Mapping[str, Any]] = ()) -> Plan:
    """``earlier``: the stored conversation of ``previous_response_id`` (chat messages)."""
    body.check_supported()
    if body.input is None and not earlier:
        raise InvalidRequestError("input is required (or previous_response_id)", param="input")
    given = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else \
        input_messages(body.input or [])
    history = [*earlier, *given]
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + history
    if not messages:
        raise InvalidRequestError("input must not be empty", param="input")
    grammar = text_format(body.text)
    tools = None
    if body.tools:
        tools = pop_tools({"tools": chat_tools(body.tools), "tool_choice": chat_tool_choice(body.tool_choice),
                           "parallel_tool_calls": body.parallel_tool_calls, "grammar": grammar}, chat=True)
    elif body.tool_choice not in (None, "none", "auto"):
        raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
    sampling: dict[str, Any] = {k: v for k, v in {
        "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed, "top_k": body.top_k,
        "min_p": body.min_p, "repeat_penalty": body.repeat_penalty, "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty, "priority": body.priority, "grammar": grammar,
        "tools": tools, "stop": [body.stop] if isinstance(body.stop, str) else body.stop,
    }.items() if v is not None}
    sampling["max_tokens"] = body.max_output_tokens  # None: until the end of the turn or the context
    return Plan(history, messages, sampling, tools)


def input_messages(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Responses input items as chat messages. Consecutive assistant-side items (message,
    function_call, reasoning) merge into one assistant turn, the way a replayed ``output`` came
    out of one; fields clients replay (``id``, ``status``, ``annotations`` ...) are ignored."""
    out: list[dict[str, Any]] = []

    def assistant() -> dict[str, Any]:
        if not out or out[-1]["role"] != "assistant":
            out.append({"role": "assistant", "content": ""})
        return out[-1]

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidRequestError(f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"{where}.role must be user, system, developer or assistant",
                                          param=f"{where}.role")
            text = content_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                turn = assistant()
                turn["content"] += text
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise InvalidRequestError(f"{where} needs call_id, name and arguments (a JSON string)", param=where)
            assistant().setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequestError(f"{where}.call_id is required", param=f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            # OpenAI replays reasoning with a summary only; llama.cpp with content: take either.
            parts = item.get("content") or item.get("summary") or []
            text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, Mapping))
            if text:
                turn = assistant()
                turn["reasoning_content"] = turn.get("reasoning_content", "") + text
        else:
            raise InvalidRequestError(f"{where}.type {kind!r} is not supported (message, function_call, "
                                      "function_call_output, reasoning)", param=f"{where}.type")
    return out


def content_text(content: Any, where: str) -> str:
    """A message's content: a string, or text parts (``input_text``, ``output_text``, ``refusal``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in TEXT_PARTS:
            texts.append(str(part.get("text", "")))
        elif kind == "refusal":
            texts.append(str(part.get("refusal", "")))
        else:
            raise InvalidRequestError(f"{where}[{j}].type {kind!r} is not supported (text parts only)",
                                      param=f"{where}[{j}].type")
    return "".join(texts)


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Flat Responses function tools as chat tools; any other tool type is a 400 naming it."""
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise InvalidRequestError(f"tools[{i}].type {tool.get('type')!r} is not supported: only function tools",
                                      param=f"tools[{i}].type")
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")
                                                      if tool.get(k) is not None}})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """``{"type": "function", "name": x}`` as chat's ``{"type": "function", "function": {"name": x}}``."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequestError('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}',
                              param="tool_choice")


def text_format(text: Mapping[str, Any] | None) -> Grammar | None:
    """``text.format``: plain text, JSON mode, or a JSON Schema (structured outputs)."""
    fmt = (text or {}).get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequestError("text.format.schema (a JSON Schema object) is required",
                                      param="text.format.schema")
        # OpenAI's strict flag, on unless false (llama.cpp's default for Responses too): objects
        # closed, and a schema keyword llguidance cannot enforce is a 400 instead of ignored.
        return Grammar.json_schema(schema, strict=fmt.get("strict") is not False)
    raise InvalidRequestError("text.format.type must be text, json_object or json_schema", param="text.format.type")

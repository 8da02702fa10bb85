"""What a Responses body means (pure): the conversation -- ``instructions`` + the stored
conversation of ``previous_response_id`` + ``input`` as chat messages -- its flat function tools
as chat tools, ``text.format`` as a constraint: one ``GenerationRequest`` on the chat path,
stateless, as llama-server translates it. What is kept between turns (``history``) is the
transport's to store; a batch line has no earlier turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.request import GenerationRequest
from llamactor.dialects.context import OneRequest, RequestContext
from llamactor.dialects.responses.output_items import Shell
from llamactor.dialects.responses.schema import ResponsesRequest

DIALECT = "responses"  # the metrics' dialect label
TEXT_PARTS = ("input_text", "output_text", "text")  # assistant replays may carry either (llama.cpp)


@dataclass(frozen=True, slots=True)
class ResponsesCall(OneRequest):
    """One ``POST /v1/responses`` call: its ``GenerationRequest``, the response's fixed fields, the conversation so far."""

    shell: Shell  # the response object's fields that do not change while it is generated
    request: GenerationRequest
    history: list[dict[str, Any]]  # earlier turns + this input, without instructions (what is stored)
    ignored: list[str]  # fields given that change nothing here (for the warning)


def response_call(body: ResponsesRequest, ctx: RequestContext,
                  earlier: Sequence[Mapping[str, Any]] = ()) -> ResponsesCall:
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
    if not body.tools and body.tool_choice not in (None, "none", "auto"):
        raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
    sampling: dict[str, Any] = {k: v for k, v in {
        "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed, "top_k": body.top_k,
        "min_p": body.min_p, "repeat_penalty": body.repeat_penalty, "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty, "priority": body.priority,
        "stop": [body.stop] if isinstance(body.stop, str) else body.stop,
    }.items() if v is not None}
    rid = ctx.id("resp_")  # also the engine's request id: one id in every log line
    request = GenerationRequest.build(
        ctx.defaults, messages=messages, request_id=rid, grammar=text_format(body.text), tool_format=ctx.tool_format,
        tools=chat_tools(body.tools) if body.tools else None,
        tool_choice=chat_tool_choice(body.tool_choice) if body.tools else None,
        parallel_tool_calls=body.parallel_tool_calls,
        max_tokens=ctx.max_tokens(body.max_output_tokens), **ctx.lora(), **sampling)
    return ResponsesCall(Shell(body, rid, ctx.model, ctx.created), request, history, body.ignored_fields())


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

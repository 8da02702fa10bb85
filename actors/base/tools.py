"""Tool calls: OpenAI ``tools`` / ``tool_choice`` in, ``tool_calls`` out. Pure code, any thread.

The model calls a tool by writing a block in the Hermes / Qwen format, the one most open tool-use
templates teach:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

- Rendering: a chat template that takes ``tools`` (it mentions them) gets them as the Jinja
  variable, as Hugging Face templates expect. Any other template -- and the plain transcript of
  a base model -- gets the plain-text fallback: a system message listing the tools, their
  argument schemas and the block format above.
- ``tool_choice``: ``"none"`` (tools described, answer never parsed), ``"auto"`` (the model
  chooses; blocks are parsed out of its answer), ``"required"`` or a named function: a grammar
  (``Grammar.lark`` with the tools' JSON Schemas embedded, objects closed and numbers bounded as
  ``json_schema`` enforces them) makes the answer one or more blocks.
- Parsing: ``parse_tool_calls`` on a finished text; ``ToolCallStream`` on streamed pieces (a call
  is emitted whole, once its block closes; text that is not a call streams as content).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar, enforced_schema

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: ``arguments`` is JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class Tools:
    """The tools of one chat request and how the model may use them (checked at construction)."""

    functions: tuple[dict[str, Any], ...]  # OpenAI's {"name", "description", "parameters"} of each tool
    choice: str = "auto"  # "none" | "auto" | "required" | the name of the one function to call
    # More than one call per answer. Off unless asked for, as in llama.cpp's server: allowed to,
    # small models repeat the same call until max_tokens.
    parallel: bool = False

    def __post_init__(self) -> None:
        names = [f["name"] for f in self.functions]
        if len(set(names)) != len(names):
            raise InvalidRequestError("tool names must be unique")
        if self.choice not in ("none", "auto", "required") and self.choice not in names:
            raise InvalidRequestError(f"tool_choice names {self.choice!r}, which is not in tools")

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]], tool_choice: Any = None,
                    parallel_tool_calls: bool | None = None) -> Tools:
        """From OpenAI's request fields (``tools`` entries of type function; ``tool_choice`` a
        string or ``{"type": "function", "function": {"name": ...}}``)."""
        if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not tools or len(tools) > 128:
            raise InvalidRequestError("tools must be a list of 1 to 128 functions")
        functions = tuple(_function(t, i) for i, t in enumerate(tools))
        choice = "auto" if tool_choice is None else tool_choice
        if isinstance(choice, Mapping):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if not isinstance(name, str):
                raise InvalidRequestError('tool_choice must be "none", "auto", "required" or '
                                          '{"type": "function", "function": {"name": ...}}')
            choice = name
        elif choice not in ("none", "auto", "required"):
            raise InvalidRequestError(f'tool_choice must be "none", "auto", "required" or a named function, got {choice!r}')
        return cls(functions, choice, parallel_tool_calls is True)

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def grammar(self) -> Grammar | None:
        """The constraint for ``required`` and named choices; None lets the model choose."""
        if self.choice in ("none", "auto"):
            return None
        chosen = [f for f in self.functions if self.choice == "required" or f["name"] == self.choice]
        call_schema = {"anyOf": [{
            "type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": f["name"]},
                           "arguments": enforced_schema(f.get("parameters") or {"type": "object"})},
        } for f in chosen], "x-guidance": {"whitespace_flexible": False, "lenient": True}}
        repeat = ' ("\\n" call)*' if self.parallel else ""
        return Grammar.lark(f'start: " "? call{repeat}\n'
                            f'call: "{OPEN}\\n" body "\\n{CLOSE}"\n'
                            f"body: %json {json.dumps(call_schema)}\n")

    def system_text(self) -> str:
        """The plain-text fallback: how a model whose template knows no tools learns about them."""
        lines = ["You can call the following tools. To call a tool, answer with only this block "
                 "(one block per call):", OPEN, '{"name": <tool name>, "arguments": <JSON object>}', CLOSE,
                 "", "Tools:"]
        for f in self.functions:
            params = json.dumps(f.get("parameters") or {"type": "object"}, separators=(",", ":"))
            lines.append(f"- {f['name']}: {f.get('description') or ''} Arguments (JSON Schema): {params}")
        return "\n".join(lines)

    def prepare(self, messages: Sequence[Mapping[str, Any]], template_takes_tools: bool) -> list[dict[str, Any]]:
        """The conversation as the template will see it: earlier calls and results in the history,
        and (without template support) the tools described in the system message."""
        out = [render_history_message(m, template_takes_tools) for m in messages]
        if template_takes_tools:
            return out
        text = self.system_text()
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}".strip()}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out

    def template_tools(self) -> list[dict[str, Any]]:
        """``tools`` as Hugging Face chat templates take them."""
        return [{"type": "function", "function": f} for f in self.functions]


def _function(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(tool.get("function"), Mapping):
        raise InvalidRequestError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}')
    f = dict(tool["function"])
    if not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
        raise InvalidRequestError(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -")
    if f.get("parameters") is not None:
        if not isinstance(f["parameters"], Mapping):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON Schema object")
        Grammar.json_schema(dict(f["parameters"]), strict=bool(f.get("strict")))  # a bad schema: 400 now
    return {k: f[k] for k in ("name", "description", "parameters") if f.get(k) is not None}


def render_history_message(message: Mapping[str, Any], template_takes_tools: bool) -> dict[str, Any]:
    """One history message: an assistant's ``tool_calls`` become blocks in its content (or stay
    structured, arguments as objects, for templates that render them); content None becomes ""."""
    m = dict(message)
    if m.get("content") is None:
        m["content"] = ""
    calls = m.get("tool_calls")
    if m.get("role") != "assistant" or not calls:
        m.pop("tool_calls", None)
        return m
    parsed = [{"name": c["function"]["name"], "arguments": _arguments_object(c["function"].get("arguments"))}
              for c in calls]
    if template_takes_tools:
        m["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": p} for c, p in zip(calls, parsed)]
        return m
    del m["tool_calls"]
    blocks = "\n".join(f"{OPEN}\n{json.dumps(p, ensure_ascii=False)}\n{CLOSE}" for p in parsed)
    m["content"] = f"{m['content']}\n{blocks}".strip()
    return m


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def _call(body: str, names: set[str]) -> ToolCall | None:
    """A block's JSON as a call of a known tool, or None."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    args = data.get("arguments", data.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", data["name"], text)


def parse_tool_calls(text: str, tools: Tools) -> tuple[str, tuple[ToolCall, ...]]:
    """``(content, calls)``: the blocks naming known tools, and the text around them."""
    names = {f["name"] for f in tools.functions}
    calls: list[ToolCall] = []
    rest: list[str] = []
    at = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), names)
        if call is None:
            continue
        calls.append(call)
        rest.append(text[at:match.start()])
        at = match.end()
    rest.append(text[at:])
    return ("".join(rest).strip() if calls else text), tuple(calls)


class ToolCallStream:
    """Splits streamed pieces into content and whole tool calls (caller's thread / event loop)."""

    def __init__(self, tools: Tools) -> None:
        self._names = {f["name"] for f in tools.functions}
        self._buffer = ""
        self._content = False  # decided: this answer is plain text

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        """Content to send now, and the calls whose blocks closed with this piece."""
        if self._content:
            return piece, []
        self._buffer += piece
        head = self._buffer.lstrip()
        if not head or (len(head) < len(OPEN) and OPEN.startswith(head)):
            return "", []  # could still become a call
        if not head.startswith(OPEN):
            self._content = True
            out, self._buffer = self._buffer, ""
            return out, []
        calls: list[ToolCall] = []
        while (end := self._buffer.find(CLOSE)) >= 0:
            block, self._buffer = self._buffer[:end + len(CLOSE)], self._buffer[end + len(CLOSE):]
            match = _BLOCK.search(block)
            call = _call(match.group(1), self._names) if match else None
            if call is None:  # not a call after all: give the text back as content
                self._content = True
                return block + self._buffer, calls
            calls.append(call)
        return "", calls

    def finish(self) -> str:
        """What was held back and never became a call (an unclosed block), as content."""
        out, self._buffer = self._buffer.strip(), ""
        return out

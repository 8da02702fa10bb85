"""Tool calls: OpenAI ``tools`` / ``tool_choice`` in, ``tool_calls`` out. Pure code, any thread.

The model calls a tool in its own format (``Tools.format``, a ``ToolCallFormat`` learned from
its chat template by ``llamactor.base.tool_probe``: Hermes / Qwen, Llama 3.x, Mistral, or what
the template shows). Without one -- a template that knows no tools, a base model's transcript --
it is taught the Hermes / Qwen block, the one most open tool-use templates teach:

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
  ``json_schema`` enforces them) makes the answer one or more calls in the format.
- Parsing: ``parse_tool_calls`` on a finished text; ``ToolCallStream`` on streamed pieces (a call
  is emitted whole, once it closes; text that is not a call streams as content), both
  ``llamactor.base.tool_parser``'s, so they agree.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import Grammar
from llamactor.base.request_checks import check_text
from llamactor.base.tool_format import FALLBACK, ToolCall, ToolCallFormat
from llamactor.base.tool_parser import ToolCallParser

__all__ = ["ToolCall", "ToolCallStream", "Tools", "parse_tool_calls", "render_history_message"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Tools:
    """The tools of one chat request and how the model may use them (checked at construction)."""

    functions: tuple[dict[str, Any], ...]  # OpenAI's {"name", "description", "parameters"} of each tool
    choice: str = "auto"  # "none" | "auto" | "required" | the name of the one function to call
    # More than one call per answer. Off unless asked for, as in llama.cpp's server: allowed to,
    # small models repeat the same call until max_tokens.
    parallel: bool = False
    format: ToolCallFormat = FALLBACK  # how this model writes a call (the caller's model says; see tool_probe)

    def __post_init__(self) -> None:
        check_text(self.functions, "tools")  # rendered into the prompt: valid Unicode (from_openai named where)
        names = [f["name"] for f in self.functions]
        if len(set(names)) != len(names):
            raise InvalidRequestError("tool names must be unique")
        if self.choice not in ("none", "auto", "required") and self.choice not in names:
            raise InvalidRequestError(f"tool_choice names {self.choice!r}, which is not in tools")

    @classmethod
    def from_openai(cls, tools: Sequence[Mapping[str, Any]], tool_choice: Any = None,
                    parallel_tool_calls: bool | None = None, format: ToolCallFormat = FALLBACK) -> Tools:
        """From OpenAI's request fields (``tools`` entries of type function; ``tool_choice`` a
        string or ``{"type": "function", "function": {"name": ...}}``); ``format``: the model's."""
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
        return cls(functions, choice, parallel_tool_calls is True, format)

    def in_format(self, format: ToolCallFormat) -> Tools:
        """These tools for a model that writes calls in ``format``."""
        return self if format == self.format else dataclasses.replace(self, format=format)

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def grammar(self) -> Grammar | None:
        """The constraint for ``required`` and named choices; None lets the model choose."""
        if self.choice in ("none", "auto"):
            return None
        chosen = [f for f in self.functions if self.choice == "required" or f["name"] == self.choice]
        return self.format.grammar(chosen, self.parallel)

    def system_text(self) -> str:
        """The plain-text fallback: how a model whose template knows no tools learns about them."""
        lines = ["You can call the following tools. To call a tool, answer with only this block "
                 "(one block per call):", FALLBACK.start + '{"name": <tool name>, "arguments": <JSON object>}'
                 + FALLBACK.end, "", "Tools:"]
        for f in self.functions:
            params = json.dumps(f.get("parameters") or {"type": "object"}, separators=(",", ":"))
            lines.append(f"- {f['name']}: {f.get('description') or ''} Arguments (JSON Schema): {params}")
        return "\n".join(lines)

    def prepare(self, messages: Sequence[Mapping[str, Any]], template_takes_tools: bool,
                renders_system: bool = True) -> list[dict[str, Any]]:
        """The conversation as the template will see it: earlier calls and results in the history,
        and (without template support) the tools described in the system message -- or, for a
        template that renders none, at the head of the first user message."""
        out = [render_history_message(m, template_takes_tools, self.format) for m in messages]
        if template_takes_tools:
            return out
        text = self.system_text()
        first_user = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        if not renders_system and first_user is not None:
            out[first_user] = {**out[first_user], "content": f"{text}\n\n{out[first_user]['content']}".strip()}
        elif out and out[0]["role"] in ("system", "developer"):
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
    check_text({k: v for k, v in f.items() if k != "parameters"}, f"tools[{i}].function")  # the schema: below
    if not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
        raise InvalidRequestError(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -")
    if f.get("parameters") is not None:
        if not isinstance(f["parameters"], Mapping):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON Schema object")
        Grammar.json_schema(dict(f["parameters"]), strict=bool(f.get("strict")),  # a bad schema: 400 now
                            where=f"tools[{i}].function.parameters")
    return {k: f[k] for k in ("name", "description", "parameters") if f.get(k) is not None}


def render_history_message(message: Mapping[str, Any], template_takes_tools: bool,
                           format: ToolCallFormat = FALLBACK) -> dict[str, Any]:
    """One history message: an assistant's ``tool_calls`` become calls written in ``format`` in
    its content (or stay structured, arguments as objects, for templates that render them);
    content None becomes ""."""
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
    m["content"] = f"{m['content']}\n{format.write(parsed)}".strip()
    return m


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def parse_tool_calls(text: str, tools: Tools) -> tuple[str, tuple[ToolCall, ...]]:
    """``(content, calls)``: the calls of known tools in the answer, and the text around them."""
    parser = ToolCallParser(tools.format, (f["name"] for f in tools.functions))
    content, calls = parser.feed(text)
    rest, last = parser.finish()
    calls += last
    return ((content + rest).strip() if calls else text), tuple(calls)


class ToolCallStream:
    """Splits streamed pieces into content and whole tool calls (caller's thread / event loop)."""

    def __init__(self, tools: Tools) -> None:
        self._parser = ToolCallParser(tools.format, (f["name"] for f in tools.functions))

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        """Content to send now, and the calls that closed with this piece."""
        return self._parser.feed(piece)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What was held back: content, or a last call the answer's end closed."""
        return self._parser.finish()

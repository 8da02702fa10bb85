"""How one model writes a tool call: the text around a call's JSON and the JSON's shape (pure).

A ``ToolCallFormat`` is learned from the model's chat template (``llamactor.base.tool_probe``) and
used three ways: the answer parser reads calls in it (``llamactor.base.tool_parser``), the grammar
of a ``required`` or named ``tool_choice`` makes the model write one in it (``grammar``), and a
history's earlier calls are written back in it where the template does not render them. The
families:

- Hermes / Qwen (``HERMES``): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
  also the plain-text fallback taught to models whose template knows no tools (``FALLBACK``).
- Llama 3.x (``LLAMA3``): a bare ``{"name": ..., "parameters": {...}}``, sometimes opened by
  ``<|python_tag|>``.
- Mistral (``MISTRAL``): ``[TOOL_CALLS]`` and a JSON *list* of ``{"name", "arguments"}`` objects.
- any other JSON-writing template: what the probe reads off it (``family="learned"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from llamactor.base.grammar import Grammar, enforced_schema


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: ``arguments`` is JSON text, as OpenAI sends it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """``start`` + a call's JSON + ``end``; with ``as_list`` the JSON is a list of calls."""

    family: str  # "hermes" | "llama3" | "mistral" | "learned" | "fallback"
    start: str  # what opens a call (or the list of calls): "<tool_call>\n"; "" for bare JSON
    end: str = ""  # what closes it: "\n</tool_call>"; "" when the turn's end closes it
    args_key: str = "arguments"  # the key of the arguments object ("parameters" for Llama 3.x)
    as_list: bool = False  # Mistral: one JSON list holds the answer's calls
    alt_starts: tuple[str, ...] = ()  # other openings the model writes (Llama's "<|python_tag|>")
    separator: str = "\n"  # between two calls (each wrapped) or two list items
    native: bool = True  # the template renders tools and calls itself (False: the plain-text fallback)

    def __post_init__(self) -> None:
        if self.args_key not in ("arguments", "parameters"):
            raise ValueError(f"a tool call's arguments key is 'arguments' or 'parameters', not {self.args_key!r}")

    @property
    def openings(self) -> tuple[str, ...]:
        """The non-empty markers that may open a call, longest first (a parser's search)."""
        return tuple(sorted({m for m in (self.start.strip(), *self.alt_starts) if m}, key=len, reverse=True))

    @property
    def bare_json(self) -> bool:
        """A call may be a bare JSON object at the start of the answer (no marker)."""
        return not self.start.strip()

    def write(self, calls: list[dict[str, Any]]) -> str:
        """``calls`` (``{"name", "arguments"}`` each, arguments an object) as the model writes them."""
        bodies = [json.dumps({"name": c["name"], self.args_key: c["arguments"]}, ensure_ascii=False) for c in calls]
        if self.as_list:
            return f"{self.start}[{', '.join(bodies)}]{self.end}"
        return self.separator.join(f"{self.start}{b}{self.end}" for b in bodies)

    def grammar(self, functions: list[dict[str, Any]], parallel: bool) -> Grammar:
        """A Lark grammar (llguidance) whose every sentence is one call (``parallel``: one or more)
        of ``functions``, each's arguments closed under its JSON Schema, written in this format."""
        call_schema = {"anyOf": [{
            "type": "object", "additionalProperties": False, "required": ["name", self.args_key],
            "properties": {"name": {"const": f["name"]},
                           self.args_key: enforced_schema(f.get("parameters") or {"type": "object"})},
        } for f in functions], "x-guidance": {"whitespace_flexible": False, "lenient": True}}
        if self.as_list:  # one list: start "[" call (", " call)* "]" end
            items = 'body (", " body)*' if parallel else "body"
            rules = f"start: \" \"? {_literal(self.start + '[')} {items} {_literal(']' + self.end)}\n"
        else:
            repeat = f" ({_literal(self.separator)} call)*" if parallel else ""
            call = " ".join([*_items(self.start), "body", *_items(self.end)])
            rules = f'start: " "? call{repeat}\ncall: {call}\n'
        return Grammar.lark(f"{rules}body: %json {json.dumps(call_schema)}\n")


def _literal(text: str) -> str:
    """A Lark string literal (llguidance reads JSON string escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _items(text: str) -> list[str]:
    """``text`` as a grammar item, or none when it is empty."""
    return [_literal(text)] if text else []


HERMES = ToolCallFormat("hermes", "<tool_call>\n", "\n</tool_call>")
FALLBACK = replace(HERMES, family="fallback", native=False)
LLAMA3 = ToolCallFormat("llama3", "", "", args_key="parameters", alt_starts=("<|python_tag|>",), separator="; ")
MISTRAL = ToolCallFormat("mistral", "[TOOL_CALLS]", "", as_list=True, separator=", ")

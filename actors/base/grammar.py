"""Constraints on what a request may generate: JSON Schema, JSON mode, Lark / GBNF grammars, regex.

Built on llguidance (the library llama.cpp itself uses for grammars). A ``Grammar`` is compiled
and checked in the *caller's* thread, with no model at hand: a bad schema or grammar is an
``InvalidRequestError`` before anything is queued. The batcher's side -- a matcher per request
and sampling under it -- is ``llamactor.grammar_sampler``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance

from llamactor.base.errors import InvalidRequestError

GrammarKind = Literal["json_schema", "json_object", "lark", "gbnf", "regex"]
_KINDS = ("json_schema", "json_object", "lark", "gbnf", "regex")


@dataclass(frozen=True, slots=True)
class Grammar:
    """A compiled constraint. Build it with the class methods; the constructor does not compile."""

    kind: GrammarKind
    compiled: str  # llguidance's grammar text (what LLMatcher takes)
    # For JSON schemas given as a pydantic model: turns the finished text into the validated object.
    parse: Callable[[str], Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidRequestError(f"grammar kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str | type, *, strict: bool = True) -> Grammar:
        """Output valid against ``schema`` (a dict, its JSON text, or a pydantic model class).

        ``strict`` (OpenAI's flag): a keyword llguidance cannot enforce is an error. Without it,
        such keywords are ignored (the output is then only as valid as the model makes it).
        Strict or not, objects are closed and numbers bounded as llama.cpp's json-schema-to-grammar
        does (``_closed_objects``, ``_bounded_numbers``): instructor's and LangChain's default
        structured output send schemas without ``strict``."""
        parse = None
        if isinstance(schema, type):
            if not hasattr(schema, "model_json_schema"):
                raise InvalidRequestError(f"json_schema must be a dict or a pydantic model class, got {schema!r}")
            parse = schema.model_validate_json  # type: ignore[attr-defined]
            schema = schema.model_json_schema()  # type: ignore[attr-defined]
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise InvalidRequestError(f"json_schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict):
            raise InvalidRequestError("json_schema must be a JSON object")
        # Compact JSON (no free whitespace): a small model left free to indent can loop on blank lines.
        options = {"lenient": not strict, "whitespace_flexible": False}
        schema = enforced_schema(schema)
        try:
            compiled = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)  # type: ignore[arg-type]
        except ValueError as e:
            raise InvalidRequestError(f"invalid json_schema: {e}") from e
        return _checked(cls("json_schema", compiled, parse), "json_schema")

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's JSON mode)."""
        compiled = llguidance.LLMatcher.grammar_from_json_schema(
            {"type": "object"}, overrides={"whitespace_flexible": False})  # type: ignore[arg-type]
        return _checked(cls("json_object", compiled), "response_format")

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """A Lark grammar as llguidance reads it (``start:`` rule, ``%json {...}`` embeds a schema)."""
        return _checked(cls("lark", llguidance.LLMatcher.grammar_from_lark(_text(text))), "grammar")

    @classmethod
    def gbnf(cls, text: str) -> Grammar:
        """A GBNF grammar as llama.cpp's server takes it (``root ::= ...``); Lark text is accepted too."""
        try:
            compiled = llguidance.grammar_from("gbnf", _text(text))
        except Exception as e:  # noqa: BLE001 - its GBNF converter raises bare Exception
            raise InvalidRequestError(f"invalid grammar: {e}") from e
        return _checked(cls("gbnf", compiled), "grammar")

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Output matching the regular expression ``pattern`` (Rust ``regex`` syntax)."""
        return _checked(cls("regex", llguidance.LLMatcher.grammar_from_regex(_text(pattern))), "grammar")

    @classmethod
    def coerce(cls, value: Grammar | str) -> Grammar:
        """``grammar=`` of the API: a ``Grammar``, or GBNF / Lark text."""
        return value if isinstance(value, Grammar) else cls.gbnf(value)


def enforced_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as llamactor enforces it, wherever it is embedded (a tool's arguments too):
    objects closed, numbers bounded."""
    return _bounded_numbers(_closed_objects(schema))  # type: ignore[no-any-return]


def _closed_objects(schema: Any) -> Any:
    """An object schema that does not say otherwise allows no properties beyond its own
    (``additionalProperties: false``): OpenAI's strict mode, and llama.cpp's default. Without it a
    small model keeps inventing keys until max_tokens (pydantic models, for one, leave it unset)."""
    if isinstance(schema, list):
        return [_closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed_objects(v) if k not in ("enum", "const", "default", "examples") else v for k, v in schema.items()}
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


# llama.cpp's grammar allows at most 16 integer digits (and 16 fraction digits); llguidance takes
# bounds and a multipleOf of at most 10 decimals, so: |x| <= 10^16 and at most 10 fraction digits.
# Unbounded, a small model writes "1000000000000…" until max_tokens and the JSON never parses.
NUMBER_BOUND = 10**16
FRACTION_STEP = "0.0000000001"


def _bounded_numbers(schema: Any) -> Any:
    """Numbers and integers without bounds of their own get llama.cpp-like ones."""
    if isinstance(schema, list):
        return [_bounded_numbers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _bounded_numbers(v) if k not in ("enum", "const", "default", "examples") else v
           for k, v in schema.items()}
    types = out.get("type")
    kinds = set(types) if isinstance(types, list) else {types}
    if kinds & {"number", "integer"} and "enum" not in out and "const" not in out:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -NUMBER_BOUND
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = NUMBER_BOUND
        if "number" in kinds and "multipleOf" not in out:
            out["multipleOf"] = float(FRACTION_STEP)
    return out


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError("a grammar must be a non-empty string")
    return value


def _checked(grammar: Grammar, what: str) -> Grammar:
    """Compile without a vocabulary: syntax, unknown rules, unsupported schema keywords."""
    error = llguidance.LLMatcher.validate_grammar(grammar.compiled, None)
    if error:
        raise InvalidRequestError(f"invalid {what}: {error.strip()}")
    return grammar

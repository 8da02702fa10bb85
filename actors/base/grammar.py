"""Constraints on what a request may generate: JSON Schema, JSON mode, Lark / GBNF grammars, regex.

Built on llguidance (the library llama.cpp itself uses for grammars). A ``Grammar`` is compiled
and checked in the *caller's* thread, with no model at hand: a bad schema or grammar is an
``InvalidRequestError`` before anything is queued. The batcher's side -- a matcher per request
and sampling under it -- is ``llamactor.tree.grammar_sampler``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance

from llamactor.base.errors import InvalidRequestError
from llamactor.base.request_checks import check_text, json_depth

GrammarKind = Literal["json_schema", "json_object", "lark", "gbnf", "regex"]
_KINDS = ("json_schema", "json_object", "lark", "gbnf", "regex")

# Caps that real constraints never reach, so that compiling one (on the caller's thread) and
# building its matcher (on the batcher thread, for every request that uses it) stay short.
# A JSON Schema nests at most 64 levels of JSON (OpenAI's structured outputs allow 10 levels of
# objects, about 20 of JSON; llguidance's JSON parser stops at 128) ...
MAX_SCHEMA_DEPTH = 64
# ... and holds at most 1,000 object properties in all (OpenAI allows 5,000, but llguidance's
# matcher for optional properties grows faster than their number: 0.2 s for 1,000, 8 s for 5,000).
MAX_SCHEMA_PROPERTIES = 1000
# A grammar's or a regex's text (llama.cpp's example grammars are under 5 KB; 2,000 alternatives,
# 27 KB, compile in 0.1 s, and 25,000 took a second).
MAX_GRAMMAR_CHARS = 32 * 1024
MAX_ERROR_CHARS = 1000  # of llguidance's error message in a 400


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
    def json_schema(cls, schema: dict[str, Any] | str | type, *, strict: bool = True,
                    where: str = "json_schema") -> Grammar:
        """Output valid against ``schema`` (a dict, its JSON text, or a pydantic model class).

        ``strict`` (OpenAI's flag): a keyword llguidance cannot enforce is an error. Without it,
        such keywords are ignored (the output is then only as valid as the model makes it).
        Strict or not, objects are closed and numbers bounded as llama.cpp's json-schema-to-grammar
        does (``_closed_objects``, ``_bounded_numbers``): instructor's and LangChain's default
        structured output send schemas without ``strict``. ``where`` names the schema in errors
        (``tools[0].function.parameters``)."""
        parse = None
        if isinstance(schema, type):
            if not hasattr(schema, "model_json_schema"):
                raise InvalidRequestError(f"json_schema must be a dict or a pydantic model class, got {schema!r}")
            parse = schema.model_validate_json  # type: ignore[attr-defined]
            schema = schema.model_json_schema()  # type: ignore[attr-defined]
        if isinstance(schema, str):
            schema = _parsed_schema(schema, where)
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"{where} must be a JSON object", param=where)
        check_schema_size(schema, where)
        # Compact JSON (no free whitespace): a small model left free to indent can loop on blank lines.
        options = {"lenient": not strict, "whitespace_flexible": False}
        schema = enforced_schema(schema)
        what = where if where == "json_schema" else f"json_schema at {where}"
        compiled = _compiled(lambda: llguidance.LLMatcher.grammar_from_json_schema(
            schema, overrides=options), what)  # type: ignore[arg-type]
        return _checked(cls("json_schema", compiled, parse), what)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's JSON mode)."""
        compiled = llguidance.LLMatcher.grammar_from_json_schema(
            {"type": "object"}, overrides={"whitespace_flexible": False})  # type: ignore[arg-type]
        return _checked(cls("json_object", compiled), "response_format")

    @classmethod
    def lark(cls, text: str, *, where: str = "grammar") -> Grammar:
        """A Lark grammar as llguidance reads it (``start:`` rule, ``%json {...}`` embeds a schema).
        Any length: the tools' grammar is one (each schema in it was checked on its own); a
        caller's grammar text comes through ``gbnf``, which caps it."""
        text = _text(text, where, capped=False)
        return _checked(cls("lark", _compiled(lambda: llguidance.LLMatcher.grammar_from_lark(text), where)), where)

    @classmethod
    def gbnf(cls, text: str, *, where: str = "grammar") -> Grammar:
        """A GBNF grammar as llama.cpp's server takes it (``root ::= ...``); Lark text is accepted too."""
        text = _text(text, where)
        return _checked(cls("gbnf", _compiled(lambda: llguidance.grammar_from("gbnf", text), where)), where)

    @classmethod
    def regex(cls, pattern: str, *, where: str = "grammar") -> Grammar:
        """Output matching the regular expression ``pattern`` (Rust ``regex`` syntax)."""
        pattern = _text(pattern, where)
        return _checked(cls("regex", _compiled(lambda: llguidance.LLMatcher.grammar_from_regex(pattern), where)), where)

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


def check_schema_size(schema: Any, where: str = "json_schema") -> None:
    """A JSON Schema within ``MAX_SCHEMA_DEPTH`` levels and ``MAX_SCHEMA_PROPERTIES`` properties,
    in valid Unicode: checked iteratively, before anything recurses over it."""
    if json_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise InvalidRequestError(f"{where} nests more than {MAX_SCHEMA_DEPTH} levels of JSON: flatten it or "
                                  "use $defs and $ref", param=where)
    check_text(schema, where)
    n = _n_properties(schema)
    if n > MAX_SCHEMA_PROPERTIES:
        raise InvalidRequestError(f"{where} has {n} object properties in all: at most {MAX_SCHEMA_PROPERTIES}",
                                  param=where)


def _n_properties(schema: Any) -> int:
    """Object properties anywhere in ``schema`` (whose depth is already bounded)."""
    if isinstance(schema, list):
        return sum(_n_properties(s) for s in schema)
    if not isinstance(schema, dict):
        return 0
    own = len(schema["properties"]) if isinstance(schema.get("properties"), dict) else 0
    return own + sum(_n_properties(v) for k, v in schema.items() if k not in ("enum", "const", "default", "examples"))


def _parsed_schema(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise InvalidRequestError(f"{where} is not valid JSON: {e}", param=where) from e


def _text(value: Any, where: str, capped: bool = True) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"{where} must be a non-empty string", param=where)
    if capped and len(value) > MAX_GRAMMAR_CHARS:
        raise InvalidRequestError(f"{where} is {len(value)} characters long: at most {MAX_GRAMMAR_CHARS}", param=where)
    check_text(value, where)
    return value


def _compiled(compile: Callable[[], str], where: str) -> str:
    """llguidance's compilers raise ValueError, or a bare Exception (its GBNF converter), or
    worse on input they cannot take: every one is the constraint's fault, a 400."""
    try:
        return compile()
    except Exception as e:  # noqa: BLE001 - see above
        raise InvalidRequestError(f"invalid {where}: {_first_line(e)}") from e


def _checked(grammar: Grammar, where: str) -> Grammar:
    """Compile without a vocabulary: syntax, unknown rules, unsupported schema keywords."""
    try:
        error = llguidance.LLMatcher.validate_grammar(grammar.compiled, None)
    except Exception as e:  # noqa: BLE001 - a grammar llguidance cannot even look at is still the caller's
        error = _first_line(e)
    if error:
        raise InvalidRequestError(f"invalid {where}: {_short(error)}")
    return grammar


def _short(text: str) -> str:
    """An error's message, cut where llguidance appends pages of parser state."""
    text = text.strip()
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " [...]"


def _first_line(error: BaseException) -> str:
    return _short(str(error) or type(error).__name__)

"""Constraints on what a request may generate: JSON Schema, JSON mode, Lark / GBNF grammars, regex.

Built on llguidance (the library llama.cpp itself uses for grammars). Two halves:

- ``Grammar`` is compiled and checked in the *caller's* thread, with no model at hand: a bad
  schema or grammar is an ``InvalidRequestError`` before anything is queued.
- ``new_matcher`` and ``fill_masks`` run on the *batcher* thread: each constrained request owns a
  matcher (its parser state), and one step's masks are computed together in llguidance's own
  thread pool, which releases the GIL. A mask is a packed bitmap, one bit per vocabulary token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from llamactor.errors import InvalidRequestError

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
        such keywords are ignored (the output is then only as valid as the model makes it)."""
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


def compile_constraint(sampling: dict[str, Any]) -> dict[str, Any]:
    """Caller's thread: the API's ``json_schema=`` (a dict, JSON text or pydantic model class) or
    ``grammar=`` (a ``Grammar`` or GBNF / Lark text) as the compiled ``grammar`` sampling field."""
    sampling = dict(sampling)
    schema, grammar = sampling.pop("json_schema", None), sampling.get("grammar")
    if schema is not None and grammar is not None:
        raise InvalidRequestError("pass json_schema= or grammar=, not both")
    if schema is not None:
        sampling["grammar"] = schema if isinstance(schema, Grammar) else Grammar.json_schema(schema)
    elif grammar is not None:
        sampling["grammar"] = Grammar.coerce(grammar)
    return sampling


# -- batcher thread ---------------------------------------------------------------------------


def new_matcher(grammar: Grammar, tokenizer: llguidance.LLTokenizer) -> llguidance.LLMatcher:
    """The parser state of one request; ``InvalidRequestError`` if the grammar does not build
    against this model's vocabulary (rare once ``Grammar`` checked it)."""
    matcher = llguidance.LLMatcher(tokenizer, grammar.compiled, log_level=0)
    if matcher.is_error():
        raise InvalidRequestError(f"invalid {grammar.kind}: {matcher.get_error()}")
    return matcher


class MaskBuilder:
    """Computes one step's masks for every constrained row at once (llguidance's thread pool).

    About 1 ms for 16 JSON-schema rows over Gemma's 262k-token vocabulary, small beside a decode
    step, so masks are computed between decodes rather than overlapping them."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._executor: llguidance.LLExecutor | None = None  # its threads start with the first constraint
        self._buffer = llg_numpy.allocate_token_bitmask(1, n_vocab)

    def for_rows(self, matchers: list[llguidance.LLMatcher | None]) -> dict[int, np.ndarray]:
        """Row -> packed int32 bitmap (bit ``t`` set: token ``t`` allowed) for the rows whose
        matcher is not None."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return {}
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        if self._buffer.shape[0] < len(rows):
            self._buffer = llg_numpy.allocate_token_bitmask(len(rows), self.n_vocab)
        constrained = [(m, j) for j, m in enumerate(m for m in matchers if m is not None)]
        llg_numpy.fill_next_token_bitmask_par(self._executor, constrained, self._buffer)
        return {i: self._buffer[j] for j, i in enumerate(rows)}


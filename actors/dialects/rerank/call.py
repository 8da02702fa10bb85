"""What a rerank or score body asks for (pure): ``RerankCall``, the arguments of one
``Client.submit_rerank`` and how its answer is shaped. Every refusal of the body itself is an
``InvalidRequestError`` (400) raised here, before the model is looked at or loaded: a missing
or empty query, no documents, a document that is neither a string nor an object with a string
``text`` (or its ``rank_fields``), more documents than the model takes (``max_rerank_documents``),
a negative ``top_n``, a ``max_tokens_per_doc`` under 1, conflicting truncation fields, a bad
priority. What only the model can tell -- a document too long with truncation off -- is the
model's 400 when it is tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llamactor.base.errors import InvalidRequestError
from llamactor.base.priority import DEFAULT_PRIORITY, parse_priority
from llamactor.base.request_checks import check_text
from llamactor.dialects.rerank.schema import Document, RerankBody, ScoreBody

DIALECT = "rerank"
Shape = Literal["rerank", "tei"]
# Fields accepted for a client's sake that change nothing here: named in the warning when given.
IGNORED = ("max_chunks_per_doc", "relevant_spans", "raw_scores", "truncation_direction", "use_activation")


@dataclass(frozen=True, slots=True)
class RerankCall:
    """One rerank: ``Client.submit_rerank(query, documents, **options())``, answered in ``shape``
    (``echoed[i]``: document ``i`` as an answer returns it: ``{"text"}``, or the object sent)."""

    query: str
    documents: tuple[str, ...]
    echoed: tuple[dict[str, Any], ...]
    top_n: int | None = None
    return_documents: bool = True
    max_tokens_per_doc: int | None = None
    truncation: bool = True
    instruction: str | None = None
    priority: int = DEFAULT_PRIORITY
    shape: Shape = "rerank"
    ignored: list[str] = field(default_factory=list)

    def options(self) -> dict[str, Any]:
        """``Client.submit_rerank``'s keyword arguments (the priority: the route's, under the tenant's ceiling)."""
        return {"top_n": self.top_n, "max_tokens_per_doc": self.max_tokens_per_doc, "truncation": self.truncation,
                "instruction": self.instruction}

    @property
    def estimate(self) -> int:
        """Characters of what the rerank computes (the query once, every document): a rate-limit guess."""
        return len(self.query) + sum(len(d) for d in self.documents)


def rerank_call(body: RerankBody, max_documents: int) -> RerankCall:
    """The rerank a body asks for; ``InvalidRequestError`` naming the field at fault."""
    if body.documents is not None and body.texts is not None:
        raise InvalidRequestError("give documents or texts (TEI's name), not both", param="documents")
    tei = body.texts is not None  # TEI's body: its answer's shape, and its return_text
    given = body.texts if tei else body.documents
    ranked, echoed = _documents(given, "texts" if tei else "documents", body.rank_fields, max_documents)
    truncation, cap = _truncation(body)
    return RerankCall(_query(body.query), ranked, echoed, top_n=_top_n(body.top_n, len(ranked)),
                      return_documents=bool(body.return_text) if tei else body.return_documents is not False,
                      max_tokens_per_doc=cap, truncation=truncation,
                      instruction=_instruction(body.instruct, body.instruction), priority=_priority(body.priority),
                      shape="tei" if tei else "rerank", ignored=_ignored(body, IGNORED))


def score_calls(body: ScoreBody, max_documents: int) -> list[RerankCall]:
    """vLLM's pairs as reranks: one query against its documents (1:1, 1:N) in one rerank, or each
    pair alone (N:N); any other pairing, or an empty side, is a 400 (as vLLM's)."""
    first, second = _score_sides(body)
    truncation, cap = _truncation(body)
    common: dict[str, Any] = {"max_tokens_per_doc": cap, "truncation": truncation,
                              "instruction": _instruction(None, body.instruction),
                              "priority": _priority(body.priority), "ignored": _ignored(body, ("use_activation",))}
    if len(first) == 1:
        documents, echoed = _documents(second, "text_2", None, max_documents)
        return [RerankCall(_query(first[0], "text_1"), documents, echoed, **common)]
    if len(first) != len(second):
        raise InvalidRequestError(f"text_1 holds {len(first)} texts and text_2 {len(second)}: input lengths must be "
                                  "either 1:1, 1:N or N:N", param="text_2")
    if len(first) > max_documents:
        raise InvalidRequestError(f"{len(first)} pairs to score, more than the {max_documents} one request may have "
                                  "(max_rerank_documents)", param="text_1")
    calls = []
    for i, (query, document) in enumerate(zip(first, second)):
        documents, echoed = _documents([document], f"text_2[{i}]", None, max_documents)
        calls.append(RerankCall(_query(query, f"text_1[{i}]"), documents, echoed, **common))
    return calls


def _score_sides(body: ScoreBody) -> tuple[list[str], list[str]]:
    pairs = [(a, b) for a, b in ((body.text_1, body.text_2), (body.data_1, body.data_2),
                                 (body.queries, body.documents)) if a is not None or b is not None]
    a, b = pairs[0] if len(pairs) == 1 else (None, None)
    if a is None or b is None:
        raise InvalidRequestError("give text_1 and text_2 (or data_1 and data_2, or queries and documents)",
                                  param="text_1")
    first, second = ([a] if isinstance(a, str) else a), ([b] if isinstance(b, str) else b)
    if not first or not second:
        raise InvalidRequestError("at least one text element must be given on each side", param="text_1")
    return first, second


def _query(query: str, name: str = "query") -> str:
    if not query.strip():
        raise InvalidRequestError(f"{name} must be a non-empty string", param=name)
    check_text(query, name)
    return query


def _documents(given: Sequence[Document] | None, name: str, rank_fields: list[str] | None,
               max_documents: int) -> tuple[tuple[str, ...], tuple[dict[str, Any], ...]]:
    """The texts ranked, and each document as answers return it."""
    if not given:
        raise InvalidRequestError(f"{name} must be a non-empty list of strings (or objects with a text)", param=name)
    if len(given) > max_documents:
        raise InvalidRequestError(f"{name} holds {len(given)} documents, more than the {max_documents} one rerank may "
                                  "have (max_rerank_documents)", param=name)
    ranked = tuple(_ranked_text(d, f"{name}[{i}]", rank_fields) for i, d in enumerate(given))
    check_text(list(ranked), name)
    return ranked, tuple({"text": d} if isinstance(d, str) else d for d in given)


def _ranked_text(document: Document, where: str, rank_fields: list[str] | None) -> str:
    """A string as it is; an object's ``text``, or its ``rank_fields`` (one: its value; several:
    ``key: value`` lines, as LangChain writes an object for Cohere)."""
    if isinstance(document, str):
        return document
    keys = rank_fields or ["text"]
    present = [k for k in keys if k in document]
    if not present:
        raise InvalidRequestError(f"{where} is an object without {' or '.join(repr(k) for k in keys)}: an object "
                                  "needs a string text (or its rank_fields)", param=where)
    for key in present:
        if not isinstance(document[key], str):
            raise InvalidRequestError(f"{where}.{key} must be a string, got {type(document[key]).__name__}",
                                      param=f"{where}.{key}")
    if len(present) == 1:
        return str(document[present[0]])
    return "\n".join(f"{k}: {document[k]}" for k in present)


def _top_n(top_n: int | None, n_documents: int) -> int | None:
    """None (every document) for null or 0, at most the documents there are; a negative one is a 400."""
    if top_n is not None and top_n < 0:
        raise InvalidRequestError(f"top_n must be a positive integer (or 0 or null: all), got {top_n}", param="top_n")
    return None if not top_n or top_n >= n_documents else top_n


def _truncation(body: RerankBody | ScoreBody) -> tuple[bool, int | None]:
    """Whether a long document is cut (``truncation``, TEI's ``truncate``; default yes, as Cohere
    does), and to how many tokens (``max_tokens_per_doc``, vLLM's ``truncate_prompt_tokens``)."""
    truncate = getattr(body, "truncate", None)
    flags = {f for f in (body.truncation, truncate) if f is not None}
    if len(flags) > 1:
        raise InvalidRequestError("truncation and truncate disagree", param="truncation")
    truncation = flags.pop() if flags else True
    cap = getattr(body, "max_tokens_per_doc", None)
    if cap is not None and cap < 1:
        raise InvalidRequestError(f"max_tokens_per_doc must be a positive integer, got {cap}",
                                  param="max_tokens_per_doc")
    if body.truncate_prompt_tokens is not None and body.truncate_prompt_tokens != -1:
        if body.truncate_prompt_tokens < 1 or not truncation:
            raise InvalidRequestError("truncate_prompt_tokens must be -1 or a positive integer, with truncation on",
                                      param="truncate_prompt_tokens")
        cap = min(cap or body.truncate_prompt_tokens, body.truncate_prompt_tokens)
    return truncation, cap


def _instruction(instruct: str | None, instruction: str | None) -> str | None:
    """SGLang's ``instruct`` or ``instruction``; blank: the model's default."""
    given = instruction if instruction is not None else instruct
    if given is None or not given.strip():
        return None
    check_text(given, "instruction")
    return given


def _priority(priority: int | str | None) -> int:
    return DEFAULT_PRIORITY if priority is None else parse_priority(priority)


def _ignored(body: RerankBody | ScoreBody, known: tuple[str, ...]) -> list[str]:
    """The fields given that change nothing: the known ones and any unknown."""
    given = [name for name in known if getattr(body, name, None) is not None]
    return given + sorted(body.model_extra or {})

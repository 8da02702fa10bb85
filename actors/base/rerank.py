"""What a rerank answers -- ``Reranking``, one ``RerankResult`` per document kept -- and the checks
of its arguments (pure: any thread, no model).

A rerank scores each document's relevance to a query as a probability in [0, 1] (how the score is
made: ``llamactor.handles.rerank``) and answers the documents by score, best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.base.request_checks import check_text


@dataclass(frozen=True, slots=True)
class RerankResult:
    index: int  # the document's place in the request's list
    relevance_score: float  # in [0, 1]
    document: str


@dataclass(frozen=True, slots=True)
class Reranking:
    """The documents kept (``top_n``), by score descending, ties by index; ``prompt_tokens``: the
    tokens the rerank computed (the shared instruction and query once, each document with the
    prompt's end)."""

    results: tuple[RerankResult, ...]
    prompt_tokens: int
    model: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "prompt_tokens": self.prompt_tokens,
                "results": [{"index": r.index, "relevance_score": r.relevance_score, "document": r.document}
                            for r in self.results]}


def ranked(documents: Sequence[str], scores: Sequence[float], top_n: int | None) -> tuple[RerankResult, ...]:
    """The documents by score descending (ties: the earlier first), the first ``top_n`` (None: all)."""
    order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
    return tuple(RerankResult(i, float(scores[i]), documents[i]) for i in order[:top_n])


@dataclass(frozen=True, slots=True)
class RerankArgs:
    """A rerank's arguments, checked (``check``); what the model alone can check -- a document's
    tokens -- is checked once it is tokenized."""

    query: str
    documents: tuple[str, ...]
    top_n: int | None
    max_tokens_per_doc: int
    truncation: bool
    instruction: str | None

    @classmethod
    def check(cls, query: Any, documents: Any, *, top_n: Any, max_tokens_per_doc: Any, truncation: Any,
              instruction: Any, max_documents: int) -> RerankArgs:
        """``InvalidRequestError`` naming the argument at fault, else the arguments."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequestError("query must be a non-empty string", param="query")
        check_text(query, "query")
        if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence) or not documents:
            raise InvalidRequestError("documents must be a non-empty list of strings", param="documents")
        if len(documents) > max_documents:
            raise InvalidRequestError(f"documents holds {len(documents)} documents, more than the {max_documents} "
                                      "one rerank may have (max_rerank_documents)", param="documents")
        for i, doc in enumerate(documents):
            if not isinstance(doc, str):
                raise InvalidRequestError(f"documents[{i}] must be a string, got {type(doc).__name__}",
                                          param=f"documents[{i}]")
        check_text(list(documents), "documents")
        if top_n is not None and (not _positive_int(top_n)):
            raise InvalidRequestError(f"top_n must be a positive integer (or None: all), got {top_n!r}", param="top_n")
        if not _positive_int(max_tokens_per_doc):
            raise InvalidRequestError(f"max_tokens_per_doc must be a positive integer, got {max_tokens_per_doc!r}",
                                      param="max_tokens_per_doc")
        if not isinstance(truncation, bool):
            raise InvalidRequestError(f"truncation must be true or false, got {truncation!r}", param="truncation")
        if instruction is not None and (not isinstance(instruction, str) or not instruction.strip()):
            raise InvalidRequestError("instruction must be a non-empty string (or None: the default)",
                                      param="instruction")
        check_text(instruction, "instruction")
        return cls(query, tuple(documents), top_n, max_tokens_per_doc, truncation, instruction)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1

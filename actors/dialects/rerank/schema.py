"""The rerank and score request bodies (pure; what they mean is ``call``).

One body takes the union every rerank client sends (README.md, *Rerank*): Jina's and
llama-server's ``{model, query, documents, top_n, return_documents}``; Cohere v1's objects with
``rank_fields`` and ``max_chunks_per_doc``; Cohere v2's ``max_tokens_per_doc``, ``priority`` and
``relevant_spans``; TEI's ``texts`` (answered as TEI's bare list) with ``truncate`` and
``return_text``; vLLM's ``truncate_prompt_tokens``; SGLang's ``instruct``. Cohere's SDK sends an
optional argument left as None as JSON null, so every optional field takes null. Unknown fields
are accepted and named in one warning (clients add their own).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

Document = str | dict[str, Any]  # a text, or an object whose ``text`` (or ``rank_fields``) is ranked


class RerankBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    query: str
    documents: list[Document] | None = None
    texts: list[str] | None = None  # TEI's name for them (its answer: a bare list of {index, score})
    top_n: StrictInt | None = None  # null, absent or 0: every document
    return_documents: StrictBool | None = None  # null or absent: true (Jina's default)
    return_text: StrictBool | None = None  # TEI's: each answer carries its text
    rank_fields: list[str] | None = None  # Cohere v1: an object's keys ranked, in order
    max_tokens_per_doc: StrictInt | None = None
    truncation: StrictBool | None = None
    truncate: StrictBool | None = None  # TEI's name for it
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)  # vLLM: -1 the model's most
    instruct: str | None = None  # SGLang's per-request judging instruction
    instruction: str | None = None
    priority: StrictInt | str | None = None
    # accepted, changing nothing: named in the ignored-fields warning when given
    max_chunks_per_doc: StrictInt | None = None
    relevant_spans: dict[str, Any] | None = None
    raw_scores: StrictBool | None = None
    truncation_direction: str | None = None
    use_activation: StrictBool | None = None


class OllamaRerankBody(RerankBody):
    """``/api/rerank``: the same body, with Ollama's ``keep_alive``."""

    keep_alive: float | str | None = None


class ScoreBody(BaseModel):
    """vLLM's ``/score``: ``text_1`` against ``text_2`` (or the newer names ``data_1`` / ``data_2``,
    ``queries`` / ``documents``): one to one, one to many, or many to many pairwise."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    truncate_prompt_tokens: StrictInt | None = Field(default=None, ge=-1)
    truncation: StrictBool | None = None
    instruction: str | None = None
    priority: StrictInt | str | None = None
    use_activation: StrictBool | None = None  # scores here are always probabilities

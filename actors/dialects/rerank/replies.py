"""The answers of a finished rerank, in each client's shape (pure).

- ``/rerank``, ``/v1/rerank``, ``/v2/rerank``: one superset body that Cohere's SDK (v1 and v2),
  Jina's clients, llama-server's and vLLM's read alike (each ignores the keys of the others):
  ``id``, ``model``, ``object: "list"``, ``results`` (best first: ``index``, ``relevance_score``,
  ``document: {text}`` unless ``return_documents`` is false), ``usage`` (Jina, vLLM,
  llama-server) and ``meta`` (Cohere: ``api_version``, ``billed_units.search_units``).
- A body with TEI's ``texts``: TEI's bare list of ``{index, score, text?}``.
- ``/score``: vLLM's ``{id, object, created, model, data: [{index, object: "score", score}], usage}``,
  in the pairs' order.
- ``/api/rerank``: the Jina shape proposed for Ollama (``model``, ``results``).

Scores are probabilities in [0, 1] whatever the model (README.md, *Rerank*).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from llamactor.dialects.context import RequestContext
from llamactor.dialects.rerank.call import RerankCall

# The paths whose clients read an error's ``detail`` (Jina's and LangChain's Jina clients raise
# ``RuntimeError(body["detail"])`` whatever the status): their error bodies carry it too.
DETAIL_PATHS = frozenset({"/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score", "/api/rerank"})


class Ranked(Protocol):
    """One document's score (``llamactor.base.rerank.RerankResult``)."""

    @property
    def index(self) -> int: ...

    @property
    def relevance_score(self) -> float: ...


class Ranking(Protocol):
    """A finished rerank (``llamactor.base.rerank.Reranking``)."""

    @property
    def results(self) -> Sequence[Ranked]: ...

    @property
    def prompt_tokens(self) -> int: ...


def reads_detail(path: str) -> bool:
    return path.rstrip("/") in DETAIL_PATHS


def rerank_reply(call: RerankCall, done: Ranking, ctx: RequestContext, api_version: str = "1") -> Any:
    """The rerank routes' body (a list for a TEI-shaped request)."""
    if call.shape == "tei":
        return [{"index": r.index, "score": r.relevance_score}
                | ({"text": call.documents[r.index]} if call.return_documents else {}) for r in done.results]
    return {"id": ctx.id("rerank-"), "model": ctx.model, "object": "list", "results": _results(call, done),
            "usage": _usage(done.prompt_tokens),
            "meta": {"api_version": {"version": api_version}, "billed_units": {"search_units": 1},
                     "tokens": {"input_tokens": done.prompt_tokens, "output_tokens": 0}}}


def score_reply(calls: Sequence[RerankCall], done: Sequence[Ranking], ctx: RequestContext) -> dict[str, Any]:
    """vLLM's ``/score`` body: one entry per pair, in the pairs' order."""
    scores = [r.relevance_score for ranking in done for r in sorted(ranking.results, key=lambda r: r.index)]
    tokens = sum(ranking.prompt_tokens for ranking in done)
    return {"id": ctx.id("score-"), "object": "list", "created": ctx.created, "model": ctx.model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": {**_usage(tokens), "completion_tokens": 0}}


def ollama_reply(call: RerankCall, done: Ranking, model: str) -> dict[str, Any]:
    """``/api/rerank``'s body (the model named as the request named it, as Ollama answers)."""
    return {"model": model, "results": _results(call, done), "prompt_eval_count": done.prompt_tokens}


def _results(call: RerankCall, done: Ranking) -> list[dict[str, Any]]:
    return [{"index": r.index, "relevance_score": r.relevance_score}
            | ({"document": call.echoed[r.index]} if call.return_documents else {}) for r in done.results]


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}

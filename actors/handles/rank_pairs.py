"""Ranking-head requests on the caller's side (caller threads): a (query, document) pair as
llama-server lays it out (``rank_pair_tokens``, from ``llamactor.base.rank_pairs``, where its rules
are), and the ``Embed`` messages with rank pooling that ``Client.submit_rank_scores`` (token ids
of whole pairs) and ``Client.submit_rank_pairs`` (texts, laid out by the batcher) send."""

from __future__ import annotations

import time
from collections.abc import Sequence

from llamactor.base.completion import Embeddings
from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import Embed, ReplyChannel
from llamactor.base.rank_pairs import PairTokenizer, RankPairs, RankScores, rank_pair_tokens
from llamactor.base.request import new_request_id
from llamactor.base.tenants import Tenant

__all__ = ["PairTokenizer", "RankPairs", "RankScores", "estimate", "pairs_message", "rank_pair_tokens",
           "scores_message", "scores_of", "token_lists"]

RANK = "rank"  # the pooling of a ranking head's scores (``llamactor.native.embedding.RANK``)


def token_lists(inputs: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """``inputs`` as tuples of ints; ``InvalidRequestError`` unless a non-empty list of non-empty
    token-id lists (what ``Client.submit_rank_scores`` takes)."""
    if isinstance(inputs, str) or not isinstance(inputs, Sequence) or not inputs:
        raise InvalidRequestError("inputs must be a non-empty list of token-id lists")
    out = []
    for i, ids in enumerate(inputs):
        if isinstance(ids, str) or not isinstance(ids, Sequence) or not ids \
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise InvalidRequestError(f"inputs[{i}] must be a non-empty list of token ids")
        out.append(tuple(ids))
    return tuple(out)


def scores_message(inputs: Sequence[Sequence[int]], tenant: Tenant, request_id: str | None) -> Embed:
    """The ``Embed`` (rank pooling) that scores ``inputs``, checked."""
    return Embed(request_id=request_id or new_request_id(), inputs=token_lists(inputs), reply=ReplyChannel(),
                 submitted_at=time.perf_counter(), pooling=RANK, normalize=False, tenant=tenant)


def pairs_message(pairs: RankPairs, tenant: Tenant, request_id: str | None) -> Embed:
    """The ``Embed`` (rank pooling) that scores ``pairs``; ``InvalidRequestError`` for an empty
    query, no documents, a document that is not a string or a bad ``max_doc_tokens``."""
    if not isinstance(pairs.query, str) or not pairs.query:
        raise InvalidRequestError("query must be a non-empty string")
    if not pairs.documents or not all(isinstance(d, str) for d in pairs.documents):
        raise InvalidRequestError("documents must be a non-empty list of strings")
    if pairs.max_doc_tokens is not None and (isinstance(pairs.max_doc_tokens, bool) or not isinstance(
            pairs.max_doc_tokens, int) or pairs.max_doc_tokens < 1):
        raise InvalidRequestError(f"max_doc_tokens must be a positive integer, got {pairs.max_doc_tokens!r}")
    return Embed(request_id=request_id or new_request_id(), inputs=(), reply=ReplyChannel(),
                 submitted_at=time.perf_counter(), pooling=RANK, normalize=False, tenant=tenant, pairs=pairs)


def estimate(msg: Embed) -> int:
    """Tokens a rank request may charge before it runs (a tenant's rate limits): ids as they are,
    text at four characters a token."""
    if msg.pairs is None:
        return sum(len(ids) for ids in msg.inputs)
    return sum((len(msg.pairs.query) + len(d)) // 4 + 2 for d in msg.pairs.documents)


def scores_of(done: Embeddings) -> RankScores:
    """A rank request's ``Embeddings`` (one column of scores) as ``RankScores``."""
    return RankScores(done.request_id, tuple(float(x) for x in done.vectors[:, 0]), done.prompt_tokens)

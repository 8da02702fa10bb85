"""Rerank on the caller's side: what ``Client.submit_rerank`` runs (its thread, then callbacks on
the threads that answer: the batcher's).

1. The judging prompt, prepared once per handle (``Judge``): its template (``rerank_prompt``; the
   built-in one rendered by a ``Tokenize`` trip through the model's chat format), its text's
   tokens and the "yes"/"no" answer tokens.
2. The query, the instruction and every document tokenized by the batcher (plain text) in one
   ``Tokenize`` message (its preparation pool, off the batcher thread), each
   document cut to ``max_tokens_per_doc`` and to what the context leaves (or refused without
   ``truncation``).
3. Scoring (``rerank_scoring.Scoring``): the documents in groups, each group ONE
   ``GenerationRequest`` whose prompt is the shared context and whose choices continue it with a
   document and the template's end, read as the answer tokens' share (``label_token_ids``:
   ``Completion.label_probs[0]`` = P(yes) / (P(yes) + P(no))). The context's KV is computed once
   and attached to every choice (the prefix cache).
4. ``Reranking``: the scores ranked, cut to ``top_n``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llamactor.base.completion import Completion, Tokenized
from llamactor.base.config import Config
from llamactor.base.errors import ContextExceededError, InvalidRequestError
from llamactor.base.logging import get_logger
from llamactor.base.messages import CallerMessage, Generate, ReplyChannel, Tokenize
from llamactor.base.rank_pairs import RankScores, capped_document
from llamactor.base.request import new_request_id
from llamactor.base.rerank import RerankArgs, Reranking, ranked
from llamactor.base.sampling import SamplingParams
from llamactor.base.tenants import Tenant
from llamactor.handles.batcher_tokens import Future, TokensKey, shielded, then, tokenized
from llamactor.handles.rerank_scoring import Labels, Scoring
from llamactor.handles.rerank_prompt import (DEFAULT_INSTRUCTION, JudgeTemplate, TextTokenizer, answer_ids,
                                             judge_messages, placeholder_template)

log = get_logger("llamactor.rerank")


class Client(Protocol):
    """What a rerank needs of its handle (``llamactor.handles.client.Client``; a loaded model's
    also has ``info``, its ``EngineInfo``)."""

    config: Config

    def send(self, msg: CallerMessage) -> Future[Any]: ...

    def send_n(self, msgs: Sequence[Generate]) -> list[Future[Completion]]: ...

    def sampling_defaults(self) -> SamplingParams: ...

    def served_name(self) -> str: ...

    def submit_rank_pairs(self, query: str, documents: Sequence[str], *, max_doc_tokens: int | None = None,
                          truncation: bool = True, template: str | None = None, tenant: str | Tenant | None = None,
                          request_id: str | None = None) -> Future[RankScores]: ...


CAP_LIMITS = "max_tokens_per_doc and the context"  # what caps a judged document's tokens


@dataclass(frozen=True, slots=True)
class Judge:
    """A handle's judging prompt, ready: the template, the answer tokens, the template's own
    texts' tokens (not asked of the batcher again)."""

    template: JudgeTemplate
    labels: Labels
    known: dict[TokensKey, list[int]]


_judges: weakref.WeakKeyDictionary[Any, Future[Judge]] = weakref.WeakKeyDictionary()
_judges_lock = threading.Lock()


def judge_of(client: Client) -> Future[Judge]:
    """The handle's ``Judge``, prepared on first use (a failed preparation is tried again next time)."""
    with _judges_lock:
        future = _judges.get(client)
        if future is None or future.cancelled() or (future.done() and future.exception() is not None):
            future = _judges[client] = _prepare_judge(client)
    return shielded(future)  # a caller that cancels its rerank leaves the judge to the others


def _prepare_judge(client: Client) -> Future[Judge]:
    info = getattr(client, "info", None)
    given = placeholder_template(client.config.rerank_template, info.rerank_template if info is not None else None)
    if given is not None:
        template: Future[JudgeTemplate] = concurrent.futures.Future()
        template.set_result(given)
    else:  # the built-in judging chat, rendered by the model's chat format (the batcher's)
        chat = Tokenize(request_id=new_request_id(), reply=ReplyChannel(), messages=judge_messages())
        rendered: Future[Tokenized] = client.send(chat)
        template = then(rendered, lambda t: JudgeTemplate.from_rendered(t.text, "the built-in judging prompt"))

    def with_tokens(t: JudgeTemplate) -> Future[Judge]:
        def build(tok: TextTokenizer) -> Labels:
            t.context(tok, "", "")
            t.suffix(tok)
            return answer_ids(tok)
        return then(tokenized(client.send, build), lambda done: Judge(t, done[0], done[1]))
    return then(template, with_tokens)


@dataclass(frozen=True, slots=True)
class RerankPrompt:
    """A rerank's tokens: the context every document shares, each document's continuation (its
    tokens, fitted, and the template's end), and the answer tokens read after it."""

    context: list[int]
    continuations: list[tuple[int, ...]]
    labels: Labels

    @property
    def n_tokens(self) -> int:
        """The tokens it computes: the context once, every continuation."""
        return len(self.context) + sum(len(c) for c in self.continuations)


def rerank_prompt(client: Client, args: RerankArgs) -> Future[RerankPrompt]:
    """The tokens ``args`` is scored on (the bench's yardstick scores the very same)."""
    instruction = args.instruction or DEFAULT_INSTRUCTION

    def tokenize(judge: Judge) -> Future[RerankPrompt]:
        if args.instruction is not None and not judge.template.takes_instruction:
            raise InvalidRequestError(f"instruction is given, but the rerank template ({judge.template.source}) "
                                      "has no {instruction} slot", param="instruction")

        def build(tok: TextTokenizer) -> tuple[list[int], list[list[int]], list[int]]:
            t = judge.template
            return t.context(tok, args.query, instruction), [t.document(tok, d) for d in args.documents], t.suffix(tok)
        return then(tokenized(client.send, build, judge.known), lambda done: fit(judge, *done[0]))

    def fit(judge: Judge, context: list[int], documents: list[list[int]], suffix: list[int]) -> RerankPrompt:
        cap = min(args.max_tokens_per_doc, _room(client, len(context) + len(suffix)))
        return RerankPrompt(context, [tuple(capped_document(d, i, cap, args.truncation, CAP_LIMITS)) + tuple(suffix)
                                      for i, d in enumerate(documents)], judge.labels)
    return then(judge_of(client), tokenize)


def submit_rerank(client: Client, args: RerankArgs, *, tenant: Tenant, request_id: str | None,
                  priority: int) -> Future[Reranking]:
    """The rerank of ``args`` (checked), answered by a future; cancelling it cancels its requests."""
    rid = request_id or new_request_id()
    started = time.perf_counter()

    def score(prompt: RerankPrompt) -> Future[Reranking]:
        scoring = Scoring(client, prompt.context, prompt.continuations, prompt.labels, tenant=tenant,
                          priority=priority, request_id=rid)

        def answer(scores: list[float]) -> Reranking:
            log.info("rerank_finished", request_id=rid, n_documents=len(scores), n_groups=scoring.n_groups,
                     prompt_tokens=prompt.n_tokens, context_tokens=len(prompt.context),
                     ms=round((time.perf_counter() - started) * 1000, 1))
            return Reranking(ranked(args.documents, scores, args.top_n), prompt.n_tokens, client.served_name())
        return then(scoring.start(), answer)
    return then(rerank_prompt(client, args), score)


def has_ranking_head(client: Client) -> bool:
    """Whether the handle's model scores pairs with a ranking head (``EngineInfo.ranking``)."""
    info = getattr(client, "info", None)
    return bool(getattr(info, "ranking", False))


def submit_ranked(client: Client, args: RerankArgs, *, tenant: Tenant, request_id: str | None) -> Future[Reranking]:
    """The rerank of ``args`` by a ranking head: each (query, document) pair laid out as
    llama-server does (the ``rerank_template`` option, else the GGUF's template, else the plain
    pair) and scored through rank pooling (``Client.submit_rank_pairs``); rate-limited there."""
    if args.instruction is not None:
        raise InvalidRequestError("instruction is for judging prompts: a ranking-head model scores the pair alone",
                                  param="instruction")
    scored = client.submit_rank_pairs(args.query, args.documents, max_doc_tokens=args.max_tokens_per_doc,
                                      truncation=args.truncation, template=client.config.rerank_template,
                                      tenant=tenant, request_id=request_id)
    return then(scored, lambda s: Reranking(ranked(args.documents, s.scores, args.top_n), s.prompt_tokens,
                                            client.served_name()))


def _room(client: Client, n_template: int) -> int:
    """The most tokens a document may have beside the context and the template's end: the
    per-sequence context less one (a prompt leaves room for the position it is read at)."""
    info = getattr(client, "info", None)
    if info is None:
        return 1 << 30
    room = info.n_ctx_seq - 1 - n_template
    if room < 1:
        raise ContextExceededError(f"the judging prompt and the query take {n_template} tokens, leaving no room for a "
                                   f"document in the per-sequence context of {info.n_ctx_seq} tokens",
                                   n_prompt_tokens=n_template, n_ctx=info.n_ctx_seq)
    return room

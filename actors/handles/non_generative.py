"""``NonGenerativeVerbs``: the request verbs that answer something other than generated text.

Rerank (a judging prompt's P("yes"), or a ranking head), embeddings, ranking-head scores of
(query, document) pairs, and tokenization: each builds its message on the caller's thread (or
event loop) and hands it to ``Delivery.send``; ``Client`` adds the generation verbs on top.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from llamactor.base.completion import Embeddings, Tokenized
from llamactor.base.embedding_request import EmbedInputs, EmbeddingRequest
from llamactor.base.messages import Embed, ReplyChannel
from llamactor.base.priority import DEFAULT_PRIORITY, parse_priority
from llamactor.base.rank_pairs import RankPairs, RankScores
from llamactor.base.request import new_request_id
from llamactor.base.rerank import RerankArgs, Reranking
from llamactor.base.tenants import Tenant, tenant_named
from llamactor.handles import rank_pairs, rerank
from llamactor.handles.batcher_tokens import then
from llamactor.handles.delivery import Delivery, Future, alone
from llamactor.handles.limits import embedding_estimate, rerank_estimate
from llamactor.handles.tokenize_call import TokenizerPrompt, tokenize_message


class NonGenerativeVerbs(Delivery):
    """Rerank, embed, rank and tokenize (caller threads)."""

    # -- rerank ------------------------------------------------------------------------------
    # Each document's relevance to ``query`` as P("yes") / (P("yes") + P("no")) after a judging
    # prompt (``llamactor.handles.rerank``): the documents of one call share the prompt and the
    # query as one prefix, computed once. ``top_n``: keep the best n (None: all);
    # ``max_tokens_per_doc``: a document's tokens (None: ``Config.rerank_max_tokens_per_doc``), a
    # longer one cut (``truncation``) or refused; ``instruction``: the task the judge is told.

    def submit_rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
                      max_tokens_per_doc: int | None = None, truncation: bool = True, instruction: str | None = None,
                      tenant: str | Tenant | None = None, request_id: str | None = None,
                      priority: Any = DEFAULT_PRIORITY) -> Future[Reranking]:
        args = RerankArgs.check(query, documents, top_n=top_n, truncation=truncation, instruction=instruction,
                                max_tokens_per_doc=self.config.rerank_max_tokens_per_doc if max_tokens_per_doc is None
                                else max_tokens_per_doc, max_documents=self.config.max_rerank_documents)
        who = tenant_named(tenant, self.config.tenants)
        if rerank.has_ranking_head(self):
            return rerank.submit_ranked(self, args, tenant=who, request_id=request_id)
        level = who.priority(parse_priority(priority))
        return self._limited(who, rerank_estimate(args), lambda: [rerank.submit_rerank(
            self, args, tenant=who, request_id=request_id, priority=level)])[0]

    def rerank(self, query: str, documents: Sequence[str], *, timeout: float | None = None,
               **options: Any) -> Reranking:
        """``Reranking``: the documents by relevance, best first, each with its score in [0, 1]."""
        return self._wait(self.submit_rerank(query, documents, **options), timeout)

    async def rerank_async(self, query: str, documents: Sequence[str], **options: Any) -> Reranking:
        return await self._await(self.submit_rerank(query, documents, **options))

    # -- embeddings --------------------------------------------------------------------------
    # ``inputs``: a string, a list of strings, a list of token ids, or a list of such lists (or an
    # ``EmbeddingRequest``). ``pooling``: "mean" | "cls" | "last" (default: the GGUF's pooling
    # type, else mean); ``normalize``: L2 (default True); ``dimensions``: keep the first
    # components, then renormalize; ``truncate``: cut inputs longer than one embedding step.

    def submit_embed(self, inputs: EmbedInputs | EmbeddingRequest, **options: Any) -> Future[Embeddings]:
        """Queue ``inputs`` for embedding; they are packed with other callers' inputs by tokens."""
        if isinstance(inputs, EmbeddingRequest):
            alone(None, options)
            r = inputs
        else:
            tenant = tenant_named(options.pop("tenant", None), self.config.tenants)
            r = EmbeddingRequest.build(inputs, tenant=tenant, **options)
        msg = Embed(request_id=r.request_id or new_request_id(), inputs=r.inputs, reply=ReplyChannel(),
                    submitted_at=time.perf_counter(), pooling=r.pooling, normalize=r.normalize,
                    dimensions=r.dimensions, truncate=r.truncate, tenant=r.tenant)
        return self._traced([msg], self._limited(r.tenant, embedding_estimate(r), lambda: [self.send(msg)]))[0]

    def embed(self, inputs: EmbedInputs | EmbeddingRequest, *, timeout: float | None = None,
              **options: Any) -> Embeddings:
        """One vector per input (``Embeddings``: iterable, ``.vectors`` a float32 array)."""
        return self._wait(self.submit_embed(inputs, **options), timeout)

    async def embed_async(self, inputs: EmbedInputs | EmbeddingRequest, **options: Any) -> Embeddings:
        return await self._await(self.submit_embed(inputs, **options))

    # -- ranking-head scores -----------------------------------------------------------------
    # A ranking-head GGUF (``EngineInfo.ranking``) scores each whole (query, document) input
    # through llama.cpp's rank pooling, in the embedding queue: packed by tokens, rate-limited as
    # embeddings; an input longer than one embedding step (or an encoder's training context) is
    # refused, nothing queued. ``InvalidRequestError`` from a model without a ranking head.

    def submit_rank_scores(self, inputs: Sequence[Sequence[int]], *, tenant: str | Tenant | None = None,
                           request_id: str | None = None) -> Future[list[float]]:
        """One relevance in [0, 1] per input (token ids of a whole pair: ``rank_pair_tokens``)."""
        msg = rank_pairs.scores_message(inputs, tenant_named(tenant, self.config.tenants), request_id)
        sent = self._traced([msg], self._limited(msg.tenant, rank_pairs.estimate(msg), lambda: [self.send(msg)]))
        return then(sent[0], lambda done: list(rank_pairs.scores_of(done).scores))

    def submit_rank_pairs(self, query: str, documents: Sequence[str], *, max_doc_tokens: int | None = None,
                          truncation: bool = True, template: str | None = None, tenant: str | Tenant | None = None,
                          request_id: str | None = None) -> Future[RankScores]:
        """``query`` against each document, each pair laid out where the vocabulary is, as
        llama-server does (``llamactor.base.rank_pairs``; ``template`` None: the GGUF's)."""
        pairs = RankPairs(query, tuple(documents), max_doc_tokens, truncation, template)
        msg = rank_pairs.pairs_message(pairs, tenant_named(tenant, self.config.tenants), request_id)
        sent = self._traced([msg], self._limited(msg.tenant, rank_pairs.estimate(msg), lambda: [self.send(msg)]))
        return then(sent[0], rank_pairs.scores_of)

    # -- what the model sees ------------------------------------------------------------------
    # ``prompt``: text, token ids, strings and token ids mixed, or chat messages (rendered by the
    # model's chat format, with ``tools``): see ``tokenize_message``. Answered by the batcher.

    def submit_tokenize(self, prompt: TokenizerPrompt, *, add_special: bool = True, with_pieces: bool = False,
                        tools: Any = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                        request_id: str | None = None) -> Future[Tokenized]:
        return self.send(tokenize_message(prompt, add_special=add_special, with_pieces=with_pieces, tools=tools,
                                          chat_template_kwargs=chat_template_kwargs, request_id=request_id))

    def tokenize(self, prompt: TokenizerPrompt, *, timeout: float | None = None,
                 **options: Any) -> Tokenized:
        """``Tokenized``: token ids, text (a chat as rendered), pieces (``with_pieces=True``)."""
        return self._wait(self.submit_tokenize(prompt, **options), timeout)

    async def tokenize_async(self, prompt: TokenizerPrompt, **options: Any) -> Tokenized:
        return await self._await(self.submit_tokenize(prompt, **options))

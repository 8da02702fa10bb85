"""``Client``: the request API every llamactor handle offers (``LLM``, ``Replicas``).

Every method runs on the caller's thread (or event loop) and only builds messages; where a
message goes is the subclass's ``send``: one actor tree (``LLM``), a replica chosen by policy
(``Replicas``), or a Ray Serve deployment (``llamactor.rayserve``). Nothing here touches llama.cpp.

The core verbs take a typed ``GenerationRequest`` (``request()`` builds one from loose arguments,
against this model's defaults) and answer one result per choice: ``submit(request)`` futures,
``stream(request)`` / ``stream_async(request)`` streams. Every other method -- ``ask``, ``chat``,
``submit_n``, the ``*_async`` forms, scoring -- is sugar over them: a request with ``n`` choices
goes out through ``send_n`` as ``n`` messages together, so they reach one tree and share the
prompt's KV (choice ``i`` seeded ``seed + i``, its id ``<request_id>-<i>``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

from llamactor.base.tool_format import FALLBACK, ToolCallFormat
from llamactor.base.completion import Completion, Embeddings, Score, Tokenized
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import CallerMessage, Embed, Generate, ReplyChannel
from llamactor.base.priority import DEFAULT_PRIORITY, parse_priority
from llamactor.base.rank_pairs import RankPairs, RankScores
from llamactor.base.embedding_request import EmbedInputs, EmbeddingRequest
from llamactor.base.request import GenerationRequest, Messages, Prompt, choice_request_id, new_request_id
from llamactor.base.rerank import RerankArgs, Reranking
from llamactor.base.tenants import Tenant, tenant_named
from llamactor.base.trace_spans import SERVICE_NAME
from llamactor.handles import rank_pairs, rerank, tracing
from llamactor.handles.batcher_tokens import then
from llamactor.handles.limits import (Limiter, WaitForLimits, embedding_estimate, generation_estimate,
                                      rerank_estimate)
from llamactor.handles.streams import AsyncTextStream, TextStream
from llamactor.handles.tokenize_call import TokenizerPrompt, tokenize_message

T = TypeVar("T")  # what a future resolves to: a Completion or Embeddings
Future = concurrent.futures.Future


class Client:
    """The request API. Subclasses set ``config`` (the model's defaults) and implement ``send``
    and ``cancel``; ``send_n`` when the ``n`` choices of one prompt need to stay together."""

    config: Config
    rate_wait: WaitForLimits | None = None  # how a request over its tenant's rate limits waits; None: refused

    @functools.cached_property
    def limiter(self) -> Limiter | None:
        """The rate limits of ``config.tenants``, enforced on this handle's submissions."""
        return Limiter.for_tenants(self.config.tenants)

    def send(self, msg: CallerMessage) -> Future[Any]:
        """Deliver ``msg``; its answer goes to ``msg.reply``, whose future this returns."""
        raise NotImplementedError

    def send_n(self, msgs: Sequence[Generate]) -> list[Future[Completion]]:
        """Deliver the ``n`` choices of one prompt, in order."""
        return [self.send(m) for m in msgs]

    def cancel(self, request_id: str) -> None:
        """End ``request_id`` now; its caller gets ``CancelledError`` holding the partial completion."""
        raise NotImplementedError

    # -- the core verbs ---------------------------------------------------------------------
    # Sampling options (``max_tokens``, ``temperature``, ``stop`` ...; see ``SamplingParams``),
    # ``priority`` ("high", "normal" (default), "low" or an int, lower first; a waiting request
    # gains ``Config.priority_aging_per_s`` levels per second), ``tenant`` (whose request: its
    # cache scope and fair share, ``Config.tenants``), ``json_schema=`` (dict or pydantic
    # model class: ``Completion.parsed``) or ``grammar=`` (GBNF / Lark text, or ``Grammar.regex``
    # ...), ``tools`` / ``tool_choice``, ``logit_bias={id: bias}``, ``lora={adapter: scale}`` (the
    # LoRA adapters of ``Config.loras`` to run under): see ``GenerationRequest.build``.

    def request(self, prompt: Prompt | None = None, *, messages: Messages | None = None,
                tenant: str | Tenant | None = None, **options: Any) -> GenerationRequest:
        """A request for this model (its defaults under ``options``), checked now: raw ``prompt``
        (text or token ids) or chat ``messages``, ``n`` choices (default 1) and the options above;
        ``tenant``: whose (a name in ``Config.tenants`` gets its weight, limits and cache scope;
        any other name the defaults; None: the default tenant)."""
        options.setdefault("adapters", self.config.lora_names)  # lora= names are checked now
        if options.get("tools") is not None:  # calls written in the model's own format
            options.setdefault("tool_format", self.tool_format())
        return GenerationRequest.build(self.sampling_defaults(), prompt=prompt, messages=messages,
                                       tenant=tenant_named(tenant, self.config.tenants), **options)

    def sampling_defaults(self) -> SamplingParams:
        """What a request's unset sampling fields get: the operator's (``config.sampling``); a
        handle on a loaded model layers the GGUF's own under them (``model_sampling``)."""
        return self.config.sampling

    def tool_format(self) -> ToolCallFormat:
        """How this model writes a tool call (its ``EngineInfo.tool_format``); the Hermes
        fallback where the handle knows no model."""
        return FALLBACK

    @overload
    def submit(self, prompt: GenerationRequest) -> list[Future[Completion]]: ...
    @overload
    def submit(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> Future[Completion]: ...

    def submit(self, prompt: GenerationRequest | Prompt, *, request_id: str | None = None,
               **sampling: Any) -> list[Future[Completion]] | Future[Completion]:
        """A request: one future per choice. A prompt (text or token ids) and options: its one
        completion's future, returned at once."""
        if isinstance(prompt, GenerationRequest):
            _alone(request_id, sampling)
            return self._send(prompt, prompt.request_id or new_request_id(), [ReplyChannel() for _ in range(prompt.n)])
        return self.submit(self.request(prompt, request_id=request_id, **sampling))[0]

    @overload
    def stream(self, prompt: GenerationRequest) -> list[TextStream]: ...
    @overload
    def stream(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> TextStream: ...

    def stream(self, prompt: GenerationRequest | Prompt, *, request_id: str | None = None,
               **sampling: Any) -> list[TextStream] | TextStream:
        """Text pieces as they are decoded (one stream per choice of a request); ``.completion``
        afterwards, ``.cancel()`` any time."""
        if not isinstance(prompt, GenerationRequest):
            return self.stream(self.request(prompt, request_id=request_id, **sampling))[0]
        _alone(request_id, sampling)
        rid = prompt.request_id or new_request_id()
        streams = [TextStream(choice_request_id(rid, i, prompt.n), self.cancel) for i in range(prompt.n)]
        for stream, future in zip(streams, self._send(prompt, rid, [ReplyChannel(on_piece=s.push) for s in streams])):
            stream.attach(future)
        return streams

    @overload
    def stream_async(self, prompt: GenerationRequest) -> list[AsyncTextStream]: ...
    @overload
    def stream_async(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> AsyncTextStream: ...

    def stream_async(self, prompt: GenerationRequest | Prompt, *, request_id: str | None = None,
                     **sampling: Any) -> list[AsyncTextStream] | AsyncTextStream:
        """As ``stream``, for the running event loop: ``async for piece in stream``, and
        ``await stream.queued()`` to learn that the batcher accepted the request (or why not)."""
        if not isinstance(prompt, GenerationRequest):
            return self.stream_async(self.request(prompt, request_id=request_id, **sampling))[0]
        _alone(request_id, sampling)
        rid, loop = prompt.request_id or new_request_id(), asyncio.get_running_loop()
        streams = [AsyncTextStream(choice_request_id(rid, i, prompt.n), self.cancel, loop) for i in range(prompt.n)]
        replies = [ReplyChannel(on_piece=s.push) for s in streams]
        for stream, future, reply in zip(streams, self._send(prompt, rid, replies), replies, strict=True):
            stream.attach(future, reply.queued)
        return streams

    # -- sugar over the core verbs ---------------------------------------------------------

    def submit_chat(self, messages: Messages, *, request_id: str | None = None, **sampling: Any) -> Future[Completion]:
        """Queue a chat completion: ``messages`` rendered with the model's chat template."""
        return self.submit(self.request(messages=messages, request_id=request_id, **sampling))[0]

    def submit_n(self, prompt: Prompt, n: int, *, request_id: str | None = None,
                 **sampling: Any) -> list[Future[Completion]]:
        """``n`` completions of one prompt, whose KV is computed once and shared by all ``n``.

        With a ``seed``, choice ``i`` uses ``seed + i``; request ids are ``<request_id>-<i>``."""
        return self.submit(self.request(prompt, n=n, request_id=request_id, **sampling))

    def submit_chat_n(self, messages: Messages, n: int, *, request_id: str | None = None,
                      **sampling: Any) -> list[Future[Completion]]:
        return self.submit(self.request(messages=messages, n=n, request_id=request_id, **sampling))

    @overload
    def ask(self, prompt: Prompt, *, n: None = None, timeout: float | None = None, **sampling: Any) -> Completion: ...
    @overload
    def ask(self, prompt: Prompt, *, n: int, timeout: float | None = None, **sampling: Any) -> list[Completion]: ...

    def ask(self, prompt: Prompt, *, n: int | None = None, timeout: float | None = None,
            **sampling: Any) -> Completion | list[Completion]:
        """One completion; with ``n``, a list of ``n`` (the prompt computed once)."""
        futures = self.submit(self.request(prompt, n=1 if n is None else n, **sampling))
        return self._wait(futures[0], timeout) if n is None else [self._wait(f, timeout) for f in futures]

    @overload
    def chat(self, messages: Messages, *, n: None = None, timeout: float | None = None,
             **sampling: Any) -> Completion: ...
    @overload
    def chat(self, messages: Messages, *, n: int, timeout: float | None = None,
             **sampling: Any) -> list[Completion]: ...

    def chat(self, messages: Messages, *, n: int | None = None, timeout: float | None = None,
             **sampling: Any) -> Completion | list[Completion]:
        futures = self.submit(self.request(messages=messages, n=1 if n is None else n, **sampling))
        return self._wait(futures[0], timeout) if n is None else [self._wait(f, timeout) for f in futures]

    def stream_chat(self, messages: Messages, *, request_id: str | None = None, **sampling: Any) -> TextStream:
        return self.stream(self.request(messages=messages, request_id=request_id, **sampling))[0]

    async def ask_async(self, prompt: Prompt, **sampling: Any) -> Completion:
        return await self._await(self.submit(prompt, **sampling))

    async def chat_async(self, messages: Messages, **sampling: Any) -> Completion:
        return await self._await(self.submit_chat(messages, **sampling))

    async def ask_n_async(self, prompt: Prompt, n: int, **sampling: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_n(prompt, n, **sampling))))

    async def chat_n_async(self, messages: Messages, n: int, **sampling: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_chat_n(messages, n, **sampling))))

    def stream_chat_async(self, messages: Messages, *, request_id: str | None = None,
                          **sampling: Any) -> AsyncTextStream:
        return self.stream_async(self.request(messages=messages, request_id=request_id, **sampling))[0]

    def stream_n_async(self, prompt: Prompt, n: int, *, request_id: str | None = None,
                       **sampling: Any) -> list[AsyncTextStream]:
        """``n`` streamed choices of one prompt (as ``submit_n``: computed once, seeds ``seed + i``)."""
        return self.stream_async(self.request(prompt, n=n, request_id=request_id, **sampling))

    def stream_chat_n_async(self, messages: Messages, n: int, *, request_id: str | None = None,
                            **sampling: Any) -> list[AsyncTextStream]:
        return self.stream_async(self.request(messages=messages, n=n, request_id=request_id, **sampling))

    # -- scoring ----------------------------------------------------------------------------
    # How likely each continuation is after ``context`` (lm-evaluation-harness's loglikelihood):
    # context and continuations are text (tokenized apart, the continuation without BOS, joined as
    # ids) or token ids. The continuations go out together, so the context's KV is computed once;
    # only the continuation tokens' logits rows are computed. Any ``ask`` can also report its
    # prompt's logprobs: ``prompt_logprobs=k`` (or ``echo=True`` with ``logprobs=k``).

    def submit_score(self, context: Prompt, continuations: Sequence[Prompt], *, request_id: str | None = None,
                     priority: Any = DEFAULT_PRIORITY) -> list[Future[Score]]:
        if isinstance(continuations, str) or not isinstance(continuations, Sequence) or not continuations:
            raise InvalidRequestError("continuations must be a non-empty list of strings or token-id lists")
        # (an empty text context scores from BOS alone: the batcher decides what is empty, once tokenized)
        request = self.request(context, n=len(continuations), continuations=continuations, request_id=request_id,
                               priority=priority, max_tokens=0, temperature=0.0, prompt_logprobs=1)
        return [then(f, Score.of) for f in self.submit(request)]

    def score(self, context: Prompt, continuations: Sequence[Prompt], *, timeout: float | None = None,
              **options: Any) -> list[Score]:
        """One ``Score`` per continuation, in order: summed logprob and whether greedy would write it."""
        return [self._wait(f, timeout) for f in self.submit_score(context, continuations, **options)]

    async def score_async(self, context: Prompt, continuations: Sequence[Prompt], **options: Any) -> list[Score]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_score(context, continuations, **options))))

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
            _alone(None, options)
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

    # -- internals (caller's thread) --------------------------------------------------------

    def _send(self, request: GenerationRequest, request_id: str, replies: list[ReplyChannel]) -> list[Future[Completion]]:
        """The one path of every generation: the request's ``n`` messages, sent together.

        Submitted together, the batcher admits them together: the first computes the prompt, the
        others wait one step and attach its KV (see Scheduler). A tenant over its rate limit is
        refused here (``RateLimitError``), before anything is queued."""
        msgs: list[Generate] = []

        def send() -> list[Future[Completion]]:
            msgs.extend(request.generate_messages(request_id, replies, time.perf_counter()))
            return self.send_n(msgs)

        return self._traced(msgs, self._limited(request.tenant, generation_estimate(request), send))

    def _traced(self, msgs: Sequence[Generate | Embed], futures: list[Future[T]]) -> list[Future[T]]:
        """``futures``, each recording its request's span when done if tracing is on
        (``llamactor.handles.tracing``; its parent: the caller's current OpenTelemetry context)."""
        if (tracer := tracing.active()) is not None:
            tracer.watch(msgs, futures, self.served_name())
        return futures

    def served_name(self) -> str:
        """The model's name as served (a ``ModelClient``'s), else its file's stem: its spans' model."""
        name = getattr(self, "name", None)
        return name if isinstance(name, str) else Path(self.config.model or SERVICE_NAME).name.removesuffix(".gguf")

    def _limited(self, tenant: Tenant, tokens: int, send: Callable[[], list[Future[T]]]) -> list[Future[T]]:
        """``send()``, within the tenant's rate limits if any tenant has some (``Limiter.submit``)."""
        limiter = self.limiter
        return send() if limiter is None else limiter.submit(tenant, tokens, send, self.rate_wait).sent

    def _wait(self, future: Future[T], timeout: float | None) -> T:
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    async def _await(self, future: Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise


def _alone(request_id: str | None, options: Mapping[str, Any]) -> None:
    """A typed request carries everything: refuse options given beside it."""
    if request_id is not None or options:
        raise TypeError("a request object carries its own options and id: pass it alone "
                        f"(got {', '.join(sorted([*options, *(['request_id'] if request_id else [])]))})")

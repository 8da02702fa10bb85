"""``Client``: the request API every llamactor handle offers (``LLM``, ``Replicas``).

Every method runs on the caller's thread (or event loop) and only builds messages; where a
message goes is the subclass's ``send`` (``Delivery``): one actor tree (``LLM``), a replica chosen
by policy (``Replicas``), or a Ray Serve deployment (``llamactor.rayserve``). Nothing here touches
llama.cpp. The verbs that answer no generated text (rerank, embeddings, ranking-head scores,
tokenize) are ``NonGenerativeVerbs``'.

The core verbs take a typed ``GenerationRequest`` (``request()`` builds one from loose arguments,
against this model's defaults) and answer one result per choice: ``submit(request)`` futures,
``stream(request)`` / ``stream_async(request)`` streams. Every other method -- ``ask``, ``chat``,
``submit_n``, the ``*_async`` forms, scoring -- is sugar over them: a request with ``n`` choices
goes out through ``send_n`` as ``n`` messages together, so they reach one tree and share the
prompt's KV (choice ``i`` seeded ``seed + i``, its id ``<request_id>-<i>``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, overload

from llamactor.base.completion import Completion, Score
from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import Generate, ReplyChannel
from llamactor.base.priority import DEFAULT_PRIORITY
from llamactor.base.request import GenerationRequest, Messages, Prompt, choice_request_id, new_request_id
from llamactor.base.tenants import Tenant, tenant_named
from llamactor.handles.batcher_tokens import then
from llamactor.handles.delivery import Future, alone
from llamactor.handles.limits import generation_estimate
from llamactor.handles.non_generative import NonGenerativeVerbs
from llamactor.handles.streams import AsyncTextStream, TextStream

__all__ = ["Client", "Future"]


class Client(NonGenerativeVerbs):
    """The request API. Subclasses set ``config`` (the model's defaults) and implement ``send``
    and ``cancel``; ``send_n`` when the ``n`` choices of one prompt need to stay together."""

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

    @overload
    def submit(self, prompt: GenerationRequest) -> list[Future[Completion]]: ...
    @overload
    def submit(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> Future[Completion]: ...

    def submit(self, prompt: GenerationRequest | Prompt, *, request_id: str | None = None,
               **sampling: Any) -> list[Future[Completion]] | Future[Completion]:
        """A request: one future per choice. A prompt (text or token ids) and options: its one
        completion's future, returned at once."""
        if isinstance(prompt, GenerationRequest):
            alone(request_id, sampling)
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
        alone(request_id, sampling)
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
        alone(request_id, sampling)
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

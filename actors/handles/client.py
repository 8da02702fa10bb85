"""``Client``: the request API every llamactor handle offers (``LLM``, ``Replicas``).

Every method runs on the caller's thread (or event loop) and only builds messages; where a
message goes is the subclass's ``send``: one actor tree (``LLM``), a replica chosen by policy
(``Replicas``), or a Ray Serve deployment (``llamactor.rayserve``). Nothing here touches llama.cpp.

Every request, single or ``n`` choices, streamed or not, is built by ``_choices``: choice ``i``
of ``n`` is seeded ``seed + i`` and has the request id ``<request_id>-<i>`` (the id itself when
``n`` is 1), and the ``n`` messages go out together through ``send_n``, so they reach one tree
and share the prompt's KV.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, overload

from llamactor.base.completion import Completion, Embeddings, Score, Tokenized
from llamactor.base.config import Config
from llamactor.base.errors import InvalidRequestError
from llamactor.base.grammar import compile_constraint
from llamactor.base.messages import Embed, Generate, ReplyChannel, Request, Tokenize
from llamactor.base.priority import DEFAULT_PRIORITY, parse_priority
from llamactor.handles.request_fields import (
    EmbedInputs,
    Messages,
    Prompt,
    check_n,
    choice_request_id,
    continuation_field,
    echo_options,
    embed_inputs,
    mapped_future,
    messages_tuple,
    new_request_id,
    prompt_fields,
)
from llamactor.handles.streams import AsyncTextStream, TextStream
from llamactor.base.tools import pop_tools

T = TypeVar("T")  # what a future resolves to: a Completion or Embeddings


class Client:
    """The request API. Subclasses set ``config`` (the model's defaults) and implement ``send``
    and ``cancel``; ``send_n`` when the ``n`` choices of one prompt need to stay together."""

    config: Config

    def send(self, msg: Request) -> concurrent.futures.Future[Any]:
        """Deliver ``msg``; its answer goes to ``msg.reply``, whose future this returns."""
        raise NotImplementedError

    def send_n(self, msgs: Sequence[Generate]) -> list[concurrent.futures.Future[Completion]]:
        """Deliver the ``n`` choices of one prompt, in order."""
        return [self.send(m) for m in msgs]

    def cancel(self, request_id: str) -> None:
        """End ``request_id`` now; its caller gets ``CancelledError`` holding the partial completion."""
        raise NotImplementedError

    # -- submitting -------------------------------------------------------------------------
    # Every method takes sampling options (``max_tokens``, ``temperature``, ``stop`` ...; see
    # ``SamplingParams``) and ``priority``: "high", "normal" (default), "low" or an int, lower
    # first; a waiting request gains 0.1 level per second (``Config.priority_aging_per_s``).
    # Structured output: ``json_schema=`` (dict or pydantic model class: ``Completion.parsed``)
    # or ``grammar=`` (GBNF / Lark text, or ``Grammar.regex(...)`` ...); ``logit_bias={id: bias}``.

    def submit(self, prompt: Prompt, *, request_id: str | None = None,
               **sampling: Any) -> concurrent.futures.Future[Completion]:
        """Queue a raw completion of ``prompt`` (text or token ids); returns its future at once."""
        return self._choices(prompt_fields(prompt), 1, request_id, sampling)[0]

    def submit_chat(self, messages: Messages, *, request_id: str | None = None,
                    **sampling: Any) -> concurrent.futures.Future[Completion]:
        """Queue a chat completion: ``messages`` rendered with the model's chat template."""
        return self._choices({"messages": messages_tuple(messages)}, 1, request_id, sampling)[0]

    def submit_n(self, prompt: Prompt, n: int, *, request_id: str | None = None,
                 **sampling: Any) -> list[concurrent.futures.Future[Completion]]:
        """``n`` completions of one prompt, whose KV is computed once and shared by all ``n``.

        With a ``seed``, choice ``i`` uses ``seed + i``; request ids are ``<request_id>-<i>``."""
        return self._choices(prompt_fields(prompt), n, request_id, sampling)

    def submit_chat_n(self, messages: Messages, n: int, *, request_id: str | None = None,
                      **sampling: Any) -> list[concurrent.futures.Future[Completion]]:
        return self._choices({"messages": messages_tuple(messages)}, n, request_id, sampling)

    @overload
    def ask(self, prompt: Prompt, *, n: None = None, timeout: float | None = None, **sampling: Any) -> Completion: ...
    @overload
    def ask(self, prompt: Prompt, *, n: int, timeout: float | None = None, **sampling: Any) -> list[Completion]: ...

    def ask(self, prompt: Prompt, *, n: int | None = None, timeout: float | None = None,
            **sampling: Any) -> Completion | list[Completion]:
        """One completion; with ``n``, a list of ``n`` (the prompt computed once)."""
        if n is None:
            return self._wait(self.submit(prompt, **sampling), timeout)
        return [self._wait(f, timeout) for f in self.submit_n(prompt, n, **sampling)]

    @overload
    def chat(self, messages: Messages, *, n: None = None, timeout: float | None = None,
             **sampling: Any) -> Completion: ...
    @overload
    def chat(self, messages: Messages, *, n: int, timeout: float | None = None,
             **sampling: Any) -> list[Completion]: ...

    def chat(self, messages: Messages, *, n: int | None = None, timeout: float | None = None,
             **sampling: Any) -> Completion | list[Completion]:
        if n is None:
            return self._wait(self.submit_chat(messages, **sampling), timeout)
        return [self._wait(f, timeout) for f in self.submit_chat_n(messages, n, **sampling)]

    def stream(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> TextStream:
        """Text pieces as they are decoded; ``.completion`` afterwards, ``.cancel()`` any time."""
        return self._stream(prompt_fields(prompt), request_id, sampling)

    def stream_chat(self, messages: Messages, *, request_id: str | None = None, **sampling: Any) -> TextStream:
        return self._stream({"messages": messages_tuple(messages)}, request_id, sampling)

    async def ask_async(self, prompt: Prompt, **sampling: Any) -> Completion:
        return await self._await(self.submit(prompt, **sampling))

    async def chat_async(self, messages: Messages, **sampling: Any) -> Completion:
        return await self._await(self.submit_chat(messages, **sampling))

    async def ask_n_async(self, prompt: Prompt, n: int, **sampling: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_n(prompt, n, **sampling))))

    async def chat_n_async(self, messages: Messages, n: int, **sampling: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_chat_n(messages, n, **sampling))))

    def stream_async(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> AsyncTextStream:
        return self._streams_async(prompt_fields(prompt), 1, request_id, sampling)[0]

    def stream_chat_async(self, messages: Messages, *, request_id: str | None = None,
                          **sampling: Any) -> AsyncTextStream:
        return self._streams_async({"messages": messages_tuple(messages)}, 1, request_id, sampling)[0]

    def stream_n_async(self, prompt: Prompt, n: int, *, request_id: str | None = None,
                       **sampling: Any) -> list[AsyncTextStream]:
        """``n`` streamed choices of one prompt (as ``submit_n``: computed once, seeds ``seed + i``)."""
        return self._streams_async(prompt_fields(prompt), n, request_id, sampling)

    def stream_chat_n_async(self, messages: Messages, n: int, *, request_id: str | None = None,
                            **sampling: Any) -> list[AsyncTextStream]:
        return self._streams_async({"messages": messages_tuple(messages)}, n, request_id, sampling)

    # -- scoring ----------------------------------------------------------------------------
    # How likely each continuation is after ``context`` (lm-evaluation-harness's loglikelihood):
    # context and continuations are text (tokenized apart, the continuation without BOS, joined as
    # ids) or token ids. The continuations go out together, so the context's KV is computed once;
    # only the continuation tokens' logits rows are computed. Any ``ask`` can also report its
    # prompt's logprobs: ``prompt_logprobs=k`` (or ``echo=True`` with ``logprobs=k``).

    def submit_score(self, context: Prompt, continuations: Sequence[Prompt], *, request_id: str | None = None,
                     priority: Any = DEFAULT_PRIORITY) -> list[concurrent.futures.Future[Score]]:
        if isinstance(continuations, str) or not isinstance(continuations, Sequence) or not continuations:
            raise InvalidRequestError("continuations must be a non-empty list of strings or token-id lists")
        variants = [{"continuation": continuation_field(c)} for c in continuations]
        prompt = {"text": context} if isinstance(context, str) else prompt_fields(context)
        futures = self._choices(prompt, len(variants), request_id, {"max_tokens": 0, "temperature": 0.0,
                                                                    "prompt_logprobs": 1, "priority": priority},
                                variants=variants)
        return [mapped_future(f, Score.of) for f in futures]

    def score(self, context: Prompt, continuations: Sequence[Prompt], *, timeout: float | None = None,
              **options: Any) -> list[Score]:
        """One ``Score`` per continuation, in order: summed logprob and whether greedy would write it."""
        return [self._wait(f, timeout) for f in self.submit_score(context, continuations, **options)]

    async def score_async(self, context: Prompt, continuations: Sequence[Prompt], **options: Any) -> list[Score]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_score(context, continuations, **options))))

    # -- embeddings --------------------------------------------------------------------------
    # ``inputs``: a string, a list of strings, a list of token ids, or a list of such lists.
    # ``pooling``: "mean" | "cls" | "last" (default: the GGUF's pooling type, else mean);
    # ``normalize``: L2 (default True); ``dimensions``: keep the first components, then renormalize.

    def submit_embed(self, inputs: EmbedInputs, *, request_id: str | None = None, pooling: str | None = None,
                     normalize: bool = True, dimensions: int | None = None) -> concurrent.futures.Future[Embeddings]:
        """Queue ``inputs`` for embedding; they are packed with other callers' inputs by tokens."""
        reply = ReplyChannel()
        msg = Embed(request_id=request_id or new_request_id(), inputs=embed_inputs(inputs), reply=reply,
                    submitted_at=time.perf_counter(), pooling=pooling, normalize=normalize, dimensions=dimensions)
        return self.send(msg)

    def embed(self, inputs: EmbedInputs, *, timeout: float | None = None, **options: Any) -> Embeddings:
        """One vector per input (``Embeddings``: iterable, ``.vectors`` a float32 array)."""
        return self._wait(self.submit_embed(inputs, **options), timeout)

    async def embed_async(self, inputs: EmbedInputs, **options: Any) -> Embeddings:
        return await self._await(self.submit_embed(inputs, **options))

    # -- what the model sees ------------------------------------------------------------------
    # ``prompt``: text (tokenized), token ids (decoded), or chat messages (rendered by the model's
    # chat format, with ``tools``, then tokenized). Answered by the batcher, like a request.

    def submit_tokenize(self, prompt: Prompt | Messages, *, add_special: bool = True, with_pieces: bool = False,
                        tools: Any = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                        request_id: str | None = None) -> concurrent.futures.Future[Tokenized]:
        if isinstance(prompt, str):
            fields: dict[str, Any] = {"text": prompt}
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
            fields = {"token_ids": tuple(prompt)}  # type: ignore[arg-type]
        else:
            fields = {"messages": messages_tuple(prompt)}  # type: ignore[arg-type]
            fields["tools"] = pop_tools({"tools": tools}, chat=True) if tools else None
            fields["chat_template_kwargs"] = dict(chat_template_kwargs) if chat_template_kwargs else None
        return self.send(Tokenize(request_id=request_id or new_request_id(), reply=ReplyChannel(),
                                  add_special=add_special, with_pieces=with_pieces, **fields))

    def tokenize(self, prompt: Prompt | Messages, *, timeout: float | None = None, **options: Any) -> Tokenized:
        """``Tokenized``: token ids, text (a chat as rendered), pieces (``with_pieces=True``)."""
        return self._wait(self.submit_tokenize(prompt, **options), timeout)

    async def tokenize_async(self, prompt: Prompt | Messages, **options: Any) -> Tokenized:
        return await self._await(self.submit_tokenize(prompt, **options))

    # -- internals (caller's thread) --------------------------------------------------------

    def _choices(self, prompt: dict[str, Any], n: int, request_id: str | None, sampling: dict[str, Any],
                 replies: Sequence[ReplyChannel] | None = None,
                 variants: Sequence[dict[str, Any]] | None = None) -> list[concurrent.futures.Future[Completion]]:
        """The one path of every generation request: ``n`` messages of one prompt, sent together
        (``variants``: per-message fields, a scored continuation each).

        Submitted together, the batcher admits them together: the first computes the prompt, the
        others wait one step and attach its KV (see Scheduler)."""
        check_n(n)
        rid = request_id or new_request_id()
        sampling = echo_options(dict(sampling))
        sampling = compile_constraint(sampling)  # once for all n choices
        tools = pop_tools(sampling, chat="messages" in prompt)
        template_kwargs = sampling.pop("chat_template_kwargs", None)
        if template_kwargs is not None and (not isinstance(template_kwargs, Mapping) or "messages" not in prompt):
            raise InvalidRequestError("chat_template_kwargs must be a mapping of template variables, for a chat")
        priority = parse_priority(sampling.pop("priority", DEFAULT_PRIORITY))
        seed = sampling.pop("seed", None)
        params = self.config.sampling.replace(**sampling)
        now = time.perf_counter()
        msgs = [Generate(request_id=choice_request_id(rid, i, n), reply=reply, submitted_at=now, priority=priority,
                         tools=tools, params=params.replace(seed=seed + i) if seed is not None else params,
                         chat_template_kwargs=dict(template_kwargs) if template_kwargs else None, **prompt,
                         **(variants[i] if variants else {}))
                for i, reply in enumerate(replies or [ReplyChannel() for _ in range(n)])]
        return self.send_n(msgs)

    def _wait(self, future: concurrent.futures.Future[T], timeout: float | None) -> T:
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    async def _await(self, future: concurrent.futures.Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def _stream(self, prompt: dict[str, Any], request_id: str | None, sampling: dict[str, Any]) -> TextStream:
        stream = TextStream(request_id or new_request_id(), self.cancel)
        stream.attach(self._choices(prompt, 1, stream.request_id, sampling, [ReplyChannel(on_piece=stream.push)])[0])
        return stream

    def _streams_async(self, prompt: dict[str, Any], n: int, request_id: str | None,
                       sampling: dict[str, Any]) -> list[AsyncTextStream]:
        check_n(n)
        rid, loop = request_id or new_request_id(), asyncio.get_running_loop()
        streams = [AsyncTextStream(choice_request_id(rid, i, n), self.cancel, loop) for i in range(n)]
        replies = [ReplyChannel(on_piece=s.push) for s in streams]
        futures = self._choices(prompt, n, rid, sampling, replies)
        for stream, future, reply in zip(streams, futures, replies, strict=True):
            stream.attach(future, reply.queued)
        return streams

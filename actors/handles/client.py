"""``Client``: the request API every llamactor handle offers (``LLM``, ``Replicas``).

Every method runs on the caller's thread (or event loop) and only builds a message; where the
message goes is the subclass's ``_send``: one actor tree (``LLM``), a replica chosen by policy
(``Replicas``), or a Ray Serve deployment (``llamactor.ray``). Nothing here touches llama.cpp.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, overload

from llamactor.completion import Completion, Embeddings
from llamactor.config import Config
from llamactor.errors import InvalidRequestError
from llamactor.grammar import compile_constraint
from llamactor.messages import Embed, Generate, ReplyChannel
from llamactor.policy import DEFAULT_PRIORITY, parse_priority
from llamactor.streams import AsyncTextStream, TextStream
from llamactor.tools import pop_tools

MAX_CHOICES = 64  # choices of one prompt per call (n, best_of)
Prompt = str | Sequence[int]
Messages = Sequence[Mapping[str, Any]]
EmbedInputs = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


class Client:
    """The request API. Subclasses set ``config`` (the model's defaults) and implement ``_send``
    (deliver a message whose answer goes to ``reply``) and ``cancel``."""

    config: Config

    def _send(self, msg: Generate | Embed, reply: ReplyChannel) -> concurrent.futures.Future[Any]:
        raise NotImplementedError

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
        return self._submit(_prompt_fields(prompt), request_id, sampling, ReplyChannel())

    def submit_chat(self, messages: Messages, *, request_id: str | None = None,
                    **sampling: Any) -> concurrent.futures.Future[Completion]:
        """Queue a chat completion: ``messages`` rendered with the model's chat template."""
        return self._submit({"messages": _messages_tuple(messages)}, request_id, sampling, ReplyChannel())

    def submit_n(self, prompt: Prompt, n: int, *, request_id: str | None = None,
                 **sampling: Any) -> list[concurrent.futures.Future[Completion]]:
        """``n`` completions of one prompt, whose KV is computed once and shared by all ``n``.

        With a ``seed``, choice ``i`` uses ``seed + i``; request ids are ``<request_id>-<i>``."""
        return self._submit_n(_prompt_fields(prompt), n, request_id, sampling)

    def submit_chat_n(self, messages: Messages, n: int, *, request_id: str | None = None,
                      **sampling: Any) -> list[concurrent.futures.Future[Completion]]:
        return self._submit_n({"messages": _messages_tuple(messages)}, n, request_id, sampling)

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
        return self._stream(_prompt_fields(prompt), request_id, sampling)

    def stream_chat(self, messages: Messages, *, request_id: str | None = None, **sampling: Any) -> TextStream:
        return self._stream({"messages": _messages_tuple(messages)}, request_id, sampling)

    async def ask_async(self, prompt: Prompt, **sampling: Any) -> Completion:
        return await self._await(self.submit(prompt, **sampling))

    async def chat_async(self, messages: Messages, **sampling: Any) -> Completion:
        return await self._await(self.submit_chat(messages, **sampling))

    async def ask_n_async(self, prompt: Prompt, n: int, **sampling: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_n(prompt, n, **sampling))))

    async def chat_n_async(self, messages: Messages, n: int, **sampling: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self._await(f) for f in self.submit_chat_n(messages, n, **sampling))))

    def stream_async(self, prompt: Prompt, *, request_id: str | None = None, **sampling: Any) -> AsyncTextStream:
        return self._stream_async(_prompt_fields(prompt), request_id, sampling)

    def stream_chat_async(self, messages: Messages, *, request_id: str | None = None,
                          **sampling: Any) -> AsyncTextStream:
        return self._stream_async({"messages": _messages_tuple(messages)}, request_id, sampling)

    # -- embeddings --------------------------------------------------------------------------
    # ``inputs``: a string, a list of strings, a list of token ids, or a list of such lists.
    # ``pooling``: "mean" | "cls" | "last" (default: the GGUF's pooling type, else mean);
    # ``normalize``: L2 (default True); ``dimensions``: keep the first components, then renormalize.

    def submit_embed(self, inputs: EmbedInputs, *, request_id: str | None = None, pooling: str | None = None,
                     normalize: bool = True, dimensions: int | None = None) -> concurrent.futures.Future[Embeddings]:
        """Queue ``inputs`` for embedding; they are packed with other callers' inputs by tokens."""
        reply = ReplyChannel()
        msg = Embed(request_id=request_id or new_request_id(), inputs=_embed_inputs(inputs), reply=reply,
                    submitted_at=time.perf_counter(), pooling=pooling, normalize=normalize, dimensions=dimensions)
        return self._send(msg, reply)

    def embed(self, inputs: EmbedInputs, *, timeout: float | None = None, **options: Any) -> Embeddings:
        """One vector per input (``Embeddings``: iterable, ``.vectors`` a float32 array)."""
        return self._wait(self.submit_embed(inputs, **options), timeout)  # type: ignore[arg-type]

    async def embed_async(self, inputs: EmbedInputs, **options: Any) -> Embeddings:
        return await self._await(self.submit_embed(inputs, **options))  # type: ignore[arg-type]

    # -- internals (caller's thread) --------------------------------------------------------

    def _submit(self, prompt: dict[str, Any], request_id: str | None, sampling: dict[str, Any],
                reply: ReplyChannel) -> concurrent.futures.Future[Completion]:
        sampling = compile_constraint(sampling)
        tools = pop_tools(sampling, chat="messages" in prompt)
        priority = parse_priority(sampling.pop("priority", DEFAULT_PRIORITY))
        params = self.config.sampling.replace(**sampling)
        rid = request_id or new_request_id()
        msg = Generate(request_id=rid, params=params, reply=reply, submitted_at=time.perf_counter(),
                       priority=priority, tools=tools, **prompt)
        return self._send(msg, reply)

    def _submit_n(self, prompt: dict[str, Any], n: int, request_id: str | None,
                  sampling: dict[str, Any]) -> list[concurrent.futures.Future[Completion]]:
        if not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
            raise InvalidRequestError(f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}")
        rid = request_id or new_request_id()
        sampling = compile_constraint(sampling)  # once for all n choices
        seed = sampling.get("seed")
        # Submitted together, so the batcher admits them together: the first computes the
        # prompt, the others wait one step and attach its KV (see Scheduler).
        return [self._submit(prompt, f"{rid}-{i}", {**sampling, **({"seed": seed + i} if seed is not None else {})},
                             ReplyChannel()) for i in range(n)]

    def _wait(self, future: concurrent.futures.Future[Completion], timeout: float | None) -> Completion:
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    async def _await(self, future: concurrent.futures.Future[Completion]) -> Completion:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def _stream(self, prompt: dict[str, Any], request_id: str | None, sampling: dict[str, Any]) -> TextStream:
        stream = TextStream(request_id or new_request_id(), self.cancel)
        stream.attach(self._submit(prompt, stream.request_id, sampling, ReplyChannel(on_piece=stream.push)))
        return stream

    def _stream_async(self, prompt: dict[str, Any], request_id: str | None,
                      sampling: dict[str, Any]) -> AsyncTextStream:
        stream = AsyncTextStream(request_id or new_request_id(), self.cancel, asyncio.get_running_loop())
        reply = ReplyChannel(on_piece=stream.push)
        stream.attach(self._submit(prompt, stream.request_id, sampling, reply), reply.queued)
        return stream



def _embed_inputs(inputs: EmbedInputs) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(inputs, str):
        return (inputs,)
    if isinstance(inputs, Sequence) and inputs and all(isinstance(t, int) for t in inputs):
        return (tuple(inputs),)  # type: ignore[arg-type]
    if not isinstance(inputs, Sequence) or not inputs:
        raise InvalidRequestError("embed takes a string, a list of strings, token ids, or lists of token ids")
    # anything else (a number, a dict) is refused by Embed with a clear message
    return tuple(x if isinstance(x, str) else tuple(x) if isinstance(x, Sequence) else x  # type: ignore[misc, arg-type]
                 for x in inputs)


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def _prompt_fields(prompt: Prompt) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"text": prompt}
    if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        return {"token_ids": tuple(prompt)}
    raise InvalidRequestError("prompt must be a string or a sequence of token ids")


def _messages_tuple(messages: Messages) -> tuple[dict[str, Any], ...]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list of {'role': ..., 'content': ...} dicts")
    return tuple(dict(m) if isinstance(m, Mapping) else m for m in messages)

"""The request fields the ``Client`` API builds from its arguments, checked on the caller's thread
(prompts, messages, embedding inputs, scored continuations, ``echo``), request ids, and futures
mapped to another result type. Pure: no actor is involved."""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from llamactor.base.completion import Completion
from llamactor.base.errors import InvalidRequestError

MAX_CHOICES = 64  # choices of one prompt per call (the API's n; HTTP caps n and best_of at 16)
Prompt = str | Sequence[int]
Messages = Sequence[Mapping[str, Any]]
EmbedInputs = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


def echo_options(sampling: dict[str, Any]) -> dict[str, Any]:
    """``echo=True`` (OpenAI's legacy name) with ``logprobs``: the prompt's logprobs too, with as
    many alternatives per token as the generated tokens get."""
    if not sampling.pop("echo", False):
        return sampling
    logprobs = sampling.get("logprobs")
    if not logprobs and not sampling.get("top_logprobs"):
        raise InvalidRequestError("echo=True reports the prompt's log-probabilities: pass logprobs=k as well")
    n_top = logprobs if isinstance(logprobs, int) and not isinstance(logprobs, bool) else 0
    sampling.setdefault("prompt_logprobs", max(n_top, sampling.get("top_logprobs") or 0))
    return sampling


def continuation_field(c: Prompt) -> str | tuple[int, ...]:
    if isinstance(c, str):
        if not c:
            raise InvalidRequestError("a continuation must not be empty")
        return c
    return prompt_fields(c)["token_ids"]  # type: ignore[no-any-return]


def mapped_future(future: concurrent.futures.Future[Completion], fn: Any) -> concurrent.futures.Future[Any]:
    """A future of ``fn(result)``; cancelling it cancels ``future`` (and so the request)."""
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(f: concurrent.futures.Future[Completion]) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
        elif (e := f.exception()) is not None:
            out.set_exception(e)
        else:
            out.set_result(fn(f.result()))
    out.add_done_callback(lambda o: future.cancel() if o.cancelled() else None)
    future.add_done_callback(done)
    return out


def embed_inputs(inputs: EmbedInputs) -> tuple[str | tuple[int, ...], ...]:
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


def check_n(n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise InvalidRequestError(f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}")


def choice_request_id(request_id: str, index: int, n: int) -> str:
    """The id of choice ``index`` of ``n``: the request's own id when ``n`` is 1."""
    return request_id if n == 1 else f"{request_id}-{index}"


def prompt_fields(prompt: Prompt) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"text": prompt}
    if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        if not prompt:
            raise InvalidRequestError("prompt must not be empty")
        return {"token_ids": tuple(prompt)}
    raise InvalidRequestError("prompt must be a string or a sequence of token ids")


def messages_tuple(messages: Messages) -> tuple[dict[str, Any], ...]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError("messages must be a list of {'role': ..., 'content': ...} dicts")
    return tuple(dict(m) if isinstance(m, Mapping) else m for m in messages)

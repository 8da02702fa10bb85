"""The OpenAI bodies of finished chat and completion requests, shared by the routes
(``openai_routes``) and batch jobs (``llamactor.jobs.endpoints``): one place decides what a choice
holds, so a batch line answers exactly as the endpoint would. Pure translation."""

from __future__ import annotations

import time
from typing import Any

from openai.types import Completion as OACompletion
from openai.types.chat import ChatCompletion

from llamactor.base.completion import Completion
from llamactor.http.openai_schema import (
    FINISH_REASON,
    CompletionRequest,
    best_of,
    chat_logprobs,
    chat_message,
    completion_logprobs,
)
from llamactor.http.prompt_logprobs import echo_logprobs, echo_text, vllm_prompt_logprobs
from llamactor.http.sse import usage


def envelope(rid: str, kind: str, model: str) -> dict[str, Any]:
    """The fields every OpenAI completion object and chunk starts with."""
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model}


def prompt_id(rid: str, index: int, n_prompts: int) -> str:
    """The llamactor request id of one prompt of a batch: the HTTP id itself, or ``-p<index>``."""
    return rid if n_prompts == 1 else f"{rid}-p{index}"


def completion_choice(index: int, c: Completion, prompt: str | list[int], body: CompletionRequest) -> dict[str, Any]:
    """One ``/v1/completions`` choice; with ``echo`` its text and logprobs start with the prompt's
    (a token-id ``prompt`` echoes as its scored pieces)."""
    echoed = echo_text(c, prompt) if body.echo else ""
    choice: dict[str, Any] = {"index": index, "text": echoed + c.text, "finish_reason": FINISH_REASON[c.finish_reason]}
    if body.logprobs is not None:
        choice["logprobs"] = (echo_logprobs(c, body.logprobs) if body.echo
                              else completion_logprobs(c.logprobs, body.logprobs))
    if body.prompt_logprobs is not None:
        choice["prompt_logprobs"] = vllm_prompt_logprobs(c)
    return choice


def completion_body(rid: str, model: str, body: CompletionRequest, prompts: list[str | list[int]],
                    generated: list[Completion]) -> dict[str, Any]:
    """The body of ``generated`` (``body.n_generated`` per prompt, in order): the ``n`` best of
    each prompt's with ``best_of``, numbered ``prompt * n + choice`` as OpenAI does. ``prompts``:
    what each choice echoes (token-id prompts already as text unless their prompt was scored)."""
    n, n_gen = body.n, body.n_generated
    done = [c for p in range(len(prompts)) for c in (
        best_of(generated[p * n_gen:(p + 1) * n_gen], n) if n_gen > n else generated[p * n_gen:(p + 1) * n_gen])]
    choices = [completion_choice(i, c, prompts[i // n], body) for i, c in enumerate(done)]
    # The openai package types token_logprobs as floats, but with echo the API's first one is
    # null (its client parses that leniently): validate the rest, then put the echo logprobs back.
    lifted = [choice.pop("logprobs", None) if body.echo else None for choice in choices]
    out = OACompletion.model_validate({**envelope(rid, "text_completion", model), "choices": choices,
                                       "usage": usage(generated)}).model_dump(exclude_none=True)
    for choice, logprobs in zip(out["choices"], lifted):
        if logprobs is not None:
            choice["logprobs"] = logprobs
    return out


def chat_body(rid: str, model: str, done: list[Completion]) -> dict[str, Any]:
    return ChatCompletion.model_validate({
        **envelope(rid, "chat.completion", model),
        "choices": [{"index": i, "message": chat_message(c), "finish_reason": FINISH_REASON[c.finish_reason],
                     "logprobs": chat_logprobs(c.logprobs)} for i, c in enumerate(done)],
        "usage": usage(done)}).model_dump(exclude_none=True)

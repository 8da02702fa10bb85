"""The OpenAI bodies of finished chat and completion requests (pure), for the routes and batch
lines alike: one place decides what a choice holds, so a batch line answers exactly as the
endpoint would. Bodies are validated by the ``openai`` package's own types, so what we send is
what its client parses.
"""

from __future__ import annotations

from typing import Any

from openai.types import Completion as OACompletion
from openai.types.chat import ChatCompletion

from llamactor.base.completion import Completion
from llamactor.dialects.openai.logprobs import chat_logprobs, completion_logprobs, echo_logprobs, vllm_prompt_logprobs
from llamactor.dialects.openai.call import ChatCall, CompletionsCall

FINISH_REASON = {"stop": "stop", "length": "length", "cancelled": "stop", "context_full": "length",
                 "tool_calls": "tool_calls"}


def envelope(rid: str, kind: str, model: str, created: int) -> dict[str, Any]:
    """The fields every OpenAI completion object and chunk starts with."""
    return {"id": rid, "object": kind, "created": created, "model": model}


def usage(done: list[Completion]) -> dict[str, Any]:
    """OpenAI's usage object for the choices of one prompt: its tokens count once, and the cached
    ones are those no choice had to compute (``n`` choices share the prompt's KV); the drafted
    tokens (a prediction's, n-gram lookup's) every choice's steps accepted and rejected, as OpenAI's
    Predicted Outputs report them (0 and 0 without drafts)."""
    prompt, completion = done[0].usage.prompt_tokens, sum(c.usage.completion_tokens for c in done)
    cached = min(c.usage.cached_tokens for c in done)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {
                "accepted_prediction_tokens": sum(c.usage.accepted_prediction_tokens for c in done),
                "rejected_prediction_tokens": sum(c.usage.rejected_prediction_tokens for c in done)}}


def chat_message(c: Completion) -> dict[str, Any]:
    """A chat choice's ``message``: its text, or its tool calls and whatever text surrounds them; a
    reasoning model's ``<think>`` block as ``reasoning_content`` (llama-server's and vLLM's field)."""
    answer = c.split
    message: dict[str, Any] = {"role": "assistant", "content": answer.content or None if answer.calls else answer.content}
    if answer.reasoning is not None:
        message["reasoning_content"] = answer.reasoning
    if answer.calls:
        message["tool_calls"] = [t.to_openai() for t in answer.calls]
    return message


def chat_reply(call: ChatCall, done: list[Completion]) -> dict[str, Any]:
    return ChatCompletion.model_validate({
        **envelope(call.id, "chat.completion", call.model, call.created),
        "choices": [{"index": i, "message": chat_message(c), "finish_reason": FINISH_REASON[c.finish_reason],
                     "logprobs": chat_logprobs(c.logprobs)} for i, c in enumerate(done)],
        "usage": usage(done)}).model_dump(exclude_none=True)


def best_of(done: list[Completion], n: int) -> list[Completion]:
    """The ``n`` choices with the highest mean token log-probability, in their original order."""
    def mean_logprob(c: Completion) -> float:
        return sum(t.logprob for t in c.logprobs) / len(c.logprobs) if c.logprobs else float("-inf")
    ranked = sorted(range(len(done)), key=lambda i: mean_logprob(done[i]), reverse=True)[:n]
    return [done[i] for i in sorted(ranked)]


def echo_text(c: Completion, prompt: str | list[int]) -> str:
    """The prompt as an echoed choice starts with it: a text prompt as sent, token ids as the text
    the answer brought back (its scored pieces, when the prompt was scored)."""
    if isinstance(prompt, str):
        return prompt
    return c.prompt_text if c.prompt_text is not None else "".join(c.prompt_pieces or ())


def completion_choice(index: int, c: Completion, prompt: str | list[int], call: CompletionsCall) -> dict[str, Any]:
    """One ``/v1/completions`` choice; with ``echo`` its text and logprobs start with the prompt's."""
    echoed = echo_text(c, prompt) if call.echo else ""
    choice: dict[str, Any] = {"index": index, "text": echoed + c.text, "finish_reason": FINISH_REASON[c.finish_reason]}
    if call.logprobs is not None:
        choice["logprobs"] = (echo_logprobs(c, call.logprobs) if call.echo
                              else completion_logprobs(c.logprobs, call.logprobs))
    if call.prompt_logprobs is not None:
        choice["prompt_logprobs"] = vllm_prompt_logprobs(c)
    return choice


def completion_reply(call: CompletionsCall, generated: list[Completion]) -> dict[str, Any]:
    """The body of ``generated`` (``n_generated`` per prompt, in order): the ``n`` best of each
    prompt's with ``best_of``, numbered ``prompt * n + choice`` as OpenAI does."""
    n, n_gen = call.n, call.n_generated
    done = [c for p in range(len(call.prompts)) for c in (
        best_of(generated[p * n_gen:(p + 1) * n_gen], n) if n_gen > n else generated[p * n_gen:(p + 1) * n_gen])]
    choices = [completion_choice(i, c, call.prompts[i // n], call) for i, c in enumerate(done)]
    # The openai package types token_logprobs as floats, but with echo the API's first one is
    # null (its client parses that leniently): validate the rest, then put the echo logprobs back.
    lifted = [choice.pop("logprobs", None) if call.echo else None for choice in choices]
    out = OACompletion.model_validate({**envelope(call.id, "text_completion", call.model, call.created),
                                       "choices": choices, "usage": usage(generated)}).model_dump(exclude_none=True)
    for choice, logprobs in zip(out["choices"], lifted):
        if logprobs is not None:
            choice["logprobs"] = logprobs
    return out


def model_object(name: str, loaded: bool, router_fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``/v1/models`` entry (``loaded``: llama-server's extra; ``router_fields``: what its router
    mode adds, ``status`` {``value``: loaded / loading / unloaded}, ``path``, ``size``)."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "llamactor", "loaded": loaded,
            **(router_fields or {})}


def adapter_object(name: str, parent: str, path: str) -> dict[str, Any]:
    """A LoRA adapter's ``/v1/models`` entry, as vLLM lists one: its model is ``parent``."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "llamactor", "parent": parent, "root": path}


def adapter_entry(i: int, name: str, path: str) -> dict[str, Any]:
    """A ``/lora-adapters`` entry, llama-server's shape (and the name): off unless asked for."""
    return {"id": i, "name": name, "path": path, "scale": 0.0}

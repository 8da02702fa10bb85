"""Log-probabilities in OpenAI's shapes (chat and legacy completions) and vLLM's (pure).

A chat choice's ``logprobs.content`` and a legacy choice's ``tokens`` / ``token_logprobs`` /
``top_logprobs`` / ``text_offset`` cover the generated tokens (a streamed chunk: the tokens its
text completes). Prompt log-probabilities:

``echo: true`` with ``logprobs: k`` makes OpenAI's legacy ``logprobs`` object cover the prompt and
the completion: ``tokens``, ``token_logprobs`` (the first prompt token's is null: nothing comes
before it), ``top_logprobs`` (null there too) and ``text_offset`` (each token's offset in the
choice's ``text``, which then starts with the prompt). That is what lm-evaluation-harness's
``local-completions`` reads for log-likelihoods. vLLM's ``prompt_logprobs: k`` is a separate list
per choice: null, then per prompt token ``{token id: {logprob, rank, decoded_token}}`` for the
token itself and its ``k`` most likely alternatives.
"""

from __future__ import annotations

from typing import Any

from llamactor.base.completion import Completion, TokenLogprob


def chat_logprobs(logprobs: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """A chat choice's (or streamed delta's) ``logprobs`` object, as OpenAI shapes it."""
    if logprobs is None:
        return None

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {"content": [{**entry(t.token, t.logprob), "top_logprobs": [entry(a, v) for a, v in t.top]}
                        for t in logprobs]}


def completion_logprobs(logprobs: tuple[TokenLogprob, ...] | None, n_top: int, offset: int = 0) -> dict[str, Any] | None:
    """A legacy completion choice's (or streamed chunk's) ``logprobs`` object: tokens,
    token_logprobs, top_logprobs, and text offsets counted from ``offset``."""
    if logprobs is None:
        return None
    offsets, at = [], offset
    for t in logprobs:
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in logprobs], "token_logprobs": [t.logprob for t in logprobs],
            "top_logprobs": [dict(t.top) for t in logprobs] if n_top else None, "text_offset": offsets}


def echo_logprobs(c: Completion, n_top: int) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs`` object over the prompt tokens, then the generated ones."""
    pieces = c.prompt_pieces or ()
    entries: list[TokenLogprob | None] = list(c.prompt_logprobs or (None,) * len(pieces))
    tokens = list(pieces) + [t.token for t in c.logprobs or ()]
    entries += list(c.logprobs or ())
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens,
            "token_logprobs": [None if e is None else e.logprob for e in entries],
            "top_logprobs": [None if e is None else dict(e.top) for e in entries] if n_top else None,
            "text_offset": offsets}


def vllm_prompt_logprobs(c: Completion) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token (null where not computed) its own entry and its
    alternatives', keyed by token id."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for e in c.prompt_logprobs or ():
        if e is None:
            out.append(None)
            continue
        entry = {str(e.token_id): {"logprob": e.logprob, "rank": e.rank, "decoded_token": e.token}}
        for rank, (token_id, (text, logprob)) in enumerate(zip(e.top_ids, e.top), start=1):
            entry.setdefault(str(token_id), {"logprob": logprob, "rank": rank, "decoded_token": text})
        out.append(entry)
    return out

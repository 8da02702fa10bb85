"""How a request ends: its ``Completion`` built and handed to the caller's future (batcher thread).

``finish_request`` resolves or fails the caller's future with what the request became -- its text,
token ids, usage (drafted tokens included), timings, logprobs, the parsed object of a pydantic
schema, a chat's answer split into text and tool calls, and what the front end asked back (the
stop string, the echoed prompt, the clamped ``max_tokens``) -- and logs ``request_finished``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from llamactor.base.answer import AnswerSplitter
from llamactor.base.completion import Completion, Timings, TokenLogprob, Usage
from llamactor.base.errors import CancelledError, LlamactorError
from llamactor.base.logging import get_logger
from llamactor.native.tokenizer import Tokenizer
from llamactor.scheduling.sequence import Sequence
from llamactor.tree.request_state import RequestState

log = get_logger("llamactor.batcher")


def _ms(start: float, end: float | None) -> float:
    return round(((end if end is not None else start) - start) * 1000, 3)


def _with_parsed(completion: Completion, parse: Any) -> Completion:
    """The pydantic model's object from the finished text (OpenAI's ``parsed``)."""
    if completion.finish_reason != "stop":
        return dataclasses.replace(completion, parse_error=f"output cut short ({completion.finish_reason})")
    try:
        return dataclasses.replace(completion, parsed=parse(completion.text))
    except Exception as e:  # noqa: BLE001 - a user's validator may raise anything; the text stays available
        return dataclasses.replace(completion, parse_error=str(e))


def _with_answer(completion: Completion, splitter: AnswerSplitter, reason: str) -> Completion:
    """The answer as its splitter split it: with calls (only an answer that ended on its own has
    them), the text around them, the whole text as ``raw_text`` and finish_reason "tool_calls"."""
    whole = splitter.whole(completion.text, calls_count=reason == "stop")
    completion = dataclasses.replace(completion, answer=whole.answer, last_parts=whole.last)
    if not whole.calls:
        return completion
    return dataclasses.replace(completion, text=whole.text, raw_text=whole.raw_text, tool_calls=whole.calls,
                               finish_reason="tool_calls")


def _prompt_logprobs(seq: Sequence, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """A scored prompt's ``prompt_token_ids`` and ``prompt_logprobs`` (None where not computed)."""
    if seq.scoring is None or tokenizer is None:
        return {}
    text = tokenizer.token_text
    entries = [None if e is None else TokenLogprob(text(t), e.logprob, tuple(zip(map(text, e.top_ids), e.top_logprobs)),
                                                   token_id=t, top_ids=e.top_ids, rank=e.rank)
               for t, e in zip(seq.token_ids, seq.scoring.entries)]
    return {"prompt_token_ids": tuple(seq.token_ids[:seq.n_prompt]), "prompt_logprobs": tuple(entries),
            "prompt_pieces": tuple(text(t) for t in seq.token_ids[:seq.n_prompt])}


def _asked_back(seq: Sequence, state: RequestState | None, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """What the answer tells its front end without a second trip: the stop string that ended it,
    the prompt as text (``echo_prompt``), the room ``max_tokens`` was cut to (``clamp_max_tokens``)."""
    req, out = seq.request, dict[str, Any]()
    if state is not None:
        out["stop_sequence"] = state.text.stop_sequence
        if state.params.max_tokens != req.params.max_tokens:
            out["clamped_max_tokens"] = state.params.max_tokens
    if req.echo_prompt and tokenizer is not None:
        out["prompt_text"] = tokenizer.detokenize(seq.token_ids[:seq.n_prompt])
    return out


def finish_request(seq: Sequence, reason: str, error: LlamactorError | None = None,
                   tokenizer: Tokenizer | None = None) -> Completion:
    """Resolve the caller's future with the completion (or fail it with ``error``), log it."""
    now = time.perf_counter()
    state: RequestState | None = seq.state
    req = seq.request
    if error is None and state is not None:
        error = state.error
    text = ""
    if state is not None:
        tail = state.text.finish()
        if reason != "cancelled":
            state.send(req.reply, tail, last=True)
        text = state.text.text
    n_gen = seq.n_generated
    decode_s = now - seq.first_token_at if seq.first_token_at is not None else 0.0
    completion = Completion(
        request_id=req.request_id, text=text, token_ids=tuple(seq.token_ids[seq.n_prompt:]),
        finish_reason=reason,  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=seq.n_prompt, completion_tokens=n_gen, cached_tokens=seq.n_cached,
                    accepted_prediction_tokens=state.n_draft_accepted if state is not None else 0,
                    rejected_prediction_tokens=state.n_draft_rejected if state is not None else 0),
        timings=Timings(queue_ms=_ms(req.submitted_at, seq.admitted_at), ttft_ms=_ms(req.submitted_at, seq.first_token_at),
                        total_ms=_ms(req.submitted_at, now),
                        decode_tokens_per_s=round((n_gen - 1) / decode_s, 2) if n_gen > 1 and decode_s > 0 else 0.0),
        logprobs=tuple(state.logprobs) if state is not None and state.logprobs is not None else None,
        label_probs=seq.label_probs,
        **_prompt_logprobs(seq, tokenizer), **_asked_back(seq, state, tokenizer),
    )
    if state is not None and state.params.grammar is not None and state.params.grammar.parse is not None:
        completion = _with_parsed(completion, state.params.grammar.parse)
    if state is not None and state.answer is not None:
        completion = _with_answer(completion, state.answer, reason)
    log.info("request_finished", request_id=req.request_id, tenant=req.tenant.name, n_prompt=seq.n_prompt,
             n_cached=seq.n_cached,
             n_gen=n_gen, ttft_ms=completion.timings.ttft_ms, ms=completion.timings.total_ms,
             finish_reason=completion.finish_reason,
             priority=req.priority, n_preempted=seq.n_preempted, n_resumed=seq.n_resumed)
    if reason == "cancelled":
        req.reply.fail(CancelledError(f"request {req.request_id} was cancelled", completion))
    elif error is not None:
        req.reply.fail(error)
    else:
        req.reply.resolve(completion)
    return completion

"""One running request's decode state, and how it ends (a ``Completion`` on its future).

Runs on the batcher thread. ``RequestState.accept`` takes each sampled token and says whether
the request is finished (EOG, stop string, max_tokens, context limit); ``finish_request``
resolves or fails the caller's future and logs the ``request_finished`` line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import structlog

from llamactor.completion import Completion, Timings, TokenLogprob, Usage
from llamactor.config import SamplingParams
from llamactor.errors import CancelledError, LlamactorError
from llamactor.native.sampling import RowSpec
from llamactor.native.tokenizer import Tokenizer
from llamactor.output import TextAssembler
from llamactor.scheduler import Sequence

log = structlog.get_logger("llamactor.batcher")


@dataclass(slots=True, eq=False)
class RequestState:
    params: SamplingParams
    rng: np.random.Generator
    text: TextAssembler
    logprobs: list[TokenLogprob] | None = None
    n_generated: int = 0
    spec: RowSpec | None = field(default=None)

    @classmethod
    def create(cls, params: SamplingParams) -> RequestState:
        return cls(params=params, rng=np.random.default_rng(params.seed), text=TextAssembler(params.stop),
                   logprobs=[] if params.logprobs else None)

    def row_spec(self, token_ids: list[int]) -> RowSpec:
        """This step's sampling row; the penalty window is the only part that changes."""
        p = self.params
        if self.spec is None:
            self.spec = RowSpec(p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.presence_penalty,
                                p.frequency_penalty, self.rng, (), p.logprobs, p.top_logprobs)
        if p.has_penalties and p.repeat_last_n > 0:
            self.spec.recent_tokens = token_ids[-p.repeat_last_n:]
        return self.spec

    def accept(self, seq: Sequence, token: int, logprob: float | None, top: list[tuple[int, float]],
               tokenizer: Tokenizer, n_ctx_seq: int) -> str | None:
        """Take the sampled ``token``; stream its text; return a finish reason, or None to go on."""
        if tokenizer.is_eog(token) and not self.params.ignore_eos:
            return "stop"
        seq.token_ids.append(token)
        self.n_generated += 1
        if self.logprobs is not None and logprob is not None:
            text = tokenizer.token_text
            self.logprobs.append(TokenLogprob(text(token), logprob, tuple((text(t), lp) for t, lp in top)))
        seq.request.reply.send_piece(self.text.push(tokenizer.token_bytes(token)))
        if self.text.stopped:
            return "stop"
        if self.params.max_tokens is not None and self.n_generated >= self.params.max_tokens:
            return "length"
        if len(seq.token_ids) >= n_ctx_seq:
            return "length"
        return None


def _ms(start: float, end: float | None) -> float:
    return round(((end if end is not None else start) - start) * 1000, 3)


def finish_request(seq: Sequence, reason: str, error: LlamactorError | None = None) -> Completion:
    """Resolve the caller's future with the completion (or fail it with ``error``), log it."""
    now = time.perf_counter()
    state: RequestState | None = seq.state
    req = seq.request
    text = ""
    if state is not None:
        tail = state.text.finish()
        if reason != "cancelled":
            req.reply.send_piece(tail)
        text = state.text.text
    n_gen = seq.n_generated
    decode_s = now - seq.first_token_at if seq.first_token_at is not None else 0.0
    completion = Completion(
        request_id=req.request_id, text=text, token_ids=tuple(seq.token_ids[seq.n_prompt:]),
        finish_reason=reason,  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=seq.n_prompt, completion_tokens=n_gen, cached_tokens=seq.n_cached),
        timings=Timings(queue_ms=_ms(req.submitted_at, seq.admitted_at), ttft_ms=_ms(req.submitted_at, seq.first_token_at),
                        total_ms=_ms(req.submitted_at, now),
                        decode_tokens_per_s=round((n_gen - 1) / decode_s, 2) if n_gen > 1 and decode_s > 0 else 0.0),
        logprobs=tuple(state.logprobs) if state is not None and state.logprobs is not None else None,
    )
    log.info("request_finished", request_id=req.request_id, n_prompt=seq.n_prompt, n_cached=seq.n_cached,
             n_gen=n_gen, ttft_ms=completion.timings.ttft_ms, ms=completion.timings.total_ms, finish_reason=reason,
             priority=req.priority, n_preempted=seq.n_preempted)
    if reason == "cancelled":
        req.reply.fail(CancelledError(f"request {req.request_id} was cancelled", completion))
    elif error is not None:
        req.reply.fail(error)
    else:
        req.reply.resolve(completion)
    return completion

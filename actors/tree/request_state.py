"""One running request's decode state, and the typed error that ends a request alone.

Runs on the batcher thread. ``RequestState.accept`` takes each sampled token and says whether
the request is finished (EOG, stop string, max_tokens, context limit) and records each token in
the request's ``Progress`` checkpoint; ``resume_sequence`` rebuilds a request from that checkpoint
on a new batcher after a crash. How a request ends -- its ``Completion`` on its future -- is
``request_end.finish_request``.

A request's failure is the request's (``request_error``): what the batcher does for one request
alone -- tokenizing, rendering its template, compiling its grammar, setting up or resuming its
sampler, drawing and accepting its token, building its answer -- touches nothing shared, so
whatever it raises ends that request alone and the batcher goes on. A ``LlamactorError`` (an
``InvalidRequestError`` above all) is the answer as it is; anything else is our bug, a
``RequestFailedError`` (500) naming the request id, logged once with its traceback. An
``EngineError`` (the context is unusable, ``shared``) is never caught there: it crashes the
batcher on purpose, as do failures of the decode, KV operations and the scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamactor.base.answer import AnswerSplitter
from llamactor.base.logging import get_logger
from llamactor.base.completion import TokenLogprob
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import EngineError, InvalidRequestError, LlamactorError, QueueFullError, \
    RequestFailedError
from llamactor.tree.grammar_sampler import new_matcher
from llamactor.base.messages import Generate, Progress, ReplyChannel
from llamactor.native.graph_sampling import GraphChain
from llamactor.native.sampling import RowSpec
from llamactor.native.tokenizer import Tokenizer
from llamactor.tree.text import TextAssembler
from llamactor.scheduling.prompt_scores import ScoreState
from llamactor.scheduling.sequence import Sequence

log = get_logger("llamactor.batcher")


@dataclass(slots=True, eq=False)
class RequestState:
    params: SamplingParams
    rng: np.random.Generator
    text: TextAssembler
    logprobs: list[TokenLogprob] | None = None
    n_generated: int = 0
    spec: RowSpec | None = field(default=None)
    matcher: Any = None  # llguidance.LLMatcher of a constrained request: where its grammar stands
    error: LlamactorError | None = None  # why accept() ended the request, if it went wrong
    n_logprobs_sent: int = 0  # logprobs already attached to streamed pieces
    progress: Progress | None = None  # the checkpoint on the request's reply channel, kept up to date
    graph: GraphChain | None = None  # its sampler chain when llama.cpp samples it inside the graph
    answer: AnswerSplitter | None = None  # splits its answer as it streams (None: nothing to split)
    drafter: Any = None  # its ``Drafter`` when it drafts (``draft_rows``)
    n_draft_accepted: int = 0  # drafted tokens taken as its own (``draft_verify``)
    n_draft_rejected: int = 0  # drafted tokens computed and not taken

    @classmethod
    def create(cls, params: SamplingParams, tokenizer: Tokenizer) -> RequestState:
        """``InvalidRequestError`` for what only the model can check: bias token ids, the grammar."""
        if params.logit_bias:
            tokenizer.check_ids((t for t, _ in params.logit_bias), "logit_bias token ids")
        matcher = new_matcher(params.grammar, tokenizer.grammar_vocab()) if params.grammar is not None else None
        return cls(params=params, rng=np.random.default_rng(params.seed), text=TextAssembler(params.stop),
                   logprobs=[] if params.logprobs else None, matcher=matcher)

    def row_spec(self, token_ids: list[int]) -> RowSpec:
        """This step's sampling row; the penalty window is the only part that changes."""
        p = self.params
        if self.spec is None:
            self.spec = RowSpec(p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty, p.presence_penalty,
                                p.frequency_penalty, self.rng, (), p.logprobs, p.top_logprobs, p.logit_bias)
        if p.has_penalties and p.repeat_last_n > 0:
            self.spec.recent_tokens = token_ids[-p.repeat_last_n:]
        return self.spec

    def send(self, reply: ReplyChannel, text: str, *, last: bool = False) -> None:
        """Stream ``text``, the answer's parts it completes, and the logprobs not yet sent (all of
        them with the ``last`` piece, which goes even without text if it has any)."""
        unsent = tuple(self.logprobs[self.n_logprobs_sent:]) if self.logprobs is not None else ()
        parts = self.answer.feed(text) if self.answer is not None and text else None
        if reply.send_piece(text, unsent, parts, last=last):
            self.n_logprobs_sent += len(unsent)

    def accept(self, seq: Sequence, token: int, logprob: float | None, top: list[tuple[int, float]],
               tokenizer: Tokenizer, n_ctx_seq: int) -> str | None:
        """Take the sampled ``token``; stream its text; return a finish reason, or None to go on."""
        if tokenizer.is_eog(token) and not self.params.ignore_eos:
            return "stop"
        if self.matcher is not None and not self.matcher.consume_token(token):
            # Under the mask only the caller's grammar outgrowing llguidance's limits does this (a
            # right-recursive one after ~2000 tokens): that request's 400, its first line only (the
            # rest is pages of parser state).
            reason = (self.matcher.get_error() or "").strip().splitlines()[:1]
            self.error = InvalidRequestError(f"the grammar failed while generating token {self.n_generated + 1}: "
                                             f"{(reason[0] if reason else 'no reason given')[:300]}")
            return "stop"
        seq.token_ids.append(token)
        self.n_generated += 1
        if self.logprobs is not None and logprob is not None:
            text = tokenizer.token_text
            self.logprobs.append(TokenLogprob(text(token), logprob, tuple((text(t), lp) for t, lp in top)))
        self.send(seq.request.reply, self.text.push(tokenizer.token_bytes(token)))
        self._checkpoint(seq, token)  # right after the send: the checkpoint is what the caller saw
        return self.ended(seq, n_ctx_seq)

    def ended(self, seq: Sequence, n_ctx_seq: int) -> str | None:
        """Why the request is over after its last accepted token, or None to go on."""
        if self.text.stopped or (self.matcher is not None and self.matcher.is_stopped()):
            return "stop"  # a stop string, or the grammar is complete and allows nothing more
        if self.params.max_tokens is not None and self.n_generated >= self.params.max_tokens:
            return "length"
        if len(seq.token_ids) >= n_ctx_seq:
            return "length"
        return None

    def _checkpoint(self, seq: Sequence, token: int) -> None:
        p = self.progress
        if p is None:
            return
        if not p.generated:
            p.n_cached, p.admitted_at, p.first_token_at = seq.n_cached, seq.admitted_at, seq.first_token_at
        p.generated.append(token)
        p.n_preempted = seq.n_preempted
        # Greedy rows never draw from the generator, and a chain in the graph counts its draws by
        # the tokens generated; only the numpy sampler's generator has a state to keep (~10 us).
        if self.graph is None and self.params.temperature != 0.0:
            p.rng_state = self.rng.bit_generator.state

    @classmethod
    def resume(cls, params: SamplingParams, tokenizer: Tokenizer, progress: Progress,
               answer: AnswerSplitter | None = None) -> RequestState:
        """The state the request had after its last checkpointed token, rebuilt by replaying the
        generated tokens: the grammar matcher consumes them, the text assembler takes their bytes
        (so the text held back for stop strings is held back again, and what it emits now was
        streamed before: the answer splitter takes it), the random generator its saved state."""
        state = cls.create(params, tokenizer)
        state.answer = answer
        generated = progress.generated
        if progress.rng_state is not None:
            state.rng.bit_generator.state = progress.rng_state
        if state.matcher is not None and generated and state.matcher.consume_tokens(generated) is False:
            raise LlamactorError(f"the grammar refused the tokens it accepted before: {state.matcher.get_error()}")
        if state.logprobs is not None and progress.logprobs is not None:
            state.logprobs = progress.logprobs[:len(generated)]  # the crash may have left one unrecorded
        for i, token in enumerate(generated):
            if streamed := state.text.push(tokenizer.token_bytes(token)):
                state.n_logprobs_sent = i + 1 if state.logprobs is not None else 0
                if answer is not None:
                    answer.feed(streamed)
        state.n_generated = len(generated)
        state.n_draft_accepted, state.n_draft_rejected = progress.n_draft_accepted, progress.n_draft_rejected
        state.progress = progress
        progress.logprobs = state.logprobs
        return state


def start_sequence(msg: Generate, prompt_ids: list[int], n_context: int, params: SamplingParams,
                   tokenizer: Tokenizer) -> Sequence:
    """A new request's sequence, with an empty checkpoint on its reply channel. With
    ``prompt_logprobs`` its prompt is scored: from its continuation (``n_context`` on) or whole;
    with ``label_token_ids`` (ids checked against the vocabulary here) its last row is read."""
    if bad := [t for group in msg.label_token_ids for t in group if not tokenizer.has_id(t)]:
        raise InvalidRequestError(f"label_token_ids holds {bad[0]}: token ids must be in [0, {tokenizer.n_vocab})",
                                  param="label_token_ids")
    scoring = None if params.prompt_logprobs is None else ScoreState(
        start=max(1, n_context) if msg.continuation is not None else 1, n_prompt=len(prompt_ids),
        n_top=params.prompt_logprobs)
    seq = Sequence(request=msg, token_ids=prompt_ids, n_prompt=len(prompt_ids), scoring=scoring,
                   prompt_only=params.max_tokens == 0, labels=msg.label_token_ids,
                   cache_upto=n_context if msg.label_token_ids and msg.continuation is not None else None)
    seq.state = state = RequestState.create(params, tokenizer)
    state.answer = AnswerSplitter.of(msg.tools, msg.split_reasoning)
    state.progress = msg.reply.progress = Progress(tuple(prompt_ids), logprobs=state.logprobs)
    return seq


def resume_sequence(msg: Generate, params: SamplingParams, tokenizer: Tokenizer) -> Sequence:
    """The sequence of a request that a crashed batcher was running, from its checkpoint: prompt +
    generated token ids (recomputed when it is admitted again, as after a preemption), usage and
    timings as its caller has seen them so far."""
    progress = msg.reply.progress
    assert progress is not None
    state = RequestState.resume(params, tokenizer, progress, AnswerSplitter.of(msg.tools, msg.split_reasoning))
    progress.n_resumed += 1
    progress.marks.append(("restarted", time.perf_counter()))
    seq = Sequence(request=msg, token_ids=[*progress.prompt_ids, *progress.generated],
                   n_prompt=len(progress.prompt_ids), n_cached=progress.n_cached, n_preempted=progress.n_preempted,
                   admitted_at=progress.admitted_at, first_token_at=progress.first_token_at,
                   n_resumed=progress.n_resumed, prompt_only=params.max_tokens == 0)
    seq.state = state
    return seq


def shared(error: BaseException) -> bool:
    """Whether ``error`` means the shared context cannot go on: it must crash the batcher."""
    return isinstance(error, EngineError)


def request_error(request: Any, error: Exception, where: str) -> LlamactorError:
    """The typed error that ends ``request`` (a ``Generate``, ``Embed`` or ``Tokenize``) for
    ``error``, raised while the batcher was ``where`` for it alone; an unexpected one is logged
    here, once, with its traceback."""
    if isinstance(error, LlamactorError):  # a refusal; a full queue is the operator's concern too
        level = log.warning if isinstance(error, QueueFullError) else log.info
        level("request_rejected", request_id=request.request_id, error=type(error).__name__, reason=str(error))
        return error
    tenant = getattr(request, "tenant", None)  # a Tokenize has none
    log.error("request_failed", request_id=request.request_id, tenant=getattr(tenant, "name", None), where=where,
              error=repr(error), exc_info=error)
    return RequestFailedError(f"request {request.request_id} failed inside llamactor ({type(error).__name__} "
                              f"while {where}); the server log has the details", request_id=request.request_id)

"""The postprocess part of a generation step (batcher thread): what one step's ``StepResult``
means for each request, one small job per function, called in this order by
``GenerationSteps.postprocess``.

Each takes what it reads explicitly; ``finish`` ends a sequence (``GenerationSteps.finish``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from llamactor.base.errors import ContextFullError, LlamactorError
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan
from llamactor.tree.draft_verify import DraftVerifier
from llamactor.tree.output_rows import record_labels, record_scores
from llamactor.tree.request_state import request_error, shared
from llamactor.tree.token_draw import Draw


class Finish(Protocol):
    def __call__(self, seq: Sequence, reason: str, error: LlamactorError | None = None, *,
                 kv_lost: bool = False) -> None: ...


def count_step(counts: dict[str, int], plan: StepPlan) -> None:
    counts["steps"] += 1
    counts["step_sequences"] += len(plan.chunks)


def record_computed(scheduler: Scheduler, counts: dict[str, int], plan: StepPlan, failed_seq_ids: frozenset[int],
                    now: float) -> None:
    """The chunks' tokens are in KV: the index records them and each ``n_past`` moves on."""
    for chunk in plan.chunks:
        seq = chunk.seq
        if seq.seq_id in failed_seq_ids:
            continue
        if seq.n_preempted or seq.n_resumed:
            counts["tokens_recomputed"] += chunk.n_tokens  # resumed: computed once before
        elif seq.n_past < seq.n_prompt:
            counts["prompt_tokens_computed"] += min(chunk.n_tokens, seq.n_prompt - seq.n_past)
        scheduler.computed(chunk, now)


def record_prompt_scores(scheduler: Scheduler, counts: dict[str, int], scored: list[tuple[Chunk, int]],
                         logits: np.ndarray) -> None:
    """Reduce the scoring rows into each scored prompt's ``ScoreState``."""
    counts["prompt_rows_scored"] += record_scores(scored, logits)
    for chunk, _ in scored:
        scheduler.prompt_scored(chunk.seq)


def record_label_probs(counts: dict[str, int], label_rows: list[tuple[Sequence, int]], logits: np.ndarray) -> None:
    """Each label sequence whose prompt ended this step reads its groups' probabilities off its
    last row (it then ends as prompt-only, ``finish_prompt_only``)."""
    counts["label_rows"] += record_labels(label_rows, logits)


def finish_prompt_only(plan: StepPlan, finish: Finish) -> None:
    """max_tokens 0: a request is done once its prompt is in KV."""
    for chunk in plan.chunks:
        if chunk.seq.prompt_only and chunk.seq.n_past == chunk.seq.n_prompt:
            finish(chunk.seq, "length")


def accept_tokens(draw: Draw, now: float, verifier: DraftVerifier, counts: dict[str, int], finish: Finish) -> None:
    """Each request takes its token (streaming it) -- and the run its drafts allow
    (``DraftVerifier.accept``) -- and ends if it is done; one whose own draw or accepting raised
    ends alone."""
    for seq, error in draw.refused:
        verifier.drop(seq)
        finish(seq, "stop", error)
    counts["tokens_sampled_in_graph"] += draw.n_in_graph
    sampled = draw.sampled
    for seq, token, logprob, top in zip(draw.seqs, sampled.tokens, sampled.logprobs, sampled.top):
        if seq.first_token_at is None:
            seq.first_token_at = now
        try:
            reason = verifier.accept(seq, token, logprob, top)
        except Exception as e:  # its grammar, its text, its stream: this sequence's alone
            if shared(e):
                raise
            finish(seq, "stop", request_error(seq.request, e, "accepting its token"))
            continue
        if reason is not None:
            finish(seq, reason)
        elif seq.request.reply.done:  # the caller cancelled its future
            finish(seq, "cancelled")
    counts["tokens_generated"] += len(draw.seqs)


def finish_without_room(plan: StepPlan, failed_seq_ids: frozenset[int], n_ctx: int, finish: Finish) -> None:
    """The sequences the decode found no KV slot for (the index and llama.cpp disagreed on room)."""
    for chunk in plan.chunks:
        if chunk.seq.seq_id in failed_seq_ids:
            finish(chunk.seq, "context_full", ContextFullError(
                f"no KV cache room for this sequence (n_ctx={n_ctx}); retry later "
                "or lower n_parallel / max_tokens"), kv_lost=True)

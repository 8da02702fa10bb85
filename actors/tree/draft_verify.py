"""Verifying a step's drafts (batcher thread, in ``postprocess``): docs/architecture.md, *Speculation*.

A sequence with drafts d1..dk had k rows after its sampling row in the decode. Its row 0 was
drawn with the others (``token_draw``); here each token is accepted exactly as an undrafted one
is (``RequestState.accept``: EOG, the grammar, stop strings, logprobs, streaming, the checkpoint,
max_tokens, the context), and while the accepted token equals the next draft the next row is
drawn with the request's own sampler, its state moved on by that token (the penalty window, the
grammar matcher, the generator). The first token that differs from its draft (or the token
after all k) ends the run. For a deterministic draft this is the standard speculative
acceptance rule, and it draws the generator exactly as one-at-a-time decoding does: greedy and
seeded outputs are the same with and without drafts.

Then the accepted drafts' cells join the sequence's KV in the index (``Scheduler.drafts_verified``)
and the rejected ones leave the context (``seq_rm``) -- before the request may finish, so a
finished sequence's cached prefix never holds a rejected cell -- and the drafter learns how its
proposal fared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llamactor.native.tokenizer import Tokenizer
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.tree.output_rows import OutputRows

Top = list[tuple[int, float]]


@dataclass(slots=True)
class DraftVerifier:
    """One step's verification: its draft rows, and what accepting needs (batcher thread)."""

    sampler: GrammarSampler
    scheduler: Scheduler
    seq_rm: Callable[[int, int], None]  # (seq_id, first position to remove)
    tokenizer: Tokenizer
    n_ctx_seq: int
    counts: dict[str, int]
    rows: OutputRows
    logits: np.ndarray
    now: float

    def accept(self, seq: Sequence, token: int, logprob: float | None, top: Top) -> str | None:
        """Take ``seq``'s drawn ``token`` and, when it drafted this step, the run its drafts let it
        take; a finish reason, or None to go on."""
        drafted = self.rows.drafted.get(seq)
        if drafted is None:
            return seq.state.accept(seq, token, logprob, top, self.tokenizer, self.n_ctx_seq)
        first_row, drafts = drafted
        n_accepted = 0
        try:
            while True:
                n_before = len(seq.token_ids)
                reason = seq.state.accept(seq, token, logprob, top, self.tokenizer, self.n_ctx_seq)
                if not (n_accepted < len(drafts) and token == drafts[n_accepted] and len(seq.token_ids) > n_before):
                    return reason
                n_accepted += 1
                if reason is not None or seq.request.reply.done:
                    return reason
                token, logprob, top = self._draw(seq, first_row + n_accepted - 1)
                self.counts["tokens_generated"] += 1
        finally:
            self._settle(seq, len(drafts), n_accepted)

    def drop(self, seq: Sequence) -> None:
        """``seq``'s draw raised: none of its drafts is taken (before it finishes)."""
        if (drafted := self.rows.drafted.get(seq)) is not None:
            self._settle(seq, len(drafted[1]), 0)

    def _draw(self, seq: Sequence, row: int) -> tuple[int, float | None, Top]:
        """The token of draft row ``row`` under ``seq``'s sampler as it stands now."""
        state = seq.state
        one = self.sampler.sample(self.logits[row:row + 1], [state.row_spec(seq.token_ids)], [state.matcher])
        return one.tokens[0], one.logprobs[0], one.top[0]

    def _settle(self, seq: Sequence, n_drafted: int, n_accepted: int) -> None:
        """The drafts counted (in the checkpoint too, before anything that may raise: usage keeps
        them across a batcher crash), the accepted drafts' cells enter the index, the rejected ones
        leave the context."""
        state = seq.state
        state.n_draft_accepted += n_accepted
        state.n_draft_rejected += n_drafted - n_accepted
        if (progress := state.progress) is not None:
            progress.n_draft_accepted, progress.n_draft_rejected = state.n_draft_accepted, state.n_draft_rejected
        self.counts["draft_tokens"] += n_drafted
        self.counts["accepted_draft_tokens"] += n_accepted
        self.counts["rejected_draft_tokens"] += n_drafted - n_accepted
        self.scheduler.drafts_verified(seq, n_drafted, n_accepted, self.now)
        if n_accepted < n_drafted:
            self.seq_rm(seq.seq_id, seq.n_past)
        if state.drafter is not None:
            state.drafter.observe(n_drafted, n_accepted)

"""Which sequences draft, and the draft rows a step adds (batcher thread).

A request whose sampling has a prediction, or asks for n-gram drafts (``speculation == "ngram"``),
gets a drafter (``make_drafter``) when it is queued. After the scheduler has packed a step, each
of its sampling chunks whose sequence drafts proposes up to ``Config.draft_max`` tokens -- never
past its ``max_tokens`` or its context, since every drafted token may be accepted and one more
sampled after them -- and ``plan_drafts`` grants each what pays at this batch size, from the
decode steps timed here (``StepCost``) and what an accepted token saves (``draft_shares``: with
``ignore_eos`` and nothing waiting, only the sequences with the most tokens left shorten the batch;
``draft_together``: with nothing waiting, a step is saved only when all of those get ahead). The
granted drafts ride on the chunk
(``Chunk.drafts``): a row with logits each, in the same decode as everyone's tokens; the
verification is ``draft_verify``'s. Batch-invariant mode never drafts (docs/architecture.md,
*Speculation*): its packed cache keeps each sequence's cells in position order, and a rejected
draft's cells would leave holes.
"""

from __future__ import annotations

import dataclasses

from llamactor.base.sampling import SamplingParams
from llamactor.native.tokenizer import Tokenizer
from llamactor.scheduling.draft_budget import DraftWish, StepCost, draft_shares, draft_together, plan_drafts
from llamactor.scheduling.drafts import Drafter, make_drafter
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan


def prediction_ids(params: SamplingParams, tokenizer: Tokenizer) -> list[int] | None:
    """A request's prediction as token ids (no BOS, specials as text): where its prompt is
    prepared (the prep pool for a long one), once per request. Any thread."""
    if not params.prediction:
        return None
    return tokenizer.tokenize(params.prediction, add_special=False, parse_special=False)


class DraftRows:
    """The batcher's drafting: drafters handed out, draft rows planned, step cost measured."""

    def __init__(self, *, enabled: bool, draft_max: int, n_batch: int, n_ubatch: int, n_ctx_seq: int,
                 counts: dict[str, int]) -> None:
        self.enabled = enabled  # False in batch-invariant mode
        # the batcher's counters: ``proposed_draft_tokens`` (what drafters proposed, verified or not)
        self.counts = counts
        self.draft_max = draft_max
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.n_ctx_seq = n_ctx_seq
        self.cost = StepCost()

    def give(self, seq: Sequence, prediction: list[int] | None) -> None:
        """A new or resumed request's drafter, if it asks for one (on its ``RequestState``)."""
        state = seq.state
        if not self.enabled or state is None or seq.prompt_only:
            return
        state.drafter = make_drafter(state.params.speculation, prediction)

    def stepped(self, n_rows: int, n_logit_rows: int, ms: float) -> None:
        """A decode of ``n_rows`` rows, ``n_logit_rows`` of them with logits, took ``ms``: the cost
        model learns from the steps whose every row has logits, as a draft row has (a prompt's rows
        without them cost a fraction of one)."""
        if n_rows == n_logit_rows:
            self.cost.record(n_rows, ms)

    def add_to(self, plan: StepPlan, scheduler: Scheduler) -> None:
        """Add the drafts that pay to ``plan``'s sampling chunks (after the scheduler packed it)."""
        slots = [(i, c, d) for i, c in enumerate(plan.chunks) if (d := _drafter(c)) is not None]
        if not slots:
            return
        proposals = [d.propose(c.seq.token_ids, c.seq.n_prompt, k)[:k] if (k := self.limit(c.seq)) > 0 else []
                     for _, c, d in slots]
        if not any(proposals):
            return
        self.counts["proposed_draft_tokens"] += sum(map(len, proposals))
        n_rows = plan.n_rows
        room = min(self.batch_room(n_rows), scheduler.draft_room(plan))
        shares = self.shares(plan, scheduler)
        together = draft_together(list(shares.values()), bool(scheduler.pending))
        wishes = [DraftWish(len(p), d.acceptance, shares[i], together, d.unproven)
                  for p, (i, _, d) in zip(proposals, slots)]
        granted = plan_drafts(wishes, n_rows, max(0, room), self.cost) if room > 0 else [0] * len(wishes)
        for (i, chunk, _), proposal, n in zip(slots, proposals, granted):
            if n > 0:
                plan.chunks[i] = dataclasses.replace(chunk, drafts=tuple(proposal[:n]))

    @staticmethod
    def shares(plan: StepPlan, scheduler: Scheduler) -> dict[int, float]:
        """Each sampling chunk's share of a step's fixed part that its accepted token saves, by its
        index in ``plan.chunks`` (``draft_shares``)."""
        sampling = [(i, c.seq) for i, c in enumerate(plan.chunks) if c.samples and c.seq.state is not None]
        remaining = [_tokens_left(seq) for _, seq in sampling]
        return dict(zip((i for i, _ in sampling), draft_shares(remaining, bool(scheduler.pending))))

    def limit(self, seq: Sequence) -> int:
        """The most tokens ``seq`` may draft now: every draft may be accepted and one token more
        sampled after them, within its ``max_tokens`` and its context."""
        params = seq.state.params
        left = self.n_ctx_seq - len(seq.token_ids) - 1
        if params.max_tokens is not None:
            left = min(left, params.max_tokens - seq.state.n_generated - 1)
        return max(0, min(self.draft_max, left))

    def batch_room(self, n_rows: int) -> int:
        """Rows a step of ``n_rows`` may add: within ``n_batch``, and within one ``n_ubatch`` when
        the step fits in one (a second micro-batch would cost a whole pass more)."""
        if n_rows <= self.n_ubatch:
            return min(self.n_batch, self.n_ubatch) - n_rows
        return self.n_batch - n_rows


def _tokens_left(seq: Sequence) -> int | None:
    """The tokens ``seq`` will still generate when that is known (``ignore_eos`` with ``max_tokens``)."""
    params = seq.state.params
    if not params.ignore_eos or params.max_tokens is None:
        return None
    return params.max_tokens - seq.state.n_generated


def _drafter(chunk: Chunk) -> Drafter | None:
    """The drafter of a chunk that samples, if its sequence drafts."""
    state = chunk.seq.state
    return state.drafter if chunk.samples and state is not None else None

"""Admission: which waiting requests take a sequence id this step, and with what cached KV (pure;
the batcher's thread). ``Scheduler`` is made of it (``Admitting``), its packing and its KV room.

A waiting request is admitted in the policy's order, then fairly (``fair_order``), when a
sequence id is free and its uncomputed tokens fit in the room the running sequences leave
(``_room_for_newcomers``); it attaches the longest prefix the ``PrefixIndex`` holds for its
scope, or has a lower tier's entry restored where that pays (``plan_restore``), unless a running
sequence will soon hold more of it (``prefix_sharing``: then it waits a step). When every id is
taken and the next in fair order waits behind work served more, one of that work is preempted
(``_preempt_for_fairness``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from llamactor.scheduling.fair_order import ahead_of, fair_order
from llamactor.scheduling.fairness import FairShare
from llamactor.scheduling.kv_nodes import KvOp, Match
from llamactor.scheduling.policy import Policy
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.prefix_sharing import waits_for_prefix, waits_for_scores
from llamactor.scheduling.prompt_scores import ScoreCache, reusable_end
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.scheduling.tier_index import NO_MATCH, RestoreOp, TierMatch, plan_restore, restore_worth_it

TierLookup = Callable[[str, list[int]], TierMatch]  # a lower cache tier's longest match (scope, tokens)


class Admitting(ABC):
    """The admission half of ``Scheduler`` (its state is the scheduler's; its hooks, the
    scheduler's and batch-invariant mode's ``PackedScheduler``'s)."""

    n_parallel: int
    index: PrefixIndex
    keep_finished: bool
    share_min_tokens: int
    scoring_attaches_kv: bool
    policy: Policy
    score_cache: ScoreCache
    tier: TierLookup | None
    pending: list[Sequence]
    running: list[Sequence]
    fair: FairShare

    @property
    def n_free(self) -> int:
        """Sequences that may still start: ``n_parallel`` less the running ones."""
        return self.n_parallel - len(self.running)

    @abstractmethod
    def _preempt(self, seq: Sequence, now: float) -> list[KvOp]:
        """Release ``seq``'s seq_id and queue it again (``Scheduler._preempt``)."""

    @abstractmethod
    def _may_admit(self, seq: Sequence) -> bool:
        """Whether ``seq`` may be admitted now, room and order aside."""

    @abstractmethod
    def _seq_id_ready(self, plan: StepPlan, now: float) -> bool:
        """Whether the next admission may take a seq_id now."""

    def _admit_pending(self, plan: StepPlan, now: float) -> None:
        if self.n_free == 0:
            return  # every step while sequences run: no ordering, no lookups
        room = self._room_for_newcomers()
        for seq in self._admission_order(now):
            if self.n_free == 0:
                break
            if not self._may_admit(seq):
                continue
            if seq.scoring is not None:
                self.score_cache.fill(seq.scope, seq.token_ids, seq.scoring)
            reusable = self._reusable(seq)
            match = self._lookup(seq, reusable)
            if self._worth_waiting(seq, reusable, match):
                continue
            needed = len(seq.token_ids) - match.n_tokens
            if needed > room - match.n_tokens and self.running:
                break  # the most urgent waits for room; admitting others past it could starve it
            room -= needed
            if not self._seq_id_ready(plan, now):
                break
            seq_id, ops = self.index.allocate(seq.scope)
            restore = self._plan_restore(seq, seq_id, reusable, match, ops, now)
            if restore is not None:
                plan.kv_ops += ops + [restore]
                n_hit = restore.n_keep
            else:
                if ops:  # an entry was dropped to free the seq_id (or make room): it may have been the match
                    match = self._lookup(seq, reusable)
                plan.kv_ops += ops + self.index.attach(seq_id, match, now)
                n_hit = match.n_tokens
            seq.seq_id, seq.n_past = seq_id, n_hit
            if seq.admitted_at is None:  # first admission (not a preempted or resumed sequence)
                seq.admitted_at, seq.n_cached = now, n_hit
            self.pending.remove(seq)
            self.running.append(seq)
            plan.admitted.append(seq)

    def _preempt_for_fairness(self, plan: StepPlan, now: float) -> None:
        """Every sequence is taken and what fairness would admit next waits behind work served
        more (``fair_order.ahead_of``): preempt one sequence of that work (the most served one's
        least urgent), so the waiting work gets a sequence next step rather than when a whole
        answer ends. The preempted sequence keeps its KV as a cached prefix and resumes from it
        (so not without the prefix cache)."""
        if self.n_free > 0 or not self.keep_finished or not self.pending:
            return
        head = next(self._admission_order(now), None)
        ahead = [] if head is None else ahead_of(head, self.running, self.fair, now)
        if ahead:
            victim = self.policy.preemption_victim(ahead, now, self.fair.rank)
            plan.kv_ops += self._preempt(victim, now)
            plan.preempted.append(victim)

    def _admission_order(self, now: float) -> Iterator[Sequence]:
        """The waiting sequences in the policy's order, then fairly (``fair_order``)."""
        ordered = self.policy.order_waiting(self.pending, now, self._cached_tokens)
        return fair_order(ordered, self.running, self.fair, now)

    def _cached_tokens(self, seq: Sequence) -> int:
        """How much of ``seq``'s prompt admission would not compute (``lpm``'s rank): the cells'
        match, or a lower tier's where restoring it pays, as admission would restore it."""
        reusable = self._reusable(seq)
        n_cells = self._lookup(seq, reusable).n_tokens
        found = self.tier(seq.scope, reusable) if self.tier is not None else NO_MATCH
        return found.n_tokens if restore_worth_it(found, n_cells) else n_cells

    def _reusable(self, seq: Sequence) -> list[int]:
        """The tokens whose KV may be attached from the cache (``reusable_end``)."""
        return seq.token_ids[:reusable_end(len(seq.token_ids), seq.scoring, self.scoring_attaches_kv)]

    def _plan_restore(self, seq: Sequence, seq_id: int, reusable: list[int], match: Match, ops: list[KvOp],
                      now: float) -> RestoreOp | None:
        """Restore the lower tier's entry into ``seq_id`` when it pays (``plan_restore``)."""
        if self.tier is None:
            return None
        return plan_restore(self.index, self.tier(seq.scope, reusable), seq_id, reusable, match.n_tokens, ops, now)

    def restore_failed(self, seq_id: int) -> Sequence | None:
        """A planned restore did not happen: the running sequence on ``seq_id`` has no cells and
        computes its prompt from the start (the caller drops its chunk from this step)."""
        seq = next((s for s in self.running if s.seq_id == seq_id), None)
        if seq is not None:
            self.index.forget_cells(seq_id)
            if seq.n_cached == seq.n_past and seq.n_preempted == 0:
                seq.n_cached = 0
            seq.n_past = 0
        return seq

    def _room_for_newcomers(self) -> int:
        """Cells free or held by cached prefixes alone, less what running sequences still compute."""
        free = self.index.n_cells - self.index.cells_used
        return free + self.index.cache_cells() - sum(s.n_unprocessed for s in self.running)

    def _lookup(self, seq: Sequence, tokens: list[int]) -> Match:
        return self.index.lookup(tokens, scope=seq.scope, pinned_only=not self.keep_finished,
                                 shared=not seq.adapters)

    def _worth_waiting(self, seq: Sequence, reusable: list[int], match: Match) -> bool:
        """A running sequence will soon hold what ``seq`` shares with it (``prefix_sharing``);
        only with the prefix cache, which is how the cells would reach ``seq``."""
        return self.keep_finished and (
            waits_for_prefix(seq, reusable, match.n_tokens, self.running, self.share_min_tokens)
            or waits_for_scores(seq, self.running))

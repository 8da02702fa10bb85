"""Batch-invariant mode: a KV cache kept *packed*, so each sequence's cells stay in position order
(pure, batcher thread). The mode is these two subclasses, taken together: ``PackedPrefixIndex``
(how cells are freed) and ``PackedScheduler`` (when, and what waits meanwhile).

Why: llama.cpp's CPU flash-attention kernel walks a query row's cells in cache index order with an
online softmax, so a sequence's logits depend on the order of its cells in the unified cache
(docs/performance.md, "Batch-invariant mode"). llama.cpp puts a step's tokens in the lowest free
cells from its search head, and a ``seq_rm`` that frees a cell moves the head back to it: a cell
freed below a sequence's cells is refilled by that sequence's next token, out of order. In a
packed cache -- every used cell below every free one -- new cells always land above the cells
held, in the order a step lists them, and each sequence's cells stay in position order.

So cells are never freed below held ones: the index frees cells only in ``flush``, which drops
every unpinned entry at once. A finished or preempted sequence keeps its cells as an entry
(attached later only with the prefix cache on), and when a step needs room, an admission a
seq_id, or the entries outgrow ``cache_budget_cells``, the scheduler *flushes*: every running
sequence is preempted and every unpinned entry dropped (each offered to the RAM/disk tier, as
eviction does), leaving only the pinned system prompt, computed first into the empty cache. The
preempted sequences resume as preempted ones do: by recomputing their tokens -- bit for bit what
they held, in this mode -- or by a restore from the tier, which llama.cpp writes into the lowest
free cells in position order; not an entry longer than the model's sliding window, whose older
window cells come back after the newer ones (``native/kv_state.py``): that one is recomputed. When
the running sequences alone overflow the cells, the least urgent ones (the usual preemption
victims) are held back until a sequence ends: one, and more until what the others may still reach
(``max_tokens``) fits, so that they do not overflow and flush again a few steps on.
"""

from __future__ import annotations

from typing import Any

from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler, TierLookup
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.scheduling.tier_index import NO_MATCH, TierMatch


UNBOUNDED_GUESS = 256  # tokens an answer without max_tokens is expected to add (rate_limits guesses alike)


class PackedPrefixIndex(PrefixIndex):
    """A ``PrefixIndex`` that frees cells only in ``flush``: a finished sequence always stays as an
    entry (seen by lookups only where entries may be), whatever the prefix cache's setting and
    with no budget; ``evict`` frees nothing; ``allocate`` takes only a free seq_id or a covered
    entry's. Batcher thread only."""

    def finish(self, seq_id: int, now: float, *, keep: bool, budget_cells: int | None = None,
               keep_upto: int | None = None) -> list[KvOp]:
        return super().finish(seq_id, now, keep=True, budget_cells=None)  # cells stay packed: kept whole

    def evict(self, n_cells: int) -> list[KvOp]:
        return []

    def _evict_for_seq_id(self) -> KvOp:
        raise IndexError("no seq_id is free without freeing cells: a packed index needs a flush()")


class PackedScheduler(Scheduler):
    """A ``Scheduler`` over a ``PackedPrefixIndex``. Batcher thread only. ``sliding_window``: the
    model's (0: none); longer tier entries are not restored."""

    index: PackedPrefixIndex

    def __init__(self, *, sliding_window: int = 0, **options: Any) -> None:
        # a row is bit-exact in any shape here: attaching a cached prefix to a scored prompt costs nothing
        super().__init__(**{**options, "scoring_attaches_kv": True})
        if not isinstance(self.index, PackedPrefixIndex):
            raise ValueError("a PackedScheduler needs a PackedPrefixIndex")
        if self.tier is not None and sliding_window > 0:
            self.tier = _within_window(self.tier, sliding_window)
        self.held: list[Sequence] = []  # preempted to make room: wait until a running sequence ends
        self._flush_next = False  # a failed decode freed cells, or entries outgrew their budget

    def finish(self, seq: Sequence, now: float, *, kv_lost: bool = False) -> list[KvOp]:
        if seq in self.running:
            self.held.clear()  # its cells will come back at the next flush: the held may try again
        elif seq in self.held:
            self.held.remove(seq)  # ended while it waited (cancelled)
        ops = super().finish(seq, now, kv_lost=kv_lost)
        over_budget = self.cache_budget_cells is not None and self.index.cache_cells() > self.cache_budget_cells
        self._flush_next |= kv_lost or over_budget  # llama.cpp freed its cells itself / the budget's cells back
        return ops

    def _before_admission(self, plan: StepPlan, now: float) -> None:
        if self._flush_next:
            self._flush(plan, now)

    def _may_admit(self, seq: Sequence) -> bool:
        return seq not in self.held or not self.running

    def _seq_id_ready(self, plan: StepPlan, now: float) -> bool:
        """A seq_id that frees no cell, or a flush (after which this step admits nothing more)."""
        if self.index.spare_id():
            return True
        self._flush(plan, now)
        return False

    def _make_room(self, plan: StepPlan, now: float) -> None:
        """Flush when the step's tokens exceed the free cells; hold the least urgent back when the
        entries' cells would not have been enough, and fail a lone sequence that cannot fit."""
        shortfall = self._shortfall(plan)
        if shortfall <= 0:
            return
        to_hold = []
        if shortfall > self.index.cache_cells():
            if len(self.running) == 1:
                plan.chunks = []
                plan.failed += self.running  # it cannot fit even alone; the batcher ends it
                return
            to_hold = self._to_hold(now)
        self._flush(plan, now)
        self.held += to_hold

    def _to_hold(self, now: float) -> list[Sequence]:
        """The least urgent running sequences: one, then more until what the others may reach by
        their end fits in the cells a flush leaves (double-counting shared prefixes: cautious)."""
        room = self.index.n_cells - self.index.pinned_cells()
        rest, held = list(self.running), []
        while len(rest) > 1:
            victim = self.policy.preemption_victim(rest, now, self.fair.rank)
            held.append(victim)
            rest.remove(victim)
            if sum(_reach(s, room) for s in rest) <= room:
                break
        return held

    def _flush(self, plan: StepPlan, now: float) -> None:
        """Preempt every running sequence and drop every unpinned entry: only pinned cells stay."""
        for seq in list(self.running):
            plan.kv_ops += self._preempt(seq, now)
            plan.preempted.append(seq)
            if seq in plan.admitted:
                plan.admitted.remove(seq)
        plan.chunks = []
        plan.kv_ops += self.index.flush()
        plan.flushed = True
        self.n_flushes += 1
        self._flush_next = False


def _reach(seq: Sequence, cap: int) -> int:
    """The cells ``seq`` may hold at its end, at most ``cap``: its tokens and what ``max_tokens``
    leaves (unbounded: ``UNBOUNDED_GUESS`` more, since counting the whole context would hold back
    all but one sequence)."""
    limit = seq.request.params.max_tokens
    more = UNBOUNDED_GUESS if limit is None else max(0, limit - seq.n_generated)
    return min(cap, len(seq.token_ids) + more)


def _within_window(lookup: TierLookup, window: int) -> TierLookup:
    """``lookup``, finding no entry longer than ``window`` tokens."""
    def within(scope: str, tokens: list[int]) -> TierMatch:
        match = lookup(scope, tokens)
        return match if match.n_entry <= window else NO_MATCH
    return within

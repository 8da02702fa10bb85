"""Batch-invariant mode's scheduler: a KV cache kept *packed*, so each sequence's cells stay in
position order (pure, batcher thread).

Why: llama.cpp's CPU flash-attention kernel walks a query row's cells in cache index order with an
online softmax, so a sequence's logits depend on the order of its cells in the unified cache
(docs/performance.md, "Batch-invariant mode"). llama.cpp puts a step's tokens in the lowest free
cells from its search head, and a ``seq_rm`` that frees a cell moves the head back to it: a cell
freed below a sequence's cells is refilled by that sequence's next token, out of order. In a
packed cache -- every used cell below every free one -- new cells always land above the cells
held, in the order a step lists them, and each sequence's cells stay in position order.

So cells are never freed below held ones. A finished or preempted sequence keeps its cells as an
entry (attached later only with the prefix cache on), and when a step needs room or an admission a
seq_id, or the entries outgrow ``cache_budget_cells``, the scheduler *flushes*: every running sequence is preempted and every unpinned entry is
dropped (each offered to the RAM/disk tier, as eviction does), leaving only the pinned system
prompt, which was computed first, into the empty cache. The preempted sequences resume as
preempted ones do, by recomputing their tokens -- bit for bit what they held, in this mode -- or by
a restore from the tier, which writes an entry's cells contiguously at the top -- except an entry
longer than the model's sliding window: its older sliding-window cells come back after the newer
ones (``native/kv_state.py``), out of order, so it is recomputed instead. When the running
sequences alone overflow the cells, the least urgent one (the usual preemption victim) is held back
until a sequence ends, so the others fit once resumed instead of overflowing again at once.
"""

from __future__ import annotations

from typing import Any

from llamactor.scheduling.prefix_index import KvOp
from llamactor.scheduling.scheduler import Scheduler, TierLookup
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.scheduling.tier_index import NO_MATCH, TierMatch


class PackedScheduler(Scheduler):
    """A ``Scheduler`` whose index is packed (``PrefixIndex(packed=True)``). Batcher thread only.
    ``sliding_window``: the model's (0: none); longer tier entries are not restored."""

    def __init__(self, *, sliding_window: int = 0, **options: Any) -> None:
        super().__init__(**options)
        if not self.index.packed:
            raise ValueError("a PackedScheduler needs a packed PrefixIndex")
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
        victim = None
        if shortfall > self.index.cache_cells():
            victim = self.policy.preemption_victim(self.running, now, self.fair.rank)
            if len(self.running) == 1:
                plan.chunks = []
                plan.failed.append(victim)  # it cannot fit even alone; the batcher ends it
                return
        self._flush(plan, now)
        if victim is not None:
            self.held.append(victim)

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


def _within_window(lookup: TierLookup, window: int) -> TierLookup:
    """``lookup``, finding no entry longer than ``window`` tokens."""
    def within(scope: str, tokens: list[int]) -> TierMatch:
        match = lookup(scope, tokens)
        return match if match.n_entry <= window else NO_MATCH
    return within

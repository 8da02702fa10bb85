"""What to run next: the pure scheduling of the batcher (no threads, no llama calls).

It holds the waiting requests and the running sequences, decides when the waiting requests
flush (``batch_size`` of them, or the oldest has waited ``batch_timeout_s``; once sequences are
running, newcomers join at the next step), admits them in the order of its ``Policy`` (priority
with aging, FCFS, or longest cached prefix first) with the longest prefix the ``PrefixIndex``
has KV for, and packs one step's token budget (``n_batch``): one decode token per generating
sequence first, then prompt chunks by urgency, so a long prompt is prefilled over several steps
instead of stalling the others.

Fairness (``FairShare``, ``fair_order``): the least served tenant goes first -- admitted first,
its prompt chunks packed first, preempted last, and preempting for when it falls far behind --
and each tenant's ``max_running`` caps its sequences; within a flow (tenant, class of work), the
policy's order holds.

KV room: a request is admitted only when its uncomputed tokens fit in what is free or held by
cached prefixes, after what the running sequences still have to compute. When a step's tokens
need more cells than are free, least recently used cached prefixes are evicted first; if that is
not enough, the least urgent running sequence is *preempted*: its KV becomes a cached prefix, it
goes back to the waiting requests holding its tokens so far, and it is resumed later by
recomputing what the cache no longer holds. Only a sequence that cannot fit while running alone
fails.

Admission (the order, the cached prefix or restore, waiting for a prefix being computed) is the
``Admitting`` half (``scheduling/admitting.py``); this module keeps the queue, the flush rule,
packing, KV room and preemption.
"""

from __future__ import annotations

from llamactor.base.errors import QueueFullError
from llamactor.scheduling.adapter_turns import AdapterTurns, group
from llamactor.scheduling.admitting import Admitting, TierLookup
from llamactor.scheduling.fair_order import fair_order
from llamactor.scheduling.fairness import FairShare
from llamactor.scheduling.policy import Policy
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.prompt_scores import ROW_COST, ScoreCache, reusable_end
from llamactor.scheduling.queue_shares import admission, waiting_by_tenant
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan
from llamactor.scheduling.step_packing import pack_step

__all__ = ["Chunk", "Scheduler", "Sequence", "StepPlan"]


class Scheduler(Admitting):
    """Waiting requests, running set and prefix index. Called only from the batcher's thread.

    ``keep_finished``: a finished (or preempted) sequence's KV stays in the index as a cached
    prefix (the prefix cache); otherwise only pinned entries (the configured system prompt) are
    ever attached. ``share_min_tokens``: a request waits while a running sequence is still
    computing at least this many more of its prompt than the cache holds -- or all of what it
    could reuse, as ``n`` choices of one prompt do -- and attaches those cells once computed.
    ``score_rows``: logits rows one step may flag for prompt scoring; ``score_share``: what scoring
    work may add to a step that has other work, as a fraction of it; ``score_cache`` remembers
    finished sequences' prompt scores so that prompts sharing a prefix compute its rows once.
    ``tier``: a lower cache tier (host RAM, disk) whose entries are restored into new cells when
    that beats recomputing what the cells lack (``restore_pays``).
    """

    def __init__(self, *, n_parallel: int, n_batch: int, batch_size: int, batch_timeout_s: float,
                 max_queue: int, index: PrefixIndex, keep_finished: bool = True,
                 cache_budget_cells: int | None = None, share_min_tokens: int = 32,
                 policy: Policy | None = None, score_rows: int = 64, score_share: float = 0.25,
                 score_row_cost: float = ROW_COST,
                 score_cache: ScoreCache | None = None, tier: TierLookup | None = None,
                 scoring_attaches_kv: bool = False) -> None:
        if n_batch < n_parallel:
            raise ValueError("n_batch must be >= n_parallel")
        self.n_parallel = n_parallel
        # A prompt still scoring attaches no cached KV unless told: computed whole, its rows are
        # computed as alone (``reusable_end``); the batch-invariant mode's rows are exact anyway.
        self.scoring_attaches_kv = scoring_attaches_kv
        self.n_batch = n_batch
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.max_queue = max_queue
        self.index = index
        self.keep_finished = keep_finished
        self.cache_budget_cells = cache_budget_cells
        self.share_min_tokens = share_min_tokens
        self.policy = policy or Policy()
        self.score_rows = score_rows
        self.score_share = score_share
        self.score_row_cost = score_row_cost  # a logits row in prompt tokens of compute, for the share
        self.score_cache = score_cache if score_cache is not None else ScoreCache()
        self.tier = tier
        self.pending: list[Sequence] = []  # in arrival order; the policy orders them at admission
        self.running: list[Sequence] = []
        self.n_preemptions = 0
        self.n_flushes = 0  # the KV cache emptied at once (only batch-invariant mode's PackedScheduler does)
        self.fair = FairShare()
        self.turns = AdapterTurns()

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``, within its tenant's share of ``max_queue`` (``QueueFullError`` beyond)."""
        decision = admission(seq.tenant, seq.weight, waiting_by_tenant(self.pending, self.n_free), self.max_queue)
        if not decision.admitted:
            raise QueueFullError(decision.reason)
        self.fair.activate(seq, [*self.pending, *self.running])
        self.pending.append(seq)

    def flush_deadline(self) -> float | None:
        """When the oldest waiting request's window ends, if a timer is what it waits for."""
        if self.running or not self.pending or len(self.pending) >= self.batch_size:
            return None
        return min(s.submitted_at for s in self.pending) + self.batch_timeout_s

    def flush_due(self, now: float) -> bool:
        if not self.pending:
            return False
        deadline = self.flush_deadline()
        return deadline is None or now >= deadline

    def schedule(self, now: float) -> StepPlan:
        """Admit what may start now, pack this step's token budget, make KV room for it."""
        plan = StepPlan()
        self._before_admission(plan, now)
        if self.flush_due(now):
            self._preempt_for_fairness(plan, now)
            self._admit_pending(plan, now)
        self._pack(plan, now)
        self._make_room(plan, now)
        return plan

    def computed(self, chunk: Chunk, now: float) -> None:
        """The chunk's tokens are in KV now: record them in the index and move ``n_past`` on."""
        seq = chunk.seq
        self.index.extend(seq.seq_id, seq.token_ids[seq.n_past:seq.n_past + chunk.n_tokens], now)
        seq.n_past += chunk.n_tokens
        self.fair.charge(seq, chunk.n_tokens)  # service as it is given: prompt chunks and decodes

    def drafts_verified(self, seq: Sequence, n_drafted: int, n_accepted: int, now: float) -> None:
        """``n_drafted`` draft rows of ``seq`` were computed this step and its first ``n_accepted``
        were taken as its tokens (now at the end of ``token_ids``): those cells are its KV and
        enter the index; the caller removes the rest from the context. Every drafted row was
        computed: fairness charges them all."""
        self.index.extend(seq.seq_id, seq.token_ids[seq.n_past:seq.n_past + n_accepted], now)
        seq.n_past += n_accepted
        self.fair.charge(seq, n_drafted)

    def draft_room(self, plan: StepPlan) -> int:
        """KV cells free after ``plan``'s chunks: the most draft rows the step may add (they hold
        cells until postprocess removes the rejected ones)."""
        return self.index.n_cells - self.index.cells_used - sum(c.n_tokens for c in plan.chunks)

    def prompt_scored(self, seq: Sequence) -> None:
        """The batcher recorded rows of ``seq``'s prompt: once all are in, other prompts may use them."""
        if seq.scoring is not None and seq.scoring.done and not seq.scoring.published:
            self.score_cache.put(seq.scope, seq.token_ids, seq.scoring)

    def finish(self, seq: Sequence, now: float, *, kv_lost: bool = False) -> list[KvOp]:
        """``seq`` ended: forget it wherever it is. A running one's KV becomes a cached entry (or is
        freed); ``kv_lost``: llama.cpp already removed its cells (a failed decode)."""
        return self._release(seq, now, kv_lost=kv_lost)

    def _release(self, seq: Sequence, now: float, *, kv_lost: bool = False) -> list[KvOp]:
        """Take ``seq`` out of the waiting or running set (ended or preempted); what its cells become."""
        if seq in self.pending:
            self.pending.remove(seq)
            return []
        if seq not in self.running:
            return []
        self.running.remove(seq)
        self.fair.forget_idle([*self.pending, *self.running])
        if seq.scoring is not None and not seq.scoring.published:
            self.score_cache.put(seq.scope, seq.token_ids, seq.scoring)
        if kv_lost:
            self.index.release(seq.seq_id)
            return []
        return self.index.finish(seq.seq_id, now, keep=self.keep_finished, budget_cells=self.cache_budget_cells,
                                 keep_upto=seq.cache_upto)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running, *self.pending):
            if seq.request_id == request_id:
                return seq
        return None

    # -- packing and room ---------------------------------------------------------------------

    def _pack(self, plan: StepPlan, now: float) -> None:
        """This step's chunks (``pack_step``): prompts of the least served tenant first, then the
        most urgent; all of one LoRA adapter set, the first in turn (``AdapterTurns``) with work."""
        for adapters in self.turns.order(self.running):
            chunks = pack_step(group(self.running, adapters), self.n_batch, self.score_rows, self.score_share,
                               lambda s: (self.fair.rank(s), self.policy.urgency(s, now)), self.score_row_cost)
            if chunks:
                self.turns.served(adapters)
                plan.chunks += chunks
                plan.adapters = adapters
                return

    def _make_room(self, plan: StepPlan, now: float) -> None:
        """Evict cached prefixes, then preempt the least urgent, until the step's tokens fit."""
        while (shortfall := self._shortfall(plan)) > 0:
            plan.kv_ops += self.index.evict(shortfall)
            if self._shortfall(plan) <= 0:
                return
            victim = self.policy.preemption_victim(self.running, now, self.fair.rank)
            plan.chunks = [c for c in plan.chunks if c.seq is not victim]
            if len(self.running) == 1:
                plan.failed.append(victim)  # it cannot fit even alone; the batcher ends it
                return
            plan.kv_ops += self._preempt(victim, now)
            plan.preempted.append(victim)
            if victim in plan.admitted:
                plan.admitted.remove(victim)

    def _shortfall(self, plan: StepPlan) -> int:
        return sum(c.n_tokens for c in plan.chunks) - (self.index.n_cells - self.index.cells_used)

    def _preempt(self, seq: Sequence, now: float) -> list[KvOp]:
        """Release ``seq``'s seq_id (its KV stays as a cached prefix while room allows) and queue it
        again with every token it has; it resumes from the longest prefix still cached."""
        ops = self._release(seq, now)
        seq.seq_id, seq.n_past = -1, 0
        seq.n_preempted += 1
        self.n_preemptions += 1
        self.pending.append(seq)
        return ops

    # -- hooks (batch-invariant mode's ``PackedScheduler`` overrides them) ------------------------

    def _before_admission(self, plan: StepPlan, now: float) -> None:
        """Anything the KV cache needs before this step admits or packs work (nothing here)."""

    def _may_admit(self, seq: Sequence) -> bool:
        """Whether ``seq`` may be admitted now, room and order aside (always, here)."""
        return True

    def _seq_id_ready(self, plan: StepPlan, now: float) -> bool:
        """Whether the next admission may take a seq_id now (here always: ``allocate`` drops an
        entry for one when none is free)."""
        return True

    # -- observability --------------------------------------------------------------------------

    def waiting_by_priority(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for seq in self.pending:
            counts[seq.priority] = counts.get(seq.priority, 0) + 1
        return dict(sorted(counts.items()))

    def oldest_waiting_effective_priority(self, now: float) -> float | None:
        """The effective priority of the request that has waited longest (None: nobody waits)."""
        if not self.pending:
            return None
        return self.policy.effective(min(self.pending, key=lambda s: s.submitted_at), now)

"""What to run next: the pure scheduling policy of the batcher (no threads, no llama calls).

It holds the waiting queue and the running sequences, decides when the waiting requests flush
(``batch_size`` of them, or the oldest has waited ``batch_timeout_s``; once sequences are running,
newcomers join at the next step), admits each with the longest prefix the ``PrefixIndex`` has KV
for, and packs one step's token budget (``n_batch``): one decode token per generating sequence
first, then prompt chunks of sequences still prefilling, so a long prompt is prefilled over
several steps instead of stalling the others. When the step's tokens need more KV cells than are
free, least recently used cached prefixes are evicted (running sequences never are).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from llamactor.errors import QueueFullError
from llamactor.messages import Generate
from llamactor.prefix_index import KvOp, Match, PrefixIndex, common_prefix_len


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's progress. ``token_ids`` is prompt + generated; ``n_past`` of them are in KV."""

    request: Generate
    token_ids: list[int]
    n_prompt: int
    seq_id: int = -1  # -1 while waiting
    n_past: int = 0
    n_cached: int = 0  # prompt tokens attached from a shared prefix instead of computed
    admitted_at: float | None = None
    first_token_at: float | None = None
    state: Any = None  # the batcher's per-request decode state; opaque here

    def __post_init__(self) -> None:
        if not 0 < self.n_prompt <= len(self.token_ids):
            raise ValueError(f"n_prompt {self.n_prompt} out of range for {len(self.token_ids)} tokens")

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def n_generated(self) -> int:
        return len(self.token_ids) - self.n_prompt

    @property
    def n_unprocessed(self) -> int:
        """Tokens not yet in KV: the rest of the prompt, or the one token sampled last step."""
        return len(self.token_ids) - self.n_past


@dataclass(frozen=True, slots=True)
class Chunk:
    """``n_tokens`` of ``seq``'s unprocessed tokens, from position ``seq.n_past``, in this step."""

    seq: Sequence
    n_tokens: int

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the last known token, so its logits are sampled."""
        return self.seq.n_past + self.n_tokens == len(self.seq.token_ids)


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    kv_ops: list[KvOp] = field(default_factory=list)  # to apply, in order, before the decode


class Scheduler:
    """Pending queue, running set and prefix index. Called only from the batcher's thread.

    ``keep_finished``: a finished sequence's KV stays in the index as a cached prefix (the prefix
    cache); otherwise only pinned entries (the configured system prompt) are ever attached.
    ``share_min_tokens``: a request waits (stays pending) while a running sequence is still
    computing at least this many more of its prompt than the cache holds -- or all of what it
    could reuse, as ``n`` choices of one prompt do -- and attaches those cells once computed.
    """

    def __init__(self, *, n_parallel: int, n_batch: int, batch_size: int, batch_timeout_s: float,
                 max_queue: int, index: PrefixIndex, keep_finished: bool = True,
                 cache_budget_cells: int | None = None, share_min_tokens: int = 32) -> None:
        if n_batch < n_parallel:
            raise ValueError("n_batch must be >= n_parallel")
        self.n_parallel = n_parallel
        self.n_batch = n_batch
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.max_queue = max_queue
        self.index = index
        self.keep_finished = keep_finished
        self.cache_budget_cells = cache_budget_cells
        self.share_min_tokens = share_min_tokens
        self.pending: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def n_free(self) -> int:
        """Sequences that may still start: ``n_parallel`` less the running ones."""
        return self.n_parallel - len(self.running)

    def add(self, seq: Sequence) -> None:
        # Requests that will start at the next flush are not queued in this sense.
        waiting_for_a_sequence = len(self.pending) - self.n_free
        if waiting_for_a_sequence >= self.max_queue:
            raise QueueFullError(f"{waiting_for_a_sequence} requests already wait for a free sequence "
                                 f"(max_queue={self.max_queue})")
        self.pending.append(seq)

    def flush_deadline(self) -> float | None:
        """When the oldest waiting request's window ends, if a timer is what it waits for."""
        if self.running or not self.pending or len(self.pending) >= self.batch_size:
            return None
        return self.pending[0].request.submitted_at + self.batch_timeout_s

    def flush_due(self, now: float) -> bool:
        if not self.pending:
            return False
        deadline = self.flush_deadline()
        return deadline is None or now >= deadline

    def schedule(self, now: float) -> StepPlan:
        """Admit what may start now, pack this step's token budget, make KV room for it."""
        plan = StepPlan()
        if self.flush_due(now):
            self._admit_pending(plan, now)
        budget = self.n_batch
        decoding = [s for s in self.running if s.n_unprocessed == 1]
        for seq in decoding:
            plan.chunks.append(Chunk(seq, 1))
        budget -= len(decoding)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.n_unprocessed > 1:
                n = min(seq.n_unprocessed, budget)
                plan.chunks.append(Chunk(seq, n))
                budget -= n
        shortfall = sum(c.n_tokens for c in plan.chunks) - (self.index.n_cells - self.index.cells_used)
        if shortfall > 0:
            plan.kv_ops += self.index.evict(shortfall)
        return plan

    def computed(self, chunk: Chunk, now: float) -> None:
        """The chunk's tokens are in KV now: record them in the index and move ``n_past`` on."""
        seq = chunk.seq
        self.index.extend(seq.seq_id, seq.token_ids[seq.n_past:seq.n_past + chunk.n_tokens], now)
        seq.n_past += chunk.n_tokens

    def finish(self, seq: Sequence, now: float, *, kv_lost: bool = False) -> list[KvOp]:
        """Forget ``seq`` wherever it is. A running one's KV becomes a cached entry (or is freed);
        ``kv_lost``: llama.cpp already removed its cells (a failed decode)."""
        if seq in self.pending:
            self.pending.remove(seq)
            return []
        if seq not in self.running:
            return []
        self.running.remove(seq)
        if kv_lost:
            self.index.release(seq.seq_id)
            return []
        return self.index.finish(seq.seq_id, now, keep=self.keep_finished, budget_cells=self.cache_budget_cells)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running, *self.pending):
            if seq.request_id == request_id:
                return seq
        return None

    # -- admission ----------------------------------------------------------------------------

    def _admit_pending(self, plan: StepPlan, now: float) -> None:
        waiting: list[Sequence] = []
        while self.pending and self.n_free > 0:
            seq = self.pending.popleft()
            reusable = seq.token_ids[:seq.n_prompt - 1]  # at least one prompt token is computed, for logits
            match = self._lookup(reusable)
            if self._worth_waiting(reusable, match):
                waiting.append(seq)
                continue
            seq_id, ops = self.index.allocate(now)
            if ops:  # an entry was dropped to free the seq_id: it may have been the match
                match = self._lookup(reusable)
            plan.kv_ops += ops + self.index.attach(seq_id, match, now)
            seq.seq_id, seq.admitted_at = seq_id, now
            seq.n_cached = seq.n_past = match.n_tokens
            self.running.append(seq)
            plan.admitted.append(seq)
        self.pending.extendleft(reversed(waiting))

    def _lookup(self, tokens: list[int]) -> Match:
        return self.index.lookup(tokens, pinned_only=not self.keep_finished)

    def _worth_waiting(self, reusable: list[int], match: Match) -> bool:
        """A running sequence still prefilling will soon hold more of ``reusable`` than the cache."""
        if not self.keep_finished or match.n_tokens >= len(reusable):
            return False
        for other in self.running:
            if other.n_past < other.n_prompt:
                shared = min(common_prefix_len(reusable, other.token_ids), other.n_prompt)
                gain = shared - match.n_tokens
                if gain > 0 and (gain >= self.share_min_tokens or shared == len(reusable)):
                    return True
        return False

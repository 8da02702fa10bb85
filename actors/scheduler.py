"""What to run next: the pure scheduling policy of the batcher (no threads, no llama calls).

It holds the waiting queue, the running sequences and the seq_id pool, decides when the waiting
requests flush (``batch_size`` of them, or the oldest has waited ``batch_timeout_s``; once
sequences are running, newcomers join at the next step), and packs one step's token budget
(``n_batch``): one decode token per generating sequence first, then prompt chunks of sequences
still prefilling, so a long prompt is prefilled over several steps instead of stalling the others.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from llamactor.errors import QueueFullError
from llamactor.messages import Generate


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
class SharedPrefix:
    """A prompt prefix prefilled once on its own reserved ``seq_id``, attached to others by seq_cp."""

    seq_id: int
    token_ids: tuple[int, ...]


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
    admitted: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, prefix seq_id or -1)


def common_prefix_len(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    """Pending queue, running set and seq_id pool. Called only from the batcher's thread."""

    def __init__(self, *, n_parallel: int, n_batch: int, batch_size: int, batch_timeout_s: float,
                 max_queue: int, shared_prefixes: tuple[SharedPrefix, ...] = ()) -> None:
        if n_batch < n_parallel:
            raise ValueError("n_batch must be >= n_parallel")
        self.n_batch = n_batch
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.max_queue = max_queue
        self.shared_prefixes = shared_prefixes
        self.pending: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_seq_ids: deque[int] = deque(range(n_parallel))

    def add(self, seq: Sequence) -> None:
        # Requests that will get a free seq_id at the next flush are not queued in this sense.
        waiting_for_a_sequence = len(self.pending) - len(self.free_seq_ids)
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
        """Admit what may start now, then pack this step's token budget."""
        plan = StepPlan()
        if self.flush_due(now):
            while self.pending and self.free_seq_ids:
                plan.admitted.append(self._admit(self.pending.popleft(), now))
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
        return plan

    def _admit(self, seq: Sequence, now: float) -> tuple[Sequence, int]:
        seq.seq_id = self.free_seq_ids.popleft()
        seq.admitted_at = now
        self.running.append(seq)
        source, best = -1, 0
        for prefix in self.shared_prefixes:
            n = common_prefix_len(prefix.token_ids, seq.token_ids)
            if n > best:
                source, best = prefix.seq_id, n
        # At least one prompt token must be computed so the step yields logits to sample from.
        seq.n_cached = seq.n_past = min(best, seq.n_prompt - 1)
        return seq, (source if seq.n_cached > 0 else -1)

    def finish(self, seq: Sequence) -> None:
        """Forget ``seq`` wherever it is; a running one gives its seq_id back to the pool."""
        if seq in self.running:
            self.running.remove(seq)
            self.free_seq_ids.append(seq.seq_id)
        elif seq in self.pending:
            self.pending.remove(seq)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running, *self.pending):
            if seq.request_id == request_id:
                return seq
        return None

"""Embedding work, packed by tokens (seed 004). Pure: no threads, no llama calls.

An ``Embed`` request holds one or more inputs. Each input becomes an ``EmbeddingInput`` in one
FIFO queue shared by every caller; ``EmbeddingQueue.pack`` takes inputs in arrival order, first
fit, until the step's token budget (``n_batch``) or its sequence ids (``n_seq_max``) run out, so
inputs from many callers share one ``llama_decode``. A request resolves when its last input has
a vector (``EmbeddingJob``).

The interleaving rule (``EmbeddingQueue.turn``): with only one kind of work waiting, it runs.
While both wait, steps are shared by *time*: generation goes first, and an embedding step runs
when embedding steps have used less than ``share`` (default 10%) of the decode time spent since
both started waiting. Those embedding steps are also smaller (a quarter of ``n_batch``, or the
one input that needs more): a full 512-token embedding step lasts as long as ~25 generation
steps here (llama.cpp computes the output projection for every token of an embedding input), and
every stream would stall for it. Alternating step by step would hand embeddings most of the time;
by time, generation keeps most of its speed under any embedding load and embeddings progress.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from llamactor.base.completion import Embeddings
from llamactor.base.errors import InvalidRequestError
from llamactor.base.messages import Embed


@dataclass(slots=True, eq=False)
class EmbeddingJob:
    """One ``Embed`` request's progress: a row per input, filled as its inputs are computed."""

    request: Embed
    pooling: str
    n_tokens: list[int]
    vectors: np.ndarray  # [n_inputs, n_embd], raw pooled
    n_done: int = 0
    n_steps: int = 0  # steps that computed some of its inputs

    @property
    def done(self) -> bool:
        return self.n_done == len(self.n_tokens)

    def result(self) -> Embeddings:
        """Normalized and truncated as asked (Matryoshka: cut to ``dimensions``, then renormalize)."""
        req = self.request
        vectors = self.vectors[:, :req.dimensions] if req.dimensions else self.vectors
        if req.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms > 0, norms, 1.0)
        return Embeddings(request_id=req.request_id, vectors=np.ascontiguousarray(vectors, dtype=np.float32),
                          pooling=self.pooling, prompt_tokens=sum(self.n_tokens),
                          total_ms=round((time.perf_counter() - req.submitted_at) * 1000, 3), n_steps=self.n_steps)


@dataclass(slots=True, eq=False)
class EmbeddingInput:
    job: EmbeddingJob
    index: int  # its row in the job
    token_ids: list[int]


@dataclass(slots=True)
class EmbeddingQueue:
    n_batch: int  # tokens per step, and the longest input
    n_seq_max: int  # inputs per step
    share: float = 0.10  # of the decode time while both kinds of work wait
    # The longest input when shorter than n_batch: a model with learned absolute positions (BERT)
    # has no position past its training context (llama.cpp would abort the process on one).
    max_input_tokens: int | None = None
    waiting: list[EmbeddingInput] = field(default_factory=list)
    contended_ms: list[float] = field(default_factory=lambda: [0.0, 0.0])  # [embedding, generation]
    # counters for stats()
    n_inputs: int = 0
    n_tokens: int = 0
    n_steps: int = 0

    @property
    def longest(self) -> int:
        """The most tokens one input may have: it is computed whole in one physical batch."""
        return self.n_batch if self.max_input_tokens is None else min(self.n_batch, self.max_input_tokens)

    def add(self, job: EmbeddingJob, inputs: list[list[int]]) -> None:
        """Queue every input of ``job``; ``InvalidRequestError`` (nothing queued) if one is empty
        or longer than ``longest``, since an embedding input cannot be split."""
        for i, tokens in enumerate(inputs):
            if not tokens:
                raise InvalidRequestError(f"input {i} is empty")
            if len(tokens) > self.longest:
                raise InvalidRequestError(f"input {i} has {len(tokens)} tokens; {self._limit_reason()}")
        self.waiting.extend(EmbeddingInput(job, i, tokens) for i, tokens in enumerate(inputs))

    def _limit_reason(self) -> str:
        if self.longest < self.n_batch:
            return f"the model has positions for {self.longest} tokens (its training context)"
        return (f"an embedding input must fit one physical batch (n_ubatch = {self.n_batch} tokens, "
                f"Config.embedding_n_batch)")

    def turn(self, generation_waiting: bool) -> bool:
        """Whether the next step is an embedding step (the rule in the module docstring)."""
        if not self.waiting or not generation_waiting:
            self.contended_ms = [0.0, 0.0]  # contention over: the next one starts afresh
            return bool(self.waiting)
        embedding_ms, generation_ms = self.contended_ms
        return embedding_ms < self.share * (embedding_ms + generation_ms)

    def charge(self, embedding: bool, ms: float) -> None:
        """Count a step's decode time while both kinds of work wait."""
        self.contended_ms[0 if embedding else 1] += ms

    def pack(self, contended: bool = False) -> list[EmbeddingInput]:
        """The next step's inputs, taken out of the queue: arrival order, first fit, all with the
        pooling of the oldest waiting input (one llama.cpp context per pooling type); a quarter
        of the budget while generation waits too."""
        if not self.waiting:
            return []
        packed: list[EmbeddingInput] = []
        budget = max(self.n_batch // 4, len(self.waiting[0].token_ids)) if contended else self.n_batch
        rest: list[EmbeddingInput] = []
        pooling = self.waiting[0].job.pooling
        for item in self.waiting:
            if item.job.pooling == pooling and len(packed) < self.n_seq_max and len(item.token_ids) <= budget:
                packed.append(item)
                budget -= len(item.token_ids)
            else:
                rest.append(item)
        self.waiting = rest
        return packed

    def record_step(self, items: list[EmbeddingInput]) -> None:
        self.n_steps += 1
        self.n_inputs += len(items)
        self.n_tokens += sum(len(i.token_ids) for i in items)
        for job in {id(i.job): i.job for i in items}.values():
            job.n_steps += 1

    def drop(self, request_id: str) -> list[EmbeddingJob]:
        """Remove a cancelled request's waiting inputs; its job, if it had any."""
        jobs = {id(i.job): i.job for i in self.waiting if i.job.request.request_id == request_id}
        self.waiting = [i for i in self.waiting if i.job.request.request_id != request_id]
        return list(jobs.values())

    def stats(self) -> dict[str, float | int]:
        steps = max(self.n_steps, 1)
        return {"embedding_inputs": self.n_inputs, "embedding_tokens": self.n_tokens, "embedding_steps": self.n_steps,
                "embedding_waiting": len(self.waiting),
                "embedding_inputs_per_step": round(self.n_inputs / steps, 3),
                "embedding_packing_efficiency": round(self.n_tokens / (steps * self.n_batch), 4)}

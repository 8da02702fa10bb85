"""One request's progress through the scheduler (``Sequence``) and one step's plan (``Chunk``s and
``StepPlan``): pure data, built and read on the batcher's thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamactor.base.adapters import BASE, AdapterSet, adapter_scope
from llamactor.base.messages import Generate
from llamactor.scheduling.fairness import GENERATE, SCORE
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prompt_scores import ScoreState
from llamactor.scheduling.tier_index import RestoreOp


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's progress. ``token_ids`` is prompt + generated; ``n_past`` of them are in KV."""

    request: Generate
    token_ids: list[int]
    n_prompt: int
    seq_id: int = -1  # -1 while waiting
    n_past: int = 0
    n_cached: int = 0  # prompt tokens attached from a shared prefix instead of computed (first admission)
    n_preempted: int = 0
    n_resumed: int = 0  # batchers that took it over from a crashed one (its tokens so far recomputed)
    admitted_at: float | None = None
    first_token_at: float | None = None
    state: Any = None  # the batcher's per-request decode state; opaque here
    scoring: ScoreState | None = None  # prompt log-probabilities wanted: which rows, what they said
    prompt_only: bool = False  # max_tokens 0: done once the prompt is in KV, nothing sampled
    # Label scoring (``Generate.label_token_ids``): the groups whose share of probability its last
    # prompt row gives, and that share once read (it is prompt-only: nothing is sampled).
    labels: tuple[tuple[int, ...], ...] = ()
    label_probs: tuple[float, ...] | None = None
    # The tokens worth keeping as a cached prefix when it ends; None: all. A rerank document's
    # label sequence keeps only the context it shares with the rerank's other documents: its own
    # tokens follow one query and are one-off, and cached cells cost every step's attention (a
    # unified KV cache's masked cells are still scanned), so they are freed at once.
    cache_upto: int | None = None
    # Read off its (frozen) request once: the scheduler asks for them several times a row a step.
    tenant: str = field(init=False, repr=False)  # its tenant's name
    weight: float = field(init=False, repr=False)  # its tenant's fair-share weight
    adapters: AdapterSet = field(init=False, repr=False)  # the LoRA adapter set it decodes under (``adapter_turns``)
    submitted_at: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        request = self.request
        self.tenant, self.weight = request.tenant.name, request.tenant.weight
        self.adapters, self.submitted_at = request.lora, request.submitted_at
        if not 0 < self.n_prompt <= len(self.token_ids):
            raise ValueError(f"n_prompt {self.n_prompt} out of range for {len(self.token_ids)} tokens")
        if self.scoring is not None and self.scoring.n_prompt != self.n_prompt:
            raise ValueError("the scoring state must cover this sequence's prompt")
        if self.labels and not self.prompt_only:
            raise ValueError("a label sequence is prompt-only")

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def scope(self) -> str:
        """The cache scope of its tenant under its adapter set: the cached prefixes, lower tiers
        and scores it may use (KV computed under other adapters is not its KV)."""
        return adapter_scope(self.request.tenant.scope, self.request.lora)

    @property
    def max_running(self) -> int | None:
        return self.request.tenant.max_running

    @property
    def work_class(self) -> str:
        """Which class of its tenant's work it is, for fairness: prompt or label scoring, or generation."""
        return SCORE if self.scoring is not None or self.labels else GENERATE

    @property
    def n_generated(self) -> int:
        return len(self.token_ids) - self.n_prompt

    @property
    def n_unprocessed(self) -> int:
        """Tokens not yet in KV: the rest of the prompt, or the one token sampled last step."""
        return len(self.token_ids) - self.n_past


@dataclass(frozen=True, slots=True)
class Chunk:
    """``n_tokens`` of ``seq``'s unprocessed tokens, from position ``seq.n_past``, in this step;
    positions ``[score_lo, score_hi)`` among them are prompt rows whose logits scoring needs, and
    its last row is an output row when it samples or reads labels. ``drafts``: tokens expected to
    follow, verified in the same decode (a row with logits each, after the chunk's last row: only
    on a chunk that samples; docs/architecture.md, *Speculation*).

    What the chunk does with its rows (``samples``, ``reads_labels``, ``output_last``,
    ``n_score_rows``) is decided when it is planned, from ``seq`` as it stands then, and kept:
    packing, drafts, the batch's rows, its output rows and the graph chains each read it once
    per row per step (a property re-derived it ~10 times a row). Read it for the step it was
    planned for: once ``n_past`` moves on, ``seq`` has outgrown the chunk."""

    seq: Sequence
    n_tokens: int
    score_lo: int = 0
    score_hi: int = 0
    drafts: tuple[int, ...] = ()
    # True when the chunk reaches the last known token, so its logits are sampled.
    samples: bool = field(init=False, repr=False, compare=False)
    # True when the chunk reaches the end of a label sequence's prompt: its last row is read.
    reads_labels: bool = field(init=False, repr=False, compare=False)
    # Whether its last row leaves llama.cpp after its scoring rows (to sample or read labels).
    output_last: bool = field(init=False, repr=False, compare=False)
    n_score_rows: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seq, end = self.seq, self.seq.n_past + self.n_tokens
        if self.score_hi > self.score_lo and not (seq.n_past <= self.score_lo and self.score_hi <= end):
            raise ValueError("a chunk's score rows must lie inside it")
        samples = end == len(seq.token_ids) and not seq.prompt_only
        reads_labels = bool(seq.labels) and end == seq.n_prompt
        if self.drafts and not samples:
            raise ValueError("only a chunk that samples carries drafts")
        object.__setattr__(self, "samples", samples)  # frozen: set once, here
        object.__setattr__(self, "reads_labels", reads_labels)
        object.__setattr__(self, "output_last", samples or reads_labels)
        object.__setattr__(self, "n_score_rows", self.score_hi - self.score_lo)


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # back among the waiting, KV released
    failed: list[Sequence] = field(default_factory=list)  # cannot fit even alone: to end with an error
    kv_ops: list[KvOp | RestoreOp] = field(default_factory=list)  # to apply, in order, before the decode
    adapters: AdapterSet = BASE  # the LoRA adapter set every chunk's sequence decodes under
    flushed: bool = False  # every running sequence preempted, every unpinned entry dropped (packed_kv)

    @property
    def n_rows(self) -> int:
        """The step's batch rows: its chunks' tokens and their drafts."""
        return sum(c.n_tokens + len(c.drafts) for c in self.chunks)

    def rows(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """The step's batch as (tokens, positions, seq_ids, wants_logits): each chunk's tokens
        from its ``n_past``, logits on its scoring rows and on the last row of a chunk that
        samples or reads labels (``Chunk.output_last``), then its drafts, each with logits
        (``OutputRows.of`` reads the same layout)."""
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        wants: list[int] = []
        for chunk in self.chunks:
            seq, n = chunk.seq, chunk.n_tokens
            tokens += seq.token_ids[seq.n_past:seq.n_past + n]
            positions += range(seq.n_past, seq.n_past + n)
            seq_ids += [seq.seq_id] * n
            if chunk.n_score_rows:
                lo, hi = chunk.score_lo - seq.n_past, chunk.score_hi - seq.n_past
                wants += [0] * lo + [1] * (hi - lo) + [0] * (n - hi)
                wants[-1] = wants[-1] or int(chunk.output_last)
            else:
                wants += [0] * (n - 1) + [int(chunk.output_last)]
            if chunk.drafts:
                end = seq.n_past + n
                tokens += chunk.drafts
                positions += range(end, end + len(chunk.drafts))
                seq_ids += [seq.seq_id] * len(chunk.drafts)
                wants += [1] * len(chunk.drafts)
        return tokens, positions, seq_ids, wants

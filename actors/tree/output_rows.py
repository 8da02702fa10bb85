"""Where a generation step's output rows go (batcher thread).

llama.cpp returns one logits row per flagged batch entry, in batch order: chunk by chunk, a
chunk's prompt rows for scoring (``Chunk.score_lo .. score_hi``), then its last row when it
samples (it reaches its last known token) or reads labels (it ends a label sequence's prompt),
as ``StepPlan.rows`` flags them, then one row per draft of a chunk that drafted. ``OutputRows`` maps them; ``record_scores`` reduces the scoring
rows into each sequence's ``ScoreState`` and ``record_labels`` each label row to its groups'
probabilities, both from views of llama.cpp's output buffer, never copied or kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llamactor.native.scoring import label_probs, score_rows
from llamactor.scheduling.prompt_scores import PromptScore
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan


@dataclass(slots=True)
class OutputRows:
    scored: list[tuple[Chunk, int]] = field(default_factory=list)  # (chunk, its first output row)
    sample_rows: list[int] = field(default_factory=list)
    to_sample: list[Sequence] = field(default_factory=list)  # the sequence of each sampling row
    label_rows: list[tuple[Sequence, int]] = field(default_factory=list)  # (label sequence, its output row)
    # A sequence with drafts: the output row of its first draft, and the drafts (``draft_verify``)
    drafted: dict[Sequence, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: StepPlan, failed_seq_ids: frozenset[int]) -> OutputRows:
        """The layout of ``plan``'s outputs, leaving out sequences whose decode failed. Call it
        before ``n_past`` moves on: whether a chunk samples depends on it."""
        out, row = cls(), 0
        for chunk in plan.chunks:
            ok = chunk.seq.seq_id not in failed_seq_ids
            if chunk.n_score_rows:
                if ok:
                    out.scored.append((chunk, row))
                row += chunk.n_score_rows
            if chunk.samples and ok:
                out.sample_rows.append(row)
                out.to_sample.append(chunk.seq)
            elif chunk.reads_labels and ok:
                out.label_rows.append((chunk.seq, row))
            row += int(chunk.output_last)
            if chunk.drafts and ok:
                out.drafted[chunk.seq] = (row, chunk.drafts)
            row += len(chunk.drafts)
        return out


def record_scores(scored: list[tuple[Chunk, int]], logits: np.ndarray) -> int:
    """Reduce each chunk's prompt rows to the logprob of the token that follows, its rank and the
    top alternatives, and record them; returns the rows reduced."""
    n_rows = 0
    for chunk, first in scored:
        seq, scoring = chunk.seq, chunk.seq.scoring
        assert scoring is not None
        positions = range(chunk.score_lo, chunk.score_hi)
        out = score_rows(logits[first:first + len(positions)], [seq.token_ids[p + 1] for p in positions],
                         scoring.n_top)
        for i, p in enumerate(positions):
            scoring.record(p, PromptScore(out.logprobs[i], out.ranks[i], tuple(out.top_ids[i]),
                                          tuple(out.top_logprobs[i])))
        n_rows += len(positions)
    return n_rows


def record_labels(label_rows: list[tuple[Sequence, int]], logits: np.ndarray) -> int:
    """Read each label sequence's groups off its row (``Sequence.label_probs``); returns the rows read."""
    for seq, row in label_rows:
        seq.label_probs = label_probs(logits[row], seq.labels)
    return len(label_rows)

"""One step's token budget, packed (pure: no threads, no I/O; the scheduler calls it on the
batcher's thread): one decode token per generating sequence first, then prompt chunks in the
order given (fairness, then urgency), so a long prompt is prefilled over several steps instead of
stalling the others; scoring prompts last, within the row budget and, beside other work, the
scoring share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamactor.scheduling.prompt_scores import ROW_COST, fit_chunk
from llamactor.scheduling.sequence import Chunk, Sequence


def pack_step(running: list[Sequence], n_batch: int, score_rows: int, score_share: float,
              order: Callable[[Sequence], Any]) -> list[Chunk]:
    """The chunks of one step within ``n_batch`` tokens; ``order`` sorts the prompts to compute."""
    chunks: list[Chunk] = []
    budget = n_batch
    prefilling: list[Sequence] = []
    scoring: list[Sequence] = []
    for seq in running:
        if seq.n_unprocessed == 1 and (seq.scoring is None or seq.scoring.done):
            chunks.append(Chunk(seq, 1))
            budget -= 1
        else:
            (prefilling if seq.scoring is None else scoring).append(seq)
    for seq in sorted(prefilling, key=order):
        if budget <= 0:
            break
        n = min(seq.n_unprocessed, budget)
        chunks.append(Chunk(seq, n))
        budget -= n
    rows, units = score_rows, scoring_units(chunks, score_share)
    for seq in sorted(scoring, key=order):
        if budget <= 0:
            break
        assert seq.scoring is not None
        n, lo, hi = fit_chunk(seq.scoring, seq.n_past, min(seq.n_unprocessed, budget), rows, units)
        if n == 0:
            continue
        chunks.append(Chunk(seq, n, lo, hi))
        budget, rows = budget - n, rows - (hi - lo)
        if units is not None:
            units -= n + ROW_COST * (hi - lo)
    return chunks


def scoring_units(chunks: list[Chunk], score_share: float) -> int | None:
    """What scoring may add to a step beside other work (tokens + ``ROW_COST`` per row): the
    scoring share of that work, at least one row's worth; None when there is no other work."""
    other = sum(c.n_tokens + ROW_COST * c.samples for c in chunks if c.seq.scoring is None)
    return max(1 + ROW_COST, int(score_share * other)) if other else None

"""One step's token budget, packed (pure: no threads, no I/O; the scheduler calls it on the
batcher's thread): one decode token per generating sequence first, then prompt chunks in the
order given (fairness, then urgency), so a long prompt is prefilled over several steps instead of
stalling the others; scoring prompts last -- prompt log-probabilities and label sequences (a
rerank's documents) alike -- within the row budget and, beside other work, the scoring share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llamactor.scheduling.prompt_scores import ROW_COST, fit_chunk
from llamactor.scheduling.sequence import Chunk, Sequence


def pack_step(running: list[Sequence], n_batch: int, score_rows: int, score_share: float,
              order: Callable[[Sequence], Any], row_cost: float = ROW_COST) -> list[Chunk]:
    """The chunks of one step within ``n_batch`` tokens; ``order`` sorts the prompts to compute;
    ``row_cost``: a logits row in prompt tokens of compute (``logits_row_cost``)."""
    chunks: list[Chunk] = []
    budget = n_batch
    prefilling: list[Sequence] = []
    scoring: list[Sequence] = []
    for seq in running:
        if seq.n_unprocessed == 1 and (seq.scoring is None or seq.scoring.done):
            chunks.append(Chunk(seq, 1))
            budget -= 1
        else:
            (prefilling if seq.scoring is None and not seq.labels else scoring).append(seq)
    for seq in sorted(prefilling, key=order):
        if budget <= 0:
            break
        n = min(seq.n_unprocessed, budget)
        chunks.append(Chunk(seq, n))
        budget -= n
    rows, units = score_rows, scoring_units(chunks, score_share, row_cost)
    for seq in sorted(scoring, key=order):
        if budget <= 0:
            break
        n, lo, hi = fit_scoring_chunk(seq, min(seq.n_unprocessed, budget), rows, units, row_cost)
        if n == 0:
            continue
        chunk = Chunk(seq, n, lo, hi)
        chunks.append(chunk)
        budget, rows = budget - n, rows - (hi - lo)
        if units is not None:
            units -= n + row_cost * (hi - lo + chunk.reads_labels)
    return chunks


def fit_scoring_chunk(seq: Sequence, n: int, rows_left: int, units_left: float | None,
                      row_cost: float = ROW_COST) -> tuple[int, int, int]:
    """A scoring sequence's chunk of at most ``n`` tokens (``fit_chunk``): ``(n, lo, hi)``. A label
    sequence's last row is one more row of cost (its prompt rows, if also scored, are fitted on
    their own: the label row comes after them)."""
    if seq.scoring is not None:
        return fit_chunk(seq.scoring, seq.n_past, n, rows_left, units_left, row_cost)
    if units_left is not None and n + row_cost * (seq.n_past + n == seq.n_prompt) > units_left:
        n = min(n, int(units_left), seq.n_unprocessed - 1)  # short of the row: it comes in a later step
    return (max(n, 0), 0, 0)


def scoring_units(chunks: list[Chunk], score_share: float, row_cost: float = ROW_COST) -> float | None:
    """What scoring may add to a step beside other work (tokens + ``row_cost`` per row): the
    scoring share of that work, at least one row's worth; None when there is no other work."""
    other = sum(c.n_tokens + row_cost * c.samples for c in chunks if c.seq.scoring is None and not c.seq.labels)
    return max(1 + row_cost, float(int(score_share * other))) if other else None

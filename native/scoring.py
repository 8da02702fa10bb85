"""Prompt scoring's reductions: for each prompt row llama.cpp returned, the next prompt token's
log-probability, its rank and the most likely tokens; for a label row, its groups' probabilities.

A step can carry 64 such rows of 262k logits. Each row is reduced on its own, in numpy: one
log-sum-exp pass, one ``count_nonzero`` for the rank and ``sampling.top_candidates`` for the top
``k`` (no sort of the vocabulary). Measured on this machine against torch's batched
``logsumexp`` / comparison-sum / ``topk`` over the same rows: 0.5-0.6 vs 0.4-1.0 ms a row, and
torch costs ~185 MiB of resident memory and 1.4 s to import, which a scoring daemon then paid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llamactor.native.sampling import log_sum_exp, top_candidates


@dataclass(slots=True)
class ScoredRows:
    """Prompt rows reduced in the step: per row the given token's log-probability, and the
    ``n_top`` most likely tokens with theirs (``top_ids`` / ``top_logprobs`` [rows, n_top])."""

    logprobs: list[float]
    ranks: list[int]  # 1 + how many tokens are more likely than the given one
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


def score_rows(logits: np.ndarray, chosen: list[int], n_top: int) -> ScoredRows:
    """Log-probabilities of ``chosen[i]`` under row ``i`` of ``logits`` ([rows, vocab] float32, raw:
    no bias, penalty or grammar applies to a prompt), and each row's ``n_top`` best.

    Rows are views of llama.cpp's output buffer: none is copied or kept past the step. The chosen
    token's logprob and the top ones come out of the same subtraction, so a chosen token that is
    the argmax has exactly the top value (lm-eval's greedy check compares them)."""
    out = ScoredRows([], [], [], [])
    for row, token in zip(logits, chosen):
        lse = log_sum_exp(row)
        picked = row[token]
        out.logprobs.append(float(picked) - lse)
        out.ranks.append(int(np.count_nonzero(row > picked)) + 1)
        vals, ids = top_candidates(row, n_top) if n_top else (row[:0], np.empty(0, np.int64))
        out.top_ids.append(ids.tolist())
        out.top_logprobs.append([float(v) - lse for v in vals])
    return out


def label_probs(row: np.ndarray, groups: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """Each group's share of the probability its token ids hold in ``row`` (raw logits): with
    mass_g = sum of exp(logit) over the group's ids, mass_g / sum of the masses -- a softmax over
    groups, so the vocabulary's normalizer cancels and only the groups' logits are read (fancy
    indexing gathers those few floats of the row, a view of llama.cpp's buffer; no log-sum-exp over
    the vocabulary). Exponents are taken from the largest of those logits, in float64."""
    picked = [row[list(ids)].astype(np.float64) for ids in groups]
    top = max(float(p.max()) for p in picked)
    masses = [float(np.exp(p - top).sum()) for p in picked]
    total = sum(masses)  # >= 1: the largest logit's own term
    return tuple(m / total for m in masses)

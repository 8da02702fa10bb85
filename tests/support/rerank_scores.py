"""Rerank scores compared across requests: two requests' batches differ in shape, and llama.cpp's
kernels with them (tests/conftest.py, ``NEAR_TIE``), so one document's score may move a little
and two near-equal documents may swap."""

from __future__ import annotations

import math

from tests.conftest import NEAR_TIE


def same_score(a: float, b: float) -> bool:
    """One document's probability in two requests: their batches differ in shape, and llama.cpp's
    kernels with them (tests/conftest.py, NEAR_TIE: each logit by up to that much), so the log-odds
    may differ by up to twice it."""
    def log_odds(p: float) -> float:
        p = min(max(p, 1e-9), 1 - 1e-9)
        return math.log(p / (1 - p))
    return abs(log_odds(a) - log_odds(b)) <= 2 * NEAR_TIE


def assert_ranked(pairs: list[tuple[int, float]], reference: dict[int, float], n: int) -> None:
    """``n`` distinct documents, best first, each with its reference score (up to ``same_score``),
    none kept that scored clearly below one left out."""
    indices = [i for i, _ in pairs]
    assert len(pairs) == n and len(set(indices)) == n and set(indices) <= set(reference)
    scores = [s for _, s in pairs]
    assert all(0.0 <= s <= 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    assert all(same_score(score, reference[index]) for index, score in pairs), (pairs, reference)
    dropped = [reference[i] for i in reference if i not in indices]
    assert all(same_score(reference[i], min(reference[i], d)) for i in indices for d in dropped)

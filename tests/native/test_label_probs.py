"""The label reduction (``native/scoring.label_probs``): the groups' share of a row's probability,
from their logits alone, equal to the full softmax's sums (pure numpy; the real engine's rows
against llama-cpp-python: tests/tree/test_label_scoring.py)."""

from __future__ import annotations

import numpy as np
import pytest

from llamactor.native.scoring import label_probs

pytestmark = pytest.mark.pure


def softmax_shares(row: np.ndarray, groups: list[list[int]]) -> list[float]:
    """The reference: the whole vocabulary's softmax, each group's probabilities summed, renormalized."""
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    mass = [p[g].sum() for g in groups]
    return [m / sum(mass) for m in mass]


@pytest.mark.parametrize("seed", range(5))
def test_the_shares_equal_the_full_softmax_summed_over_each_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(50_000) * 4).astype(np.float32)
    groups = [list(rng.choice(50_000, size=k, replace=False)) for k in (1, 3, 4)]
    got = label_probs(row, groups)
    assert got == pytest.approx(softmax_shares(row, groups), rel=1e-9)
    assert sum(got) == pytest.approx(1.0, abs=1e-12)


def test_two_single_token_groups_are_the_sigmoid_of_the_logit_difference() -> None:
    row = np.zeros(10, np.float32)
    row[3], row[7] = 2.5, -1.0  # yes, no
    yes, no = label_probs(row, [[3], [7]])
    assert yes == pytest.approx(1 / (1 + np.exp(-3.5)), rel=1e-12) and no == pytest.approx(1 - yes)


def test_huge_and_tiny_logits_neither_overflow_nor_vanish() -> None:
    row = np.full(8, -1e4, np.float32)
    row[0], row[1] = 3e4, 3e4 - 2.0  # exp of either alone overflows float64
    got = label_probs(row, [[0], [1, 2]])
    assert got[0] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-12) and np.isfinite(got).all()
    assert label_probs(row, [[2], [3]]) == pytest.approx((0.5, 0.5))  # far below the row's top: still a share


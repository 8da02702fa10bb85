"""A ranking head's outputs as relevance in [0, 1] (``rank_scores``), pure."""

from __future__ import annotations

import numpy as np
import pytest

from llamactor.native.embedding import rank_scores

pytestmark = pytest.mark.pure


def test_one_label_is_a_logit_read_through_a_sigmoid() -> None:
    scores = rank_scores(np.array([[0.0], [2.0], [-10.9]], dtype=np.float32), softmax_in_graph=False)
    np.testing.assert_allclose(scores, [0.5, 1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(10.9))], rtol=1e-6)


def test_a_graph_that_ends_in_a_softmax_gives_its_first_label_as_it_is() -> None:
    outputs = np.array([[0.8, 0.2], [0.1, 0.9]], dtype=np.float32)
    np.testing.assert_allclose(rank_scores(outputs, softmax_in_graph=True), outputs[:, 0], rtol=1e-7)


def test_several_labels_elsewhere_are_a_softmax_and_label_zero_is_relevant() -> None:
    outputs = np.array([[3.0, 1.0], [1000.0, 1000.0]], dtype=np.float32)
    np.testing.assert_allclose(rank_scores(outputs, softmax_in_graph=False),
                               [np.exp(3) / (np.exp(3) + np.exp(1)), 0.5], rtol=1e-12)  # no overflow at 1000

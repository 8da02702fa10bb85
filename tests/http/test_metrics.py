"""The speculation and overlapped-step series of /metrics without a model: the batchers' draft counters read from each
replica's stats (absent from a batcher that does not draft), and the drafted tokens of finished
requests' usage by model and dialect. The daemon's own scrape is tests/http/test_prediction.py."""

from __future__ import annotations

import dataclasses

import pytest

from llamactor.base.completion import Usage
from llamactor.http.metrics import Metrics, ReplicaStats

from tests.support.daemon import metric
from tests.support.dialects import completion

pytestmark = pytest.mark.pure

DRAFTING = {"state": "ready", "proposed_draft_tokens": 64, "draft_tokens": 40, "accepted_draft_tokens": 31,
            "rejected_draft_tokens": 9}
REPLICA = r'\{model="m",replica="%d"\}'


def test_the_batchers_draft_counters_are_spec_decode_series_per_replica_and_absent_until_published() -> None:
    replicas: ReplicaStats = [("m", 0, DRAFTING), ("m", 1, {"state": "ready"})]
    text = Metrics(lambda: replicas).render().decode()
    for name, value in (("proposed", 64), ("draft", 40), ("accepted", 31), ("rejected", 9)):
        series = f"llamactor_spec_decode_{name}_tokens_total"
        assert metric(text, series + REPLICA % 0) == value
        assert f'{series}{{model="m",replica="1"}}' not in text  # that batcher publishes no draft counters


def test_finished_requests_add_their_accepted_and_rejected_prediction_tokens_by_model_and_dialect() -> None:
    metrics = Metrics(lambda: [])
    observe = metrics.observer("m", "openai", "default")
    observe(dataclasses.replace(completion("x"), usage=Usage(20, 5, 8, accepted_prediction_tokens=12,
                                                             rejected_prediction_tokens=3)))
    observe(completion("no drafts"))
    text = metrics.render().decode()
    assert metric(text, r'llamactor_accepted_prediction_tokens_total\{dialect="openai",model="m"\}') == 12
    assert metric(text, r'llamactor_rejected_prediction_tokens_total\{dialect="openai",model="m"\}') == 3


def test_the_overlapped_loops_counters_are_per_replica_series() -> None:
    replicas: ReplicaStats = [("m", 0, {"state": "ready", "steps_planned_ahead": 120, "rows_dropped": 3})]
    text = Metrics(lambda: replicas).render().decode()
    assert metric(text, "llamactor_overlap_steps_planned_ahead_total" + REPLICA % 0) == 120
    assert metric(text, "llamactor_overlap_rows_dropped_total" + REPLICA % 0) == 3


def test_the_graph_samplers_counters_are_per_replica_series() -> None:
    replicas: ReplicaStats = [("m", 0, {"state": "ready", "tokens_sampled_in_graph": 900, "graph_chain_changes": 12,
                                        "graph_chains_adopted": 5})]
    text = Metrics(lambda: replicas).render().decode()
    assert metric(text, "llamactor_tokens_sampled_in_graph_total" + REPLICA % 0) == 900
    assert metric(text, "llamactor_graph_chain_changes_total" + REPLICA % 0) == 12
    assert metric(text, "llamactor_graph_chains_adopted_total" + REPLICA % 0) == 5

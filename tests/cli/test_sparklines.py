"""``llamactor top``'s sparklines (``llamactor.cli.sparklines``): pure, no daemon."""

from __future__ import annotations

import pytest

from llamactor.cli.sparklines import BARS, History, sparkline
from llamactor.http.live_snapshot import Figures

pytestmark = pytest.mark.pure


def test_each_value_is_a_bar_as_high_as_its_share_of_the_highest() -> None:
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8], 8) == BARS
    assert sparkline([0, 4, 8], 10) == " ▄█"  # fewer values than columns: one column each, no padding


def test_zero_is_blank_and_any_value_above_zero_shows() -> None:
    assert sparkline([0, 0.001, 1000], 3) == " ▁█"  # one cache hit among many still shows
    assert sparkline([0, 0, 0], 3) == "   " and sparkline([], 5) == ""


def test_a_fixed_top_scales_a_ratio_against_one_not_against_its_highest() -> None:
    assert sparkline([0.25, 0.5], 2, top=1.0) == "▂▄"
    assert sparkline([0.25, 0.5], 2) == "▄█"
    assert sparkline([2.0], 1, top=1.0) == "█"  # above the top: the full bar, never an index error


def test_more_values_than_columns_keep_each_columns_peak() -> None:
    values = [0.0] * 100
    values[37] = 5.0  # one spike among a hundred samples, drawn in twenty columns
    line = sparkline(values, 20)
    assert len(line) == 20 and line.count("█") == 1 and line.strip() == "█"
    assert line.index("█") == 7  # column 7 holds samples 35..39
    assert sparkline(list(range(1, 9)) * 10, 8) == "█" * 8  # every column's share holds an 8


def test_history_keeps_the_last_window_of_snapshots_by_series() -> None:
    history = History(interval_s=1.0, window_s=3.0)
    for n in range(5):
        history.add(Figures(running=n, kv_use=n / 10))
    assert history.series("running") == [2.0, 3.0, 4.0]  # three seconds of one-second snapshots
    assert history.series("kv_use") == [0.2, 0.3, 0.4]
    assert History(interval_s=10.0, window_s=1.0).samples.maxlen == 1

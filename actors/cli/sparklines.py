"""``llamactor top``'s curves: the last minutes of the live view's figures as unicode sparklines
(``▁▂▃▄▅▆▇█``), what ``/ui/engine`` draws as charts. Pure: ``History`` keeps the recent snapshots'
figures (the server keeps none), ``sparkline`` draws one series; the command's main thread calls both.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

from llamactor.http.live_snapshot import Figures

BARS = "▁▂▃▄▅▆▇█"
WINDOW_S = 300.0  # what the curves cover: the last five minutes, as the page's charts
# the series top draws, in the page's order: (label, the Figures field, a fixed top: 1 for a ratio)
SERIES: tuple[tuple[str, str, float | None], ...] = (
    ("tokens/s", "tokens_per_s", None), ("prompt tokens/s", "prompt_tokens_per_s", None),
    ("running", "running", None), ("waiting", "waiting", None), ("KV use", "kv_use", 1.0),
    ("cache hits/s", "prefix_hits_per_s", None), ("rows: decode", "rows_decode", None),
    ("rows: prefill", "rows_prefill", None), ("rows: scoring", "rows_scoring", None),
    ("rows: embedding", "rows_embedding", None))


def sparkline(values: Sequence[float], width: int, top: float | None = None) -> str:
    """``values`` (oldest first) as at most ``width`` characters, the newest on the right. More
    values than columns: each column shows the highest of its share (a peak is never averaged
    away). A bar's height is its value over ``top`` (default: the highest value); zero or less is
    a blank, any value above zero at least ``▁``, so one cache hit shows."""
    columns = _columns(values, width)
    highest = top if top is not None else max(columns, default=0.0)
    return "".join(_bar(v, highest) for v in columns)


def _columns(values: Sequence[float], width: int) -> list[float]:
    if len(values) <= width:
        return list(values)
    edges = [round(i * len(values) / width) for i in range(width + 1)]
    return [max(values[a:b]) for a, b in zip(edges, edges[1:])]


def _bar(value: float, top: float) -> str:
    if value <= 0 or top <= 0:
        return " "
    return BARS[min(len(BARS), max(1, math.ceil(len(BARS) * value / top))) - 1]


class History:
    """The figures of the snapshots of the last ``window_s`` seconds, by series, oldest first."""

    def __init__(self, interval_s: float, window_s: float = WINDOW_S) -> None:
        self.interval_s = interval_s
        self.samples: collections.deque[Figures] = collections.deque(maxlen=max(1, round(window_s / interval_s)))

    def add(self, figures: Figures) -> None:
        self.samples.append(figures)

    def series(self, field: str) -> list[float]:
        return [float(getattr(f, field)) for f in self.samples]

"""How many drafted tokens a step verifies: only the rows that raise the step's throughput.

A step's time grows with its rows: a fixed part (reading the weights once per decode) and a part
per row (``StepCost``, fitted from the steps the batcher times). Verifying ``d`` drafted tokens
adds ``d`` rows, ``cost.ms(n + d) - cost.ms(n)`` more milliseconds; a sequence's ``i``-th drafted
token is emitted with probability ``acceptance ** i`` (only if every token before it was accepted).
``plan_drafts`` adds rows greedily, the most promising first, while the step's expected useful
rows per millisecond (each row without drafts is one: a prompt token computed or a token emitted)
still rise. At one stream the fixed part dominates and drafts pay; at high concurrency the rows are
already many, the per-row part dominates, and no drafts are planned (docs/architecture.md,
*Speculation*).

Pure: no clock; the batcher thread records each step's time and plans the next step's drafts.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 128  # the steps the fit is made of: recent ones, so it follows the engine's load
MIN_STEPS = 8  # fewer recorded steps: the prior's shape at the observed level
# A step's cost before anything is known, in shape only (its level comes from the steps timed):
# optimistic about rows, so a first draft is tried and its real cost measured.
PRIOR_FIXED_MS = 10.0
PRIOR_ROW_MS = 0.1
OUTLIER_MADS = 5.0  # steps further than this from the first fit are left out of the second
# A draft row must raise the step's expected throughput by at least this share: break-even rows
# (a fit's rounding away from no fixed part) are not worth their KV cells.
MIN_GAIN = 1e-4


@dataclass(frozen=True, slots=True)
class Line:
    fixed: float
    per_row: float

    def ms(self, n_rows: int) -> float:
        return self.fixed + self.per_row * n_rows


class StepCost:
    """A step's expected milliseconds as ``fixed + per_row * rows`` (batcher thread).

    Least squares over the last ``WINDOW`` steps, refitted without the outliers of a first fit
    (a step stalled by the host), constrained to be non-negative and non-decreasing in rows. While
    the steps seen are too few, or all of about one size (one stream decoding: every step one row),
    the prior's shape is kept, scaled to the steps' average time."""

    def __init__(self, prior: Line = Line(PRIOR_FIXED_MS, PRIOR_ROW_MS)) -> None:
        self.prior = prior
        self.steps: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self._line: Line | None = None  # the fit, until a step is recorded

    def record(self, n_rows: int, ms: float) -> None:
        if n_rows >= 1 and ms >= 0:
            self.steps.append((n_rows, ms))
            self._line = None

    def ms(self, n_rows: int) -> float:
        return self.line().ms(n_rows)

    def line(self) -> Line:
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> Line:
        steps = list(self.steps)
        if len(steps) < MIN_STEPS or len({n for n, _ in steps}) < 2:
            return self._prior_at_level(steps)
        first = least_squares(steps)
        residuals = [abs(ms - first.ms(n)) for n, ms in steps]
        spread = statistics.median(residuals) * OUTLIER_MADS
        kept = [step for step, r in zip(steps, residuals) if r <= spread] if spread > 0 else steps
        if len(kept) < MIN_STEPS or len({n for n, _ in kept}) < 2:
            return first
        return least_squares(kept)

    def _prior_at_level(self, steps: list[tuple[int, float]]) -> Line:
        if not steps:
            return self.prior
        level = statistics.median(ms for _, ms in steps)
        rows = statistics.median(n for n, _ in steps)
        scale = level / self.prior.ms(round(rows)) if self.prior.ms(round(rows)) > 0 else 1.0
        return Line(self.prior.fixed * scale, self.prior.per_row * scale)


def least_squares(steps: list[tuple[int, float]]) -> Line:
    """The line through ``(rows, ms)`` points, its parts kept non-negative."""
    mean_n = statistics.fmean(n for n, _ in steps)
    mean_ms = statistics.fmean(ms for _, ms in steps)
    var = sum((n - mean_n) ** 2 for n, _ in steps)
    slope = sum((n - mean_n) * (ms - mean_ms) for n, ms in steps) / var if var else 0.0
    if slope <= 0:
        return Line(max(mean_ms, 0.0), 0.0)
    fixed = mean_ms - slope * mean_n
    if fixed < 0:  # through the origin instead
        return Line(0.0, sum(n * ms for n, ms in steps) / sum(n * n for n, _ in steps))
    return Line(fixed, slope)


@dataclass(frozen=True)
class DraftWish:
    n_proposed: int  # draft tokens its drafter proposed (already cut to draft_max)
    acceptance: float  # the drafter's estimate


def plan_drafts(wishes: Sequence[DraftWish], n_rows: int, room: int, cost: StepCost) -> list[int]:
    """How many of each wish's drafted tokens this step verifies (same order), given the step's
    ``n_rows`` rows without drafts and ``room`` rows left in its token budget: rows are added in
    order of their expected tokens while the step's expected useful rows per ms rise; all zeros when
    the step is full or drafting does not pay (high concurrency)."""
    planned = [0] * len(wishes)
    if room <= 0:
        return planned
    useful, rows = float(n_rows), n_rows
    for value, index in _rows_by_value(wishes):
        if rows - n_rows >= room:
            break
        before, after = cost.ms(rows), cost.ms(rows + 1)
        if value <= 0 or (useful + value) * before <= useful * after * (1 + MIN_GAIN):  # no gain
            break
        planned[index] += 1
        useful += value
        rows += 1
    return planned


def _rows_by_value(wishes: Sequence[DraftWish]) -> list[tuple[float, int]]:
    """Every proposed draft row as (expected tokens, wish index), the most promising first (ties:
    the earlier wish first); a wish's rows come in order since ``acceptance ** i`` falls with i."""
    rows: list[tuple[float, int]] = []
    for index, wish in enumerate(wishes):
        p = min(max(wish.acceptance, 0.0), 1.0)
        rows.extend((p ** i, index) for i in range(1, max(wish.n_proposed, 0) + 1))
    return sorted(rows, key=lambda row: (-row[0], row[1]))

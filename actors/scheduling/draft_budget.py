"""How many drafted tokens a step verifies: only the rows whose expected saving beats their cost.

A decode step's time grows with its rows: a fixed part (reading the weights once per decode) and a
part per row (``StepCost``, fitted from the decode steps the batcher times: steps whose every row
has logits, as a draft row has -- a prompt's rows without logits cost a fraction of one, and would
make rows look cheap). Verifying a drafted token adds a row now: ``per_row`` more milliseconds. A
sequence's ``i``-th drafted token is accepted with probability ``acceptance ** i`` (only if every
token before it was), and an accepted token saves what emitting it later would have cost: its row,
and its ``share`` of a step's fixed part -- the step it makes unnecessary, shared by the sequences
that must all get ahead before the batch takes one step fewer (``DraftWish.share``). ``plan_drafts``
adds rows greedily, the most valuable first, while a row's expected saving beats its cost. At one
stream the fixed part dominates and drafts pay; at high concurrency a row's share of the fixed part
is small, and no drafts are planned (docs/architecture.md, *Speculation*).

Measured, never assumed: until the steps timed span two row counts (``StepCost.measured``) nothing
is drafted but a probe -- a step of ``PROBE_ROWS`` drafted rows more than the steps seen, so that the
next fit has a slope. The window forgets, so a batcher that stopped drafting probes again now and
then (three steps in ``WINDOW``) and follows the engine's load.

A drafter's acceptance is measured too: one that has had nothing accepted yet (``DraftWish.unproven``)
is judged on its first row as if it were ``HOPEFUL``. A request's drafter starts at a prior (the
n-gram drafter's is 0.5); where a row costs about what a step's fixed part does (a loaded CPU), no
row pays at the prior, nothing is verified, and the estimate never learns that the request quotes
its prompt word for word. Its cost is bounded: a row a step until a token is accepted or the
drafter's back-off rests it.

Pure: no clock; the batcher thread records each step's time and plans the next step's drafts.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 128  # the steps the fit is made of: recent ones, so it follows the engine's load
MIN_STEPS = 8  # fewer recorded steps: no outliers left out of the fit
OUTLIER_MADS = 5.0  # steps further than this from the first fit are left out of the second
# Evidence before the fit is used: steps at two row counts this far apart, this many at each.
PROBE_ROWS = 4
PROBES = 3  # the median of three: one stalled probe does not decide
# A draft row's expected saving must beat its cost by this share: break-even rows (a fit's
# rounding away from no fixed part) are not worth their KV cells.
MIN_GAIN = 1e-4
# The acceptance an unproven drafter's first row is judged at: as likely as a caller's prediction.
HOPEFUL = 0.9


@dataclass(frozen=True, slots=True)
class Line:
    fixed: float
    per_row: float

    def ms(self, n_rows: int) -> float:
        return self.fixed + self.per_row * n_rows


class StepCost:
    """A decode step's expected milliseconds as ``fixed + per_row * rows`` (batcher thread).

    Least squares over the last ``WINDOW`` steps, refitted without the outliers of a first fit
    (a step stalled by the host), constrained to be non-negative and non-decreasing in rows. Until
    the steps are ``measured`` (two row counts, ``PROBE_ROWS`` apart), the line is the pessimistic
    one: no fixed part, every row as dear as the steps' average row."""

    def __init__(self) -> None:
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
            self._line = self._fit() if self.measured() else self._pessimistic()
        return self._line

    def timed(self, n_rows: int) -> bool:
        """Whether ``PROBES`` steps of ``n_rows`` rows are in the window."""
        return sum(1 for n, _ in self.steps if n == n_rows) >= PROBES

    def measured(self) -> bool:
        """Whether the window holds ``PROBES`` steps at least ``PROBE_ROWS`` rows above its
        smallest and as many that far below its largest: a slope to fit."""
        sizes = [n for n, _ in self.steps]
        if not sizes:
            return False
        low, high = min(sizes), max(sizes)
        return (sum(1 for n in sizes if n >= low + PROBE_ROWS) >= PROBES
                and sum(1 for n in sizes if n <= high - PROBE_ROWS) >= PROBES)

    def _fit(self) -> Line:
        steps = list(self.steps)
        first = least_squares(steps)
        if len(steps) < MIN_STEPS:
            return first
        residuals = [abs(ms - first.ms(n)) for n, ms in steps]
        spread = statistics.median(residuals) * OUTLIER_MADS
        kept = [step for step, r in zip(steps, residuals) if r <= spread] if spread > 0 else steps
        if len(kept) < MIN_STEPS or len({n for n, _ in kept}) < 2:
            return first
        return least_squares(kept)

    def _pessimistic(self) -> Line:
        """Every row as dear as the average row of the steps seen: no drafted row ever pays."""
        if not self.steps:
            return Line(0.0, 1.0)
        return Line(0.0, sum(ms for _, ms in self.steps) / sum(n for n, _ in self.steps))


def least_squares(steps: list[tuple[int, float]]) -> Line:
    """The line through the median time of each row count, weighted by its steps (a stalled step
    moves its count's median little, however far it lies), its parts kept non-negative."""
    by_rows: dict[int, list[float]] = {}
    for n, ms in steps:
        by_rows.setdefault(n, []).append(ms)
    points = [(n, statistics.median(times), len(times)) for n, times in by_rows.items()]
    total = sum(w for _, _, w in points)
    mean_n = sum(n * w for n, _, w in points) / total
    mean_ms = sum(ms * w for _, ms, w in points) / total
    var = sum(w * (n - mean_n) ** 2 for n, _, w in points)
    slope = sum(w * (n - mean_n) * (ms - mean_ms) for n, ms, w in points) / var if var else 0.0
    if slope <= 0:
        return Line(max(mean_ms, 0.0), 0.0)
    fixed = mean_ms - slope * mean_n
    if fixed < 0:  # through the origin instead
        return Line(0.0, sum(w * n * ms for n, ms, w in points) / sum(w * n * n for n, _, w in points))
    return Line(fixed, slope)


@dataclass(frozen=True)
class DraftWish:
    n_proposed: int  # draft tokens its drafter proposed (already cut to draft_max)
    acceptance: float  # the drafter's estimate
    # The share of a step's fixed part one accepted token saves: 1 / (the sequences that must all
    # get ahead by a token before the batch takes one step fewer); 0 when its getting ahead shortens
    # nothing (``draft_shares``).
    share: float = 1.0
    # How many sequences must all get ahead by a token before the batch takes one step fewer
    # (``draft_together``): the fixed part is saved with the chance that each of them does, about
    # ``acceptance ** (i * together)`` for the i-th drafted token, not ``acceptance ** i``.
    together: int = 1
    # Whether its drafter has had nothing accepted yet: its first row is judged at ``HOPEFUL``.
    unproven: bool = False


def draft_shares(remaining: Sequence[int | None], waiting: bool) -> list[float]:
    """Each sampling sequence's ``DraftWish.share`` in a step of ``len(remaining)`` of them, given
    how many tokens each has left when that is known (``ignore_eos``: ``max_tokens`` ends it), else
    None. With requests waiting, or any length unknown, a token saves a step's ``1 / n`` (a slot freed
    early is filled, or the sequences end when they will); otherwise the batch lasts as long as its
    longest sequence, and only the sequences tied for the longest save anything by getting ahead."""
    n = len(remaining)
    if waiting or any(r is None for r in remaining):
        return [1 / n] * n
    longest = max(r for r in remaining if r is not None)
    tied = sum(1 for r in remaining if r == longest)
    return [1 / tied if r == longest else 0.0 for r in remaining]


def draft_together(shares: Sequence[float], waiting: bool) -> int:
    """``DraftWish.together`` for a step whose sampling sequences hold ``shares``: with requests
    waiting, 1 (a slot freed early is filled, so each sequence's token counts alone); otherwise the
    sequences holding a share -- the batch ends with the last of them, so it is a step shorter only
    when every one of them got ahead (two edits running to ``max_tokens`` shorten the burst by the
    lesser of their accepted runs)."""
    return 1 if waiting else max(1, sum(1 for share in shares if share > 0))


def plan_drafts(wishes: Sequence[DraftWish], n_rows: int, room: int, cost: StepCost) -> list[int]:
    """How many of each wish's drafted tokens this step verifies (same order), given the step's
    ``n_rows`` rows without drafts and ``room`` rows left in its token budget: rows in order of
    their expected saving while it beats a row's cost; until the cost is measured, a probe of
    ``PROBE_ROWS`` (after steps of ``n_rows`` were timed alone). All zeros when the step is full or
    drafting does not pay (high concurrency)."""
    planned = [0] * len(wishes)
    if room <= 0:
        return planned
    if not cost.measured():
        return _probe(wishes, min(room, PROBE_ROWS)) if cost.timed(n_rows) else planned
    line = cost.line()
    for value, index in _rows_by_value(wishes, line):
        if sum(planned) >= room or value <= line.per_row * (1 + MIN_GAIN):
            break
        planned[index] += 1
    return planned


def _probe(wishes: Sequence[DraftWish], n: int) -> list[int]:
    """Up to ``n`` of the most promising rows (a step of another size to time)."""
    planned = [0] * len(wishes)
    for value, index in _rows_by_value(wishes, Line(1.0, 0.0))[:n]:
        if value > 0:
            planned[index] += 1
    return planned


def _rows_by_value(wishes: Sequence[DraftWish], line: Line) -> list[tuple[float, int]]:
    """Every proposed draft row as (expected milliseconds saved under ``line``, wish index), the
    most valuable first (ties: the earlier wish first); a wish's rows come in order since
    ``acceptance ** i`` falls with i. A row saves its own row for sure once accepted, and its share
    of the step's fixed part when every sequence the step waits for got as far (``together``)."""
    rows: list[tuple[float, int]] = []
    for index, wish in enumerate(wishes):
        p = min(max(wish.acceptance, 0.0), 1.0)
        fixed, together = line.fixed * max(wish.share, 0.0), max(wish.together, 1)
        for i in range(1, max(wish.n_proposed, 0) + 1):
            q = max(p, HOPEFUL) if wish.unproven and i == 1 else p
            rows.append((q ** i * line.per_row + q ** (i * together) * fixed, index))
    return sorted(rows, key=lambda row: (-row[0], row[1]))

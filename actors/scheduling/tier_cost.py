"""Whether an evicted prefix is worth saving to the host-RAM tier: a pure cost model.

Saving copies an entry's cells out of the context, and llama.cpp's per-sequence state call copies
each contiguous run of a sequence's cells apart, per layer, K and V: its cost is a part per run
(on a GPU each run is a device-to-host copy per layer; the cells of sequences decoded together
interleave, so a generated answer is about one run per token) and a part per cell (the bytes).
What a save buys is the recomputation of the tokens that leave the cells, if they are asked for
again: tokens × the prefill cost per token × the chance that they are. So an entry is saved only
when ``p × tokens × token_ms > runs × range_ms + cells × cell_ms`` (docs/performance.md,
*Tiering that pays for itself*).

The chance is learned from what became of evicted entries, in two classes: *returning* ones
(their prefix was used again while in the cells, or came back from the tier) and *fresh* ones
(computed once). A saved entry restored, or a skipped entry's prefix asked for again (a *ghost*
hit, as ARC's ghost lists learn from what they dropped), counts as a reuse of its class; every
eviction counts as a trial; both decay, so the estimate follows the traffic. One-off requests
drive the fresh class towards 0 and stop being saved; a conversation that comes back keeps it up.

The costs start from a calibration on the device in use (one small save of a fragmented and one of
a contiguous sequence, and the prefill that made them) and follow the engine as it runs: moving
averages of observed saves (a scale on the calibrated costs) and of step times. And saves take at
most ``step_share`` of the steps' time: each step adds that share of its time to a credit (at most
``BURST_STEPS`` steps' worth, so one long entry may still go after a few steps without saves), each
save takes its time from it, and a save that pays but finds too little credit is dropped (its
ghost stays, so its reuse is still learned).

Pure: no threads, no clock, no llama calls; the batcher passes the times in (batcher thread) and
carries out the ``SaveDecision``s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

# A prefill step with fewer rows than this is mostly a decode's fixed cost: not a per-token rate.
MIN_PREFILL_ROWS = 32
# Moving averages: the weight of a new observation.
EMA_WEIGHT = 0.1
# Evictions over which the reuse estimate forgets (its counts decay by 1 - 1/REUSE_MEMORY each).
REUSE_MEMORY = 6.0
# Before any evidence: a returning prefix is likely to come back again, a fresh one as likely as not.
PRIOR_REUSE = {"returning": 0.75, "fresh": 0.5}
PRIOR_WEIGHT = 2.0  # the prior counts as this many evictions (it decays like them)
BURST_STEPS = 4.0  # the save credit holds at most this many steps' share


def reuse_class(returning: bool) -> str:
    """The reuse estimate an entry counts in: ``returning`` (its prefix was used again) or ``fresh``."""
    return "returning" if returning else "fresh"


class Verdict(Enum):
    SAVE = "save"
    NOT_WORTH = "not_worth"  # expected recomputation saved below the save's cost
    OVER_BUDGET = "over_budget"  # worth it, but the steps' share for saves is spent


@dataclass(frozen=True, slots=True)
class SaveCandidate:
    """An evicted entry offered to the tier: ``n_cells`` cells in ``n_runs`` contiguous runs, of
    which ``n_leaving`` leave the cells (a trimmed tail: fewer than ``n_cells``); ``returning``:
    its prefix was used again before."""

    n_cells: int
    n_runs: int
    n_leaving: int
    returning: bool

    def __post_init__(self) -> None:
        if self.n_cells < 1 or not 1 <= self.n_runs <= self.n_cells or not 0 <= self.n_leaving <= self.n_cells:
            raise ValueError(f"bad save candidate {self!r}")

    @property
    def kind(self) -> str:
        return reuse_class(self.returning)


@dataclass(frozen=True, slots=True)
class Displaced:
    """What a save would push out of the tier: the tokens it still has room for (beyond them, as
    many of its least recently used entry's, ``returning`` or not, leave)."""

    room_tokens: float = float("inf")
    returning: bool = False

    @property
    def kind(self) -> str:
        return reuse_class(self.returning)


@dataclass(frozen=True, slots=True)
class SaveDecision:
    verdict: Verdict
    cost_ms: float  # the save's expected time
    gain_ms: float  # the recomputation it is expected to spare

    @property
    def save(self) -> bool:
        return self.verdict is Verdict.SAVE


@dataclass(frozen=True, slots=True)
class Calibration:
    """Costs measured on the device in use, at start."""

    range_ms: float  # per contiguous run of cells saved
    cell_ms: float  # per cell saved
    token_ms: float  # per token prefilled (recomputing)
    step_ms: float  # a step's time, before any was observed

    @classmethod
    def from_saves(cls, fragmented: tuple[int, int, float], contiguous: tuple[int, int, float],
                   prefill: tuple[int, float]) -> Calibration:
        """From two timed saves ``(runs, cells, ms)`` that differ in runs per cell, and one timed
        prefill ``(tokens, ms)``; noise never makes a cost negative."""
        (r1, c1, t1), (r2, c2, t2) = fragmented, contiguous
        det = r1 * c2 - r2 * c1
        range_ms = (t1 * c2 - t2 * c1) / det if det else t1 / max(r1, 1)
        range_ms = max(range_ms, 0.0)
        cell_ms = max((t2 - range_ms * r2) / c2, 0.0)
        n_tokens, prefill_ms = prefill
        return cls(range_ms, cell_ms, prefill_ms / n_tokens, prefill_ms)


@dataclass(slots=True)
class ReuseEstimate:
    """The chance that an evicted entry of one class is asked for again: decayed reuses over
    decayed evictions, starting from a prior worth ``PRIOR_WEIGHT`` evictions."""

    prior: float
    uses: float = field(init=False)
    trials: float = field(init=False)

    def __post_init__(self) -> None:
        self.uses, self.trials = self.prior * PRIOR_WEIGHT, PRIOR_WEIGHT

    @property
    def p(self) -> float:
        return min(1.0, self.uses / self.trials)

    def evicted(self) -> None:
        keep = 1 - 1 / REUSE_MEMORY
        self.uses *= keep
        self.trials = self.trials * keep + 1

    def reused(self) -> None:
        self.uses += 1


def ema(old: float, new: float) -> float:
    return old + EMA_WEIGHT * (new - old)


class TierCostModel:
    """Decides which evicted entries are saved (batcher thread, one at a time)."""

    def __init__(self, calibration: Calibration, *, step_share: float = 0.25) -> None:
        if not 0 < step_share <= 1:
            raise ValueError("step_share must be in (0, 1]")
        self.calibration = calibration
        self.step_share = step_share
        self.save_scale = 1.0  # observed save time / calibrated prediction, averaged
        self.token_ms = calibration.token_ms
        self.step_ms = calibration.step_ms
        self.reuse = {kind: ReuseEstimate(prior) for kind, prior in PRIOR_REUSE.items()}
        self.credit_ms = self._credit_cap()  # time saves may take now (``step_share`` of the steps')
        self.counts = {"saves_skipped": 0, "saves_over_budget": 0, "ghost_hits": 0}

    # -- the decision ---------------------------------------------------------------------------

    def save_cost_ms(self, c: SaveCandidate) -> float:
        cal = self.calibration
        return self.save_scale * (c.n_runs * cal.range_ms + c.n_cells * cal.cell_ms)

    def gain_ms(self, c: SaveCandidate) -> float:
        return self.reuse[c.kind].p * c.n_leaving * self.token_ms

    def decide(self, c: SaveCandidate) -> SaveDecision:
        """Save ``c`` or not; the eviction is counted as a trial of its class either way."""
        cost, gain = self.save_cost_ms(c), self.gain_ms(c)
        self.reuse[c.kind].evicted()
        if gain <= cost:
            self.counts["saves_skipped"] += 1
            return SaveDecision(Verdict.NOT_WORTH, cost, gain)
        if cost > self.credit_ms:
            self.counts["saves_over_budget"] += 1
            return SaveDecision(Verdict.OVER_BUDGET, cost, gain)
        self.credit_ms -= cost  # until the save's real time replaces it (``saved``)
        return SaveDecision(Verdict.SAVE, cost, gain)

    def price_ms(self, c: SaveCandidate, displaced: Displaced = Displaced()) -> float | None:
        """What letting ``c`` go from the cells now costs, as ``decide`` would treat it: the expected
        recomputation where a save does not pay, else the save and, at its class's chance of reuse,
        a restore (about a save's time), and the expected recomputation of what the save would push
        out of a full tier (``displaced``); None where the save would pay but the steps' share
        cannot take it now (dropped instead, it would cost its recomputation: it waits)."""
        cost, gain = self.save_cost_ms(c), self.gain_ms(c)
        if gain <= cost:
            return gain
        if cost > self.credit_ms:
            return None
        pushed_out = max(c.n_cells - displaced.room_tokens, 0.0) * self.token_ms
        return cost * (1 + self.reuse[c.kind].p) + self.reuse[displaced.kind].p * pushed_out

    # -- what the engine reports ----------------------------------------------------------------

    def _credit_cap(self) -> float:
        return BURST_STEPS * self.step_share * self.step_ms

    def saved(self, decision: SaveDecision, c: SaveCandidate, ms: float) -> None:
        """A save ``decide`` allowed took ``ms``: the credit pays the real time, and the calibrated
        costs are scaled towards it."""
        self.credit_ms -= ms - decision.cost_ms
        predicted = self.save_cost_ms(c) / self.save_scale
        if predicted > 0:
            self.save_scale = ema(self.save_scale, ms / predicted)

    def stepped(self, n_rows: int, ms: float) -> None:
        """A decode step of ``n_rows`` rows took ``ms``: its share for saves, the step time, and
        the prefill rate from steps large enough to be one."""
        self.step_ms = ema(self.step_ms, ms)
        self.credit_ms = min(self.credit_ms + self.step_share * ms, self._credit_cap())
        if n_rows >= MIN_PREFILL_ROWS:
            self.token_ms = ema(self.token_ms, ms / n_rows)

    def reused(self, returning: bool) -> None:
        """A saved entry was restored (or a skipped one's prefix asked for again: ``ghost``)."""
        self.reuse[reuse_class(returning)].reused()

    def ghost_hit(self, returning: bool) -> None:
        self.counts["ghost_hits"] += 1
        self.reused(returning)

    def stats(self) -> dict[str, float]:
        cal = self.calibration
        return {"range_ms": round(cal.range_ms * self.save_scale, 5), "cell_ms": round(cal.cell_ms * self.save_scale, 5),
                "token_ms": round(self.token_ms, 4), "step_ms": round(self.step_ms, 3),
                "credit_ms": round(self.credit_ms, 3),
                **{f"p_reuse_{kind}": round(r.p, 4) for kind, r in self.reuse.items()}, **self.counts}

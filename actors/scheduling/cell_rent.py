"""What the prefix cache's kept cells cost every step, and when an idle entry has paid for its keep.

llama.cpp's unified KV cache attends over every cell up to the highest one in use, for every row
of every step: each row's attention walks (and masks out) the cached prefixes that no running
sequence reads, and builds its mask over them. So a kept entry whose cells lie on top is not free
while others compute: it costs every step what all the cells it holds up cost (on the 2-core CPU of
docs/performance.md, *Kept cells pay rent*, a full 8,192-cell cache made a lone stream's decode
steps 1.3× slower on Gemma 3 and 1.6× on SmolLM2, and prefills slower too; and *Stop 54*: keeping
only the highest of 16 stacked entries cost what keeping all 16 did). vLLM and SGLang attend over
each sequence's own blocks only; there a kept block is free, here it is rented.

Keeping idle entries is renting; letting them go (offered to the host-RAM tier, else dropped) is
buying: their next use then costs what the tier cost model expects (``TierCostModel.price_ms``: the
save now and the restore then, or the recomputation). The rule is the ski-rental one: an option
is bought once the rent it would have saved since it was open reaches its price, which is never
more than twice what the best choice in hindsight costs. Letting entries go saves only where it
brings the top down, so the options are the entries stacked from the top (``CellMap.layers``):
the top one alone, the top two, and so on. At each look, the option down to each entry is charged
the cells it would bring the top down by (from the highest kept cell to the next entry's below it,
holes included) over the steps since the last look, owed by that entry since its last use; the
largest option whose rent has reached the sum of its entries' prices goes, all of it. An entry
under a pinned one, or under one with no price now, waits. Running sequences are left out of the
stack: they end, or their next tokens move down into freed cells, and then the entries' cells are
what the steps attend over. Steps with no rows charge nothing: an idle server keeps its cache.

The rates are learned from decode steps: ``ms ≈ a + b·rows + (c + d·rows)·cells_attended``, least
squares with exponential forgetting (``MEMORY_STEPS``), taken once the cells attended have varied
enough to tell them apart from the rest and kept while they do not (a full cache stays full),
starting from a prior (``PRIOR_CELL_TOKEN_RATIO`` of the prefill cost per token, a step). Steps of
one row count (a lone stream's) fit ``c`` alone. Prefill steps have their own fit,
``ms ≈ a + b·rows + e·rows·cells_attended``: a prompt row attends over every cell as a decode
row does, but costs the matmuls far less, so in a burst of prompts kept cells cost far more per
step than a decode's rates would say (on Gemma 3, prefilling a token took 1.8 ms with the cache
empty and 3.2 ms with it full).

Pure: no threads, no clock, no llama calls; the batcher passes times in (batcher thread).
"""

from __future__ import annotations

import numpy as np

from llamactor.scheduling.cell_map import CellMap
from llamactor.scheduling.kv_nodes import IdleEntry, KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.tier_cost import Displaced, SaveCandidate, TierCostModel

# Steps over which the rate's fit forgets (each step's weight decays by 1 - 1/MEMORY_STEPS).
MEMORY_STEPS = 2048
# A decode step has fewer rows than this (prefill rows also attend over their own prompt).
DECODE_ROWS = 32
# The cells attended must have spread this much (their weighted standard deviation) for a fit.
MIN_CELLS_SPREAD = 256.0
# The rows of decode steps must have spread this much to tell a cell's cost per row from its cost per step.
MIN_ROWS_SPREAD = 0.5
# The rows of prefill steps must have spread this much to tell their fixed part from their part per row.
MIN_PREFILL_ROWS_SPREAD = 16.0
# Steps (their forgetting weight) a fit needs. A burst's prefill steps are few, one or two a prompt:
# with 8 of them the first fit of a burst put a cell's cost per prompt row at 0.
MIN_STEPS, MIN_PREFILL_STEPS = 8, 32
# Before a fit: a kept cell costs a step this fraction of prefilling a token (this CPU, a lone
# stream: ~0.8 µs a cell against ~1-2 ms a token on a small cache).
PRIOR_CELL_TOKEN_RATIO = 1 / 1000
# Steps between two looks at the entries (each look is a pass over them).
CHECK_EVERY = 16


class StepFit:
    """Least squares with exponential forgetting over steps' ``[1, rows, cells, rows·cells]``
    against their ms (batcher thread). Steps are queued cheaply and folded in at ``fold``."""

    def __init__(self, min_steps: int) -> None:
        self.min_steps = min_steps
        self._sums = np.zeros((5, 5))  # weighted sums of [1, rows, cells, rows·cells, ms] outer products
        self._new: list[tuple[float, float, float, float, float]] = []  # steps not yet in the sums

    def add(self, n_rows: int, cells: int, ms: float) -> None:
        self._new.append((1.0, n_rows, cells, n_rows * cells, ms))

    def fold(self) -> bool:
        """Fold the queued steps into the sums; whether there were any."""
        if not self._new:
            return False
        x = np.array(self._new)
        decay = (1 - 1 / MEMORY_STEPS) ** np.arange(len(x) - 1, -1, -1)
        self._sums = self._sums * (1 - 1 / MEMORY_STEPS) ** len(x) + (x * decay[:, None]).T @ x
        self._new.clear()
        return True

    def spread(self, column: int) -> float:
        """The weighted standard deviation of ``column`` (1: rows, 2: cells); 0 with fewer than ``min_steps``."""
        s = self._sums
        w = s[0, 0]
        return 0.0 if w < self.min_steps else float(max(s[column, column] / w - (s[0, column] / w) ** 2, 0.0)) ** 0.5

    def solve(self, terms: list[int]) -> list[float] | None:
        """The coefficients of ``terms`` (columns) that fit the ms best; None where they cannot be told apart."""
        try:
            solved = np.linalg.solve(self._sums[np.ix_(terms, terms)], self._sums[terms, 4])
        except np.linalg.LinAlgError:
            return None
        return [float(v) for v in solved] if np.all(np.isfinite(solved)) else None


class CellRent:
    """What a cell attended costs a step, and the rent the idle entries owe (batcher thread).

    A decode step of ``rows`` rows is charged ``max(c + d·rows, 0)`` per cell attended, with the
    rates of the time (``c``: per step, ``d``: per row). On this CPU a lone stream's cost per kept
    cell was about the same on both models, but at 8 rows Gemma 3's steps hardly paid any more,
    where SmolLM2's paid several times as much: hence a part per step and a part per row. A
    prefill step (``DECODE_ROWS`` rows or more) is charged ``max(e·rows, 0)``: each prompt row
    attends over every cell attended, and prefill rows cost the matmuls far less each than decode
    rows, so they have a fit of their own (``ms ≈ a + b·rows + e·rows·cells``); until it has one,
    as a decode step of ``DECODE_ROWS - 1`` rows."""

    def __init__(self, token_ms: float) -> None:
        self.cell_step_ms = token_ms * PRIOR_CELL_TOKEN_RATIO
        self.cell_row_ms = 0.0
        self.cell_prefill_row_ms: float | None = None  # None: no fit of prefill steps yet
        self.fitted = False
        self._decodes, self._prefills = StepFit(MIN_STEPS), StepFit(MIN_PREFILL_STEPS)
        self._charged = 0.0  # the rent per cell attended that all steps so far have charged
        self._charged_at_look = 0.0  # ... by the last look
        self._owed: dict[int, tuple[float, float]] = {}  # idle entry -> (its last use, the rent it owes since)
        self._steps = 0
        self.let_go = 0

    def per_cell_ms(self, n_rows: int) -> float:
        """What one more cell attended costs a step of ``n_rows`` rows, at the present rates."""
        if n_rows >= DECODE_ROWS and self.cell_prefill_row_ms is not None:
            return max(self.cell_prefill_row_ms * n_rows, 0.0)
        return max(self.cell_step_ms + self.cell_row_ms * min(n_rows, DECODE_ROWS - 1), 0.0)

    def stepped(self, n_rows: int, ms: float, cells_attended: int) -> None:
        """A step of ``n_rows`` rows took ``ms`` attending over ``cells_attended`` cells (one past
        the highest in use). Cheap: the fits run at the next look (``check_due``)."""
        self._steps += 1
        self._charged += self.per_cell_ms(n_rows)
        if n_rows > 0:
            (self._decodes if n_rows < DECODE_ROWS else self._prefills).add(n_rows, cells_attended, ms)

    def _fit(self) -> None:
        """The rates, from the steps so far, where the cells attended have spread enough to tell
        them (else the last ones)."""
        if self._decodes.fold() and self._decodes.spread(2) >= MIN_CELLS_SPREAD:
            # Steps of one row count (a lone stream's) cannot tell the per-step part from the
            # per-row one: then a cell costs what it costs at that count, whatever the rows.
            if self._decodes.spread(1) >= MIN_ROWS_SPREAD:
                solved = self._decodes.solve([0, 1, 2, 3])
                rates = None if solved is None else (solved[2], solved[3])
            else:
                solved = self._decodes.solve([0, 2])
                rates = None if solved is None else (solved[1], 0.0)
            if rates is not None:
                (self.cell_step_ms, self.cell_row_ms), self.fitted = rates, True
        if self._prefills.fold() and self._prefills.spread(2) >= MIN_CELLS_SPREAD:
            # Prompt chunks of one size make rows·cells a multiple of cells: fit without ``b``.
            terms = [0, 1, 3] if self._prefills.spread(1) >= MIN_PREFILL_ROWS_SPREAD else [0, 3]
            if (solved := self._prefills.solve(terms)) is not None:
                self.cell_prefill_row_ms = solved[-1]

    def charge_layers(self, layers: list[tuple[int, int]], idle: list[IdleEntry]) -> None:
        """A look: the option down to each idle entry of ``layers`` (``CellMap.layers``: the entries
        from the top, each with the cells the top would come down by if it and those above went)
        owes those cells' rent over the steps since the last look. What an entry owes is forgotten
        once it is used again."""
        per_cell, self._charged_at_look = self._charged - self._charged_at_look, self._charged
        last_used = {e.seq_id: e.last_used for e in idle}
        self._owed = {seq_id: owed for seq_id, owed in self._owed.items() if last_used.get(seq_id) == owed[0]}
        for seq_id, cells in layers:
            if seq_id in last_used:
                owed = self._owed.get(seq_id, (last_used[seq_id], 0.0))[1]
                self._owed[seq_id] = (last_used[seq_id], owed + cells * per_cell)

    def owed_ms(self, entry: IdleEntry) -> float:
        """The rent the option down to ``entry`` has cost the steps since its last use (as of the last look)."""
        owed = self._owed.get(entry.seq_id)
        return owed[1] if owed is not None and owed[0] == entry.last_used else 0.0

    def check_due(self) -> bool:
        """Whether this step looks at the entries (every ``CHECK_EVERY``-th); the rates are fitted
        to the steps since the last look first."""
        if self._steps % CHECK_EVERY:
            return False
        self._fit()
        return True

    def due(self, stacked: list[tuple[IdleEntry, float | None]]) -> list[int]:
        """The seq_ids to let go: of ``stacked`` (the idle entries from the top, each with its price;
        None: not now), the largest run from the top whose option's rent has reached its price."""
        gone, total = 0, 0.0
        for k, (entry, price) in enumerate(stacked, 1):
            if price is None:
                break
            total += price
            if self.owed_ms(entry) >= total:
                gone = k
        self.let_go += gone
        return [entry.seq_id for entry, _ in stacked[:gone]]

    def stats(self) -> dict[str, float | bool | int]:
        return {"cell_us_at_1_row": round(self.per_cell_ms(1) * 1000, 4),
                "cell_us_at_8_rows": round(self.per_cell_ms(8) * 1000, 4), "fitted": self.fitted,
                "cell_us_at_512_prefill_rows": round(self.per_cell_ms(512) * 1000, 4),
                "prefill_fitted": self.cell_prefill_row_ms is not None, "let_go": self.let_go}


def let_go(index: PrefixIndex, cells: CellMap, rent: CellRent, cost: TierCostModel,
           displaced: Displaced = Displaced()) -> list[KvOp]:
    """The evictions of the entries whose rent is due (``cells``: where the entries' cells lie;
    ``displaced``: what a save would push out of the tier). Call it at a look (``check_due``)."""
    idle = {e.seq_id: e for e in index.idle_entries()}
    layers = cells.layers(list(index.entries))
    rent.charge_layers(layers, list(idle.values()))
    stacked = []
    for seq_id, _ in layers:  # the idle entries from the top, down to the first that is not (pinned)
        if (e := idle.get(seq_id)) is None:
            break
        stacked.append((e, cost.price_ms(SaveCandidate(e.n_tokens, min(e.runs, e.n_tokens), e.own_cells, e.returning),
                                         displaced)))
    return index.evict_entries(rent.due(stacked))

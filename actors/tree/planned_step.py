"""Step k+1 laid out while step k computes, launched as soon as k's tokens are drawn (batcher thread).

In the overlapped loop (``overlapped_steps``) the host's path from step k's results to step k+1's
launch was collect, draw, commit, schedule, enact, the batch's arrays, launch. In the steady state
of decoding -- every running sequence has a row in step k and samples there, nobody waits, none
drafts, scores or reads labels, and free or cached cells make room for each -- the scheduler's plan
for step k+1 is known before k is collected: one decode row per sequence of step k, in the same
order, on the same seq ids, at the next positions, under the same adapters. ``plan_ahead`` lays
those rows out while k computes, with a placeholder where each token step k draws goes. When k
is collected and drawn, ``still_holds`` checks that nothing the plan did not see happened
meanwhile (a request arrived or ended, a cancel or a stop string is pending, a row was refused or
found no room, one of k's tokens ends its request: EOG not ignored, max_tokens, the context),
evicting the cached prefixes the scheduler would evict to make room for k+1's rows; then ``fill`` writes k's tokens over the placeholders and step k+1 is launched at once, and commit,
schedule and enact follow while the device computes -- the scheduler's own plan must be the one
launched (``matches``; a difference is a bug). Otherwise the laid-out rows are dropped and step
k+1 is planned after k's commit, as before (docs/architecture.md, *Overlapped steps*).

The placeholders live only in the planned token array: the sequences, their samplers (penalty
windows, grammars), the drafters, the graph chains and the prefix index see step k's tokens at
its commit, as in the loop without planning ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llamactor.base.adapters import AdapterSet
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Chunk, Sequence, StepPlan
from llamactor.tree.overlap_rules import ends_by_length

PLACEHOLDER = 0  # a planned row's token until step k's draw is written over it


@dataclass(slots=True)
class PlannedStep:
    """Step k+1's rows, laid out while step k computes: a decode row per sequence of ``seqs``."""

    seqs: list[Sequence]  # the running sequences, in order: the rows of step k+1
    drawn: list[Sequence]  # step k's sequences in its order: the order of its draw
    order: np.ndarray | None  # the row of step k's draw each row of k+1 takes its token from (None: the same)
    adapters: AdapterSet
    eog_rows: list[int]  # the rows of step k's draw whose token ends its request if it is an EOG
    cells_needed: int  # KV cells step k's commit takes, and step k+1's rows after it
    tokens: np.ndarray  # PLACEHOLDER until ``fill``
    positions: np.ndarray
    seq_ids: np.ndarray
    wants: np.ndarray

    def fill(self, tokens: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step k's drawn tokens (a row per sequence of ``seqs``, in order) over the placeholders;
        the arrays ``Engine.launch`` takes."""
        self.tokens[:] = tokens if self.order is None else np.asarray(tokens, dtype=np.int32)[self.order]
        return self.tokens, self.positions, self.seq_ids, self.wants


def decodes_on(chunk: Chunk) -> bool:
    """Whether ``chunk``'s sequence, once it takes the token this chunk samples, is packed into the
    next step as one plain decode row (``pack_step``) and nothing else: it samples, with no drafts,
    no scoring left, no labels, and no drafter to propose any."""
    seq = chunk.seq
    return (chunk.samples and not chunk.drafts and not chunk.n_score_rows and seq.state is not None
            and seq.state.drafter is None and (seq.scoring is None or seq.scoring.done))


def plan_ahead(plan: StepPlan, scheduler: Scheduler, n_ctx_seq: int) -> PlannedStep | None:
    """Step k+1's rows, if step k (``plan``, launched) is the steady state of decoding: every running
    sequence decodes in it (``decodes_on``), nobody waits, and no token of step k can end its
    request by its length (``ends_by_length``); else None. The rows follow the running sequences'
    order, as ``pack_step`` packs decodes (a prompt's last chunk came after them in step k). Call it
    once step k-1 is postprocessed (each request's count is then the one step k's commit sees) and
    before step k commits (positions are read off ``n_past``)."""
    chunks = {c.seq: c for c in plan.chunks}
    if not chunks or scheduler.pending or len(scheduler.running) != len(chunks):
        return None
    if not all(decodes_on(c) for c in plan.chunks) or not all(s in chunks for s in scheduler.running):
        return None
    seqs, drawn, n = list(scheduler.running), [c.seq for c in plan.chunks], len(chunks)
    if any(ends_by_length(s, n_ctx_seq) for s in drawn):
        return None
    where = {s: i for i, s in enumerate(drawn)}
    order = None if seqs == drawn else np.fromiter((where[s] for s in seqs), dtype=np.intp, count=n)
    return PlannedStep(
        seqs=seqs, drawn=drawn, order=order, adapters=plan.adapters,
        eog_rows=[i for i, s in enumerate(drawn) if not s.state.params.ignore_eos],
        cells_needed=sum(c.n_tokens for c in plan.chunks) + n,
        tokens=np.full(n, PLACEHOLDER, dtype=np.int32),
        positions=np.fromiter((s.n_past + chunks[s].n_tokens for s in seqs), dtype=np.int32, count=n),
        seq_ids=np.fromiter((s.seq_id for s in seqs), dtype=np.int32, count=n),
        wants=np.ones(n, dtype=np.int8))


def still_holds(planned: PlannedStep, drawn: list[Sequence], tokens: list[int], scheduler: Scheduler,
                pending_ends: bool, is_eog: Callable[[int], bool], apply: Callable[[list[KvOp]], object]) -> bool:
    """Whether the scheduler will plan step k+1 as ``planned`` once step k commits: each of step k's
    sequences drew its token (``drawn``, in step k's order: no row dropped or refused), none ends
    there (an EOG not ignored: their lengths were checked in ``plan_ahead``) or meanwhile
    (``pending_ends``: a cancel, a stop string), nobody arrived or left, and the KV cache has a cell
    for each row (``made_room``)."""
    if pending_ends or scheduler.pending or drawn != planned.drawn or len(scheduler.running) != len(drawn):
        return False
    if any(is_eog(tokens[i]) for i in planned.eog_rows):
        return False
    return made_room(scheduler.index, planned.cells_needed, apply)


def made_room(index: PrefixIndex, cells_needed: int, apply: Callable[[list[KvOp]], object]) -> bool:
    """Whether ``cells_needed`` cells are free, once cached prefixes are evicted for them (``apply``
    carries the evictions out) as the scheduler's plan would: ``Scheduler._make_room`` evicts the
    same least recently used entries for the same shortfall (committing step k extends running
    sequences only, and changes no entry). Where that is not enough, the scheduler preempts."""
    if (short := cells_needed - (index.n_cells - index.cells_used)) > 0:
        apply(index.evict(short))
    return index.n_cells - index.cells_used >= cells_needed


def matches(planned: PlannedStep, plan: StepPlan) -> bool:
    """Whether the scheduler's plan for the step is the one launched ahead: the same sequences in
    the same order, a decode row each, under the same adapters, and nothing else to carry out."""
    return (not plan.kv_ops and not plan.preempted and not plan.failed and not plan.admitted
            and plan.adapters == planned.adapters and len(plan.chunks) == len(planned.seqs)
            and all(c.seq is s and c.n_tokens == 1 and not c.drafts and not c.n_score_rows
                    for c, s in zip(plan.chunks, planned.seqs)))


def must_match(planned: PlannedStep, plan: StepPlan) -> None:
    """Raise where the scheduler's plan is not the step launched ahead (``matches``): a bug in
    ``still_holds``, which the batcher's supervisor recovers from as from any other."""
    if not matches(planned, plan):
        raise RuntimeError(f"the step launched ahead is not the one the scheduler planned: {len(planned.seqs)} rows "
                           f"launched, {plan.n_rows} planned ({len(plan.kv_ops)} KV ops, {len(plan.admitted)} admitted, "
                           f"{len(plan.preempted)} preempted)")

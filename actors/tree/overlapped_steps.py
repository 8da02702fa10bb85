"""The overlapped generation step (batcher thread): step k's postprocess while the device computes k+1.

The serial step is schedule -> enact -> run -> postprocess (``GenerationSteps.step``). On a backend
whose ``llama_decode`` returns before the device finishes (CUDA, Vulkan, Metal), that leaves the
device idle through each postprocess and each schedule. Here, as vLLM's async scheduling and
SGLang's overlap scheduler do, each ``Step`` message runs (docs/architecture.md, *Overlapped steps*):

1. ``Engine.collect`` step k, launched by the last message (synchronise, read), and draw its tokens;
2. ``commit`` step k: the rows of sequences that ended meanwhile are dropped (their cells removed,
   then their deferred ``finish``), each ``n_past`` moves on, and each drawn token is appended to
   its sequence *provisionally*, so that step k+1 can be planned;
3. schedule and enact step k+1, and ``Engine.launch`` its decode;
4. the rest of step k's postprocess: the provisional tokens come off again and are accepted as the
   serial loop accepts them (detokenizing, stop strings, replies, checkpoints), while the device computes.

Step k+1 stays in flight when the message ends: the actor's own work between steps (queueing the
next ``Step``, the stats board, new requests and cancels) happens while the device computes, so
that the path from a step's results to the next launch is collect, commit, schedule, enact, launch.
In the steady state of decoding, step k+1 is laid out while k computes (``planned_step``): then the
path is collect, draw, launch, and commit, schedule and enact follow while the device computes.

A sequence that ends at step k (EOG, stop string, max_tokens, a cancel) has a row in step k+1
already: ``GenerationSteps.finish`` defers its end to the next ``commit`` (``defer``), which drops
the row; so a sequence wastes at most one row, and stop strings and cancels take effect one step
later at most. Draws and acceptances happen per sequence in the serial loop's order, from the same
logits, so outputs are token-identical, greedy and seeded. A step whose result the next plan
depends on beyond its tokens (``needs_postprocess_first``) is postprocessed in full first.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Protocol

from llamactor.base.errors import LlamactorError
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.tree import step_postprocess as post
from llamactor.tree.draft_verify import DraftVerifier
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.overlap_rules import ends_with, needs_postprocess_first, overlap_on, split_draw, without
from llamactor.tree.planned_step import PlannedStep, must_match, plan_ahead, still_holds
from llamactor.tree.token_draw import StepResult, draw_tokens
from llamactor.tree.watchdog import watched


__all__ = ["OverlappedSteps", "ends_with", "needs_postprocess_first", "overlap_on", "split_draw", "without"]


class Steps(Protocol):
    """What the loop uses of ``GenerationSteps`` (the serial loop's verbs and parts)."""

    engine: Any
    counters: Any
    scheduler: Any
    watchdog: Any
    tiers: Any
    drafts: Any
    sampler: Any
    _plan: StepPlan | None

    def schedule(self, now: float) -> StepPlan: ...
    def enact(self, plan: StepPlan) -> None: ...
    def apply(self, ops: Any) -> list[int]: ...
    def tiers_stepped(self, n_rows: int, ms: float) -> None: ...
    def arrays(self, plan: StepPlan) -> tuple[Any, Any, Any, Any]: ...
    def record_outputs(self, result: StepResult) -> None: ...
    def verifier(self, result: StepResult, now: float) -> DraftVerifier: ...
    def finish(self, seq: Sequence, reason: str, error: LlamactorError | None = None, *,
               kv_lost: bool = False) -> None: ...


@dataclass(slots=True)
class Deferred:
    """How a sequence that still has a row in flight or pending is to end, once that row is dropped."""

    reason: str
    error: LlamactorError | None
    kv_lost: bool


@dataclass(slots=True)
class InFlight:
    """A step launched, not yet collected: its plan, what ``Engine.collect`` takes, its output rows
    (laid out at launch), how long the launch took (ms), and its rows and rows with logits (for
    the draft budget's step timings)."""

    plan: StepPlan
    launched: Any
    rows: OutputRows
    launch_ms: float
    n_rows: int
    n_logit_rows: int


@dataclass(slots=True)
class Pending:
    """A step collected and drawn, not yet committed."""

    plan: StepPlan
    result: StepResult


class OverlappedSteps:
    """The overlapped loop over a ``GenerationSteps``' verbs (batcher thread)."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.in_flight: InFlight | None = None
        self.held: set[Sequence] = set()  # the sequences with a row in flight or pending
        self.finishing: dict[Sequence, Deferred] = {}  # ended meanwhile: finished at the next commit
        self.provisional: list[Sequence] = []  # those a token was appended to provisionally
        self.planned: PlannedStep | None = None  # the step after the one in flight, laid out ahead

    def holds(self, seq: Sequence) -> bool:
        return seq in self.held

    def defer(self, seq: Sequence, reason: str, error: LlamactorError | None, kv_lost: bool) -> None:
        """End ``seq`` at the next commit (its first end counts, as the serial loop's would)."""
        self.finishing.setdefault(seq, Deferred(reason, error, kv_lost))

    def step(self, now: float) -> None:
        """One ``Step`` message: collect and commit step k, launch k+1, postprocess k; k+1 stays in
        flight. Where k+1 was laid out while k computed and that plan still holds, k+1 is launched
        before k's commit (``step_planned``)."""
        steps, timed = self.steps, self.steps.counters.timed
        pending, planned, self.planned = None, self.planned, None
        if (flight := self.in_flight) is not None:
            self.in_flight = None
            pending = timed("run", self.collect, flight)
            now = time.perf_counter()  # the plan's clock: after the wait for the device
            serial = needs_postprocess_first(pending.plan, pending.result)
            if not serial and planned is not None and self.plan_holds(planned, pending):
                return self.step_planned(planned, pending, now)
            timed("postprocess", self.commit, pending, not serial)
            if serial:
                timed("postprocess", self.postprocess_rest, pending)
                pending = None
        steps._plan = None
        plan = timed("schedule", steps.schedule, now)
        steps._plan = plan
        timed("enact", steps.enact, plan)
        if plan.chunks:
            self.in_flight = timed("run", self.launch, plan)
        if pending is not None:
            timed("postprocess", self.postprocess_rest, pending)
        if plan.chunks:
            self.planned = timed("schedule", plan_ahead, plan, steps.scheduler, steps.engine.info.n_ctx_seq)

    def plan_holds(self, planned: PlannedStep, pending: Pending) -> bool:
        """Whether step k+1, laid out while step k computed, is still the step to launch (``still_holds``)."""
        draw = pending.result.draw
        return still_holds(planned, draw.seqs, draw.sampled.tokens, self.steps.scheduler, bool(self.finishing),
                           self.steps.engine.tokenizer.is_eog, self.steps.apply)

    def step_planned(self, planned: PlannedStep, pending: Pending, now: float) -> None:
        """Launch step k+1 as laid out while step k computed, with k's tokens; then, while the device
        computes, commit k, schedule and enact k+1 (the scheduler's plan must be the one launched),
        postprocess k, and lay out k+2."""
        steps, timed = self.steps, self.steps.counters.timed
        n = len(planned.seqs)
        launched, launch_ms = timed("run", self.launch_arrays, planned.fill(pending.result.draw.sampled.tokens), n)
        steps.counters.counts["steps_planned_ahead"] += 1
        timed("postprocess", self.commit, pending, True)
        steps._plan = None
        plan = timed("schedule", steps.schedule, now)
        steps._plan = plan
        must_match(planned, plan)
        timed("enact", steps.enact, plan)
        self.held = {c.seq for c in plan.chunks}
        self.in_flight = InFlight(plan, launched, OutputRows.of(plan, frozenset()), launch_ms, n, n)
        timed("postprocess", self.postprocess_rest, pending)
        self.planned = timed("schedule", plan_ahead, plan, steps.scheduler, steps.engine.info.n_ctx_seq)

    def settle(self) -> None:
        """Collect, commit and postprocess the step in flight, if any: the index and the cells agree again."""
        self.planned = None
        if (flight := self.in_flight) is not None:
            self.in_flight = None
            pending = self.collect(flight)
            self.commit(pending, False)
            self.postprocess_rest(pending)

    def launch(self, plan: StepPlan) -> InFlight:
        """Start the plan's decode; its output rows are laid out once it is launched (off the
        device's path), before any sequence moves on."""
        t0 = time.perf_counter()
        arrays = self.steps.arrays(plan)
        launched, launch_ms = self.launch_arrays(arrays, len(plan.chunks), t0)
        self.held = {c.seq for c in plan.chunks}
        wants = arrays[3]
        return InFlight(plan, launched, OutputRows.of(plan, frozenset()), launch_ms, len(wants), int(wants.sum()))

    def launch_arrays(self, arrays: tuple[Any, Any, Any, Any], n_sequences: int,
                      t0: float | None = None) -> tuple[Any, float]:
        """``Engine.launch`` of a step's rows, under the watchdog; and how long it took (ms) since ``t0``."""
        steps, t0 = self.steps, time.perf_counter() if t0 is None else t0
        launched = watched(steps.watchdog, steps.counters.counts["steps"],
                           {"n_tokens": len(arrays[0]), "n_sequences": n_sequences},
                           lambda: steps.engine.launch(*arrays))
        return launched, (time.perf_counter() - t0) * 1000

    def collect(self, flight: InFlight) -> Pending:
        """Wait for the decode in flight and draw the tokens of the rows whose sequences go on."""
        steps, plan = self.steps, flight.plan
        t0 = time.perf_counter()
        decoded = watched(steps.watchdog, steps.counters.counts["steps"], {"n_sequences": len(plan.chunks)},
                          lambda: steps.engine.collect(flight.launched))
        ms = flight.launch_ms + (time.perf_counter() - t0) * 1000  # the decode as the host saw it: launch and wait
        steps.drafts.stepped(flight.n_rows, flight.n_logit_rows, ms)  # what a drafted step forgoes
        steps.tiers_stepped(sum(c.n_tokens for c in plan.chunks), ms)
        rows = flight.rows
        if self.finishing or decoded.failed_seq_ids:
            rows = without(rows, set(self.finishing), decoded.failed_seq_ids)
        draw = steps.counters.timed("sample", draw_tokens, steps.sampler, decoded, rows)
        return Pending(plan, StepResult(decoded, rows, draw))

    def commit(self, pending: Pending, enders_first: bool) -> None:
        """Step k's tokens are in KV: drop the rows of sequences that ended meanwhile (then end
        them), move the others on, accept the tokens that surely end theirs (``enders_first``), and
        append each other drawn token provisionally."""
        steps, plan, result = self.steps, pending.plan, pending.result
        ended, self.finishing, self.held = self.finishing, {}, set()
        failed = result.decoded.failed_seq_ids
        for chunk in plan.chunks:
            if chunk.seq in ended:
                steps.counters.counts["rows_dropped"] += chunk.n_tokens
                if chunk.seq.seq_id not in failed:
                    steps.engine.seq_rm(chunk.seq.seq_id, chunk.seq.n_past, -1)  # its wasted row's cells
        for seq, how in ended.items():
            steps.finish(seq, how.reason, how.error, kv_lost=how.kv_lost or seq.seq_id in failed)
        post.count_step(steps.counters.counts, plan)
        kept = dataclasses.replace(plan, chunks=[c for c in plan.chunks if c.seq not in ended])
        post.record_computed(steps.scheduler, steps.counters.counts, kept, failed, time.perf_counter())
        _, draw = split_draw(result.draw, [s in ended for s in result.draw.seqs])
        tokenizer, n_ctx_seq = steps.engine.tokenizer, steps.engine.info.n_ctx_seq
        ending, draw = split_draw(draw, [enders_first and ends_with(s, t, tokenizer, n_ctx_seq)
                                         for s, t in zip(draw.seqs, draw.sampled.tokens)])
        now = time.perf_counter()
        post.accept_tokens(ending, now, steps.verifier(pending.result, now), steps.counters.counts, steps.finish)
        pending.plan, pending.result.draw, self.provisional = kept, draw, list(draw.seqs)
        for seq, token in zip(draw.seqs, draw.sampled.tokens):
            seq.token_ids.append(token)

    def postprocess_rest(self, pending: Pending) -> None:
        """The rest of step k's postprocess, as the serial loop's: the provisional tokens come off
        and are accepted (streamed, checked for stops), prompt-only and roomless sequences end."""
        steps, plan, result = self.steps, pending.plan, pending.result
        for seq in self.provisional:
            seq.token_ids.pop()
        self.provisional = []
        steps.record_outputs(result)
        post.finish_prompt_only(plan, steps.finish)
        now = time.perf_counter()
        post.accept_tokens(result.draw, now, steps.verifier(result, now), steps.counters.counts, steps.finish)
        post.finish_without_room(plan, result.decoded.failed_seq_ids, steps.engine.info.n_ctx, steps.finish)

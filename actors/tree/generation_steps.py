"""The batcher's generation work: requests in, one step at a time, requests out (batcher thread).

A step is four verbs, as nano-vllm's: ``schedule`` (the pure scheduler's ``StepPlan``), ``enact``
(the plan carried out on the llama context: KV operations, preemptions, sequences that cannot
fit, graph chains, adapters), ``run`` (one decode and each sampling row's token: a
``StepResult``, ``token_draw``) and ``postprocess`` (what the result means for each request,
``step_postprocess``). ``run`` and ``postprocess`` share nothing but the plan and the result, so
that one step's ``run`` may overlap the previous step's ``postprocess`` (``OverlappedSteps``, where
the decode is asynchronous). The verbs are timed in one place, ``StepCounters.timed``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from llamactor.base.logging import get_logger
from llamactor.base.config import Config
from llamactor.base.errors import ContextFullError, LlamactorError
from llamactor.base.messages import Generate, PromptPrepared
from llamactor.base.request import admitted_sampling
from llamactor.native.engine import Engine
from llamactor.scheduling.packed_kv import PackedPrefixIndex, PackedScheduler
from llamactor.scheduling.policy import Policy
from llamactor.scheduling.kv_nodes import KvOp
from llamactor.scheduling.prefix_index import PrefixIndex
from llamactor.scheduling.prompt_scores import logits_row_cost
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.scheduling.tier_index import RestoreOp
from llamactor.tree import step_postprocess as post
from llamactor.tree.counters import StepCounters
from llamactor.tree.draft_rows import DraftRows, prediction_ids
from llamactor.tree.draft_verify import DraftVerifier
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.tree.graph_chains import GraphChains
from llamactor.tree.output_rows import OutputRows
from llamactor.tree.overlapped_steps import OverlappedSteps, overlap_on
from llamactor.tree.prompt_prep import PromptPrep
from llamactor.tree.prompt_tokens import PromptBuilder
from llamactor.tree.request_end import finish_request
from llamactor.tree.request_state import request_error, resume_sequence, shared, start_sequence
from llamactor.tree.tiers.ram import CacheTiers
from llamactor.tree.token_draw import StepResult, draw_tokens
from llamactor.tree.watchdog import Watchdog, watched

log = get_logger("llamactor.batcher")


def make_scheduler(cfg: Config, engine: Engine, index: PrefixIndex, tiers: CacheTiers | None) -> Scheduler:
    """The pure scheduler over ``index`` (batcher thread, at start); batch-invariant mode's keeps
    the KV cache packed, so each sequence's cells stay in position order."""
    options: dict[str, Any] = dict(
        n_parallel=cfg.n_parallel, n_batch=engine.info.n_batch, batch_size=cfg.flush_batch_size,
        batch_timeout_s=cfg.batch_timeout_ms / 1000, max_queue=cfg.max_queue, index=index,
        keep_finished=cfg.prefix_cache, cache_budget_cells=cfg.prefix_cache_cells,
        score_rows=cfg.score_rows_per_step, score_share=cfg.score_time_share,
        score_row_cost=logits_row_cost(engine.info.n_vocab, engine.info.n_embd, engine.info.n_params),
        scoring_attaches_kv=not cfg.score_exact,
        policy=Policy(cfg.schedule_policy, cfg.priority_aging_per_s),
        tier=tiers.lookup if tiers is not None else None)
    if cfg.batch_invariant:
        return PackedScheduler(sliding_window=engine.n_swa, **options)
    return Scheduler(**options)


class GenerationSteps:
    """The running and waiting generation requests and the steps that serve them (batcher thread)."""

    def __init__(self, engine: Engine, config: Config, prompts: PromptBuilder, prep: PromptPrep,
                 tiers: CacheTiers | None, counters: StepCounters, watchdog: Watchdog | None) -> None:
        """Batcher thread, at start: the prefix index with the system prompts' KV prefilled and
        pinned, and the scheduler over it."""
        self.engine = engine
        index_kind = PackedPrefixIndex if config.batch_invariant else PrefixIndex
        self.index = index_kind(n_seq_ids=engine.info.n_seq_max, n_cells=engine.info.n_ctx,
                                offer_evicted=tiers is not None)
        if tiers is not None:
            tiers.calibrate_on(engine)  # while the context is empty
        for tokens in prompts.shared_prefix_tokens():
            self._prefill_pinned(tokens)
        self.scheduler = make_scheduler(config, engine, self.index, tiers)
        self.prompts = prompts
        self.prep = prep
        self.tiers = tiers  # where an evicted prefix goes first (and comes back from), if anywhere
        self.counters = counters
        self.watchdog = watchdog
        self.chains = GraphChains(engine, greedy_in_graph=config.sample_in_graph is True, counts=counters.counts,
                                  max_attached=config.n_parallel)
        self.sampler = GrammarSampler(engine.info.n_vocab)
        self.drafts = DraftRows(enabled=not config.batch_invariant, draft_max=config.draft_max,
                                n_batch=engine.info.n_batch, n_ubatch=engine.info.n_ubatch,
                                n_ctx_seq=engine.info.n_ctx_seq, counts=counters.counts)
        self._plan: StepPlan | None = None  # the step's plan, once scheduled: its suspects
        self.overlap = OverlappedSteps(self) if overlap_on(config, engine.decodes_async) else None

    def _prefill_pinned(self, tokens: list[int]) -> None:
        """Compute a system prompt's KV on a fresh seq_id and pin it in the index."""
        seq_id, _ = self.index.allocate(None)  # the operator's: every tenant's requests attach it
        self.engine.prefill(seq_id, tokens)
        self.index.extend(seq_id, tokens, 0.0)
        self.index.pin(seq_id)

    # -- requests in ------------------------------------------------------------------------

    def add(self, msg: Generate) -> None:
        """A new request: resumed from its checkpoint, or its prompt prepared (small ones at once)."""
        if msg.reply.future.done():  # cancelled by its caller before it arrived
            return
        self.engine.adapters.check(msg.lora)  # built without the model's names (a remote caller)
        n_ctx_seq = self.engine.info.n_ctx_seq
        # A crashed batcher was running it: go on from its checkpoint. (A scored or label prompt
        # starts again: its rows are not in the checkpoint, and it streamed nothing before its end.)
        if msg.reply.progress is not None and msg.params.prompt_logprobs is None and not msg.label_token_ids:
            params = admitted_sampling(msg, self.prompts.template.stop, len(msg.reply.progress.prompt_ids), n_ctx_seq)
            seq = resume_sequence(msg, params, self.engine.tokenizer)
            log.info("request_resumed", n_prompt=seq.n_prompt, n_generated=seq.n_generated, n_resumed=seq.n_resumed)
            if (reason := seq.state.ended(seq, n_ctx_seq)) is not None:
                finish_request(seq, reason)  # it crashed between its last token and its end
                return
            self.drafts.give(seq, prediction_ids(params, self.engine.tokenizer))
            self._enqueue(seq)
        elif (done := self.prep.submit(msg)) is not None:  # a small prompt is prepared here at once
            self.prepared(done)

    def prepared(self, done: PromptPrepared) -> None:
        """A request's prompt, prepared: fit it in the context and queue the request, unless its
        caller cancelled it meanwhile."""
        if not self.prep.take(done):
            return
        if done.error is not None:
            raise done.error
        tokens, n_context, prediction = done.result  # type: ignore[misc]
        msg = done.request
        assert isinstance(msg, Generate)
        params = admitted_sampling(msg, self.prompts.template.stop, len(tokens), self.engine.info.n_ctx_seq)
        seq = start_sequence(msg, tokens, n_context, params, self.engine.tokenizer)
        self.drafts.give(seq, prediction)
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence) -> None:
        """Add a request's sequence to the scheduler (``QueueFullError`` if it is full)."""
        msg = seq.request
        self.scheduler.add(seq)
        assert msg.reply.progress is not None
        # After add: a request the queue refuses never owned a chain to free.
        self.chains.give(seq, msg.reply.progress)
        msg.reply.mark_queued()
        log.debug("request_queued", n_prompt=seq.n_prompt, pending=len(self.scheduler.pending))

    def cancel(self, request_id: str) -> None:
        seq = self.scheduler.find(request_id)
        if seq is not None:
            self.finish(seq, "cancelled")

    def fail(self, msg: Generate, error: LlamactorError) -> None:
        """Handling ``msg`` raised ``error``: fail it, and take its sequence out if it was queued."""
        seq = self.scheduler.find(msg.request_id)
        msg.reply.fail(error)
        if seq is not None and seq.request is msg:
            self.finish(seq, "cancelled")

    # -- one step ---------------------------------------------------------------------------

    def step(self, now: float) -> None:
        """One generation step: schedule -> enact -> run -> postprocess (or the overlapped loop's)."""
        if self.overlap is not None:
            return self.overlap.step(now)
        self._plan = None
        timed = self.counters.timed
        plan = timed("schedule", self.schedule, now)
        self._plan = plan
        timed("enact", self.enact, plan)
        if not plan.chunks:
            return
        result = timed("run", self.run, plan)
        timed("postprocess", self.postprocess, plan, result)

    def suspects(self) -> Iterable[str]:
        """The requests of the step in hand: its plan's once scheduled, else all there are."""
        if self._plan is None:
            return (s.request_id for s in (*self.scheduler.running, *self.scheduler.pending))
        held = self.overlap.held if self.overlap is not None else ()
        return (s.request_id for s in (*(c.seq for c in self._plan.chunks), *self._plan.failed, *held))

    def schedule(self, now: float) -> StepPlan:
        """The scheduler's plan, with the drafts that pay at its batch size (``draft_rows``)."""
        plan = self.scheduler.schedule(now)
        self.drafts.add_to(plan, self.scheduler)
        return plan

    def enact(self, plan: StepPlan) -> None:
        """Carry ``plan`` out on the llama context: its KV operations (a prompt whose restore failed
        starts over), preemptions, sequences that cannot fit, then the step's chains and adapters."""
        for seq_id in self.apply(plan.kv_ops):
            seq = self.scheduler.restore_failed(seq_id)
            plan.chunks = [c for c in plan.chunks if c.seq is not seq]
        for seq in plan.preempted:
            self.chains.release(seq, finished=False)
            if (progress := seq.request.reply.progress) is not None:  # the trace's event (docs/operations.md, *Traces*)
                progress.marks.append(("preempted", time.perf_counter()))
            log.info("request_preempted", request_id=seq.request_id, n_tokens=len(seq.token_ids),
                     n_preempted=seq.n_preempted, priority=seq.priority)
        if plan.flushed:
            log.info("kv_flushed", n_preempted=len(plan.preempted), n_flushes=self.scheduler.n_flushes,
                     kv_used=self.index.cells_used)
        for seq in plan.failed:
            self.finish(seq, "context_full", ContextFullError(
                f"this sequence ({len(seq.token_ids)} tokens) does not fit in the KV cache even alone "
                f"(n_ctx={self.engine.info.n_ctx}, {self.index.pinned_cells()} cells pinned by system prompts)"))
        if plan.chunks:
            self.chains.before_step(plan)
            self.engine.set_adapters(plan.adapters)  # llama.cpp applies them to the whole context

    def run(self, plan: StepPlan) -> StepResult:
        """One decode of the plan's rows, and the token of each sampling row."""
        tokens, positions, seq_ids, wants = self.arrays(plan)
        t0 = time.perf_counter()
        decoded = watched(self.watchdog, self.counters.counts["steps"],
                          {"n_tokens": len(tokens), "n_sequences": len(plan.chunks)},
                          lambda: self.engine.decode(tokens, positions, seq_ids, wants))
        ms = (time.perf_counter() - t0) * 1000
        self.drafts.stepped(len(tokens), int(np.count_nonzero(wants)), ms)  # what a decode row costs: when drafts pay
        self.tiers_stepped(len(tokens), ms)
        rows = OutputRows.of(plan, decoded.failed_seq_ids)  # before n_past moves on
        return StepResult(decoded, rows, self.counters.timed("sample", draw_tokens, self.sampler, decoded, rows))

    def tiers_stepped(self, n_rows: int, ms: float) -> None:
        """What saves may take of a step, what recomputing costs, what kept cells cost: and the idle
        entries whose cells cost more than they save leave them (nothing is in flight)."""
        if self.tiers is not None:
            self.apply(self.tiers.stepped(n_rows, ms, self.index, self.engine.cells))

    @staticmethod
    def arrays(plan: StepPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The plan's rows as the engine's decode takes them."""
        tokens, positions, seq_ids, wants = plan.rows()
        return (np.array(tokens, dtype=np.int32), np.array(positions, dtype=np.int32),
                np.array(seq_ids, dtype=np.int32), np.array(wants, dtype=np.int8))

    def postprocess(self, plan: StepPlan, result: StepResult) -> None:
        """What the step's result means for each request (``step_postprocess``)."""
        now, counts, failed = time.perf_counter(), self.counters.counts, result.decoded.failed_seq_ids
        post.count_step(counts, plan)
        post.record_computed(self.scheduler, counts, plan, failed, now)
        self.record_outputs(result)
        post.finish_prompt_only(plan, self.finish)
        post.accept_tokens(result.draw, now, self.verifier(result, now), counts, self.finish)
        post.finish_without_room(plan, failed, self.engine.info.n_ctx, self.finish)

    def record_outputs(self, result: StepResult) -> None:
        """The step's prompt scores and label probabilities, read off its logits."""
        counts = self.counters.counts
        if result.rows.scored:
            self.counters.timed("score", post.record_prompt_scores, self.scheduler, counts, result.rows.scored,
                                result.decoded.logits)
        if result.rows.label_rows:
            self.counters.timed("score", post.record_label_probs, counts, result.rows.label_rows, result.decoded.logits)

    def verifier(self, result: StepResult, now: float) -> DraftVerifier:
        """How the step's requests take their tokens: each one, and the run its drafts allow."""
        return DraftVerifier(self.sampler, self.scheduler, self.engine.seq_rm, self.engine.tokenizer,
                             self.engine.info.n_ctx_seq, self.counters.counts, result.rows, result.decoded.logits, now)

    # -- requests out, and the KV operations they leave -------------------------------------

    def finish(self, seq: Sequence, reason: str, error: LlamactorError | None = None, *,
               kv_lost: bool = False) -> None:
        """End ``seq``; ``kv_lost``: the engine already removed its cells (no KV slot in a decode).
        One with a row in an overlapped step still to commit ends at that commit."""
        if self.overlap is not None and self.overlap.holds(seq):
            return self.overlap.defer(seq, reason, error, kv_lost)
        self.chains.release(seq, finished=True)
        self.apply(self.scheduler.finish(seq, time.perf_counter(), kv_lost=kv_lost))
        self.counters.counts["requests_finished"] += 1
        try:
            finish_request(seq, reason, error, self.engine.tokenizer)
        except Exception as e:  # its answer (tool calls, a user's parser) is its own: it fails alone
            if shared(e):
                raise
            seq.request.reply.fail(request_error(seq.request, e, "building its answer"))

    def apply(self, ops: Iterable[KvOp | RestoreOp]) -> list[int]:
        """Carry out the prefix index's decisions on the llama context, in order; an evicted
        entry is offered to the lower tier first (saved if that pays). Returns the seq_ids whose
        restore failed."""
        failed = []
        for op in ops:
            if isinstance(op, RestoreOp):
                if self.tiers is None or not self.tiers.restore(self.engine, op):
                    failed.append(op.seq_id)
            elif op.src >= 0:
                self.engine.seq_cp(op.src, op.seq_id, 0, op.p0)
            else:
                if op.save and op.scope is not None and self.tiers is not None:
                    self.tiers.offer(self.engine, op)
                self.engine.seq_rm(op.seq_id, op.p0, -1)
        return failed

"""The batcher actor: the one thread that owns the llama.cpp context.

It holds every running request, steps while there is work (schedule -> run -> postprocess) and
sleeps otherwise: the next ``Step`` is a message it tells itself, so callers' messages are
handled between steps, and a lone request waits for company on a ``threading.Timer`` that
tells it ``FlushDue`` (``FlushTimer``), never on a spin.

A request's failure is the request's (``llamactor.tree.request_state.request_error``): whatever handling one request's
message raises (tokenizing, its template, its grammar, its sampler, resuming it) fails that
request alone, and so does what the per-sequence part of a step raises for one sequence (drawing
or accepting its token, building its answer). The rest -- the decode, KV operations, the
scheduler, an ``EngineError`` anywhere -- is shared: it reaches ``on_failure``, which reports to
the supervisor before the actor dies, naming the requests it was handling then (``suspects``:
the message in hand, or the sequences of the failing step) so that the supervisor can quarantine
one that keeps killing it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pykka
import structlog

from llamactor.base.logging import get_logger
from llamactor.base.config import Config
from llamactor.base.errors import ContextFullError, LlamactorError, QueueFullError, StepAbortedError
from llamactor.tree.counters import StepCounters, audit_kv, batcher_stats
from llamactor.tree.tiers.ram import CacheTiers
from llamactor.tree.embedding_steps import EmbeddingSteps
from llamactor.scheduling.embedding_queue import EmbeddingQueue
from llamactor.tree.grammar_sampler import GrammarSampler
from llamactor.tree.graph_chains import GraphChains, sample_rows
from llamactor.base.messages import (
    AuditKv,
    BatcherFailed,
    BatcherReady,
    Cancel,
    Embed,
    FlushDue,
    Generate,
    GetStats,
    InjectCrash,
    PromptPrepared,
    Request,
    Step,
    Tokenize,
    tell_quietly,
)
from llamactor.native.engine import Engine
from llamactor.native.sampling import Sampled
from llamactor.scheduling.policy import Policy
from llamactor.scheduling.prefix_index import KvOp, PrefixIndex
from llamactor.scheduling.tier_index import RestoreOp
from llamactor.tree.prompt_prep import PromptPrep
from llamactor.tree.prompt_tokens import PromptBuilder
from llamactor.tree.request_state import finish_request, request_error, resume_sequence, shared, start_sequence
from llamactor.scheduling.packed_kv import PackedPrefixIndex, PackedScheduler
from llamactor.scheduling.scheduler import Scheduler
from llamactor.scheduling.sequence import Sequence, StepPlan
from llamactor.tree.output_rows import OutputRows, record_scores
from llamactor.tree.flush_timer import FlushTimer
from llamactor.tree.board import BATCHER_PUBLISH_S, StatsBoard
from llamactor.tree.watchdog import Watchdog

log = get_logger("llamactor.batcher")


class BatcherActor(pykka.ThreadingActor):
    def __init__(self, config: Config, model_path: str, supervisor: pykka.ActorRef[Any] | None = None,
                 generation: int = 0, watchdog_trips: int = 0, board: StatsBoard | None = None,
                 tiers: CacheTiers | None = None) -> None:
        super().__init__()
        self.config = config
        self.model_path = model_path
        self.watchdog_trips = watchdog_trips  # of earlier generations, for the batcher_stats line
        self.supervisor = supervisor
        self.generation = generation
        self.board = board if board is not None else StatsBoard()
        self.tiers = tiers  # the tree's, not this generation's: evicted prefixes outlive a crash
        self._failed = False
        self.step_counters = StepCounters()
        self.counters = self.step_counters.counts
        self.step_ms = self.step_counters.step_ms
        self._last_publish = 0.0
        self._step_queued = False
        self.flush_timer = FlushTimer(self.actor_ref)
        self._last_stats_log = time.perf_counter()
        self.watchdog: Watchdog | None = None
        # What it is handling, so that a failure can name its suspects to the supervisor: the
        # message in hand, or (during a step) a function of the step's requests (evaluated only then).
        self._in_hand: Any = None
        self._step_suspects: Callable[[], Iterable[str]] | None = None

    # -- lifecycle (batcher thread) ---------------------------------------------------------

    def on_start(self) -> None:
        """Load the model, create the context, prefill the shared system prompt once (pinned)."""
        try:
            cfg = self.config
            self.engine = Engine(self.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_ubatch=cfg.n_ubatch,
                                 n_seq_max=cfg.seq_ids, n_threads=cfg.n_threads, n_gpu_layers=cfg.n_gpu_layers,
                                 chat_template=cfg.chat_template, kv_type=cfg.kv_type, flash_attn=cfg.flash_attn,
                                 test_hang=cfg.watchdog_test_hang and self.generation == 1,
                                 graph_sampling=cfg.sample_in_graph, loras=cfg.loras,
                                 batch_invariant=cfg.batch_invariant)
            self.chains = GraphChains(self.engine)
            self.sampler = GrammarSampler(self.engine.info.n_vocab)
            self.embeddings = EmbeddingSteps(
                EmbeddingQueue(cfg.embedding_n_batch, cfg.embedding_n_seq_max, cfg.embedding_time_share),
                self.engine.tokenizer,
                lambda inputs, pooling: self.engine.embedder(cfg.embedding_n_batch, cfg.embedding_n_seq_max).embed(
                    inputs, pooling), self.engine.info.n_embd, self.engine.info.embedding_pooling)
            self.prompts = PromptBuilder(self.engine.tokenizer, self.engine.chat_template, cfg.system_prompt)
            self.prep = PromptPrep(self.prompts, self.actor_ref, self.engine.info.n_ctx_seq)
            if self.tiers is not None and not self.engine.seq_state_supported:
                self.tiers = None
            index_kind = PackedPrefixIndex if cfg.batch_invariant else PrefixIndex
            self.index = index_kind(n_seq_ids=self.engine.info.n_seq_max, n_cells=self.engine.info.n_ctx,
                                    offer_evicted=self.tiers is not None)
            for tokens in self.prompts.shared_prefix_tokens():
                self._prefill_pinned(tokens)
            self.scheduler = self._make_scheduler(cfg)
            if cfg.watchdog_timeout_s > 0:
                self.watchdog = Watchdog(cfg.watchdog_timeout_s, self.engine.abort_flag, self._on_watchdog_fired)
            if self.engine.test_hang is not None:
                self.engine.test_hang.arm()  # the first step's decode hangs until the watchdog aborts it
            self.board.batcher = self.stats()
            if self.supervisor is not None:
                tell_quietly(self.supervisor, BatcherReady(self.generation, self.engine.info))
            log.info("batcher_started", generation=self.generation, n_ctx=self.engine.info.n_ctx,
                     n_ctx_seq=self.engine.info.n_ctx_seq, n_parallel=cfg.n_parallel,
                     n_seq_max=self.engine.info.n_seq_max, prefix_cache=cfg.prefix_cache,
                     n_pinned_tokens=self.index.pinned_cells(), sample_in_graph=self.engine.graph_sampling,
                     loras=list(cfg.lora_names), batch_invariant=cfg.batch_invariant)
        except Exception as e:
            self._report_failure(e)
            raise

    def _make_scheduler(self, cfg: Config) -> Scheduler:
        """The pure scheduler over ``self.index`` (batcher thread, at start); batch-invariant
        mode's keeps the KV cache packed, so each sequence's cells stay in position order."""
        options: dict[str, Any] = dict(
            n_parallel=cfg.n_parallel, n_batch=self.engine.info.n_batch, batch_size=cfg.flush_batch_size,
            batch_timeout_s=cfg.batch_timeout_ms / 1000, max_queue=cfg.max_queue, index=self.index,
            keep_finished=cfg.prefix_cache, cache_budget_cells=cfg.prefix_cache_cells,
            score_rows=cfg.score_rows_per_step, score_share=cfg.score_time_share,
            policy=Policy(cfg.schedule_policy, cfg.priority_aging_per_s),
            tier=self.tiers.lookup if self.tiers is not None else None)
        if cfg.batch_invariant:
            return PackedScheduler(sliding_window=self.engine.n_swa, **options)
        return Scheduler(**options)

    def _prefill_pinned(self, tokens: list[int]) -> None:
        """Compute a system prompt's KV on a fresh seq_id and pin it in the index."""
        seq_id, _ = self.index.allocate(None)  # the operator's: every tenant's requests attach it
        self.engine.prefill(seq_id, tokens)
        self.index.extend(seq_id, tokens, 0.0)
        self.index.pin(seq_id)

    def on_failure(self, exception_type: Any, exception_value: BaseException | None, traceback: Any) -> None:
        log.error("batcher_failed", generation=self.generation, error=repr(exception_value))
        self._offer_entries()  # before the supervisor hears: the next generation finds them warm
        self._report_failure(exception_value or RuntimeError("unknown failure"), self._suspects())
        self._failed = True
        self.on_stop()  # pykka skips on_stop after a failure; the context must still be freed

    def _offer_entries(self) -> None:
        """Copy every cached prefix still in the cells to the lower tier (the context is going)."""
        if self.tiers is None or getattr(self, "engine", None) is None or not hasattr(self, "index"):
            return
        try:
            for seq_id, pinned in list(self.index.entries.items()):
                scope = self.index.scopes[seq_id]
                if not pinned and scope is not None:
                    self.tiers.save(self.engine, seq_id, scope, self.index.tokens(seq_id))
        except Exception as e:  # a context in a bad state: what was saved stays, the rest is lost
            log.warning("cache_tier_offer_failed", generation=self.generation, error=repr(e))

    def on_stop(self) -> None:
        if self.tiers is not None and self.tiers.persistent and not self._failed:
            self._offer_entries()  # a shutdown: what is cached goes to disk, with the RAM tier
            self.tiers.persist()
        self.flush_timer.cancel()
        if self.watchdog is not None:
            self.watchdog.stop()
        if getattr(self, "prep", None) is not None:
            self.prep.close()  # before the engine: no tokenize may run on a freed vocabulary
        if getattr(self, "engine", None) is not None:
            self.engine.close()
            self.engine = None  # type: ignore[assignment]

    def _suspects(self) -> tuple[str, ...]:
        """The requests it was handling when it failed: the step's, or the message's in hand."""
        if self._step_suspects is not None:
            return tuple(dict.fromkeys(self._step_suspects()))
        msg = self._in_hand
        if isinstance(msg, PromptPrepared):  # a request's prompt back from the pool: that request's
            msg = msg.request
        return (msg.request_id,) if isinstance(msg, (Generate, Embed, Tokenize, Cancel)) else ()

    def _report_failure(self, error: BaseException, suspects: tuple[str, ...] = ()) -> None:
        self.flush_timer.cancel()
        if self.supervisor is not None:
            tell_quietly(self.supervisor, BatcherFailed(self.generation, repr(error),
                                                        watchdog=isinstance(error, StepAbortedError),
                                                        suspects=suspects))

    def _on_watchdog_fired(self, step_no: int, elapsed_s: float, shape: dict[str, Any]) -> None:
        """Watchdog thread: log the hung step; the watchdog then sets the engine's abort flag."""
        log.error("watchdog_fired", generation=self.generation, step=step_no, ms=round(elapsed_s * 1000, 1),
                  timeout_s=self.config.watchdog_timeout_s, **shape)

    # -- messages (batcher thread) ----------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        self._in_hand, self._step_suspects = message, None
        if isinstance(message, Step):
            self._step_queued = False
            self._step()
        elif isinstance(message, (Generate, Embed, Tokenize)):
            self._on_request(message, message)
        elif isinstance(message, PromptPrepared):  # a request's prompt, back from the preparation pool
            self._on_request(message.request, message)
        elif isinstance(message, FlushDue):
            if not self.flush_timer.fired(message):
                return None  # a stale timer: the window it guarded was already flushed
        elif isinstance(message, Cancel):
            self._on_cancel(message.request_id)
        elif isinstance(message, GetStats):
            return self.stats()
        elif isinstance(message, AuditKv):
            return self._audit_kv()
        elif isinstance(message, InjectCrash):
            raise RuntimeError("a crash was injected (LLM.inject_crash)")
        else:
            raise TypeError(f"batcher got an unknown message: {message!r}")
        self._arm()
        self._publish(time.perf_counter())
        return None

    def _on_request(self, msg: Request, message: Request | PromptPrepared) -> None:
        """One request's message (``msg`` itself, or its prompt prepared by the pool): whatever
        handling it raises fails that request alone."""
        try:
            if isinstance(message, PromptPrepared):
                self._on_prepared(message)
            elif isinstance(message, Generate):
                self._on_generate(message)
            elif isinstance(message, Embed):
                self.embeddings.add(message)
            else:
                self._on_tokenize(message)
        except Exception as e:
            if shared(e):
                raise
            error = request_error(msg, e, f"handling its {type(msg).__name__} message")
            seq = self.scheduler.find(msg.request_id) if isinstance(msg, Generate) else None
            msg.reply.fail(error)
            if seq is not None and seq.request is msg:  # it failed after it was queued: take it out again
                self._finish(seq, "cancelled")

    def _on_generate(self, msg: Generate) -> None:
        with structlog.contextvars.bound_contextvars(request_id=msg.request_id):
            if msg.reply.future.done():  # cancelled by its caller before it arrived
                return
            try:
                self.engine.adapters.check(msg.lora)  # built without the model's names (a remote caller)
                params, n_ctx_seq = self.prompts.params(msg), self.engine.info.n_ctx_seq
                # A crashed batcher was running it: go on from its checkpoint. (A scored prompt starts
                # again: its rows are not in the checkpoint, and it streamed nothing before its end.)
                if msg.reply.progress is not None and params.prompt_logprobs is None:
                    params = self.prompts.fit(msg, params, len(msg.reply.progress.prompt_ids), n_ctx_seq)
                    seq = resume_sequence(msg, params, self.engine.tokenizer)
                    log.info("request_resumed", n_prompt=seq.n_prompt, n_generated=seq.n_generated,
                             n_resumed=seq.n_resumed)
                    if (reason := seq.state.ended(seq, n_ctx_seq)) is not None:
                        finish_request(seq, reason)  # it crashed between its last token and its end
                        return
                else:  # a small prompt is prepared here at once; any other off this thread
                    if (done := self.prep.submit(msg)) is not None:
                        self._on_prepared(done)
                    return
                self._enqueue(seq)
            except LlamactorError as e:
                self._reject(msg, e)

    def _on_prepared(self, done: PromptPrepared) -> None:
        """A prompt the pool prepared: fit it in the context and queue its request (a ``Tokenize``:
        answer it), unless its caller cancelled it meanwhile."""
        msg = done.request
        with structlog.contextvars.bound_contextvars(request_id=msg.request_id):
            if not self.prep.take(done):
                return
            try:
                if done.error is not None:
                    raise done.error
                if isinstance(msg, Tokenize):
                    msg.reply.resolve(done.result)  # type: ignore[arg-type]
                    return
                tokens, n_context = done.result  # type: ignore[misc]
                params = self.prompts.fit(msg, self.prompts.params(msg), len(tokens), self.engine.info.n_ctx_seq)
                self._enqueue(start_sequence(msg, tokens, n_context, params, self.engine.tokenizer))
            except LlamactorError as e:
                self._reject(msg, e)

    def _enqueue(self, seq: Sequence) -> None:
        """Add a request's sequence to the scheduler (``QueueFullError`` if it is full)."""
        msg = seq.request
        self.scheduler.add(seq)
        assert msg.reply.progress is not None
        # After add: a request the queue refuses never owned a chain to free.
        self.chains.give(seq, msg.reply.progress)
        msg.reply.mark_queued()
        log.debug("request_queued", n_prompt=seq.n_prompt, pending=len(self.scheduler.pending))

    @staticmethod
    def _reject(msg: Generate | Tokenize, e: LlamactorError) -> None:
        level = log.warning if isinstance(e, QueueFullError) else log.info
        level("request_rejected", error=type(e).__name__, reason=str(e))
        msg.reply.fail(e)

    def _on_tokenize(self, msg: Tokenize) -> None:
        if not msg.reply.future.done():
            self.prep.submit(msg)  # rendered and tokenized off this thread: _on_prepared answers it

    def _on_cancel(self, request_id: str) -> None:
        if self.prep.cancel(request_id):
            return
        seq = self.scheduler.find(request_id)
        if seq is not None:
            self._finish(seq, "cancelled")
        self.embeddings.cancel(request_id)

    def _arm(self) -> None:
        """After each message: queue the next step, start the window timer, or go idle."""
        now = time.perf_counter()
        if self.scheduler.running or self.scheduler.flush_due(now) or self.embeddings.queue.waiting:
            self.flush_timer.cancel()
            if not self._step_queued:
                self._step_queued = True
                self.actor_ref.tell(Step())
            return
        deadline = self.scheduler.flush_deadline()
        if deadline is not None:
            self.flush_timer.start(deadline - now)
        else:  # idle: the logits rows only prompt scoring fills go back to the kernel
            self.engine.release_logits_rows(keep=self.config.n_parallel)

    # -- one step: schedule -> run -> postprocess ------------------------------------------

    def _step(self) -> None:
        t0 = time.perf_counter()
        queue = self.embeddings.queue
        generation_waiting = bool(self.scheduler.running) or self.scheduler.flush_due(t0)
        contended = generation_waiting and bool(queue.waiting)
        if queue.turn(generation_waiting):  # embedding and generation share time (EmbeddingQueue)
            waiting = [item.job.request.request_id for item in queue.waiting]  # before the step takes some
            self._step_suspects = lambda: waiting
            self._guarded(lambda: self.embeddings.step(contended), {"kind": "embedding", "n_waiting": len(queue.waiting)})
            if contended:
                queue.charge(True, (time.perf_counter() - t0) * 1000)
            return
        self._generation_step(t0)
        if contended:
            queue.charge(False, (time.perf_counter() - t0) * 1000)

    def _generation_step(self, t0: float) -> None:
        scheduler = self.scheduler
        self._step_suspects = lambda: (s.request_id for s in (*scheduler.running, *scheduler.pending))
        plan = self.scheduler.schedule(t0)
        self._step_suspects = lambda: (s.request_id for s in (*(c.seq for c in plan.chunks), *plan.failed))
        for seq_id in self._apply(plan.kv_ops):  # a restore that failed: that prompt starts over
            seq = self.scheduler.restore_failed(seq_id)
            plan.chunks = [c for c in plan.chunks if c.seq is not seq]
        for seq in plan.preempted:
            self.chains.release(seq, finished=False)
            log.info("request_preempted", request_id=seq.request_id, n_tokens=len(seq.token_ids),
                     n_preempted=seq.n_preempted, priority=seq.priority)
        if plan.flushed:
            log.info("kv_flushed", n_preempted=len(plan.preempted), n_flushes=self.scheduler.n_flushes,
                     kv_used=self.index.cells_used)
        for seq in plan.failed:
            self._finish(seq, "context_full", ContextFullError(
                f"this sequence ({len(seq.token_ids)} tokens) does not fit in the KV cache even alone "
                f"(n_ctx={self.engine.info.n_ctx}, {self.index.pinned_cells()} cells pinned by system prompts)"))
        if not plan.chunks:
            return
        self.chains.before_step(plan)
        self.engine.set_adapters(plan.adapters)  # llama.cpp applies them to the whole context
        t1 = time.perf_counter()
        result = self._run(plan)
        t2 = time.perf_counter()
        self._postprocess(plan, result)
        self.step_counters.add_step_time(t0, t1, t2, time.perf_counter())

    def _apply(self, ops: Iterable[KvOp | RestoreOp]) -> list[int]:
        """Carry out the prefix index's decisions on the llama context, in order; an evicted
        entry goes to the lower tier first. Returns the seq_ids whose restore failed."""
        failed = []
        for op in ops:
            if isinstance(op, RestoreOp):
                if self.tiers is None or not self.tiers.restore(self.engine, op):
                    failed.append(op.seq_id)
            elif op.src >= 0:
                self.engine.seq_cp(op.src, op.seq_id, 0, op.p0)
            else:
                if op.save and op.scope is not None and self.tiers is not None:
                    self.tiers.save(self.engine, op.seq_id, op.scope, op.save)
                self.engine.seq_rm(op.seq_id, op.p0, -1)
        return failed

    def _run(self, plan: StepPlan) -> Any:
        tokens, positions, seq_ids, wants = plan.rows()
        return self._guarded(lambda: self.engine.decode(
            np.array(tokens, dtype=np.int32), np.array(positions, dtype=np.int32), np.array(seq_ids, dtype=np.int32),
            np.array(wants, dtype=np.int8)), {"n_tokens": len(tokens), "n_sequences": len(plan.chunks)})

    def _guarded(self, decode: Any, shape: dict[str, Any]) -> Any:
        """Run one decode under the watchdog's eye."""
        if self.watchdog is not None:
            self.watchdog.step_started(self.counters["steps"], shape)
        try:
            return decode()
        finally:
            if self.watchdog is not None:
                self.watchdog.step_ended()

    def _postprocess(self, plan: StepPlan, result: Any) -> None:
        now = time.perf_counter()
        self.counters["steps"] += 1
        self.counters["step_sequences"] += len(plan.chunks)
        rows = OutputRows.of(plan, result.failed_seq_ids)  # before n_past moves on
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.seq_id in result.failed_seq_ids:
                continue
            if seq.n_preempted or seq.n_resumed:
                self.counters["tokens_recomputed"] += chunk.n_tokens  # resumed: computed once before
            elif seq.n_past < seq.n_prompt:
                self.counters["prompt_tokens_computed"] += min(chunk.n_tokens, seq.n_prompt - seq.n_past)
            self.scheduler.computed(chunk, now)
        if rows.scored:
            t = time.perf_counter()
            self.counters["prompt_rows_scored"] += record_scores(rows.scored, result.logits)
            for chunk, _ in rows.scored:
                self.scheduler.prompt_scored(chunk.seq)
            self.step_ms["score"] += (time.perf_counter() - t) * 1000
        for chunk in plan.chunks:  # max_tokens 0: done once the prompt is in KV
            if chunk.seq.prompt_only and chunk.seq.n_past == chunk.seq.n_prompt:
                self._finish(chunk.seq, "length")
        if rows.to_sample:
            self._sample(rows.to_sample, result.logits if len(rows.sample_rows) == len(result.logits)
                         else result.logits[rows.sample_rows],
                         None if result.tokens is None else result.tokens[rows.sample_rows], now)
        for chunk in plan.chunks:
            if chunk.seq.seq_id in result.failed_seq_ids:  # the index and llama.cpp disagreed on room
                self._finish(chunk.seq, "context_full", ContextFullError(
                    f"no KV cache room for this sequence (n_ctx={self.engine.info.n_ctx}); retry later "
                    "or lower n_parallel / max_tokens"), kv_lost=True)
        if now - self._last_stats_log >= self.config.stats_interval_s:
            self._last_stats_log = now
            log.info("batcher_stats", **self.stats())

    def _sample(self, to_sample: list[Sequence], logits: np.ndarray, graph_tokens: np.ndarray | None,
                now: float) -> None:
        """Draw each sampling row's token (or take the one llama.cpp drew in the graph), stream
        it, and end the sequences that are done."""
        t_sample = time.perf_counter()
        mask_ms = self.sampler.mask_ms
        try:
            sampled, n_in_graph = sample_rows(self.sampler, to_sample, logits, graph_tokens)
        except Exception as e:
            if shared(e):
                raise
            to_sample, sampled, n_in_graph = self._sample_apart(to_sample, logits, graph_tokens)
        self.step_ms["mask"] += self.sampler.mask_ms - mask_ms
        self.step_ms["sample"] += (time.perf_counter() - t_sample) * 1000 - (self.sampler.mask_ms - mask_ms)
        self.counters["tokens_sampled_in_graph"] += n_in_graph
        for seq, token, logprob, top in zip(to_sample, sampled.tokens, sampled.logprobs, sampled.top):
            if seq.first_token_at is None:
                seq.first_token_at = now
            try:
                reason = seq.state.accept(seq, token, logprob, top, self.engine.tokenizer, self.engine.info.n_ctx_seq)
            except Exception as e:  # its grammar, its text, its stream: this sequence's alone
                if shared(e):
                    raise
                self._finish(seq, "stop", request_error(seq.request, e, "accepting its token"))
                continue
            if reason is not None:
                self._finish(seq, reason)
            elif seq.request.reply.future.done():  # the caller cancelled its future
                self._finish(seq, "cancelled")
        self.counters["tokens_generated"] += len(to_sample)

    def _sample_apart(self, to_sample: list[Sequence], logits: np.ndarray,
                      graph_tokens: np.ndarray | None) -> tuple[list[Sequence], Sampled, int]:
        """The step's sampling raised: draw each row again on its own, and end alone each sequence
        whose own row raises. (A bug's path: the draws may differ from an undisturbed run's.)"""
        kept: list[Sequence] = []
        out = Sampled([], [], [])
        n_in_graph = 0
        for i, seq in enumerate(to_sample):
            try:
                one, n = sample_rows(self.sampler, [seq], logits[i:i + 1],
                                     None if graph_tokens is None else graph_tokens[i:i + 1])
            except Exception as e:
                if shared(e):
                    raise
                self._finish(seq, "stop", request_error(seq.request, e, "sampling its token"))
                continue
            kept.append(seq)
            out.tokens += one.tokens
            out.logprobs += one.logprobs
            out.top += one.top
            n_in_graph += n
        return kept, out, n_in_graph

    def _finish(self, seq: Sequence, reason: str, error: LlamactorError | None = None, *,
                kv_lost: bool = False) -> None:
        """End ``seq``; ``kv_lost``: the engine already removed its cells (no KV slot in a decode)."""
        self.chains.release(seq, finished=True)
        self._apply(self.scheduler.finish(seq, time.perf_counter(), kv_lost=kv_lost))
        self.counters["requests_finished"] += 1
        try:
            finish_request(seq, reason, error, self.engine.tokenizer)
        except Exception as e:  # its answer (tool calls, a user's parser) is its own: it fails alone
            if shared(e):
                raise
            seq.request.reply.fail(request_error(seq.request, e, "building its answer"))

    def _audit_kv(self) -> list[str]:
        return audit_kv(self.engine, self.index)

    def stats(self) -> dict[str, Any]:
        stats = batcher_stats(generation=self.generation, watchdog_trips=self.watchdog_trips,
                              counters=self.step_counters, scheduler=self.scheduler, index=self.index,
                              info=self.engine.info, embeddings=self.embeddings, sampler=self.sampler)
        if self.tiers is not None:
            stats["cache_ram"] = self.tiers.stats()
        return stats

    def _publish(self, now: float) -> None:
        """Put a stats snapshot on the tree's board: when idle, or at most every BATCHER_PUBLISH_S."""
        idle = not self._step_queued and not self.flush_timer.armed
        if idle or now - self._last_publish >= BATCHER_PUBLISH_S:
            self._last_publish = now
            self.board.batcher = self.stats()

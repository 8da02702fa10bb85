"""The batcher actor: the one thread that owns the llama.cpp context.

It holds every running request, steps while there is work and sleeps otherwise: the next
``Step`` is a message it tells itself, so callers' messages are handled between steps, and a lone
request waits for company on a ``threading.Timer`` that tells it ``FlushDue`` (``FlushTimer``),
never on a spin. The actor dispatches messages, arms the next step, publishes its stats to the
tree's board and lives and dies; the steps are ``GenerationSteps``' (schedule -> enact -> run ->
postprocess) and ``EmbeddingSteps``'.

A request's failure is the request's (``llamactor.tree.request_state.request_error``): whatever
handling one request's message raises (tokenizing, its template, its grammar, its sampler, resuming
it, a full queue) fails that request alone, and so does what the per-sequence part of a step raises
for one sequence (drawing or accepting its token, building its answer). The rest -- the decode, KV
operations, the scheduler, an ``EngineError`` anywhere -- is shared: it reaches ``on_failure``,
which reports to the supervisor before the actor dies, naming the requests it was handling then
(``suspects``: the message in hand, or the sequences of the failing step) so that the supervisor
can quarantine one that keeps killing it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pykka
import structlog

from llamactor.base.config import Config
from llamactor.base.errors import ModelLoadError, StepAbortedError
from llamactor.base.logging import get_logger
from llamactor.base.messages import AuditKv, BatcherFailed, BatcherReady, CallerMessage, Cancel, Embed, FlushDue, \
    Generate, GetStats, InjectCrash, PromptPrepared, Step, Tokenize
from llamactor.base.step_posts import gathering_posts
from llamactor.tree.tell import tell_quietly
from llamactor.native.engine import Engine
from llamactor.tree.board import BATCHER_PUBLISH_S, StatsBoard
from llamactor.tree.counters import StepCounters, audit_kv, batcher_stats
from llamactor.tree.embedding_steps import embedding_steps_for, refuse_generation
from llamactor.tree.flush_timer import FlushTimer
from llamactor.tree.generation_steps import GenerationSteps
from llamactor.tree.prompt_prep import PromptPrep
from llamactor.tree.prompt_tokens import PromptBuilder
from llamactor.tree.request_state import request_error, shared
from llamactor.tree.tiers.ram import CacheTiers
from llamactor.tree.watchdog import Watchdog, watched

log = get_logger("llamactor.batcher")


class BatcherActor(pykka.ThreadingActor):
    """One model's batcher: ``__init__`` runs on the caller's thread, everything else on the actor's."""

    use_daemon_thread = True  # as its supervisor's: stopped at exit by ``handles/llm.py``'s hook

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
                                 n_seq_max=cfg.seq_ids_within, n_threads=cfg.n_threads, n_gpu_layers=cfg.n_gpu_layers,
                                 chat_template=cfg.chat_template, kv_type=cfg.kv_type, flash_attn=cfg.flash_attn,
                                 test_hang=cfg.watchdog_test_hang and self.generation == 1,
                                 graph_sampling=cfg.sample_in_graph, loras=cfg.loras,
                                 batch_invariant=cfg.batch_invariant)
            info = self.engine.info
            self.embeddings = embedding_steps_for(self.engine, cfg)
            # (a ranking model never generates: no system prompt to prefill, past an encoder's positions maybe)
            self.prompts = PromptBuilder(self.engine.tokenizer, self.engine.chat_template,
                                         None if info.ranking else cfg.system_prompt)
            self.prep = PromptPrep(self.prompts, self.actor_ref, self.engine.info.n_ctx_seq)
            if self.tiers is not None and not self.engine.seq_state_supported:
                self.tiers = None
            if cfg.watchdog_timeout_s > 0:
                self.watchdog = Watchdog(cfg.watchdog_timeout_s, self.engine.abort_flag, self._on_watchdog_fired)
            self.generation_steps = GenerationSteps(self.engine, cfg, self.prompts, self.prep, self.tiers,
                                                    self.step_counters, self.watchdog)
            self.scheduler, self.index = self.generation_steps.scheduler, self.generation_steps.index
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
            self.tiers.offer_entries(self.engine, self.index)
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
                                                        suspects=suspects,
                                                        load_error=error if isinstance(error, ModelLoadError) else None))

    def _on_watchdog_fired(self, step_no: int, elapsed_s: float, shape: dict[str, Any]) -> None:
        """Watchdog thread: log the hung step; the watchdog then sets the engine's abort flag."""
        log.error("watchdog_fired", generation=self.generation, step=step_no, ms=round(elapsed_s * 1000, 1),
                  timeout_s=self.config.watchdog_timeout_s, **shape)

    # -- messages (batcher thread) ----------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        with gathering_posts():  # a step's replies to a front-end link leave once, at its end
            return self._on_message(message)

    def _on_message(self, message: Any) -> Any:
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

    def _on_request(self, msg: CallerMessage, message: CallerMessage | PromptPrepared) -> None:
        """One request's message (``msg`` itself, or its prompt prepared by the pool): whatever
        handling it raises -- a refusal (``LlamactorError``) or a bug -- fails that request alone."""
        with structlog.contextvars.bound_contextvars(request_id=msg.request_id):
            try:
                if isinstance(message, PromptPrepared):
                    self._on_prepared(message)
                elif isinstance(message, Generate):
                    refuse_generation(self.engine.info)
                    self.generation_steps.add(message)
                elif isinstance(message, Embed):
                    self.embeddings.add(message)
                elif not message.reply.future.done():
                    self.prep.submit(message)  # rendered and tokenized off this thread: _on_prepared answers
            except Exception as e:
                if shared(e):
                    raise
                error = request_error(msg, e, f"handling its {type(msg).__name__} message")
                if isinstance(msg, Generate):
                    self.generation_steps.fail(msg, error)
                else:
                    msg.reply.fail(error)

    def _on_prepared(self, done: PromptPrepared) -> None:
        """A prompt the pool prepared: a ``Generate``'s goes to the generation steps; a
        ``Tokenize`` is answered, unless its caller cancelled it meanwhile."""
        msg = done.request
        if isinstance(msg, Generate):
            self.generation_steps.prepared(done)
        elif self.prep.take(done):
            if done.error is not None:
                raise done.error
            msg.reply.resolve(done.result)  # type: ignore[arg-type]

    def _on_cancel(self, request_id: str) -> None:
        if self.prep.cancel(request_id):
            return
        self.generation_steps.cancel(request_id)
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
            self.engine.rows.release(keep=self.config.n_parallel)

    def _step(self) -> None:
        """One step: the embeddings' (``EmbeddingSteps``) or the generation's (``GenerationSteps``),
        as the two share time (``EmbeddingQueue``)."""
        t0 = time.perf_counter()
        queue = self.embeddings.queue
        generation_waiting = bool(self.scheduler.running) or self.scheduler.flush_due(t0)
        contended = generation_waiting and bool(queue.waiting)
        embedding_turn = queue.turn(generation_waiting)
        if embedding_turn:
            waiting = [item.job.request.request_id for item in queue.waiting]  # before the step takes some
            self._step_suspects = lambda: waiting
            watched(self.watchdog, self.counters["steps"], {"kind": "embedding", "n_waiting": len(queue.waiting)},
                    lambda: self.embeddings.step(contended))
        else:
            self._step_suspects = self.generation_steps.suspects
            self.generation_steps.step(t0)
            self._log_stats(time.perf_counter())
        if contended:
            queue.charge(embedding_turn, (time.perf_counter() - t0) * 1000)

    def _log_stats(self, now: float) -> None:
        """The ``batcher_stats`` line, every ``stats_interval_s`` of generation."""
        if now - self._last_stats_log >= self.config.stats_interval_s:
            self._last_stats_log = now
            log.info("batcher_stats", **self.stats())

    def _audit_kv(self) -> list[str]:
        if self.generation_steps.overlap is not None:
            self.generation_steps.overlap.settle()  # a pending step's cells are not in the index yet
        return audit_kv(self.engine, self.index)

    def stats(self) -> dict[str, Any]:
        stats = batcher_stats(generation=self.generation, watchdog_trips=self.watchdog_trips,
                              counters=self.step_counters, scheduler=self.scheduler, index=self.index,
                              info=self.engine.info, embeddings=self.embeddings,
                              sampler=self.generation_steps.sampler)
        stats["kv_layout"] = self.engine.cells.stats()  # one past the top cell in use: what a step attends over
        if self.tiers is not None:
            stats["cache_ram"] = self.tiers.stats()
        return stats

    def _publish(self, now: float) -> None:
        """Put a stats snapshot on the tree's board: when idle, or at most every BATCHER_PUBLISH_S."""
        idle = not self._step_queued and not self.flush_timer.armed
        if idle or now - self._last_publish >= BATCHER_PUBLISH_S:
            self._last_publish = now
            self.board.batcher = self.stats()

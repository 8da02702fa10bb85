"""The batcher actor: the one thread that owns the llama.cpp context.

It holds every running request, steps while there is work (schedule -> run -> postprocess) and
sleeps otherwise: the next ``Step`` is a message it tells itself, so callers' messages are
handled between steps, and a lone request waits for company on a ``threading.Timer`` that
tells it ``FlushDue``, never on a spin. Work messages arrive by ``tell``, so an exception in a
handler reaches ``on_failure``, which reports to the supervisor before the actor dies.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pykka
import structlog

from llamactor.config import Config
from llamactor.errors import ContextFullError, LlamactorError, QueueFullError
from llamactor.messages import (
    BatcherFailed,
    BatcherReady,
    Cancel,
    FlushDue,
    Generate,
    GetStats,
    Step,
    tell_quietly,
)
from llamactor.native.engine import Engine
from llamactor.native.sampling import sample
from llamactor.prompts import PromptBuilder
from llamactor.requests import RequestState, finish_request
from llamactor.scheduler import Scheduler, Sequence, SharedPrefix, StepPlan

log = structlog.get_logger("llamactor.batcher")


class BatcherActor(pykka.ThreadingActor):
    def __init__(self, config: Config, model_path: str, supervisor: pykka.ActorRef[Any] | None = None,
                 generation: int = 0) -> None:
        super().__init__()
        self.config = config
        self.model_path = model_path
        self.supervisor = supervisor
        self.generation = generation
        self.counters = {"steps": 0, "tokens_generated": 0, "prompt_tokens_computed": 0, "tokens_cached": 0,
                         "requests_finished": 0, "step_sequences": 0}
        self.step_ms = {"schedule": 0.0, "decode": 0.0, "sample": 0.0, "postprocess": 0.0}
        self._step_queued = False
        self._timer: threading.Timer | None = None
        self._timer_id = 0
        self._last_stats_log = time.perf_counter()

    # -- lifecycle (batcher thread) ---------------------------------------------------------

    def on_start(self) -> None:
        """Load the model, create the context, prefill the shared system prompt once."""
        try:
            cfg = self.config
            n_prefix_seqs = 2 if cfg.system_prompt else 0
            self.engine = Engine(self.model_path, n_ctx=cfg.n_ctx, n_batch=cfg.n_batch, n_ubatch=cfg.n_ubatch,
                                 n_seq_max=cfg.n_parallel + n_prefix_seqs, n_threads=cfg.n_threads,
                                 n_gpu_layers=cfg.n_gpu_layers)
            self.prompts = PromptBuilder(self.engine.tokenizer, self.engine.chat_template, cfg.system_prompt)
            prefixes = []
            for i, tokens in enumerate(self.prompts.shared_prefix_tokens()):
                seq_id = cfg.n_parallel + i
                self.engine.prefill(seq_id, tokens)
                prefixes.append(SharedPrefix(seq_id, tuple(tokens)))
            self.n_prefix_tokens = sum(len(p.token_ids) for p in prefixes)
            self.scheduler = Scheduler(n_parallel=cfg.n_parallel, n_batch=self.engine.info.n_batch,
                                       batch_size=cfg.flush_batch_size, batch_timeout_s=cfg.batch_timeout_ms / 1000,
                                       max_queue=cfg.max_queue, shared_prefixes=tuple(prefixes))
            if self.supervisor is not None:
                tell_quietly(self.supervisor, BatcherReady(self.generation, self.engine.info))
            log.info("batcher_started", generation=self.generation, n_ctx=self.engine.info.n_ctx,
                     n_ctx_seq=self.engine.info.n_ctx_seq, n_parallel=cfg.n_parallel,
                     n_prefix_tokens=self.n_prefix_tokens)
        except Exception as e:
            self._report_failure(e)
            raise

    def on_failure(self, exception_type: Any, exception_value: BaseException | None, traceback: Any) -> None:
        log.error("batcher_failed", generation=self.generation, error=repr(exception_value))
        self._report_failure(exception_value or RuntimeError("unknown failure"))
        self.on_stop()  # pykka skips on_stop after a failure; the context must still be freed

    def on_stop(self) -> None:
        self._cancel_timer()
        if getattr(self, "engine", None) is not None:
            self.engine.close()
            self.engine = None  # type: ignore[assignment]

    def _report_failure(self, error: BaseException) -> None:
        self._cancel_timer()
        if self.supervisor is not None:
            tell_quietly(self.supervisor, BatcherFailed(self.generation, repr(error)))

    # -- messages (batcher thread) ----------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Step):
            self._step_queued = False
            self._step()
        elif isinstance(message, Generate):
            self._on_generate(message)
        elif isinstance(message, FlushDue):
            if message.timer_id != self._timer_id:
                return None  # a stale timer: the window it guarded was already flushed
            self._timer = None
        elif isinstance(message, Cancel):
            self._on_cancel(message.request_id)
        elif isinstance(message, GetStats):
            return self.stats()
        else:
            raise TypeError(f"batcher got an unknown message: {message!r}")
        self._arm()
        return None

    def _on_generate(self, msg: Generate) -> None:
        with structlog.contextvars.bound_contextvars(request_id=msg.request_id):
            if msg.reply.future.done():  # cancelled by its caller before it arrived
                return
            try:
                tokens = self.prompts.prompt_tokens(msg, n_ctx_seq=self.engine.info.n_ctx_seq)
                seq = Sequence(request=msg, token_ids=tokens, n_prompt=len(tokens))
                seq.state = RequestState.create(msg.params)
                self.scheduler.add(seq)
            except LlamactorError as e:
                level = log.warning if isinstance(e, QueueFullError) else log.info
                level("request_rejected", error=type(e).__name__, reason=str(e))
                msg.reply.fail(e)
                return
            log.debug("request_queued", n_prompt=len(tokens), pending=len(self.scheduler.pending))

    def _on_cancel(self, request_id: str) -> None:
        seq = self.scheduler.find(request_id)
        if seq is not None:
            self._finish(seq, "cancelled")

    def _arm(self) -> None:
        """After each message: queue the next step, start the window timer, or go idle."""
        now = time.perf_counter()
        if self.scheduler.running or self.scheduler.flush_due(now):
            self._cancel_timer()
            if not self._step_queued:
                self._step_queued = True
                self.actor_ref.tell(Step())
            return
        deadline = self.scheduler.flush_deadline()
        if deadline is not None and self._timer is None:
            self._timer_id += 1
            self._timer = threading.Timer(max(0.0, deadline - now), tell_quietly,
                                          (self.actor_ref, FlushDue(self._timer_id)))
            self._timer.daemon = True
            self._timer.start()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_id += 1

    # -- one step: schedule -> run -> postprocess ------------------------------------------

    def _step(self) -> None:
        t0 = time.perf_counter()
        plan = self.scheduler.schedule(t0)
        if not plan.chunks:
            return
        self._attach_shared_prefixes(plan)
        t1 = time.perf_counter()
        result = self._run(plan)
        t2 = time.perf_counter()
        self._postprocess(plan, result)
        self._add_step_time(t0, t1, t2, time.perf_counter())

    def _add_step_time(self, t0: float, t1: float, t2: float, t3: float) -> None:
        """Cumulative per-phase milliseconds, for the benchmark's per-step breakdown."""
        c = self.step_ms
        c["schedule"] += (t1 - t0) * 1000
        c["decode"] += (t2 - t1) * 1000
        c["postprocess"] += (t3 - t2) * 1000

    def _attach_shared_prefixes(self, plan: StepPlan) -> None:
        for seq, source in plan.admitted:
            self.engine.seq_rm(seq.seq_id)  # a reused seq_id must start empty
            if source >= 0:
                self.engine.seq_cp(source, seq.seq_id, 0, seq.n_cached)
            self.counters["tokens_cached"] += seq.n_cached

    def _run(self, plan: StepPlan) -> Any:
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        wants: list[int] = []
        for chunk in plan.chunks:
            seq, n = chunk.seq, chunk.n_tokens
            tokens += seq.token_ids[seq.n_past:seq.n_past + n]
            positions += range(seq.n_past, seq.n_past + n)
            seq_ids += [seq.seq_id] * n
            wants += [0] * (n - 1) + [1 if chunk.samples else 0]
        return self.engine.decode(np.array(tokens, dtype=np.int32), np.array(positions, dtype=np.int32),
                                  np.array(seq_ids, dtype=np.int32), np.array(wants, dtype=np.int8))

    def _postprocess(self, plan: StepPlan, result: Any) -> None:
        now = time.perf_counter()
        self.counters["steps"] += 1
        self.counters["step_sequences"] += len(plan.chunks)
        sampling = [c for c in plan.chunks if c.samples]  # before n_past moves on
        rows = [i for i, c in enumerate(sampling) if c.seq.seq_id not in result.failed_seq_ids]
        to_sample = [sampling[i].seq for i in rows]
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq.seq_id in result.failed_seq_ids:
                continue
            if seq.n_past < seq.n_prompt:
                self.counters["prompt_tokens_computed"] += min(chunk.n_tokens, seq.n_prompt - seq.n_past)
            seq.n_past += chunk.n_tokens
        logits = result.logits if len(rows) == len(result.logits) else result.logits[rows]
        t_sample = time.perf_counter()
        sampled = sample(logits, [s.state.row_spec(s.token_ids) for s in to_sample])
        self.step_ms["sample"] += (time.perf_counter() - t_sample) * 1000
        for seq, token, logprob, top in zip(to_sample, sampled.tokens, sampled.logprobs, sampled.top):
            if seq.first_token_at is None:
                seq.first_token_at = now
            reason = seq.state.accept(seq, token, logprob, top, self.engine.tokenizer, self.engine.info.n_ctx_seq)
            if reason is not None:
                self._finish(seq, reason)
            elif seq.request.reply.future.done():  # the caller cancelled its future
                self._finish(seq, "cancelled")
        self.counters["tokens_generated"] += len(to_sample)
        for chunk in plan.chunks:
            if chunk.seq.seq_id in result.failed_seq_ids:
                self._finish(chunk.seq, "context_full", ContextFullError(
                    f"no KV cache room for this sequence (n_ctx={self.engine.info.n_ctx}); retry later "
                    "or lower n_parallel / max_tokens"))
        if now - self._last_stats_log >= self.config.stats_interval_s:
            self._last_stats_log = now
            log.info("batcher_stats", **self.stats())

    def _finish(self, seq: Sequence, reason: str, error: LlamactorError | None = None) -> None:
        was_running = seq in self.scheduler.running
        self.scheduler.finish(seq)
        if was_running:
            self.engine.seq_rm(seq.seq_id)
        self.counters["requests_finished"] += 1
        finish_request(seq, reason, error)

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        kv_used = self.n_prefix_tokens + sum(seq.n_past - seq.n_cached for seq in s.running)
        return {"generation": self.generation, "running": len(s.running), "pending": len(s.pending),
                "free_seq_ids": len(s.free_seq_ids), "n_parallel": self.config.n_parallel,
                "kv_used": kv_used, "kv_size": self.engine.info.n_ctx,
                "kv_usage": round(kv_used / self.engine.info.n_ctx, 4), **self.counters,
                "step_ms": {k: round(v, 3) for k, v in self.step_ms.items()}}

"""The batcher's embedding work: requests in, packed steps, retries in halves, results out.

Runs on the batcher thread (it tokenizes and calls the engine's embedding contexts). The queue
and the packing rule are pure (``llamactor.scheduling.embedding_queue``); this is where they meet llama.cpp.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from llamactor.base.config import Config
from llamactor.base.engine_info import EngineInfo
from llamactor.base.logging import get_logger
from llamactor.scheduling.embedding_queue import EmbeddingInput, EmbeddingJob, EmbeddingQueue
from llamactor.base.errors import CancelledError, ContextFullError, InvalidRequestError, LlamactorError
from llamactor.base.messages import Embed
from llamactor.native.embedding import RANK, EmbeddingNoRoomError
from llamactor.native.engine import Engine
from llamactor.native.tokenizer import Tokenizer

log = get_logger("llamactor.batcher")

EmbedFn = Callable[[list[list[int]], str], np.ndarray]  # (inputs, pooling) -> [n, n_embd] ([n, 1]: rank)


class EmbeddingSteps:
    def __init__(self, queue: EmbeddingQueue, tokenizer: Tokenizer, embed: EmbedFn, n_embd: int,
                 default_pooling: str, ranking: bool = False, rerank_template: str | None = None) -> None:
        self.queue = queue
        self._ranking = ranking  # the model has a ranking head: rank pooling gives its scores
        self._rerank_template = rerank_template  # the GGUF's: how a (query, document) pair is laid out
        self._tokenizer = tokenizer
        self._embed = embed
        self._n_embd = n_embd
        self._default_pooling = default_pooling
        self.ms = 0.0  # cumulative time in embedding decodes
        self.n_retries = 0  # packed steps split in halves for lack of room

    def add(self, msg: Embed) -> None:
        """Tokenize and queue every input of ``msg``, or fail it alone (nothing queued)."""
        if msg.reply.future.done():
            return
        try:
            inputs = self._inputs(msg)
            if msg.truncate:  # Ollama's default: an input longer than one step keeps its head
                inputs = [ids[:self.queue.longest] for ids in inputs]
            self._tokenizer.check_ids(t for ids in inputs for t in ids)
            pooling = self._pooling(msg)
            width = 1 if pooling == RANK else self._n_embd  # rank pooling: one score per input
            job = EmbeddingJob(msg, pooling, [len(t) for t in inputs], np.zeros((len(inputs), width), dtype=np.float32))
            self.queue.add(job, inputs)
        except LlamactorError as e:
            log.info("request_rejected", request_id=msg.request_id, error=type(e).__name__, reason=str(e))
            msg.reply.fail(e)
            return
        msg.reply.mark_queued()

    def _inputs(self, msg: Embed) -> list[list[int]]:
        """``msg``'s inputs as token ids: texts tokenized (BOS as the model adds it), ids as they
        are, (query, document) pairs laid out as llama-server does (``llamactor.base.rank_pairs``)."""
        if msg.pairs is not None:
            return msg.pairs.tokens(self._tokenizer, self._rerank_template)
        return [list(x) if isinstance(x, tuple) else self._tokenizer.tokenize(x, add_special=True) for x in msg.inputs]

    def _pooling(self, msg: Embed) -> str:
        """The pooling ``msg`` gets; ``InvalidRequestError`` for rank pooling on a model without a
        ranking head (its scores would be a generator's hidden state projected by nothing)."""
        if msg.pooling == RANK and not self._ranking:
            raise InvalidRequestError("this model has no ranking head (its GGUF's pooling type is not rank): "
                                      "it cannot give rank scores")
        return msg.pooling or self._default_pooling

    def cancel(self, request_id: str) -> None:
        for job in self.queue.drop(request_id):
            self._finish(job, CancelledError(f"request {request_id} was cancelled"))

    def step(self, contended: bool = False) -> None:
        """One packed step (or, after running out of room, its halves); ``contended``: generation
        waits too, so the step is kept short."""
        items = self.queue.pack(contended)
        if items:
            self._run(items)

    def _run(self, items: list[EmbeddingInput]) -> None:
        start = time.perf_counter()
        try:
            vectors = self._embed([i.token_ids for i in items], items[0].job.pooling)
        except EmbeddingNoRoomError:
            self.ms += (time.perf_counter() - start) * 1000
            if len(items) == 1:  # down to one input: only its request fails (docs/architecture.md, "Embeddings")
                self._fail_input(items[0])
                return
            self.n_retries += 1
            log.warning("embedding_step_retry", n_inputs=len(items), n_tokens=sum(len(i.token_ids) for i in items))
            half = len(items) // 2
            self._run(items[:half])
            self._run(items[half:])
            return
        self.ms += (time.perf_counter() - start) * 1000
        self.queue.record_step(items)
        for item, vector in zip(items, vectors):
            job = item.job
            if job.request.reply.future.done():  # cancelled or failed meanwhile
                continue
            job.vectors[item.index] = vector
            job.n_done += 1
            if job.done:
                self._finish(job)

    def _fail_input(self, item: EmbeddingInput) -> None:
        self.queue.drop(item.job.request.request_id)
        self._finish(item.job, ContextFullError(
            f"an embedding input of {len(item.token_ids)} tokens found no memory even alone"))

    def _finish(self, job: EmbeddingJob, error: LlamactorError | None = None) -> None:
        req = job.request
        log.info("request_finished", request_id=req.request_id, kind="embedding", n_inputs=len(job.n_tokens),
                 n_prompt=sum(job.n_tokens), n_steps=job.n_steps, pooling=job.pooling,
                 ms=round((time.perf_counter() - req.submitted_at) * 1000, 3),
                 finish_reason="error" if error else "stop")
        if error is not None:
            req.reply.fail(error)
        else:
            req.reply.resolve(job.result())  # type: ignore[arg-type]


def encoder_positions(info: EngineInfo) -> int | None:
    """The most positions an input may use on a non-causal encoder (BERT and its kin, ranking heads
    among them: learned absolute positions end at the training context), else None: no limit but
    the step's."""
    causal = info.metadata.get(f"{info.metadata.get('general.architecture', '')}.attention.causal")
    return info.n_ctx_train if causal == "false" else None


def refuse_generation(info: EngineInfo) -> None:
    """``InvalidRequestError`` if the model cannot generate: a ranking head scores, it has no
    language-model output (its generation context's logits would all be zero)."""
    if info.ranking:
        raise InvalidRequestError("this model is a ranking model (its GGUF's pooling type is rank): it scores "
                                  "(query, document) pairs for rerank and embeds, but cannot generate text")


def embedding_steps_for(engine: Engine, cfg: Config) -> EmbeddingSteps:
    """The embedding steps on ``engine``'s model under ``cfg``'s embedding options (the batcher's
    thread; the embedding contexts are made on the first embedding step)."""
    info = engine.info
    queue = EmbeddingQueue(cfg.embedding_n_batch, cfg.embedding_n_seq_max, cfg.embedding_time_share,
                           encoder_positions(info))

    def embed(inputs: list[list[int]], pooling: str) -> np.ndarray:
        return engine.embedder(cfg.embedding_n_batch, cfg.embedding_n_seq_max).embed(inputs, pooling)

    return EmbeddingSteps(queue, engine.tokenizer, embed, info.n_embd, info.embedding_pooling, info.ranking,
                          info.rerank_template)

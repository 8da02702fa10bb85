"""Embedding contexts on the generation engine's model: the weights are loaded once.

Only the batcher actor's thread calls these methods. One llama.cpp context per pooling type
(mean, cls, last; made on first use), each with ``embeddings`` on and its own small KV cache,
cleared after every step: an embedding input is computed whole in one physical batch (llama.cpp
cannot pool across micro-batches), so ``n_ubatch == n_batch`` and an input longer than that is
refused before it is queued. Inputs are packed by tokens: one sequence id each, up to
``n_batch`` tokens and ``n_seq_max`` inputs per ``llama_decode``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp
import numpy as np

from llamactor.base.errors import EngineError, StepAbortedError
from llamactor.native.abort import AbortFlag
from llamactor.native.batch import ReusableBatch

POOLING = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
           "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
_GGUF_POOLING = {v: k for k, v in POOLING.items()}


class EmbeddingNoRoomError(EngineError):
    """A packed embedding step found no memory / KV room (llama_decode returned 1): retry smaller."""


@dataclass(frozen=True, slots=True)
class EmbeddingInfo:
    n_embd: int
    n_batch: int  # tokens one embedding step packs; also the longest input (n_ubatch == n_batch)
    n_seq_max: int  # inputs one step packs


class Embedder:
    """The embedding side of one loaded model."""

    def __init__(self, model: llama_cpp.llama_model_p, *, n_batch: int, n_seq_max: int, n_threads: int,
                 abort_flag: AbortFlag | None = None) -> None:
        self._model = model
        self._abort_flag = abort_flag  # the generation context's: the watchdog stops embedding steps too
        self._n_threads = n_threads
        self._contexts: dict[str, tuple[llama_cpp.llama_context_p, ReusableBatch]] = {}
        self.info = EmbeddingInfo(n_embd=llama_cpp.llama_model_n_embd(model), n_batch=n_batch, n_seq_max=n_seq_max)

    def _context(self, pooling: str) -> tuple[llama_cpp.llama_context_p, ReusableBatch]:
        found = self._contexts.get(pooling)
        if found is None:
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = self.info.n_batch
            cparams.n_batch = cparams.n_ubatch = self.info.n_batch
            cparams.n_seq_max = self.info.n_seq_max
            cparams.n_threads = cparams.n_threads_batch = self._n_threads
            cparams.embeddings = True
            cparams.pooling_type = POOLING[pooling]
            cparams.kv_unified = True
            cparams.no_perf = True
            if self._abort_flag is not None:
                cparams.abort_callback = self._abort_flag.callback
                cparams.abort_callback_data = self._abort_flag.data
            ctx = llama_cpp.llama_init_from_model(self._model, cparams)
            if not ctx:
                raise EngineError(f"llama.cpp could not create an embedding context ({pooling} pooling)")
            found = self._contexts[pooling] = (ctx, ReusableBatch(self.info.n_batch, None))  # no shadows
        return found

    def embed(self, inputs: list[list[int]], pooling: str) -> np.ndarray:
        """One ``llama_decode`` over ``inputs`` packed together: their pooled, unnormalized
        embeddings as rows [len(inputs), n_embd]. ``EmbeddingNoRoomError`` if they do not fit."""
        ctx, batch = self._context(pooling)
        n_tokens = sum(len(t) for t in inputs)
        if not inputs or n_tokens > self.info.n_batch or len(inputs) > self.info.n_seq_max:
            raise ValueError(f"{len(inputs)} inputs of {n_tokens} tokens do not fit one embedding step")
        tokens = np.fromiter((t for ids in inputs for t in ids), dtype=np.int32, count=n_tokens)
        positions = np.concatenate([np.arange(len(ids), dtype=np.int32) for ids in inputs])
        seq_ids = np.repeat(np.arange(len(inputs), dtype=np.int32), [len(ids) for ids in inputs])
        batch.fill(tokens, positions, seq_ids, np.ones(n_tokens, dtype=np.int8))
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        rc = llama_cpp.llama_decode(ctx, batch.view())
        if rc == 1:
            raise EmbeddingNoRoomError(f"no room for {len(inputs)} inputs of {n_tokens} tokens")
        if rc == 2:
            raise StepAbortedError("the watchdog aborted an embedding step")
        if rc != 0:
            raise EngineError(f"llama_decode of an embedding step returned {rc}")
        out = np.empty((len(inputs), self.info.n_embd), dtype=np.float32)
        for i in range(len(inputs)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, i)
            if not ptr:
                raise EngineError(f"llama.cpp returned no embedding for input {i}")
            out[i] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.info.n_embd,))
        return out

    def close(self) -> None:
        for ctx, _ in self._contexts.values():
            llama_cpp.llama_free(ctx)
        self._contexts.clear()


def default_pooling(model: llama_cpp.llama_model_p) -> str:
    """The pooling type the GGUF declares (``<arch>.pooling_type``) if we support it, else mean."""
    return _GGUF_POOLING.get(_model_pooling(model), "mean")


def _model_pooling(model: llama_cpp.llama_model_p) -> int:
    """The pooling type the GGUF declares, or -1."""
    buf = ctypes.create_string_buffer(64)
    arch = ctypes.create_string_buffer(64)
    if llama_cpp.llama_model_meta_val_str(model, b"general.architecture", arch, len(arch)) < 0:
        return -1
    key = arch.value + b".pooling_type"
    if llama_cpp.llama_model_meta_val_str(model, key, buf, len(buf)) < 0:
        return -1
    try:
        return int(buf.value)
    except ValueError:
        return -1

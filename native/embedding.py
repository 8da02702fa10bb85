"""Embedding contexts on the generation engine's model: the weights are loaded once.

Only the batcher actor's thread calls these methods. One llama.cpp context per pooling type
(mean, cls, last, and rank for a ranking-head GGUF; made on first use), each with ``embeddings`` on and its own small KV cache,
cleared after every step: an embedding input is computed whole in one physical batch (llama.cpp
cannot pool across micro-batches), so ``n_ubatch == n_batch`` and an input longer than that is
refused before it is queued. Inputs are packed by tokens: one sequence id each, up to
``n_batch`` tokens and ``n_seq_max`` inputs per ``llama_decode``.

Rank pooling (a cross-encoder: bge-reranker, a converted Qwen3-Reranker) gives ``n_cls_out``
floats per input instead of a vector: its classifier head's output at [CLS] (the last token for a
causal model). ``rank_scores`` maps them to a relevance in [0, 1]; see its docstring.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp
import numpy as np

from llamactor.base.errors import EngineError, StepAbortedError
from llamactor.native.abort import AbortFlag
from llamactor.native.batch import ReusableBatch

RANK = "rank"  # the pooling name of a ranking head's scores (not an embedding: one score per input)
POOLING = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
           "last": llama_cpp.LLAMA_POOLING_TYPE_LAST, RANK: llama_cpp.LLAMA_POOLING_TYPE_RANK}
_GGUF_POOLING = {v: k for k, v in POOLING.items() if k != RANK}  # a ranking GGUF embeds with mean
# Architectures whose rank-pooling graph ends in a softmax over the labels (llama.cpp's
# build_pooling): their first output is already a probability.
_SOFTMAX_IN_GRAPH = frozenset({"qwen3", "qwen3vl"})


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
        self._n_cls_out = max(1, llama_cpp.llama_model_n_cls_out(model))
        self._softmax_in_graph = model_architecture(model) in _SOFTMAX_IN_GRAPH

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
            if pooling == RANK:  # a score must not depend on its company: flash attention sums the
                # masked-out pairs of a packed step in f16 tiles too (~2e-5 off a pair scored alone)
                cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
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
        embeddings as rows [len(inputs), n_embd] -- for ``RANK`` pooling their relevance scores
        in [0, 1] as one column [len(inputs), 1]. ``EmbeddingNoRoomError`` if they do not fit."""
        ctx = self._decode(inputs, pooling)
        if pooling == RANK:
            return rank_scores(self._rows(ctx, len(inputs), self._n_cls_out), self._softmax_in_graph)[:, None]
        return self._rows(ctx, len(inputs), self.info.n_embd)

    def _decode(self, inputs: list[list[int]], pooling: str) -> llama_cpp.llama_context_p:
        """The context of ``pooling`` after one decode of ``inputs``, one sequence id each."""
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
        return ctx

    @staticmethod
    def _rows(ctx: llama_cpp.llama_context_p, n_inputs: int, width: int) -> np.ndarray:
        """Each sequence's pooled output, ``width`` floats (llama.cpp's buffer holds that many)."""
        out = np.empty((n_inputs, width), dtype=np.float32)
        for i in range(n_inputs):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, i)
            if not ptr:
                raise EngineError(f"llama.cpp returned no embedding for input {i}")
            out[i] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(width,))
        return out

    def close(self) -> None:
        for ctx, _ in self._contexts.values():
            llama_cpp.llama_free(ctx)
        self._contexts.clear()


def rank_scores(outputs: np.ndarray, softmax_in_graph: bool) -> np.ndarray:
    """Relevance in [0, 1] from a ranking head's outputs [n, n_cls_out] (llama-server reports the
    raw ``outputs[:, 0]``). One label: a logit, so its sigmoid (sentence-transformers' CrossEncoder
    does the same). A graph that ends in a softmax (qwen3's yes/no head): label 0 as it is. Two or
    more labels elsewhere: a softmax over them, and label 0 taken as "relevant" -- the order the
    converters write (Qwen3-Reranker's ["yes", "no"]); a head with another order scores inverted."""
    logits = outputs.astype(np.float64)
    if softmax_in_graph:
        return logits[:, 0]
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0]))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted[:, 0] / shifted.sum(axis=1)


def is_ranking(model: llama_cpp.llama_model_p) -> bool:
    """Whether the GGUF declares rank pooling: a cross-encoder's classifier head, not a generator."""
    return _model_pooling(model) == llama_cpp.LLAMA_POOLING_TYPE_RANK


def model_architecture(model: llama_cpp.llama_model_p) -> str:
    """``general.architecture``, or "" if the GGUF has none."""
    buf = ctypes.create_string_buffer(64)
    if llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf)) < 0:
        return ""
    return buf.value.decode(errors="replace")


def default_pooling(model: llama_cpp.llama_model_p) -> str:
    """The pooling type the GGUF declares (``<arch>.pooling_type``) if we support it, else mean."""
    return _GGUF_POOLING.get(_model_pooling(model), "mean")


def _model_pooling(model: llama_cpp.llama_model_p) -> int:
    """The pooling type the GGUF declares, or -1."""
    buf = ctypes.create_string_buffer(64)
    arch = model_architecture(model)
    if not arch:
        return -1
    key = arch.encode() + b".pooling_type"
    if llama_cpp.llama_model_meta_val_str(model, key, buf, len(buf)) < 0:
        return -1
    try:
        return int(buf.value)
    except ValueError:
        return -1

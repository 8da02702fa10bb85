"""The process-wide half of batch-invariant mode: ggml's tiled K-quant GEMM switched off.

ggml's CPU backend reads ``GGML_CPU_TILED_MM`` once per process, into a static, the first time a
matmul asks whether to tile; after that, setting the variable changes nothing. The tiled kernel
sums a row's dot products in an order that depends on how many rows its step has (8 or more:
docs/performance.md, "Where the numbers part"), so batch-invariant mode needs it off before the
process's first matmul. ``claim_tiled_mm_off`` sets it if no model was loaded yet, and otherwise
refuses with ``BatchInvarianceError``. Called by any thread before a model loads (the caller's in
``llamactor.start`` and the CLI, the batcher's in ``Engine``); ``mark_model_loaded`` by the
batcher's thread after a load.
"""

from __future__ import annotations

import os
import threading

from llamactor.base.errors import BatchInvarianceError

TILED_MM_VAR = "GGML_CPU_TILED_MM"
_lock = threading.Lock()
_model_loaded = False  # set by the first Engine: from then on ggml may have read the variable


def tiled_mm_off() -> bool:
    return os.environ.get(TILED_MM_VAR) == "0"


def claim_tiled_mm_off() -> None:
    """Make sure ggml will read ``GGML_CPU_TILED_MM=0`` (any thread, before a model loads)."""
    with _lock:
        if tiled_mm_off():
            return
        if _model_loaded:
            raise BatchInvarianceError(
                f"batch_invariant needs {TILED_MM_VAR}=0 before this process's first model load, and a model "
                f"was already loaded (ggml reads the variable once per process): start the process with "
                f"{TILED_MM_VAR}=0 in its environment")
        os.environ[TILED_MM_VAR] = "0"


def mark_model_loaded() -> None:
    """Record that a model was loaded in this process (the batcher's thread, after the load)."""
    global _model_loaded
    with _lock:
        _model_loaded = True


def invariant_params(mparams: object, cparams: object, n_threads: int) -> None:
    """The recipe's llama.cpp settings (the batcher's thread, before the load): plain (not
    repacked) weights, whose GEMM and GEMV sum alike; flash attention, whose one-row kernel walks
    a query's cells in order wherever they sit; no GPU layers; and one thread for a ubatch of one
    token, which llama.cpp computes with ``n_threads`` (larger ones with ``n_threads_batch``), so
    flash attention never splits a lone query row's cells among threads (the split follows the
    cache's used range, i.e. the company). ``n_ubatch`` <= 32 is ``Config``'s part."""
    import llama_cpp  # here: importing llamactor (and this module with it) must not load llama.cpp

    mparams.use_extra_bufts = False  # type: ignore[attr-defined]
    mparams.n_gpu_layers = 0  # type: ignore[attr-defined]
    cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED  # type: ignore[attr-defined]
    cparams.n_threads = 1  # type: ignore[attr-defined]
    cparams.n_threads_batch = n_threads  # type: ignore[attr-defined]

"""What saving to the host-RAM tier and recomputing cost on the device in use, measured at start.

Batcher thread, on a fresh context before anything else is in it (``GenerationSteps`` calls it
once per tree: ``CacheTiers`` keeps the model across batcher restarts). One small decode: two
sequences token by token, so that one's cells alternate with the other's (one run per cell, as a
generated answer's cells are among other sequences'), then a third of twice their length in one
run. Their two saves differ in runs per cell, which gives the cost of a run and of a cell
(``tier_cost.Calibration.from_saves``); the decode gives a first recomputation rate per token,
which the steps then refine. One decode of 32 tokens and four small saves.
"""

from __future__ import annotations

import time

import numpy as np

from llamactor.native.engine import Engine
from llamactor.scheduling.tier_cost import Calibration

N_TOKENS = 8  # per interleaved sequence; the contiguous one has twice as many


def _timed_save_ms(engine: Engine, seq_id: int, n_tokens: int) -> float:
    """The faster of two saves of ``seq_id`` (the first may pay for a first allocation)."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        engine.save_seq(seq_id, n_tokens)
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def calibrate(engine: Engine) -> Calibration:
    """Measure on ``engine``'s empty context (sequences 0 to 2 are used, and left empty)."""
    n = N_TOKENS
    token = engine.tokenizer.bos_id if engine.tokenizer.bos_id >= 0 else 0
    interleaved = engine.info.n_seq_max >= 3
    if interleaved:  # 0 and 1 alternate over 2n cells (n runs each), then 2 holds 2n cells in one run
        positions = np.concatenate([np.repeat(np.arange(n), 2), np.arange(2 * n)])
        seq_ids = np.concatenate([np.tile([0, 1], n), np.full(2 * n, 2)])
        fragmented_id, contiguous_id, runs = 0, 2, n
    else:  # too few sequences: two contiguous sizes tell a fixed part from the per-cell one
        positions = np.concatenate([np.arange(n), np.arange(2 * n)])
        seq_ids = np.concatenate([np.zeros(n), np.ones(2 * n)])
        fragmented_id, contiguous_id, runs = 0, 1, 1
    used = sorted(set(seq_ids.astype(int).tolist()))
    try:
        t0 = time.perf_counter()
        engine.decode(np.full(len(positions), token, dtype=np.int32), positions.astype(np.int32),
                      seq_ids.astype(np.int32), np.zeros(len(positions), dtype=np.int8))
        decode_ms = (time.perf_counter() - t0) * 1000
        fragmented = (runs, n, _timed_save_ms(engine, fragmented_id, n))
        contiguous = (1, 2 * n, _timed_save_ms(engine, contiguous_id, 2 * n))
    finally:
        for seq_id in used:
            engine.seq_rm(seq_id)
    return Calibration.from_saves(fragmented, contiguous, (len(positions), decode_ms))

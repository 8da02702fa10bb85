"""One sequence's KV cells copied out of the context and back: llama.cpp's per-sequence state calls.

Batcher thread only (through ``Engine.save_seq`` / ``Engine.restore_seq``).

``llama_state_seq_get_data`` writes every layer's cells of a sequence, except, in the
sliding-window layers, the cells its window has moved past: a state restored from it can only be
continued from its end. llamactor's cached prefixes are attached at any length, so a ``SeqState``
also carries those older sliding-window cells, as *windows* of ``n_swa`` positions saved with
``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`` (sliding-window layers only) from the sequence's shadow
trimmed to each window's end: restored, the sequence holds every position in every layer, exactly
as before it left (the bytes are the same). Restoring the windows needs a scratch seq_id that
nobody else uses while it runs.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import numpy as np

_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
# The build whose layout the bytes have: a saved state is valid for this one only.
BUILD = f"llama-cpp-python {llama_cpp.__version__}, state v{llama_cpp.LLAMA_STATE_SEQ_VERSION}"


@dataclass(frozen=True, slots=True)
class SeqState:
    """``n_tokens`` positions of one sequence: ``full`` (every layer; the sliding-window layers'
    last ``n_swa`` positions) and ``windows`` (the sliding-window layers' older positions, newest
    first). Opaque bytes of this context's layout: valid only for the same model and KV settings."""

    n_tokens: int
    full: bytes
    windows: tuple[bytes, ...] = ()
    # The positions in the order of the cells they lay in, as the bytes hold them (where a restore
    # lays them: ``scheduling/cell_map.py``); None: not known (read from disk).
    cell_order: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.n_tokens < 1 or not self.full:
            raise ValueError("a sequence state holds at least one position")

    @property
    def nbytes(self) -> int:
        return len(self.full) + sum(len(w) for w in self.windows)


def _get(ctx: Any, seq_id: int, flags: int) -> bytes:
    size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq_id, flags)
    buf = (ctypes.c_uint8 * size)()
    n = llama_cpp.llama_state_seq_get_data_ext(ctx, buf, size, seq_id, flags)
    if n == 0:
        raise RuntimeError(f"llama_state_seq_get_data_ext failed for sequence {seq_id}")
    return bytes(memoryview(buf)[:n])


def _set(ctx: Any, seq_id: int, data: bytes, flags: int) -> bool:
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return llama_cpp.llama_state_seq_set_data_ext(ctx, buf, len(data), seq_id, flags) > 0


def save(ctx: Any, memory: Any, seq_id: int, shadow: int | None, n_tokens: int, n_swa: int) -> SeqState:
    """Copy out positions ``0 .. n_tokens - 1`` of ``seq_id`` (whose shadow is ``shadow``; None:
    a model without sliding-window layers, whose sequences have none).

    The shadow is trimmed window by window to save the older sliding-window cells, then made to
    co-own every cell of ``seq_id`` again; nothing is allocated meanwhile, so no cell is lost."""
    full = _get(ctx, seq_id, 0)
    windows: list[bytes] = []
    if shadow is not None and n_swa > 0 and n_tokens > n_swa:
        end = n_tokens - n_swa  # ``full`` holds the sliding-window layers' positions from here on
        try:
            while end > 0:
                llama_cpp.llama_memory_seq_rm(memory, shadow, end, -1)
                windows.append(_get(ctx, shadow, _PARTIAL))  # positions end - n_swa .. end - 1
                end -= n_swa
        finally:
            llama_cpp.llama_memory_seq_rm(memory, shadow, -1, -1)
            llama_cpp.llama_memory_seq_cp(memory, seq_id, shadow, -1, -1)
    return SeqState(n_tokens, full, tuple(windows))


def restore(ctx: Any, memory: Any, seq_id: int, shadow: int | None, scratch: int, state: SeqState) -> bool:
    """Put ``state`` into the empty ``seq_id`` (and its shadow, if it has one); False, with nothing
    left behind, when llama.cpp refuses it (no room, or bytes of another layout)."""
    ok = _set(ctx, seq_id, state.full, 0)
    if ok and shadow is not None:
        # Co-owned at once: a cell with one owner outside its window may be reused by the next
        # allocation in the sliding-window cache.
        llama_cpp.llama_memory_seq_cp(memory, seq_id, shadow, -1, -1)
        for window in state.windows:
            ok = _set(ctx, scratch, window, _PARTIAL)
            if ok:
                llama_cpp.llama_memory_seq_cp(memory, scratch, seq_id, -1, -1)
                llama_cpp.llama_memory_seq_cp(memory, scratch, shadow, -1, -1)
            llama_cpp.llama_memory_seq_rm(memory, scratch, -1, -1)
            if not ok:
                break
    if not ok:
        for s in (seq_id, shadow):
            if s is not None:
                llama_cpp.llama_memory_seq_rm(memory, s, -1, -1)
    return ok

"""A ``llama_batch`` whose arrays are numpy buffers allocated once and refilled every step.

llama_batch_init allocates one malloc'd ``seq_id`` array per token; filling those costs a
Python-level pointer dereference per token. Here every token's ``seq_id`` pointer is set once,
at construction, to its own slot of one flat int32 array, so a whole step is filled with a few
numpy slice assignments: one batch at ``n_batch`` capacity, reused (docs/architecture.md, *A request,
module by module*, step 5).

On a model with sliding-window layers every token carries two seq_ids: its sequence's and that
sequence's *shadow* (``seq_id + shadow_offset``). A KV cell then always belongs to at least two
sequences, which keeps llama.cpp's sliding-window cache from recycling it once it falls out of its
sequence's window (it reuses only cells with a single owner): cached prefixes keep every cell a
later request may attach. A model without them needs no shadows (``shadow_offset`` None): its
cells stay while any sequence owns them, and all of llama.cpp's ids are sequences.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

_I32P = ctypes.POINTER(ctypes.c_int32)


class ReusableBatch:
    """One fixed-capacity batch. Used by the batcher thread only."""

    def __init__(self, capacity: int, shadow_offset: int | None) -> None:
        """``shadow_offset`` None: one seq_id per token, no shadows (embedding steps, models
        without sliding-window layers)."""
        self.capacity = capacity
        self.shadow_offset = shadow_offset
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.seq_id = np.zeros((capacity, 2), dtype=np.int32)  # [sequence, its shadow] per token
        self.logits = np.zeros(capacity, dtype=np.int8)
        self._n_seq_id = np.full(capacity, 1 if shadow_offset is None else 2, dtype=np.int32)
        base = self.seq_id.ctypes.data
        self._seq_id_ptrs = (_I32P * capacity)(*(ctypes.cast(base + 8 * i, _I32P) for i in range(capacity)))
        self.n_tokens = 0

    def fill(self, token: np.ndarray, pos: np.ndarray, seq_id: np.ndarray, logits: np.ndarray,
             unshadowed: np.ndarray | None = None) -> None:
        """``unshadowed``: the entries that carry their sequence's id alone this step (rows
        sampled inside the graph: llama.cpp copies every row's logits to the host while any output
        row carries a sequence without a sampler, and a shadow never has one)."""
        n = len(token)
        if n > self.capacity:
            raise ValueError(f"{n} tokens exceed the batch capacity {self.capacity}")
        self.token[:n] = token
        self.pos[:n] = pos
        self.seq_id[:n, 0] = seq_id
        if self.shadow_offset is not None:
            self.seq_id[:n, 1] = seq_id
            self.seq_id[:n, 1] += self.shadow_offset
        self.logits[:n] = logits
        if self.shadow_offset is not None:
            self._n_seq_id[:n] = 2
            if unshadowed is not None:
                self._n_seq_id[:n][unshadowed] = 1
        self.n_tokens = n

    def view(self) -> llama_cpp.llama_batch:
        """A llama_batch over the filled entries (no copy)."""
        return llama_cpp.llama_batch(
            n_tokens=self.n_tokens,
            token=ctypes.cast(self.token.ctypes.data, ctypes.POINTER(llama_cpp.llama_token)),
            embd=None,
            pos=ctypes.cast(self.pos.ctypes.data, ctypes.POINTER(llama_cpp.llama_pos)),
            n_seq_id=ctypes.cast(self._n_seq_id.ctypes.data, _I32P),
            seq_id=ctypes.cast(ctypes.addressof(self._seq_id_ptrs), ctypes.POINTER(ctypes.POINTER(llama_cpp.llama_seq_id))),
            logits=ctypes.cast(self.logits.ctypes.data, ctypes.POINTER(ctypes.c_int8)),
        )

"""The context's logits rows: reading the ones a decode wrote, and handing back the pages of the
ones no step uses (``native/host_pages.py``). Only the batcher's thread calls it, between decodes
(llama.cpp may move the buffer when a decode needs more outputs, so its address is read each time).
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from llamactor.native.host_pages import OutputPages


class LogitsRows:
    """The output rows of one llama.cpp context (``n_vocab`` floats each, from row 0)."""

    def __init__(self, ctx: llama_cpp.llama_context_p, n_vocab: int) -> None:
        self._ctx, self.n_vocab = ctx, n_vocab
        # llama.cpp made room for one row per sequence id and cleared (touched) them all.
        self._pages = OutputPages(n_vocab, llama_cpp.llama_n_seq_max(ctx))
        self._pages.wrote(self._base(), 0, False)

    def wrote(self, n_rows: int, sampling: bool) -> None:
        """A decode wrote ``n_rows`` rows; ``sampling``: with the graph's chains attached."""
        self._pages.wrote(self._base(), n_rows, sampling)

    def release(self, keep: int) -> None:
        """Give back the pages of the rows from ``keep`` on, and of the graph sampler's regions."""
        self._pages.release(self._base(), keep)

    def view(self, n_rows: int) -> np.ndarray:
        """The first ``n_rows`` rows, in place: valid until the next decode."""
        if n_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(n_rows, self.n_vocab))

    def _base(self) -> int | None:
        return ctypes.cast(llama_cpp.llama_get_logits(self._ctx), ctypes.c_void_p).value

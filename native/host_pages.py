"""Handing back to the kernel host pages that llama.cpp reserved but no step is using.

llama.cpp sizes its logits buffer for one row of ``n_vocab`` floats per sequence id (shadows
included: 2 MiB per id with Gemma's 262k vocabulary) and clears it when it makes it, so every
page is resident from the start although a step writes only its own output rows, from row 0.
``MADV_DONTNEED`` drops the pages of rows no step is using; a later step that writes them gets
fresh zero pages, which is what the clear had put there. Only the batcher's thread calls this,
between decodes (the buffer is never read or written concurrently).
"""

from __future__ import annotations

import ctypes
import mmap

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.restype = ctypes.c_int


def release(address: int, n_bytes: int) -> bool:
    """Drop the whole pages inside ``[address, address + n_bytes)``; False if the kernel refused
    (e.g. pinned memory of a GPU build's host buffer), which costs only the memory it keeps."""
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + n_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end <= start:
        return True
    return _libc.madvise(start, end - start, mmap.MADV_DONTNEED) == 0


class OutputPages:
    """The pages of llama.cpp's output buffer that llamactor hands back, and when.

    The buffer holds one logits row per output (at least one per sequence id) and, while any
    sequence samples inside the graph, three more ``n_vocab``-wide regions per row for the graph's
    logits, probabilities and candidates (``llama_context::output_reserve``) -- 3 MiB a row with
    Gemma 3, cleared, so resident, whenever llama.cpp makes the buffer again. The graph writes
    those regions only for the few candidates its chains keep, so all of them go back at once.
    """

    def __init__(self, n_vocab: int, n_rows_min: int) -> None:
        self.row_bytes = n_vocab * 4
        self.n_vocab = n_vocab
        self.n_rows_min = n_rows_min  # llama.cpp sizes the buffer for at least this many outputs
        self.logits_resident = n_rows_min  # rows whose pages may be resident (the first clear touched all)
        self._base: int | None = None
        self._sampling: tuple[int, int] | None = None  # (address, bytes) of the graph's regions

    def wrote(self, base: int | None, n_rows: int, sampling: bool) -> None:
        """A decode wrote ``n_rows`` output rows at ``base``; ``sampling``: with chains attached."""
        n_max = max(n_rows, self.n_rows_min)
        if base != self._base:  # a new buffer: llama.cpp cleared all of it
            self._base, self._sampling = base, None
            self.logits_resident = max(self.logits_resident, n_max)
            if sampling and base is not None:
                release(base + n_max * self.row_bytes, self._sampling_bytes(n_max))
        self.logits_resident = max(self.logits_resident, n_rows)
        if sampling and base is not None:
            self._sampling = (base + n_max * self.row_bytes, self._sampling_bytes(n_max))

    def _sampling_bytes(self, n_max: int) -> int:
        return (2 * self.n_vocab * n_max + (1 + self.n_vocab) * n_max) * 4

    def release(self, base: int | None, keep: int) -> None:
        """Hand back the logits rows from ``keep`` on, and the graph's regions of the last layout
        that had them (only while the buffer is the one they were measured in)."""
        if base is None or base != self._base:
            return
        if self.logits_resident > keep:
            release(base + keep * self.row_bytes, (self.logits_resident - keep) * self.row_bytes)
            self.logits_resident = keep
        if self._sampling is not None:
            release(*self._sampling)
            self._sampling = None

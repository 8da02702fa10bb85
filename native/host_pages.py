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

"""An abort flag that llama.cpp reads between graph nodes without taking Python's GIL.

``llama_set_abort_callback`` makes the CPU backend call ``bool cb(void *data)`` after every graph
node of a decode (from its first worker thread) and stop the graph when it returns true;
``llama_decode`` then returns 2. A Python callback there would take the GIL hundreds of times
per step -- and wait for it whenever an HTTP or caller thread holds it. So the callback is C's
``strlen`` on a two-byte buffer that is ``"\\0\\0"`` (length 0: go on) or ``"!\\0"`` (length 1:
abort): a length of 0 or 1 is the same value read as ``size_t`` or as ``bool`` on every ABI that
returns both in the same register. Setting the flag is a single byte store from any thread
(the watchdog's).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from typing import Any

import llama_cpp

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)


class AbortFlag:
    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(2)
        strlen = ctypes.cast(_libc.strlen, ctypes.c_void_p).value
        assert strlen is not None
        self.callback = llama_cpp.ggml_abort_callback(strlen)
        self.data = ctypes.cast(self._buffer, ctypes.c_void_p)

    def set(self) -> None:
        """Ask the running (or next) decode to stop at its next graph node. Any thread."""
        self._buffer[0] = b"!"

    def clear(self) -> None:
        self._buffer[0] = b"\0"

    @property
    def is_set(self) -> bool:
        return self._buffer[0] != b"\0"

    def read_as_llama_cpp_does(self) -> bool:
        """Call the callback the way the CPU backend does (for tests)."""
        return bool(self.callback(self.data))


class TestHang:
    """Tests only: make one decode hang inside ``llama_decode`` until the abort flag is set.

    Installed as the context's graph-eval callback (``cb_eval``, settable only at creation), it
    blocks at the first node of the decode after ``arm()``, as a stuck kernel would, so the
    watchdog, the abort callback and ``llama_decode`` returning 2 all run for real. Answering
    "not needed" for every node keeps each graph whole.
    """

    __test__ = False  # not a pytest class

    def __init__(self, flag: AbortFlag, cparams: Any, max_hang_s: float = 600.0) -> None:
        self.flag = flag
        self.armed = False
        self.max_hang_s = max_hang_s
        self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)
        cparams.cb_eval = self._callback
        cparams.cb_eval_user_data = None

    def arm(self) -> None:
        self.armed = True

    def _on_node(self, _tensor: Any, _ask: bool, _user_data: Any) -> bool:
        if self.armed:
            self.armed = False
            deadline = time.monotonic() + self.max_hang_s
            while not self.flag.is_set and time.monotonic() < deadline:
                time.sleep(0.005)
        return False

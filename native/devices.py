"""The ggml backend devices of the loaded llama.cpp build: CPU always, CUDA0 / Vulkan0 / MTL0 ...
when it was built with a GPU backend (``make install GGML=cuda``), with their free and total memory.

llama-cpp-python binds ``llama_supports_gpu_offload`` but not ggml's device registry, so the
``ggml_backend_dev_*`` functions are bound here through ctypes, from the very libraries llama_cpp
loaded: libggml (``dev_count``, ``dev_get``: the registry) and libggml-base (the device calls),
in llama_cpp's lib folder or ``$LLAMA_CPP_LIB_PATH``. Opening an already loaded library hands
back the same handle, so these are the devices llama.cpp itself offloads to.

Call from the batcher thread (the one thread that calls into llama.cpp): a GPU backend's memory
query runs on the device, beside the decodes.
"""

from __future__ import annotations

import ctypes
import functools
import time
from pathlib import Path

import llama_cpp
from llama_cpp._ctypes_extensions import load_shared_library

from llamactor.base.engine_info import DEVICE_TYPES, Device

__all__ = ["Device", "devices", "recent_devices", "gpu_offload", "default_n_gpu_layers"]

_recent: tuple[float, tuple[Device, ...]] | None = None  # (monotonic time read, devices): recent_devices()


@functools.cache
def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml and libggml-base, typed once (the first call, on the batcher thread)."""
    folder = Path(llama_cpp.llama_cpp._base_path)  # llama_cpp's lib folder, or $LLAMA_CPP_LIB_PATH
    ggml, base = load_shared_library("ggml", folder), load_shared_library("ggml-base", folder)
    ggml.ggml_backend_dev_count.argtypes, ggml.ggml_backend_dev_count.restype = (), ctypes.c_size_t
    ggml.ggml_backend_dev_get.argtypes, ggml.ggml_backend_dev_get.restype = (ctypes.c_size_t,), ctypes.c_void_p
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, name).argtypes, getattr(base, name).restype = (ctypes.c_void_p,), ctypes.c_char_p
    base.ggml_backend_dev_type.argtypes, base.ggml_backend_dev_type.restype = (ctypes.c_void_p,), ctypes.c_int
    base.ggml_backend_dev_memory.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t))
    base.ggml_backend_dev_memory.restype = None
    return ggml, base


def _text(raw: bytes | None) -> str:
    return raw.decode(errors="replace") if raw else ""


def _device(base: ctypes.CDLL, dev: int) -> Device:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    kind = base.ggml_backend_dev_type(dev)
    return Device(name=_text(base.ggml_backend_dev_name(dev)), description=_text(base.ggml_backend_dev_description(dev)),
                  type=DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else f"type{kind}",
                  memory_free=free.value, memory_total=total.value)


def devices() -> tuple[Device, ...]:
    """Every device of ggml's registry, in its order (GPUs first, then the CPU), memory read now."""
    ggml, base = _ggml()
    return tuple(_device(base, ggml.ggml_backend_dev_get(i)) for i in range(ggml.ggml_backend_dev_count()))


def recent_devices(max_age_s: float = 1.0) -> tuple[Device, ...]:
    """``devices()`` as read at most ``max_age_s`` ago: what the published stats carry, so that
    a busy batcher publishing every few steps asks the driver for its memory once a second."""
    global _recent
    now = time.monotonic()
    if _recent is None or now - _recent[0] > max_age_s:
        _recent = (now, devices())
    return _recent[1]


def gpu_offload() -> bool:
    """Whether the build has a backend that layers can be offloaded to (CUDA, Vulkan, Metal ...)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def default_n_gpu_layers() -> int:
    """What ``Config.n_gpu_layers=None`` means: every layer (llama.cpp's -1) on a GPU build, none
    on a CPU build (where 0 is what llamactor always passed)."""
    return -1 if gpu_offload() else 0

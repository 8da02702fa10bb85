"""What a GGUF file says of its model, read from its header alone (any thread, though reading a
header takes up to a few hundred milliseconds: call it off an event loop). Reads the file with
plain Python (no llama.cpp).

Ollama's ``/api/tags``, ``/api/show`` and ``/api/ps`` describe models that may not be loaded (listing must
not load them) or that live in Ray Serve replicas, so the facts come from the file itself, not from
the engine: its key-values with their types (clients read ``<arch>.context_length`` as a number),
the chat template, and the parameter count summed over the tensor shapes. Only the header is read
(through ``mmap``: the weights are never touched), once per file version.
"""

from __future__ import annotations

import functools
import hashlib
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"GGUF"
# GGUF value types: fixed-size scalars by struct format; 8 is a string, 9 an array
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SHORT_ARRAY = 5  # Ollama's /api/show leaves longer arrays (the vocabulary) empty unless verbose

# llama.cpp's llama_ftype (general.file_type), named as Ollama names quantization levels
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


@dataclass(frozen=True)
class GgufFile:
    path: str
    size: int
    mtime: float
    metadata: dict[str, Any] = field(default_factory=dict)  # arrays longer than SHORT_ARRAY: [] unless verbose
    n_params: int = 0  # summed over the tensors' shapes

    @property
    def digest(self) -> str:
        """A stable 64-hex id of this file version (clients show it, none verifies it)."""
        return hashlib.sha256(f"{self.path}:{self.size}:{self.mtime}".encode()).hexdigest()

    @property
    def family(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def quantization(self) -> str:
        file_type = self.metadata.get("general.file_type")
        return FILE_TYPES.get(file_type, "unknown") if isinstance(file_type, int) else "unknown"

    def details(self) -> dict[str, Any]:
        """Ollama's ``details`` object."""
        return {"parent_model": "", "format": "gguf", "family": self.family,
                "families": [self.family] if self.family else None,
                "parameter_size": human_number(self.n_params) if self.n_params else "",
                "quantization_level": self.quantization}

    def model_info(self) -> dict[str, Any]:
        """Ollama's ``model_info``: the key-values but the name and the template, and the
        parameter count (which Ollama adds)."""
        info = {k: v for k, v in self.metadata.items() if k not in ("general.name", "tokenizer.chat_template")}
        info["general.parameter_count"] = self.n_params
        return info


def human_number(n: int) -> str:
    """Ollama's ``format.HumanNumber``: 268098176 -> "268.10M", 7615616512 -> "7.6B"."""
    for unit, suffix, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= unit:
            value = n / unit
            return f"{value:.0f}{suffix}" if value == math.floor(value) else f"{value:.{decimals}f}{suffix}"
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def read_gguf(path: str, verbose: bool = False) -> GgufFile | None:
    """The header of the GGUF file at ``path`` (cached per file version), or None when it cannot
    be read as one (missing here, e.g. on a Ray ingress node; not GGUF)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _read_cached(path, st.st_size, st.st_mtime, verbose)


@functools.lru_cache(maxsize=32)
def _read_cached(path: str, size: int, mtime: float, verbose: bool) -> GgufFile | None:
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            metadata, n_params = _Reader(buf, None if verbose else SHORT_ARRAY).header()
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
    return GgufFile(path, size, mtime, metadata, n_params)


class _Reader:
    def __init__(self, buf: Any, max_array: int | None) -> None:
        self.buf, self.at, self.max_array = buf, 0, max_array

    def _unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        text = bytes(self.buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return text

    def _value(self, kind: int) -> Any:
        if kind in _SCALAR:
            return self._unpack(_SCALAR[kind])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self._unpack("<I"), self._unpack("<Q")
        keep = self.max_array is None or count <= self.max_array
        if item in _SCALAR and not keep:  # skipped without reading: the vocabulary's scores, types
            self.at += count * struct.calcsize(_SCALAR[item])
            return []
        values = [self._value(item) for _ in range(count)]
        return values if keep else []

    def header(self) -> tuple[dict[str, Any], int]:
        if bytes(self.buf[:4]) != MAGIC:
            raise ValueError("not a GGUF file")
        self.at = 4
        version = self._unpack("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            metadata[key] = self._value(self._unpack("<I"))
        n_params = 0
        for _ in range(n_tensors):
            self._string()  # name
            dims = [self._unpack("<Q") for _ in range(self._unpack("<I"))]
            self.at += 4 + 8  # type, offset
            n_params += math.prod(dims)
        return metadata, n_params

"""Copies of a GGUF model with metadata added: sampling recommendations (``general.sampling.*``), as a
model author's converter writes them (the types of the ``gguf`` package's ``GGUFWriter.add_sampling_*``),
or any keys (``with_metadata``: a ``tokenizer.chat_template.rerank``).

The copy is spliced at the byte level: the header's key-value count grows, the new pairs follow
the old ones, the tensor infos follow unchanged and the tensor data is re-aligned (its offsets
are relative to where it starts). ``gguf_new_metadata`` does the same through ``GGUFReader``,
which takes two minutes over Gemma's 262,144-token vocabulary; this takes a second.
"""

from __future__ import annotations

import struct
from pathlib import Path

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUFValueType

_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
            GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
            GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
# general.sampling.<key> -> its type in llama.cpp's writer (the other keys are float32)
_TYPES = {"sequence": GGUFValueType.STRING, "top_k": GGUFValueType.INT32, "penalty_last_n": GGUFValueType.INT32,
          "mirostat": GGUFValueType.INT32}


def with_sampling(source: str, target: Path, sampling: dict[str, object]) -> Path:
    """``target``: ``source`` with ``general.sampling.<key>`` set to each of ``sampling``."""
    return with_metadata(source, target, {f"general.sampling.{key}": (_TYPES.get(key, GGUFValueType.FLOAT32), value)
                                          for key, value in sampling.items()})


def with_metadata(source: str, target: Path, pairs: dict[str, tuple[GGUFValueType, object]]) -> Path:
    """``target``: ``source`` with each key of ``pairs`` added, of its (type, value)."""
    data = memoryview(Path(source).read_bytes())
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version >= 3, source
    kv_end, alignment = _skip_kvs(data, 24, n_kv)
    infos_end = _skip_tensor_infos(data, kv_end, n_tensors)
    new = b"".join(_kv(key, kind, value) for key, (kind, value) in pairs.items())
    head = struct.pack("<4sIQQ", magic, version, n_tensors, n_kv + len(pairs))
    written = len(head) + (kv_end - 24) + len(new) + (infos_end - kv_end)
    with open(target, "wb") as out:
        for part in (head, data[24:kv_end], new, data[kv_end:infos_end], bytes(-written % alignment),
                     data[infos_end + (-infos_end % alignment):]):
            out.write(part)
    return target


def _string(data: memoryview, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", data, at)
    return bytes(data[at + 8:at + 8 + n]).decode(), at + 8 + n


def _skip_value(data: memoryview, at: int, kind: int) -> int:
    if kind == GGUFValueType.STRING:
        return _string(data, at)[1]
    if kind == GGUFValueType.ARRAY:
        item, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if item in _SCALARS:
            return at + count * struct.calcsize(_SCALARS[GGUFValueType(item)])
        for _ in range(count):
            at = _skip_value(data, at, item)
        return at
    return at + struct.calcsize(_SCALARS[GGUFValueType(kind)])


def _skip_kvs(data: memoryview, at: int, n_kv: int) -> tuple[int, int]:
    """Where the key-value pairs end, and the file's data alignment."""
    alignment = GGUF_DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key, at = _string(data, at)
        (kind,) = struct.unpack_from("<I", data, at)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", data, at + 4)
        at = _skip_value(data, at + 4, kind)
    return at, alignment


def _skip_tensor_infos(data: memoryview, at: int, n_tensors: int) -> int:
    for _ in range(n_tensors):
        at = _string(data, at)[1]
        (n_dims,) = struct.unpack_from("<I", data, at)
        at += 4 + 8 * n_dims + 4 + 8  # the dims, the type, the offset
    return at


def _kv(key: str, kind: GGUFValueType, value: object) -> bytes:
    encoded = key.encode()
    if kind == GGUFValueType.STRING:
        text = str(value).encode()
        payload = struct.pack("<Q", len(text)) + text
    else:
        payload = struct.pack("<" + _SCALARS[kind], value)
    return struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", kind) + payload

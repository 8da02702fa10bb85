"""Folders of models for the tests: links to the two real GGUFs, and small files written with the
``gguf`` package that a scan must leave out (a LoRA adapter, a projector) or that cannot load."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np


def write_gguf(path: Path, arch: str, kind: str | None = None) -> Path:
    """A tiny GGUF whose header says ``general.architecture`` ``arch`` and ``general.type`` ``kind``."""
    writer = gguf.GGUFWriter(str(path), arch)
    if kind is not None:
        writer.add_type(kind)
    if kind == gguf.GGUFType.ADAPTER:  # llama.cpp's LoRA format
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 8.0)
    writer.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def model_folder(folder: Path, model_path: str, instruct_path: str) -> Path:
    """``gemma.gguf`` and ``smol.gguf`` (links to the real models), ``lora-smol.gguf`` (an adapter),
    ``mmproj-smol.gguf`` (a projector by name) and ``broken.gguf`` (not a GGUF at all)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.symlink(model_path, folder / "gemma.gguf")
    os.symlink(instruct_path, folder / "smol.gguf")
    write_gguf(folder / "lora-smol.gguf", "llama", gguf.GGUFType.ADAPTER)
    (folder / "mmproj-smol.gguf").write_bytes(b"GGUF projector weights would be here")
    (folder / "broken.gguf").write_bytes(b"this is not a model")
    (folder / "notes.txt").write_text("not a .gguf: not looked at")
    return folder

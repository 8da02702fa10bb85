"""A folder of models (``llamactor serve --models-dir DIR``), as llama-server's router mode reads one.

Every ``*.gguf`` directly in the folder is a model named by its file stem, except LoRA adapters
(GGUF ``general.type`` "adapter") and multimodal projectors (``general.type`` "mmproj", the
``clip`` architecture, or ``mmproj`` in the file name): those are kept apart, not served. The
kind comes from the GGUF header alone (``llamactor.native.gguf_header``: the weights are never
read); a file whose header cannot be read is still listed as a model, so that loading it fails
with its reason (``ModelLoadError``) where a client can see it. Runs on the caller's thread
(reading the headers of a folder of large models takes a few hundred milliseconds each).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.native.gguf_header import read_gguf

MODEL, ADAPTER, PROJECTOR = "model", "adapter", "projector"


@dataclass(frozen=True, slots=True)
class FoundFile:
    name: str  # the file stem: the model id clients send
    path: str
    size: int  # bytes
    kind: str = MODEL


@dataclass(frozen=True, slots=True)
class ModelDir:
    path: str
    models: list[FoundFile] = field(default_factory=list)
    skipped: list[FoundFile] = field(default_factory=list)  # adapters and projectors

    def path_of(self, name: str) -> str | None:
        return next((m.path for m in self.models if m.name == name), None)


def classify(filename: str, metadata: Mapping[str, Any] | None) -> str:
    """What a GGUF file is, from its name and header (None: unreadable, taken for a model)."""
    meta = metadata or {}
    if meta.get("general.type") == "adapter":
        return ADAPTER
    if meta.get("general.type") == "mmproj" or meta.get("general.architecture") == "clip":
        return PROJECTOR
    if "mmproj" in filename.lower():
        return PROJECTOR
    return MODEL


def scan_models_dir(directory: str) -> ModelDir:
    """The models of ``directory`` by name, sorted; ``InvalidRequestError`` if it is no folder."""
    folder = Path(os.path.expanduser(directory))
    if not folder.is_dir():
        raise InvalidRequestError(f"models_dir {directory}: not a directory")
    found = ModelDir(str(folder))
    for path in sorted(folder.glob("*.gguf")):
        if not path.is_file():  # a folder named x.gguf, a dangling link
            continue
        header = read_gguf(str(path))
        entry = FoundFile(path.stem, str(path), path.stat().st_size,
                          classify(path.name, header.metadata if header else None))
        (found.models if entry.kind == MODEL else found.skipped).append(entry)
    return found

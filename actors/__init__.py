"""llamactor: one local GGUF model shared by many concurrent callers through batched llama.cpp decodes.

    import llamactor
    with llamactor.start(n_parallel=8) as llm:
        print(llm.ask("Write a haiku", max_tokens=64, temperature=0).text)
"""

from llamactor.launch import start
from llamactor.handles.llm import LLM
from llamactor.handles.client import Client
from llamactor.serving.model_specs import ModelSpec
from llamactor.serving.replicas import Replicas
from llamactor.serving.router import Router
from llamactor.base.completion import Completion, Embeddings, Timings, Tokenized, Usage
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.grammar import Grammar
from llamactor.base.errors import (
    BatcherRestartedError,
    BatchInvarianceError,
    BatcherUnavailableError,
    CancelledError,
    ContextExceededError,
    ContextFullError,
    EngineError,
    InvalidRequestError,
    LlamactorError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotLoadedError,
    PermissionDeniedError,
    PoisonRequestError,
    QueueFullError,
    RateLimitError,
    RequestFailedError,
    SequenceLimitError,
)

__all__ = [
    "LLM", "start", "Client", "Router", "Replicas", "ModelSpec", "Completion", "Embeddings", "Tokenized", "Timings", "Usage", "Config", "SamplingParams", "Grammar",
    "LlamactorError", "InvalidRequestError", "QueueFullError", "RateLimitError", "PermissionDeniedError", "ContextFullError", "ContextExceededError", "CancelledError",
    "BatcherRestartedError", "BatcherUnavailableError", "EngineError", "ModelLoadError", "ModelNotFoundError",
    "BatchInvarianceError", "RequestFailedError", "PoisonRequestError", "ModelNotLoadedError", "SequenceLimitError",
]

"""Every exception a llamactor caller can receive, in one module.

Each error ends exactly one request (or, for the ``Batcher*`` errors, the requests that the
failure touched) and says why in words a caller can show to a user. The HTTP front end maps
each class to one status code via ``http_status``.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamactor.base.completion import Completion


class LlamactorError(Exception):
    """Base class of every llamactor error. ``details``: extra fields for the HTTP error body."""

    http_status = 500
    code = "internal_error"

    def __init__(self, *args: object, **details: object) -> None:
        super().__init__(*args)
        self.details = details


class InvalidRequestError(LlamactorError, ValueError):
    """The request itself is wrong: empty prompt, too long for the context, bad sampling values."""

    http_status = 400
    code = "invalid_request_error"


def require(ok: bool, message: str) -> None:
    """An ``InvalidRequestError`` saying ``message`` unless ``ok``: a setting's check."""
    if not ok:
        raise InvalidRequestError(message)


class ContextExceededError(InvalidRequestError):
    """The prompt (plus ``max_tokens``) does not fit in one sequence's context. Over HTTP, as
    llama-server answers it: type ``exceed_context_size_error`` with ``n_prompt_tokens`` and
    ``n_ctx``."""

    code = "exceed_context_size_error"


class QueueFullError(LlamactorError):
    """The batcher already holds ``max_queue`` waiting requests; retry later."""

    http_status = 429
    code = "queue_full"


class PermissionDeniedError(LlamactorError):
    """The caller's key may not do this (an admin's operation)."""

    http_status = 403
    code = "permission_denied"


class RateLimitError(LlamactorError):
    """The tenant is over its requests or tokens per minute; retry after ``retry_after`` seconds.
    ``headers``: what it has left, as OpenAI's ``x-ratelimit-*`` headers say it."""

    http_status = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.headers = headers

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled whole (a front-end process gets its 429 from the engine's limits): the default
        # would call the class with the message alone.
        return functools.partial(type(self), retry_after=self.retry_after, headers=self.headers), (str(self),)


class ContextFullError(LlamactorError):
    """This sequence cannot fit in the shared KV cache even alone (every other running sequence
    preempted, cached prefixes evicted), or llama.cpp found no room for it although the scheduler
    expected some (``llama_decode`` returned 1 with the step already split down to it)."""

    http_status = 400
    code = "context_full"


class CancelledError(LlamactorError, concurrent.futures.CancelledError):
    """The request was cancelled; ``completion`` holds what was generated before that."""

    http_status = 499
    code = "cancelled"

    def __init__(self, message: str = "request cancelled", completion: Completion | None = None):
        super().__init__(message)
        self.completion = completion


class BatcherRestartedError(LlamactorError):
    """The process serving this stream died after it had delivered tokens (a Ray Serve replica lost):
    its checkpoint died with it, so it cannot resume. (A batcher crash in-process resumes streams.)"""

    http_status = 503
    code = "batcher_restarted"


class BatcherUnavailableError(LlamactorError):
    """Nothing can serve the request now: the handle is closed or closing, the supervisor gave up
    restarting its batcher, the server is starting or draining, a model was unloaded mid-route,
    ``max_loaded`` models are loaded and busy, or no Ray replica could serve it."""

    http_status = 503
    code = "batcher_unavailable"


class RequestFailedError(LlamactorError):
    """Something went wrong inside llamactor while it handled this request alone (tokenizing,
    rendering, setting up its sampler, a step only it touched): our bug, not the caller's, so a
    500. Only this request fails; the model goes on serving the others. The message names the
    request id; the server log has the traceback once (event ``request_failed``)."""

    code = "request_failed"


class PoisonRequestError(LlamactorError):
    """Quarantined: this request was being handled each time the batcher crashed, twice, so it is
    not replayed a third time (Erlang's poison message). A 422, not a 500: the request is well
    formed but cannot be processed, and repeating it is what would hurt -- the OpenAI and
    Anthropic clients retry a 5xx on their own, never a 4xx other than 408/409/429. The server
    log names it once (event ``request_quarantined``)."""

    http_status = 422
    code = "poison_request"


class ModelNotLoadedError(BatcherUnavailableError):
    """The model is served but not loaded, and this caller may not load it by asking for it
    (``Config.load_on_request``: loading is an admin's unless the operator says otherwise)."""

    code = "model_not_loaded"


class EngineError(LlamactorError):
    """llama.cpp failed in a way that leaves the context unusable; crashes the batcher on purpose."""


class StepAbortedError(EngineError):
    """A decode step was aborted because it ran longer than ``watchdog_timeout_s``."""


class ModelLoadError(LlamactorError):
    """The GGUF file could not be loaded (missing, unreadable, not a model). Over HTTP a 500, as
    llama-server's router answers a model that failed to load; the other models keep serving."""

    code = "model_load_error"


class SequenceLimitError(ModelLoadError):
    """The configuration asks for more sequence ids than the model's context holds (256, or 128
    on a model with sliding-window layers: ``llamactor.base.config.max_sequences``); ``details``
    has ``max_sequences``. Raised as the model loads, before its context is made."""

    code = "sequence_limit"


class BatchInvarianceError(LlamactorError):
    """Batch-invariant mode was asked for too late: a model was already loaded in this process
    without ``GGML_CPU_TILED_MM=0`` in the environment (ggml reads it once per process)."""

    code = "batch_invariance_error"


class ModelNotFoundError(LlamactorError, KeyError):
    """The request names a model the router does not serve (OpenAI answers 404)."""

    http_status = 404
    code = "model_not_found"

    @classmethod
    def among(cls, name: str, served: list[str]) -> ModelNotFoundError:
        return cls(f"The model {name!r} does not exist; this server serves {', '.join(repr(n) for n in served)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""

"""Errors in each client's own shape (pure).

OpenAI (``/v1/...`` and the prefix-less llama-server routes): ``{"error": {"message", "type",
"param", "code"}}``. Anthropic (``/v1/messages...``): ``{"type": "error", "error": {"type",
"message"}}`` with Anthropic's error types. Ollama (``/api/...``): ``{"error": "message"}``. A
llamactor error keeps its status (internal ones are 500); anything unexpected is a 500 whose
message says no more than "internal server error".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llamactor.base.errors import LlamactorError, RateLimitError

Dialect = Literal["openai", "anthropic", "ollama"]

# Anthropic's error types by HTTP status (its API reference, "Errors")
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


def dialect_of(path: str) -> Dialect:
    """Whose error shape a path answers in."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What an error body says: its status, message, type and code, and extra fields (OpenAI's
    error object takes them: llama-server's ``n_prompt_tokens`` / ``n_ctx``, a ``param``)."""

    status: int
    message: str
    type: str
    code: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    retry_headers: dict[str, str] = field(default_factory=dict)  # a 429's Retry-After and x-ratelimit-*

    @classmethod
    def of(cls, e: BaseException) -> ErrorInfo:
        """A llamactor error as its status (500 for internal ones); anything else a bare 500."""
        if not isinstance(e, LlamactorError):
            return cls(500, "internal server error", "server_error")
        status = e.http_status if e.http_status < 500 or e.http_status == 503 else 500
        retry = {"Retry-After": str(e.retry_after), **e.headers} if isinstance(e, RateLimitError) else {}
        return cls(status, str(e), e.code, e.code, dict(e.details), retry)

    def body(self, dialect: Dialect) -> dict[str, object]:
        """The error object of ``dialect``."""
        if dialect == "anthropic":
            return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(self.status, "api_error"),
                                               "message": self.message}}
        if dialect == "ollama":
            return {"error": self.message}
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code,
                          **self.extra}}

    @property
    def headers(self) -> dict[str, str] | None:
        """A 429 says when to come back (a tenant's quota: and what it has left)."""
        if self.status != 429:
            return None
        return self.retry_headers or {"Retry-After": "1"}

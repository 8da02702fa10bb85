"""Errors in each client's own shape, chosen by the request's path (pure).

OpenAI (``/v1/...`` and the prefix-less llama-server routes): ``{"error": {"message", "type",
"param", "code"}}``. Anthropic (``/v1/messages...``): ``{"type": "error", "error": {"type",
"message"}}`` with Anthropic's error types. Ollama (``/api/...``): ``{"error": "message"}``.
A 429 carries ``Retry-After``; anything unexpected is a 500 without a stack trace.
"""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse

from llamactor.base.errors import LlamactorError

Dialect = Literal["openai", "anthropic", "ollama"]

# Anthropic's error types by HTTP status (its API reference, "Errors")
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


def dialect_of(path: str) -> Dialect:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


def error_body(dialect: Dialect, status: int, message: str, type_: str, code: str | None = None,
               **extra: object) -> dict[str, object]:
    """The error object of ``dialect``; ``extra`` fields join OpenAI's error (llama-server's
    ``n_prompt_tokens`` / ``n_ctx``)."""
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    if dialect == "ollama":
        return {"error": message}
    return {"error": {"message": message, "type": type_, "param": None, "code": code, **extra}}


def error_response(path: str, status: int, message: str, type_: str, code: str | None = None,
                   headers: dict[str, str] | None = None, **extra: object) -> JSONResponse:
    return JSONResponse(error_body(dialect_of(path), status, message, type_, code, **extra), status_code=status,
                        headers=headers)


def from_exception(path: str, e: LlamactorError) -> JSONResponse:
    """A llamactor error as its HTTP status (500 for internal ones) in the path's dialect."""
    headers = {"Retry-After": "1"} if e.http_status == 429 else None
    status = e.http_status if e.http_status < 500 or e.http_status == 503 else 500
    return error_response(path, status, str(e), e.code, e.code, headers, **e.details)

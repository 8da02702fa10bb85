"""The app's exception handlers: every refusal in the dialect of the request's path
(``llamactor.dialects.errors``) with the status of its error class (400, 401, 404, 413, 429 +
Retry-After, 503); anything unexpected is a 500 with no stack trace (uvicorn's event loop).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamactor.base.errors import LlamactorError
from llamactor.base.logging import get_logger
from llamactor.dialects.errors import ErrorInfo, dialect_of
from llamactor.dialects.rerank.replies import reads_detail

log = get_logger("llamactor.http")


def error_response(path: str, error: ErrorInfo, headers: dict[str, str] | None = None) -> JSONResponse:
    body = error.body(dialect_of(path))
    if reads_detail(path):  # Jina-style rerank clients read only ``detail``, whatever the status
        body["detail"] = error.message
    return JSONResponse(body, status_code=error.status, headers=headers or error.headers)


async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body the schema refuses: a 400 naming where (pydantic's message, without its prefix)."""
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    if first.get("type") == "json_invalid" or not first:
        message = "invalid JSON body"
    text = f"{where}: {message}" if where else message
    return error_response(request.url.path, ErrorInfo(400, text, "invalid_request_error", "invalid_request_error"))


async def llamactor_error(request: Request, exc: LlamactorError) -> JSONResponse:
    return error_response(request.url.path, ErrorInfo.of(exc))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404 (no such path), 405 (wrong method): the dialect's error shape, not FastAPI's ``{"detail": ...}``."""
    type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(request.url.path, ErrorInfo(exc.status_code, str(exc.detail), type_),
                          dict(exc.headers or {}) or None)


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("http_unexpected_error", error=repr(exc))
    return error_response(request.url.path, ErrorInfo.of(exc))

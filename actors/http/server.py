"""The HTTP app (FastAPI): transport only. Middleware (``middleware``: the API key, ids, logging,
the request counter, JSON bodies; ``body_limit``), the exception handlers (``errors``: each
dialect's error shape), and one ``APIRouter`` per dialect, whose module-level handlers turn a
body into typed requests and back through ``llamactor.dialects`` over the common request path
(``request_path``) and the one stream framing (``framing``).

Handlers run on uvicorn's event loop and only await futures from the actor trees. A client that
disconnects cancels its request.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamactor.base.errors import LlamactorError
from llamactor.http import (anthropic_routes, batches_routes, engine_routes, errors, files_routes, model_admin_routes,
                            ollama_model_routes, ollama_routes, openai_routes, ops_routes, responses_routes,
                            tokenizer_routes, ui_routes)
from llamactor.http.body_limit import BodyLimitMiddleware
from llamactor.http.middleware import JsonBodies, guard_and_log
from llamactor.http.state import ServerState

# Served twice: under /v1 and at the root (llama-server's routes: an openai client whose
# base_url lacks /v1 calls those).
BOTH_PREFIXES = (openai_routes.router, responses_routes.router, tokenizer_routes.router, files_routes.router,
                 batches_routes.router)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="llamactor", docs_url=None, redoc_url=None, strict_content_type=False)
    app.state.server = state
    app.middleware("http")(guard_and_log)
    app.add_exception_handler(RequestValidationError, errors.invalid_body)  # type: ignore[arg-type]
    app.add_exception_handler(LlamactorError, errors.llamactor_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, errors.http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, errors.unexpected)
    app.include_router(ops_routes.router)
    app.include_router(model_admin_routes.router)  # llama-server's /models/load and /models/unload: the root only
    app.include_router(engine_routes.router)  # the live view of the engine, and its pages
    app.include_router(ui_routes.router)
    for router in BOTH_PREFIXES:
        app.include_router(router, prefix="/v1")
        app.include_router(router)
    for router in (anthropic_routes.router, ollama_routes.router, ollama_model_routes.router):
        app.include_router(router)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=state.max_body_bytes)  # outermost: runs first
    return app

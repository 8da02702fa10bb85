"""The daemon's own web pages (uvicorn's event loop): the chat at ``/ui/`` and the live view of
the engine at ``/ui/engine``, plain HTML and small JavaScript modules shipped inside the package
(``llamactor/http/ui/``, package data), so they work offline. Every page and asset is sent with a
Content-Security-Policy that allows this origin alone: no other origin's script, style, font or
connection. The pages themselves hold no data and need no key; what they fetch does.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

router = APIRouter()

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                           "form-action 'self'; frame-ancestors 'none'")
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
UI_PREFIX = "/ui"


def _assets() -> dict[str, tuple[bytes, str]]:
    """Every file of the package's ``ui`` folder, read once: name -> (bytes, media type). Only
    these names are served (no path from a request ever reaches the file system)."""
    folder = resources.files("llamactor.http") / "ui"
    return {f.name: (f.read_bytes(), MEDIA_TYPES[ext]) for f in folder.iterdir()
            if (ext := "." + f.name.rpartition(".")[2]) in MEDIA_TYPES}


ASSETS = _assets()


def page_response(name: str) -> Response:
    body, media_type = ASSETS[name]
    return Response(body, media_type=media_type, headers={
        "Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"})


@router.get("/ui", include_in_schema=False)
async def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.api_route("/ui/", methods=["GET", "HEAD"], include_in_schema=False)
async def chat_page() -> Response:
    return page_response("index.html")


@router.api_route("/ui/engine", methods=["GET", "HEAD"], include_in_schema=False)
async def engine_page() -> Response:
    return page_response("engine.html")


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name not in ASSETS or name.endswith(".html"):
        return Response("not found", status_code=404, media_type="text/plain")
    return page_response(name)

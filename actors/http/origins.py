"""Who may drive the daemon from a browser (uvicorn's event loop): the Host and Origin checks that
close DNS rebinding and cross-site requests (the class of Ollama's CVE-2024-28224), and the CORS
policy built on the same list.

- **Host**, checked when no key is asked for (no ``--api-key`` or ``--keys``): a DNS-rebinding page
  reaches the daemon under its own name, so a name that is not one of ours is a 403. Allowed: any
  IP literal (rebinding always carries a name), ``localhost`` and ``*.localhost``, this machine's
  hostname, the bind address, and ``--allowed-hosts`` (``*``: any). With keys the check is off:
  a rebinding page has no key, and a daemon reached by its LAN name keeps working.
- **Origin**, checked always, as Ollama does: a browser request from another site is a 403 unless
  its origin is the request's own (the daemon's web pages), a loopback one (any port), the bind
  address, or in ``--allowed-origins`` (``*``: any); ``null`` (sandboxed frames, files) is refused.
- A browser's body must say it is JSON: a non-JSON Content-Type (``text/plain``, a form) with an
  Origin is the "simple request" that skips CORS preflight, so it is a 415. Without an Origin
  (curl, LiteLLM's Ollama provider) any Content-Type is read as JSON (``middleware.JsonBodies``).
- CORS (Starlette's ``CORSMiddleware``) answers the allowed origins alone.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware

from llamactor.base.logging import get_logger
from llamactor.dialects.errors import ErrorInfo
from llamactor.http.body_limit import ASGIApp, Receive, Scope, Send, refuse
from llamactor.http.errors import error_response

log = get_logger("llamactor.http")
WILDCARD_BINDS = ("", "0.0.0.0", "::")
EXPOSED_HEADERS = ["x-request-id", "retry-after", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                   "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
                   "x-ratelimit-reset-tokens"]


def host_name(netloc: str) -> str:
    """``Example.COM:8000`` -> ``example.com``; ``[::1]:80`` -> ``::1``."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:].partition("]")[0]
    return netloc.rpartition(":")[0] if netloc.count(":") == 1 else netloc


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """``localhost`` (and RFC 6761's ``*.localhost``), 127.0.0.0/8, ``::1``."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OriginPolicy:
    """The hosts and origins a daemon bound to ``bind_host`` accepts (see the module's docstring).
    ``bind_host`` None: a Unix socket, which no browser reaches (the Host check is off)."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    bind_host: str | None = "127.0.0.1"

    @property
    def any_origin(self) -> bool:
        return "*" in self.allowed_origins

    def host_allowed(self, host_header: str | None) -> bool:
        """Whether a keyless request's Host names us (no Host: HTTP/1.0, which no browser sends)."""
        if self.bind_host is None or not host_header or "*" in self.allowed_hosts:
            return True
        host = host_name(host_header)
        return (is_ip(host) or is_loopback(host) or host == self._bind_name() or host == socket.gethostname().lower()
                or host in {host_name(h) for h in self.allowed_hosts})

    def origin_allowed(self, origin: str, host_header: str | None = None) -> bool:
        """Whether a browser at ``origin`` may call (``host_header``: the request's own Host, so
        that the daemon's own pages are allowed under whatever name they were opened)."""
        origin = origin.strip().lower().rstrip("/")
        if self.any_origin or origin in {o.lower().rstrip("/") for o in self.allowed_origins}:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null", file:, app:, extensions: only by name in --allowed-origins
        if host_header and parts.netloc == host_header.strip().lower():
            return True  # same origin
        host = host_name(parts.netloc)
        return is_loopback(host) or (host == self._bind_name() and host not in WILDCARD_BINDS)

    def _bind_name(self) -> str:
        return host_name(self.bind_host or "")


class OriginGuard:
    """Refuses a foreign Host (keyless only: ``keyless()`` says, per request, since SIGHUP may
    change the keys), a foreign Origin, and a browser's non-JSON body, from the headers alone:
    before the body is read, the connection closed."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy, keyless: Callable[[], bool],
                 is_json: Callable[[bytes | None], bool]) -> None:
        self.app, self.policy, self.keyless, self.is_json = app, policy, keyless, is_json

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (error := self.check(scope)) is not None:
            await refuse(error_response(scope["path"], error), scope, receive, send)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> ErrorInfo | None:
        headers = {k: v for k, v in scope.get("headers") or [] if k in (b"host", b"origin", b"content-type")}
        host, origin = (v.decode("latin-1") if v is not None else None for v in map(headers.get, (b"host", b"origin")))
        content_type = headers.get(b"content-type")
        if self.keyless() and not self.policy.host_allowed(host):
            log.warning("http_host_refused", host=host[:100] if host else None)
            return ErrorInfo(403, "this Host is not allowed (a keyless daemon answers its own names: "
                                  "--allowed-hosts)", "permission_error", "host_not_allowed")
        if origin is not None and not self.policy.origin_allowed(origin, host):
            log.warning("http_origin_refused", origin=origin[:100])
            return ErrorInfo(403, "this Origin is not allowed (--allowed-origins)", "permission_error",
                             "origin_not_allowed")
        if origin is not None and scope["method"] not in ("GET", "HEAD", "OPTIONS") and not self.is_json(content_type):
            return ErrorInfo(415, "a browser's request body must be sent as Content-Type: application/json",
                             "invalid_request_error", "unsupported_media_type")
        return None


class PolicyCors(CORSMiddleware):
    """Starlette's CORS, answering the origins the policy allows (preflights included); no
    credentials (keys travel in headers, never in cookies)."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy) -> None:
        super().__init__(app, allow_origins=["*"] if policy.any_origin else [], allow_methods=["*"],
                         allow_headers=["*"], expose_headers=EXPOSED_HEADERS, max_age=600,
                         allow_private_network=True)  # Chrome asks before a public page calls localhost
        self.policy = policy

    def is_allowed_origin(self, origin: str) -> bool:
        return self.policy.origin_allowed(origin)

"""What the daemon's front-end processes share in the engine's process (``--frontend-processes N``;
docs/operations.md, *Front-end processes*): the tenants' requests and tokens per minute (one
``Limiter``) and the Responses API's stored responses (one ``ResponseStore``), so that N front
ends count a tenant's limits once and a conversation's turns may land on any of them.

A front end is our own process (it checked the tenant's key, and its estimates are our code's);
what it asks here names the tenant it found, and a stored response is found under that tenant
alone. Nothing here waits: a request over its tenant's limits is refused at once (a 429), so no
link's reader or worker ever sleeps on a tenant. (The batch lines that do wait for their limits run
in this process, ``engine_jobs``, and wait on their own job threads.)

Threads: each link's reader (a ``LIMITED`` frame reserves, its ``SETTLE`` settles:
``engine_link``), its call workers (``call``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from llamactor.handles.limits import Limiter
from llamactor.http.responses_store import Previous, ResponseStore, Stored

CALLS = frozenset({"response_get", "response_put", "response_delete"})  # answered by ``call``


class EngineState:
    """The one ``Limiter`` and ``ResponseStore`` behind every front end's link (any thread)."""

    def __init__(self, limiter: Limiter | None = None, responses: ResponseStore | None = None) -> None:
        self.limiter = limiter or Limiter()
        self.responses = responses or ResponseStore()
        self._lock = threading.Lock()  # the store's: call workers of every link use it

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        """A link's call worker: one of ``CALLS``, answered at once."""
        if method == "response_get":
            return self.response_get(*args)
        if method == "response_put":
            return self.response_put(*args)
        return self.response_delete(*args)

    def response_get(self, tenant: str, response_id: str) -> Stored | None:
        with self._lock:
            return self.responses.get(tenant, response_id)

    def response_put(self, tenant: str, response: dict[str, Any], messages: Sequence[dict[str, Any]],
                     previous: Previous | None) -> bool:
        """Store ``response``; with ``previous``, ``messages`` are what follows that response's
        conversation (which stays shared, not copied). False, storing nothing, if that conversation
        is no longer held as it was (deleted, evicted): the front end sends the whole instead."""
        with self._lock:
            if previous is not None:
                before = self.responses.get(tenant, previous[0])
                if before is None or len(before.messages) != previous[1]:
                    return False
                messages = (*before.messages, *messages)
            self.responses.put(tenant, response, messages)
            return True

    def response_delete(self, tenant: str, response_id: str) -> bool:
        with self._lock:
            return self.responses.delete(tenant, response_id)

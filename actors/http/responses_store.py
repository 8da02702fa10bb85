"""Finished responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}``: a bounded
in-memory LRU, one per daemon. The routes reach it through ``Responses`` (awaited): in one
process the app's own (``LocalResponses``, in its ``ServerState``); with front-end processes the
engine's, over the link (``link_state.LinkResponses``; ``engine_state.EngineState`` holds it), so
that a conversation's turns may land on any front end.

``ResponseStore`` itself is used by one thread at a time (uvicorn's event loop, or under the
engine state's lock), so it needs no lock of its own. Entries
belong to the tenant that made them: another tenant's id is not found (404). Each entry holds the whole conversation up to and including that response as chat messages (without
``instructions``, which OpenAI does not carry over): a follow-up sends all of it again, and the
prefix cache makes that cheap. Entries of one conversation share their message dicts (a turn's
list only copies references), so a chain of n turns costs n lists of pointers, not n copies of
the text. Nothing is persisted: a restart forgets every response (then 404, as for an id never seen).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llamactor.base.errors import LlamactorError

CAPACITY = 1000  # responses kept; the least recently stored or used goes first


class ResponseNotFoundError(LlamactorError):
    """``previous_response_id`` names a response this server does not hold (never made, not
    stored, evicted, or made before a restart). 404 as vLLM answers it (OpenAI itself says 400),
    in OpenAI's body: type invalid_request_error, code previous_response_not_found."""

    http_status = 404
    code = "previous_response_not_found"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Previous response with id {response_id!r} not found.", param="previous_response_id",
                         type="invalid_request_error")


class UnknownResponseError(LlamactorError):
    """``GET`` / ``DELETE /v1/responses/{id}`` of an id not held."""

    http_status = 404
    code = "not_found"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id {response_id!r} not found.", param="response_id",
                         type="invalid_request_error")


@dataclass(frozen=True)
class Stored:
    messages: tuple[dict[str, Any], ...]  # the conversation through this response's output
    response: dict[str, Any]  # the response object as returned


class ResponseStore:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], Stored] = OrderedDict()  # (tenant, id) -> entry

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant: str, response_id: str) -> Stored | None:
        entry = self._entries.get((tenant, response_id))
        if entry is not None:
            self._entries.move_to_end((tenant, response_id))  # a conversation still going on stays
        return entry

    def put(self, tenant: str, response: dict[str, Any], messages: Sequence[dict[str, Any]]) -> None:
        key = (tenant, response["id"])
        self._entries[key] = Stored(tuple(messages), response)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def delete(self, tenant: str, response_id: str) -> bool:
        return self._entries.pop((tenant, response_id), None) is not None


Previous = tuple[str, int]  # the previous response's id, and how many messages of its conversation came first


class Responses(Protocol):
    """The stored responses as the routes use them (uvicorn's event loop). ``put``'s ``previous``
    says that ``messages`` begin with that response's conversation (its length): a store that
    keeps it may be sent only what follows."""

    async def get(self, tenant: str, response_id: str) -> Stored | None: ...

    async def put(self, tenant: str, response: dict[str, Any], messages: Sequence[dict[str, Any]],
                  previous: Previous | None = None) -> None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...


class LocalResponses:
    """The one-process app's stored responses: a ``ResponseStore`` on the event loop."""

    def __init__(self, store: ResponseStore | None = None) -> None:
        self.store = store or ResponseStore()

    async def get(self, tenant: str, response_id: str) -> Stored | None:
        return self.store.get(tenant, response_id)

    async def put(self, tenant: str, response: dict[str, Any], messages: Sequence[dict[str, Any]],
                  previous: Previous | None = None) -> None:
        self.store.put(tenant, response, messages)

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self.store.delete(tenant, response_id)

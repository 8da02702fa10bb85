"""Finished responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}``: a bounded
in-memory LRU (one per app, in its ``ServerState``).

Used only on uvicorn's event loop (handlers and stream generators), so it needs no lock. Entries
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
from typing import Any

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

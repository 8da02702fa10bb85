"""OpenAI's Responses API routes: ``POST /responses`` (streamed or not), ``GET`` and ``DELETE
/responses/{id}``, under ``/v1`` and at the root (uvicorn's event loop).

A request is translated statelessly onto the chat path (``llamactor.dialects.responses``), as
llama-server does. Finished responses are kept (unless ``store: false``) in the app's bounded
in-memory store (``responses_store``; with front-end processes, the engine's), so that
``previous_response_id`` continues a conversation:
the whole conversation is sent again, which the prefix cache makes a cache hit
(``usage.input_tokens_details.cached_tokens``). An unknown id is a 404 in OpenAI's error shape
(code ``previous_response_not_found``, param ``previous_response_id``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from llamactor.dialects.responses.call import DIALECT, ResponsesCall, input_messages, response_call
from llamactor.dialects.responses.events import ResponseEvents
from llamactor.dialects.responses.output_items import response_reply
from llamactor.dialects.responses.schema import ResponsesRequest
from llamactor.http.framing import NAMED_SSE, stream_response
from llamactor.http.request_path import Planned, answer, open_stream, planned, warn_ignored
from llamactor.http.responses_store import Previous, ResponseNotFoundError, Responses, UnknownResponseError
from llamactor.http.state import State, tenant_of

router = APIRouter()


@router.post("/responses", response_model=None)
async def create(body: ResponsesRequest, request: Request, state: State) -> Any:
    earlier: tuple[dict[str, Any], ...] = ()
    previous_id = body.previous_response_id
    if previous_id is not None:  # only the tenant's own: another's is not found
        previous = await state.responses.get(tenant_of(request).name, previous_id)
        if previous is None:
            raise ResponseNotFoundError(previous_id)
        earlier = previous.messages
    call = await planned(state, request, body.model, DIALECT, lambda ctx: response_call(body, ctx, earlier))
    p = call.plan
    warn_ignored(DIALECT, p.ignored, p.shell.id)
    after = None if previous_id is None else (previous_id, len(earlier))
    if body.stream:
        updates = await open_stream(request, call)
        stream = ResponseEvents(p, lambda response: keep(state.responses, call, response, after))
        return stream_response(stream.events(updates), NAMED_SSE, stream.failed, updates)
    [c] = await answer(request, call)
    return await keep(state.responses, call, response_reply(p.shell, c), after)


async def keep(store: Responses, call: Planned[ResponsesCall], response: dict[str, Any],
               previous: Previous | None) -> dict[str, Any]:
    """Store a finished response with its conversation as its tenant's, unless asked not to
    (OpenAI's default: stored); stored before the client hears of it (a next turn may come at
    once, to another front-end process)."""
    if call.plan.shell.body.store is not False:
        await store.put(call.tenant.name, response, call.plan.history + input_messages(response["output"]), previous)
    return response


@router.get("/responses/{response_id}", response_model=None)
async def retrieve(response_id: str, request: Request, state: State) -> Any:
    stored = await state.responses.get(tenant_of(request).name, response_id)
    if stored is None:
        raise UnknownResponseError(response_id)
    return stored.response


@router.delete("/responses/{response_id}", response_model=None)
async def delete(response_id: str, request: Request, state: State) -> Any:
    if not await state.responses.delete(tenant_of(request).name, response_id):
        raise UnknownResponseError(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}

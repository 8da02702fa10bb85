"""OpenAI's Responses API: ``POST /v1/responses`` (streamed or not), ``GET`` and ``DELETE
/v1/responses/{id}``, each also without ``/v1`` (llama-server's routes).

Handlers run on uvicorn's event loop. A request is translated statelessly onto the chat path
(``responses_schema``: instructions, input items, function tools, ``text.format``), as
llama-server does, and answered as a response object (``responses_output``) or as events
(``responses_stream``). Finished responses are kept (unless ``store: false``) in a bounded
in-memory LRU per app (``responses_store``), so that ``previous_response_id`` continues a
conversation: the whole conversation is sent again, which the prefix cache makes a cache hit
(``usage.input_tokens_details.cached_tokens``). An unknown id is a 404 in OpenAI's error shape
(code ``previous_response_not_found``, param ``previous_response_id``).

Fields accepted but not acted on, and fields this server does not know, are named in one
warning log line per request (``request_fields_ignored``); none of them changes the answer.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from fastapi import FastAPI, Request

from llamactor.base.logging import get_logger
from llamactor.http.request_path import all_queued, complete, ready_model
from llamactor.http.responses_output import Shell, output_items, status_of, usage
from llamactor.http.responses_schema import ResponsesRequest, input_messages, plan
from llamactor.http.responses_store import ResponseNotFoundError, ResponseStore, UnknownResponseError
from llamactor.http.responses_stream import response_events, sse_events
from llamactor.http.state import ServerState

DIALECT = "responses"  # the metrics' dialect label
log = get_logger("llamactor.http")


def register(app: FastAPI, state: ServerState) -> None:
    """Add this dialect's routes to ``app``, with the app's own response store."""
    store = ResponseStore()

    async def create(body: ResponsesRequest, request: Request) -> Any:
        rid = f"resp_{request.state.request_id}"  # also the engine's request id: one id in every log line
        ignored = body.ignored_fields()
        if ignored:
            log.warning("request_fields_ignored", dialect="responses", fields=ignored, request_id=request.state.request_id)
        earlier: tuple[dict[str, Any], ...] = ()
        if body.previous_response_id is not None:
            previous = store.get(body.previous_response_id)
            if previous is None:
                raise ResponseNotFoundError(body.previous_response_id)
            earlier = previous.messages
        p = plan(body, earlier)  # every 400 of the request itself, before the model is touched
        llm = await ready_model(state, body.model)
        shell = Shell(body, rid, llm.name, int(time.time()))
        observe = state.metrics.observer(llm.name, DIALECT)

        def keep(response: dict[str, Any]) -> None:
            if body.store is not False:  # OpenAI's default: stored
                store.put(response, p.history + input_messages(response["output"]))

        if body.stream:
            # before the 200: the batcher accepted the request, or its refusal is the 4xx
            streams = await all_queued([functools.partial(llm.stream_chat_n_async, p.messages, 1, request_id=rid,
                                                          **p.sampling)])
            return sse_events(response_events(streams[0], shell, p.parsed_tools, observe, keep))
        [c] = await complete(request, observe, lambda: llm.submit_chat_n(p.messages, 1, request_id=rid, **p.sampling))
        response = shell.response(status_of(c), output_items(c), usage(c))
        keep(response)
        return response

    async def retrieve(response_id: str) -> Any:
        stored = store.get(response_id)
        if stored is None:
            raise UnknownResponseError(response_id)
        return stored.response

    async def delete(response_id: str) -> Any:
        if not store.delete(response_id):
            raise UnknownResponseError(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    for prefix in ("/v1", ""):
        app.post(f"{prefix}/responses", response_model=None)(create)
        app.get(f"{prefix}/responses/{{response_id}}", response_model=None)(retrieve)
        app.delete(f"{prefix}/responses/{{response_id}}", response_model=None)(delete)

"""The Ollama dialect: ``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``,
``/api/tags``, ``/api/ps``, ``/api/show``, ``/api/version``, ``/`` ("Ollama is running"), and
answers for the model-management routes that llamactor does not have (pull, push, create ...).

Handlers run on uvicorn's event loop over the common request path (``request_path``); reading a
GGUF header or unloading a model runs in a worker thread. Responses echo the request's model
string, as Ollama does; ``name:latest`` finds ``name`` and a single-model daemon answers to any
name. Models are listed as ``name:latest``: Open WebUI appends ``:latest`` to every name it
routes and looks it up in ``/api/tags``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.background import BackgroundTask

from llamactor.base.chat_template import TRANSCRIPT_STOP, TRANSCRIPT_TEMPLATE
from llamactor.base.errors import BatcherUnavailableError, InvalidRequestError, LlamactorError, ModelNotFoundError
from llamactor.base.logging import get_logger
from llamactor.base.models import resolve_model_path
from llamactor.base.tools import Tools, pop_tools
from llamactor.handles.model import ModelClient
from llamactor.handles.streams import AsyncTextStream
from llamactor.http.errors import error_response
from llamactor.http.ollama_embed import embed_inputs
from llamactor.http.ollama_gguf import GgufFile, read_gguf
from llamactor.http.ollama_schema import (
    DIALECT, ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ModelRequest, Options, PullRequest,
    ShowRequest, chat_messages, keep_alive_s,
)
from llamactor.http.ollama_stream import (
    AnswerParts, Shape, answer_lines, chat_shape, created_at, generate_shape, ndjson_response, whole_answer,
)
from llamactor.http.request_path import all_queued, complete, ready_model
from llamactor.http.state import ServerState

log = get_logger("llamactor.http")
# What /api/version reports: numeric (Open WebUI parses it into ints) and >= 0.6.4 (VS Code
# Copilot's minimum); Ollama 0.12 has everything answered here (tools, thinking, dimensions).
VERSION = os.environ.get("LLAMACTOR_OLLAMA_VERSION", "0.12.0")
UNLOAD_DRAIN_S = 30.0  # keep_alive 0: requests in flight on the model get this long to finish
FOREVER = timedelta(days=292 * 365)  # Ollama's "never expires" (a max int64 of nanoseconds)
UNSUPPORTED = {"/api/push": "POST", "/api/create": "POST", "/api/copy": "POST", "/api/delete": "DELETE",
               "/api/blobs/{digest}": "POST"}


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def register(app: FastAPI, state: ServerState) -> None:
    if not re.fullmatch(r"\d+(\.\d+)*", VERSION):
        raise ValueError(f"LLAMACTOR_OLLAMA_VERSION must be a numeric version such as 0.12.0, got {VERSION!r}")

    def lookup(name: str) -> ModelClient:
        """The model ``name`` names, not loaded (Ollama's 404 text if none)."""
        if not name:
            raise InvalidRequestError("model is required")
        if state.router is None or state.draining:
            raise BatcherUnavailableError("the server is starting or shutting down")
        try:
            return state.model(state.router, name)
        except ModelNotFoundError:
            served = ", ".join(tagged(n) for n in state.model_names)
            raise ModelNotFoundError(f"model '{name}' not found (this server serves {served})") from None

    async def loaded(body: ModelRequest | EmbedRequest | EmbeddingsRequest) -> tuple[ModelClient, int]:
        """The model, loaded; with the nanoseconds that took (Ollama's load_duration)."""
        lookup(body.model)
        started = time.perf_counter()
        llm = await ready_model(state, body.model)
        warn_options(body.options, llm.name)
        if body.model_extra:  # Ollama (Go's JSON) ignores unknown fields; clients send their own extras
            log.debug("ollama_fields_ignored", model=llm.name, fields=sorted(body.model_extra))
        return llm, int((time.perf_counter() - started) * 1e9)

    def warn_options(options: Options, model: str) -> None:
        ignored, unknown = options.not_applied()
        if ignored or unknown:
            log.warning("ollama_options_not_applied", model=model, ignored=ignored, unknown=unknown,
                        why="llamactor cannot apply these per request (num_ctx and the like are fixed at load)")

    async def unload(llm: ModelClient) -> None:
        drop = getattr(llm, "unload", None)  # in-process Replicas; Ray Serve's replicas are not unloaded per request
        if drop is None:
            log.warning("ollama_keep_alive_ignored", model=llm.name, why="models served by Ray Serve are not unloaded")
            return
        await asyncio.to_thread(drop, UNLOAD_DRAIN_S)

    async def load_or_unload(body: ModelRequest, shape: dict[str, Any]) -> JSONResponse:
        """An empty prompt: load the model, or unload it (keep_alive 0); one object, even when streamed."""
        if keep_alive_s(body.keep_alive) == 0:
            await unload(lookup(body.model))
            reason = "unload"
        else:
            await loaded(body)
            reason = "load"
        return JSONResponse({"model": body.model, "created_at": created_at(), **shape, "done": True,
                             "done_reason": reason})

    def unload_after(keep_alive: float | str | None, llm: ModelClient) -> BackgroundTask | None:
        """keep_alive 0: the model is unloaded once the answer is sent."""
        return BackgroundTask(unload, llm) if keep_alive_s(keep_alive) == 0 else None

    async def answer(request: Request, body: ModelRequest, llm: ModelClient, load_ns: int, shape: Shape,
                     start: Callable[[], list[AsyncTextStream]], submit: Callable[[], list[Any]], tools: Tools | None,
                     parse_thinking: bool) -> Response:
        """Stream, or answer whole (``start`` and ``submit`` send the request either way)."""
        after = unload_after(body.keep_alive, llm)
        observe = state.metrics.observer(llm.name, DIALECT)
        want_logprobs = bool(body.logprobs or body.top_logprobs)

        def head() -> dict[str, Any]:
            return {"model": body.model, "created_at": created_at()}
        if body.streamed:
            streams = await all_queued([start])  # a refusal (prompt too long ...) is a 4xx before the 200
            return ndjson_response(answer_lines(streams[0], head, shape, AnswerParts(tools, body.think, parse_thinking),
                                                observe, want_logprobs, load_ns), after)
        done = await complete(request, observe, submit)
        return JSONResponse(whole_answer(done[0], head, shape, AnswerParts(None, body.think, parse_thinking),
                                         want_logprobs, load_ns), background=after)

    async def chat(body: ChatRequest, request: Request) -> Response:
        keep_alive_s(body.keep_alive)  # a bad duration: 400 before anything happens
        if not body.messages:
            return await load_or_unload(body, {"message": {"role": "assistant", "content": ""}})
        llm, load_ns = await loaded(body)
        tools = pop_tools({"tools": body.tools or None}, chat=True)  # validated; Ollama has no tool_choice: auto
        sampling = {**body.sampling(llm.config), **body.template_kwargs(), **({"tools": tools} if tools else {})}
        messages = chat_messages(body.messages, body.model)
        rid = f"ollama-{request.state.request_id}"
        return await answer(request, body, llm, load_ns, chat_shape,
                            functools.partial(llm.stream_chat_n_async, messages, 1, request_id=rid, **sampling),
                            lambda: llm.submit_chat_n(messages, 1, request_id=rid, **sampling), tools, True)

    async def generate(body: GenerateRequest, request: Request) -> Response:
        keep_alive_s(body.keep_alive)
        body.check()
        prompt = body.prompt
        if not prompt:
            return await load_or_unload(body, {"response": ""})
        llm, load_ns = await loaded(body)
        rid = f"ollama-{request.state.request_id}"
        sampling = body.sampling(llm.config)
        if body.raw:  # the prompt as is; the answer as the model wrote it (thinking parsed only when asked)
            return await answer(request, body, llm, load_ns, generate_shape,
                                functools.partial(llm.stream_n_async, prompt, 1, request_id=rid, **sampling),
                                lambda: llm.submit_n(prompt, 1, request_id=rid, **sampling), None,
                                bool(body.think))
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
            {"role": "user", "content": prompt}]
        sampling.update(body.template_kwargs())
        return await answer(request, body, llm, load_ns, generate_shape,
                            functools.partial(llm.stream_chat_n_async, messages, 1, request_id=rid, **sampling),
                            lambda: llm.submit_chat_n(messages, 1, request_id=rid, **sampling), None, True)

    async def embed(body: EmbedRequest, request: Request) -> JSONResponse:
        keep_alive_s(body.keep_alive)
        texts = ([body.input] if body.input else []) if isinstance(body.input, str) else body.input
        llm, load_ns = await loaded(body)
        if not texts:  # Ollama answers an empty input with no vectors (having loaded the model)
            return JSONResponse({"model": body.model, "embeddings": [], "load_duration": load_ns},
                                background=unload_after(body.keep_alive, llm))
        result = await embed_inputs(request, llm, texts, body.truncate is not False, True, body.dimensions)
        return JSONResponse({"model": body.model, "embeddings": result.vectors.tolist(),
                             "total_duration": int(result.total_ms * 1e6) + load_ns, "load_duration": load_ns,
                             "prompt_eval_count": result.prompt_tokens}, background=unload_after(body.keep_alive, llm))

    async def embeddings(body: EmbeddingsRequest, request: Request) -> JSONResponse:
        """The legacy route: one prompt, one vector, not normalized."""
        keep_alive_s(body.keep_alive)
        llm, _ = await loaded(body)
        vector = (await embed_inputs(request, llm, [body.prompt], True, False, None)).vectors[0].tolist() \
            if body.prompt else []
        return JSONResponse({"embedding": vector}, background=unload_after(body.keep_alive, llm))

    async def describe(name: str, verbose: bool = False) -> tuple[ModelClient, GgufFile | None]:
        llm = lookup(name)
        try:
            path = resolve_model_path(llm.config.model)
        except LlamactorError:  # not on this node (a Ray ingress): described without the file
            return llm, None
        return llm, await asyncio.to_thread(read_gguf, path, verbose)

    def entry(name: str, gguf: GgufFile | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": tagged(name), "model": tagged(name), "size": gguf.size if gguf else 0,
                               "digest": gguf.digest if gguf else "",
                               "details": gguf.details() if gguf else {"parent_model": "", "format": "gguf"}}
        if gguf:
            out["modified_at"] = datetime.fromtimestamp(gguf.mtime).astimezone().isoformat(timespec="microseconds")
        return out

    async def tags() -> dict[str, Any]:
        return {"models": [entry(name, (await describe(name))[1]) for name in state.model_names]}

    async def ps() -> dict[str, Any]:
        """The loaded models; each expires when its idle_unload_s would unload it (else never)."""
        now, models = datetime.now(timezone.utc), []
        for name in state.model_names:
            llm, gguf = await describe(name)
            if not llm.loaded:
                continue
            idle_s = getattr(getattr(llm, "spec", None), "idle_unload_s", None)
            last_used = getattr(llm, "last_used", None)
            expires = FOREVER if idle_s is None or last_used is None else timedelta(
                seconds=max(0.0, idle_s - (time.monotonic() - last_used)))
            # in-process, the engine's per-sequence window (the model is loaded); under Ray, the configured one
            info = getattr(llm, "info", None) if hasattr(type(llm), "info") else None
            listed = entry(name, gguf)
            listed.pop("modified_at", None)
            models.append({**listed, "expires_at": (now + expires).isoformat(timespec="microseconds"),
                           "size_vram": listed["size"] if llm.config.n_gpu_layers != 0 else 0,
                           "context_length": info.n_ctx_seq if info is not None else llm.config.n_ctx})
        return {"models": sorted(models, key=lambda m: m["expires_at"], reverse=True)}

    async def show(body: ShowRequest) -> dict[str, Any]:
        name = body.model or body.name or ""
        llm, gguf = await describe(name, bool(body.verbose))
        config, meta = llm.config, gguf.metadata if gguf else {}
        template = config.chat_template or meta.get("tokenizer.chat_template") or TRANSCRIPT_TEMPLATE
        stops = list(config.sampling.stop) + (list(TRANSCRIPT_STOP) if template == TRANSCRIPT_TEMPLATE else [])
        s = config.sampling
        params = [("num_ctx", config.n_ctx), ("temperature", s.temperature), ("top_k", s.top_k), ("top_p", s.top_p),
                  ("min_p", s.min_p), ("repeat_penalty", s.repeat_penalty), ("repeat_last_n", s.repeat_last_n),
                  *(("stop", stop) for stop in stops)]
        lines = [f"{k:<30} {json_value(v)}" for k, v in params]
        capabilities = ["completion"] + (["tools"] if "tools" in template else []) + (
            ["thinking"] if any(t in template for t in ("<think>", "enable_thinking", "reasoning_content")) else [])
        modelfile = "\n".join([f"# Modelfile of {tagged(name)}, served by llamactor", "",
                               f"FROM {gguf.path if gguf else config.model or ''}", f'TEMPLATE """{template}"""',
                               *([f'SYSTEM """{config.system_prompt}"""'] if config.system_prompt else []),
                               *(f"PARAMETER {line}" for line in lines)]) + "\n"
        out: dict[str, Any] = {"modelfile": modelfile, "parameters": "\n".join(lines), "template": template,
                               "details": entry(name, gguf)["details"], "model_info": gguf.model_info() if gguf else {},
                               "capabilities": capabilities}
        if gguf:
            out["modified_at"] = entry(name, gguf)["modified_at"]
        if isinstance(meta.get("general.license"), str):
            out["license"] = meta["general.license"]
        if config.system_prompt:
            out["system"] = config.system_prompt
        return out

    async def pull(body: PullRequest) -> Response:
        """A model this server serves is already "pulled" (scripts pull before they chat); no other can be."""
        lookup(body.model or body.name or "")
        if body.stream is False:
            return JSONResponse({"status": "success"})

        async def line() -> Any:
            yield {"status": "success"}
        return ndjson_response(line())

    def unsupported(path: str) -> Any:
        async def refuse(request: Request) -> JSONResponse:
            return error_response(request.url.path, 501, f"{path.removeprefix('/api/').split('/')[0]} is not "
                                  "supported: llamactor serves the GGUF files it was started with (--model NAME=PATH)",
                                  "not_supported_error")
        return refuse

    async def version() -> dict[str, str]:
        return {"version": VERSION}

    async def root() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")

    app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)(root)
    app.api_route("/api/version", methods=["GET", "HEAD"])(version)
    app.api_route("/api/tags", methods=["GET", "HEAD"])(tags)
    app.get("/api/ps")(ps)
    app.post("/api/show")(show)
    app.post("/api/chat", response_model=None)(chat)
    app.post("/api/generate", response_model=None)(generate)
    app.post("/api/embed", response_model=None)(embed)
    app.post("/api/embeddings", response_model=None)(embeddings)
    app.post("/api/pull", response_model=None)(pull)
    for path, method in UNSUPPORTED.items():
        app.api_route(path, methods=[method, "HEAD"] if "blobs" in path else [method])(unsupported(path))


def json_value(value: Any) -> str:
    """A parameter value as Ollama's ``%#v`` prints it: strings quoted, numbers bare."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)

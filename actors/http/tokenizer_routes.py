"""The tokenizer and template endpoints, in llama-server's and vLLM's shapes at once, so clients of
either (and lm-evaluation-harness, which probes ``/tokenizer_info`` and ``/tokenize`` before it
trusts a server's tokenizer) parse the answer. Served at the root and under ``/v1``.

- ``POST /tokenize``: ``content`` (llama-server: a string, or strings and token ids mixed;
  ``add_special`` default false, ``with_pieces``) or ``prompt`` / ``messages`` (vLLM:
  ``add_special_tokens`` default true for a prompt, false for messages; ``return_token_strs``).
  Answers ``tokens`` (ids, or ``{id, piece}`` with ``with_pieces``) plus vLLM's ``count``,
  ``max_model_len`` and ``token_strs``. Special-token text ("<eos>") is its single id.
- ``POST /detokenize``: ``tokens`` -> the text as ``content`` (llama-server) and ``prompt`` (vLLM).
- ``GET /tokenizer_info``: vLLM's shape (``eos_token``, ``bos_token``, ``model_max_length``,
  ``chat_template`` ...) from the GGUF's metadata.
- ``POST /apply-template``: ``messages`` (+ ``tools``, ``chat_template_kwargs``) -> ``prompt``,
  the text the model would see.

The tokenizing itself is done by the batcher (``Client.tokenize``): one thread owns llama.cpp.
Handlers run on uvicorn's event loop.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from llamactor.base.completion import Tokenized
from llamactor.base.errors import InvalidRequestError
from llamactor.handles.model import ModelClient
from llamactor.http.openai_schema import ChatMessage
from llamactor.http.request_path import ready_model
from llamactor.http.state import ServerState


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # llama-server ignores the rest too
    model: str | None = None
    content: str | list[str | int] | None = None  # llama-server
    add_special: bool = False
    parse_special: bool = True  # llama-server's; special text is always parsed here
    with_pieces: bool = False
    prompt: str | None = None  # vLLM
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


class ApplyTemplateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the body of a chat request: sampling fields do not matter
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def register(app: FastAPI, state: ServerState) -> None:
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        llm = await ready_model(state, body.model)
        want_pieces = body.with_pieces or body.return_token_strs
        done: Tokenized | None = None  # one batcher round trip, pieces included when asked for
        tokens: list[int] = []
        if body.messages is not None:
            done = await llm.tokenize_async([m.as_dict() for m in body.messages], tools=body.tools or None,
                                            chat_template_kwargs=body.chat_template_kwargs, with_pieces=want_pieces)
        elif body.prompt is not None:
            special = body.add_special_tokens if body.add_special_tokens is not None else True
            done = await llm.tokenize_async(body.prompt, add_special=special, with_pieces=want_pieces)
        elif body.content is not None:  # strings and ids mixed: the pieces of the joined ids after
            tokens = await _content(llm, body.content, body.add_special)
            done = await llm.tokenize_async(tokens, with_pieces=True) if tokens and want_pieces else None
        if done is not None:
            tokens = list(done.token_ids)
        pieces = list(done.pieces) if done is not None and done.pieces is not None else [""] * len(tokens)
        return {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces)] if body.with_pieces else tokens,
                "count": len(tokens), "max_model_len": llm.info.n_ctx_seq,
                "token_strs": pieces if body.return_token_strs else None}

    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        llm = await ready_model(state, body.model)
        text = (await llm.tokenize_async(body.tokens)).text if body.tokens else ""
        return {"content": text, "prompt": text}

    async def tokenizer_info(model: str | None = None) -> dict[str, Any]:
        llm = await ready_model(state, model)
        meta = llm.info.metadata
        ids = {key: meta.get(f"tokenizer.ggml.{key}_token_id", "") for key in ("eos", "bos", "padding", "unknown")}
        ids = {key: value for key, value in ids.items() if value.isdigit()}  # absent, or -1: none
        # every special token's text in one batcher round trip
        pieces = (await llm.tokenize_async([int(v) for v in ids.values()], with_pieces=True)).pieces if ids else ()
        token = dict(zip(ids, pieces or ()))
        return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": token.get("eos"),
                "bos_token": token.get("bos"), "pad_token": token.get("padding"),
                "unk_token": token.get("unknown"), "add_bos_token": meta.get("tokenizer.ggml.add_bos_token") == "true",
                "add_eos_token": meta.get("tokenizer.ggml.add_eos_token") == "true",
                "model_max_length": llm.info.n_ctx_seq, "chat_template": meta.get("tokenizer.chat_template"),
                "vocab_size": llm.info.n_vocab}

    async def apply_template(body: ApplyTemplateRequest) -> dict[str, Any]:
        llm = await ready_model(state, body.model)
        done = await llm.tokenize_async([m.as_dict() for m in body.messages], tools=body.tools or None,
                                        chat_template_kwargs=body.chat_template_kwargs)
        return {"prompt": done.text}

    for prefix in ("", "/v1"):
        app.post(f"{prefix}/tokenize")(tokenize)
        app.post(f"{prefix}/detokenize")(detokenize)
        app.get(f"{prefix}/tokenizer_info")(tokenizer_info)
        app.post(f"{prefix}/apply-template")(apply_template)


async def _content(llm: ModelClient, content: str | list[str | int], add_special: bool) -> list[int]:
    """llama-server's ``content``: a string, or strings and token ids mixed (BOS only at the start)."""
    parts = [content] if isinstance(content, str) else content
    tokens: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, int):
            tokens.append(part)
        elif isinstance(part, str):
            tokens += (await llm.tokenize_async(part, add_special=add_special and i == 0)).token_ids
        else:
            raise InvalidRequestError("content must be a string or a list of strings and token ids")
    return tokens

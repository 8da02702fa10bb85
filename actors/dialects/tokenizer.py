"""The tokenizer and template endpoints, in llama-server's and vLLM's shapes at once, so clients of
either (and lm-evaluation-harness, which probes ``/tokenizer_info`` and ``/tokenize`` before it
trusts a server's tokenizer) parse the answer (pure).

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

Each is one ``Tokenize`` trip to the batcher (``TokenizeCall``), which alone calls llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from llamactor.base.completion import Tokenized
from llamactor.base.engine_info import EngineInfo
from llamactor.base.request_checks import check_messages, check_text
from llamactor.base.tools import Tools
from llamactor.dialects.openai.schema import ChatMessage

SPECIAL_TOKENS = ("eos", "bos", "padding", "unknown")


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


@dataclass(frozen=True, slots=True)
class TokenizeCall:
    """One ``Client.tokenize`` call: what to tokenize (text, token ids, strings and ids mixed, or a
    chat) and how; ``prompt`` None: nothing (an empty body answers no tokens)."""

    prompt: Any
    add_special: bool = True
    with_pieces: bool = False
    tools: Tools | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def options(self) -> dict[str, Any]:
        """``Client.tokenize``'s keyword arguments."""
        out: dict[str, Any] = {"add_special": self.add_special, "with_pieces": self.with_pieces}
        if self.tools is not None or self.chat_template_kwargs is not None:
            out.update(tools=self.tools, chat_template_kwargs=self.chat_template_kwargs)
        return out


def tokenize_call(body: TokenizeRequest) -> TokenizeCall:
    pieces = body.with_pieces or body.return_token_strs
    if body.messages is not None:
        return _chat_call(body.messages, body.tools, body.chat_template_kwargs, with_pieces=pieces)
    if body.prompt is not None:
        special = body.add_special_tokens if body.add_special_tokens is not None else True
        check_text(body.prompt, "prompt")
        return TokenizeCall(body.prompt, special, pieces)
    if body.content is not None:  # strings and ids mixed: strings tokenized (BOS only before the first), ids kept
        check_text(body.content, "content")
        return TokenizeCall(body.content if isinstance(body.content, str) else list(body.content),
                            body.add_special, pieces)
    return TokenizeCall(None)


def _chat_call(messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
               template_kwargs: dict[str, Any] | None, with_pieces: bool = False) -> TokenizeCall:
    """A chat to render, checked as a chat request's is (``GenerationRequest``): at most
    ``MAX_MESSAGES``, earlier tool calls well formed, valid Unicode everywhere."""
    chat = [m.as_dict() for m in messages]
    check_messages(chat)
    if template_kwargs is not None:
        check_text(template_kwargs, "chat_template_kwargs")
    return TokenizeCall(chat, with_pieces=with_pieces, tools=Tools.from_openai(tools) if tools else None,
                        chat_template_kwargs=template_kwargs)


def tokenize_reply(body: TokenizeRequest, done: Tokenized | None, info: EngineInfo) -> dict[str, Any]:
    tokens = list(done.token_ids) if done is not None else []
    pieces = list(done.pieces) if done is not None and done.pieces is not None else [""] * len(tokens)
    return {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces)] if body.with_pieces else tokens,
            "count": len(tokens), "max_model_len": info.n_ctx_seq,
            "token_strs": pieces if body.return_token_strs else None}


def apply_template_call(body: ApplyTemplateRequest) -> TokenizeCall:
    return _chat_call(body.messages, body.tools, body.chat_template_kwargs)


def special_token_ids(info: EngineInfo) -> dict[str, int]:
    """The model's special tokens that the GGUF names (absent, or -1: none)."""
    ids = {key: info.metadata.get(f"tokenizer.ggml.{key}_token_id", "") for key in SPECIAL_TOKENS}
    return {key: int(value) for key, value in ids.items() if value.isdigit()}


def tokenizer_info_reply(info: EngineInfo, specials: dict[str, str]) -> dict[str, Any]:
    """vLLM's ``/tokenizer_info``; ``specials``: each special token's text by kind."""
    meta = info.metadata
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": specials.get("eos"),
            "bos_token": specials.get("bos"), "pad_token": specials.get("padding"),
            "unk_token": specials.get("unknown"), "add_bos_token": meta.get("tokenizer.ggml.add_bos_token") == "true",
            "add_eos_token": meta.get("tokenizer.ggml.add_eos_token") == "true",
            "model_max_length": info.n_ctx_seq, "chat_template": meta.get("tokenizer.chat_template"),
            "vocab_size": info.n_vocab}

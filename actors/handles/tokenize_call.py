"""A tokenizer call's prompt, checked and shaped into the ``Tokenize`` message that
``Client.submit_tokenize`` sends (the caller's thread or event loop; nothing here touches llama.cpp).

The prompt is text (tokenized), token ids (decoded), strings and token ids mixed (the strings
tokenized, BOS only before the first), or chat messages (rendered by the model's chat format, with
``tools``, then tokenized); the batcher answers it as it answers a request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llamactor.base.messages import ReplyChannel, Tokenize
from llamactor.base.request import Messages, Prompt, messages_tuple, new_request_id
from llamactor.base.request_checks import check_messages, check_text
from llamactor.base.tools import Tools

TokenizerPrompt = Prompt | Messages | Sequence[str | int]


def tokenize_message(prompt: TokenizerPrompt, *, add_special: bool = True, with_pieces: bool = False,
                     tools: Any = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                     request_id: str | None = None) -> Tokenize:
    """``prompt`` as a ``Tokenize`` message; ``InvalidRequestError`` for text no tokenizer takes (a
    lone surrogate is the caller's 400, as on every route) or a malformed chat."""
    check_text(prompt, "prompt")
    return Tokenize(request_id=request_id or new_request_id(), reply=ReplyChannel(), add_special=add_special,
                    with_pieces=with_pieces, **_prompt_fields(prompt, tools, chat_template_kwargs))


def _prompt_fields(prompt: TokenizerPrompt, tools: Any,
                   chat_template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``Tokenize`` fields that hold ``prompt``, by its shape."""
    if isinstance(prompt, str):
        return {"text": prompt}
    if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        return {"token_ids": tuple(prompt)}  # type: ignore[arg-type]
    if isinstance(prompt, Sequence) and all(isinstance(t, (str, int)) for t in prompt):
        return {"parts": tuple(prompt)}
    check_messages(messages_tuple(prompt))  # type: ignore[arg-type]
    check_text(chat_template_kwargs, "chat_template_kwargs")
    return {"messages": messages_tuple(prompt),  # type: ignore[arg-type]
            "tools": tools if isinstance(tools, Tools) or not tools else Tools.from_openai(tools),
            "chat_template_kwargs": dict(chat_template_kwargs) if chat_template_kwargs else None}

"""``RequestContext``: what the transport knows of a request beyond its body (pure).

Every dialect's call builder (``chat_call(body, ctx)`` ...) takes one: the transport's id for the request (each dialect prefixes
its own: ``chatcmpl-``, ``msg_`` ...), the model that answers it -- its name, as responses name
it, its sampling defaults, under which the body's options apply, and the format it writes tool
calls in -- and when it was made; its LoRA adapters (a body picks them by id, or by naming one as
its model). The server derives the rest of a caller's identity here too, never from the body.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamactor.base.adapters import from_ids
from llamactor.base.sampling import SamplingParams
from llamactor.base.request import GenerationRequest
from llamactor.base.tool_format import FALLBACK, ToolCallFormat


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    model: str
    defaults: SamplingParams = field(default_factory=SamplingParams)
    created: int = field(default_factory=lambda: int(time.time()))
    adapters: tuple[str, ...] | None = ()  # the model's LoRA adapters, in id order (None: not known here)
    adapter: str | None = None  # the adapter the body's ``model`` named (vLLM's convention), at scale 1
    tool_format: ToolCallFormat = FALLBACK  # how the model writes a tool call (its EngineInfo's)

    def max_tokens(self, asked: int | None) -> int | None:
        """A body's limit on new tokens; without one, the operator's (``--max-tokens``) if they set
        one, else none -- until the end of the turn or the context, as OpenAI's chat API and vLLM
        do (llama-server's ``-n`` is the same operator's default)."""
        if asked is not None:
            return asked
        return self.defaults.max_tokens if "max_tokens" in self.defaults.given else None

    def id(self, prefix: str) -> str:
        """The request's id in a dialect's form (``chatcmpl-<id>``, ``msg_<id>`` ...)."""
        return f"{prefix}{self.request_id}"

    def lora(self, entries: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """``GenerationRequest.build``'s LoRA keywords: the adapter the model name picked, and
        llama-server's ``[{"id", "scale"}]`` entries over it; checked against the model's adapters."""
        lora = {self.adapter: 1.0} if self.adapter is not None else {}
        if self.adapters is None:  # a check without the model (a batch file's lines): ids as placeholders
            lora.update({f"#{e.get('id')}": e.get("scale", 1.0) for e in entries or ()})
        else:
            lora.update(from_ids(entries or (), self.adapters))
        return {"lora": lora, "adapters": self.adapters}


class OneRequest:
    """Mixed into the calls of bodies that make one generation request: ``requests`` is it alone."""

    __slots__ = ()
    request: GenerationRequest

    @property
    def requests(self) -> list[GenerationRequest]:
        return [self.request]

"""``RequestContext``: what the transport knows of a request beyond its body (pure).

Every dialect's ``plan`` takes one: the transport's id for the request (each dialect prefixes
its own: ``chatcmpl-``, ``msg_`` ...), the model that answers it -- its name, as responses name
it, its sampling defaults, under which the body's options apply, and the format it writes tool
calls in -- and when it was made. The server derives the rest of a caller's identity here too,
never from the body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llamactor.base.config import SamplingParams
from llamactor.base.request import GenerationRequest
from llamactor.base.tool_format import FALLBACK, ToolCallFormat


@dataclass(frozen=True, slots=True)
class RequestContext:
    request_id: str
    model: str
    defaults: SamplingParams = field(default_factory=SamplingParams)
    created: int = field(default_factory=lambda: int(time.time()))
    tool_format: ToolCallFormat = FALLBACK  # how the model writes a tool call (its EngineInfo's)

    def id(self, prefix: str) -> str:
        """The request's id in a dialect's form (``chatcmpl-<id>``, ``msg_<id>`` ...)."""
        return f"{prefix}{self.request_id}"


class OneRequest:
    """Mixed into the plans of bodies that make one generation request: ``requests`` is it alone."""

    __slots__ = ()
    request: GenerationRequest

    @property
    def requests(self) -> list[GenerationRequest]:
        return [self.request]

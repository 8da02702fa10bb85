"""The result of one request: ``Completion`` with its ``Usage`` and ``Timings``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cancelled", "context_full"]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV was attached from the prefix cache, not computed

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    queue_ms: float  # submit -> admitted to a sequence
    ttft_ms: float  # submit -> first token sampled
    total_ms: float  # submit -> finished
    decode_tokens_per_s: float  # generated tokens after the first, per second


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its text, its log-probability, and the most likely alternatives."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Completion:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token, if asked

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["usage"]["total_tokens"] = self.usage.total_tokens
        return data

"""Tenants' quotas: requests and tokens per minute as token buckets (pure: the clock is an argument;
the handle that owns it holds the lock).

Each limited tenant has a bucket per limit, holding up to a minute's worth and refilled
continuously. A request reserves one request and an *estimate* of its tokens when it is admitted
(its prompt's characters / 4, plus its ``max_tokens``), and settles with the real count when it
ends: the estimate is given back, the real tokens taken (a bucket may go below zero: the next
requests wait until it refills). A request over a bucket's reach now is refused with when to come
back; one larger than a whole minute's tokens could never run and is a bad request instead.
What a tenant has left is reported as OpenAI reports it (``x-ratelimit-*``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llamactor.base.errors import InvalidRequestError, RateLimitError
from llamactor.base.tenants import Tenant

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for an estimate before tokenizing


@dataclass(slots=True)
class Bucket:
    capacity: float  # a minute's worth
    level: float
    at: float  # when ``level`` was last brought up to date

    @classmethod
    def full(cls, per_minute: int, now: float) -> Bucket:
        return cls(float(per_minute), float(per_minute), now)

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity / 60.0)
        self.at = now

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` is there (0: now)."""
        return max(0.0, (amount - self.level) * 60.0 / self.capacity)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return self.wait_s(self.capacity)


@dataclass(frozen=True, slots=True)
class Limits:
    """What a tenant may still do: OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``."""

    values: dict[str, str] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        return {f"x-ratelimit-{k}": v for k, v in self.values.items()}


@dataclass(slots=True)
class TenantBuckets:
    requests: Bucket | None
    tokens: Bucket | None

    def limits(self) -> Limits:
        out: dict[str, str] = {}
        for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is not None:
                out[f"limit-{kind}"] = str(int(bucket.capacity))
                out[f"remaining-{kind}"] = str(max(0, math.floor(bucket.level)))
                out[f"reset-{kind}"] = duration(bucket.reset_s())
        return Limits(out)


class RateLimits:
    """The buckets of the tenants that have limits (a tenant without one is never refused)."""

    def __init__(self) -> None:
        self._buckets: dict[str, TenantBuckets] = {}
        self._tenants: dict[str, Tenant] = {}

    def reserve(self, tenant: Tenant, tokens: int, now: float) -> Limits:
        """Take one request and ``tokens`` (an estimate) from ``tenant``'s buckets, or raise
        ``RateLimitError`` (with the seconds to wait) and take nothing."""
        buckets = self._of(tenant, now)
        if buckets is None:
            return Limits()
        if buckets.tokens is not None and tokens > buckets.tokens.capacity:
            raise InvalidRequestError(f"this request (about {tokens} tokens with its max_tokens) is larger than "
                                      f"tenant {tenant.name!r}'s tokens_per_minute ({int(buckets.tokens.capacity)}): "
                                      "it could never run; lower max_tokens or the prompt")
        waits = [b.wait_s(need) for b, need in ((buckets.requests, 1), (buckets.tokens, tokens)) if b is not None]
        if max(waits, default=0.0) > 0:
            limits = buckets.limits()
            raise RateLimitError(f"tenant {tenant.name!r} is over its rate limit; retry in {duration(max(waits))}",
                                 retry_after=max(1, math.ceil(max(waits))), headers=limits.headers())
        if buckets.requests is not None:
            buckets.requests.level -= 1
        if buckets.tokens is not None:
            buckets.tokens.level -= tokens
        return buckets.limits()

    def wait_s(self, tenant: Tenant, tokens: int, now: float) -> float:
        """Seconds until ``tenant``'s buckets hold one request and ``tokens`` (0: now)."""
        buckets = self._of(tenant, now)
        if buckets is None:
            return 0.0
        return max((b.wait_s(need) for b, need in ((buckets.requests, 1), (buckets.tokens, tokens)) if b is not None),
                   default=0.0)

    def settle(self, tenant: Tenant, reserved: int, used: int, now: float) -> None:
        """The request ended having used ``used`` tokens where ``reserved`` were taken."""
        buckets = self._of(tenant, now)
        if buckets is not None and buckets.tokens is not None:
            buckets.tokens.level = min(buckets.tokens.capacity, buckets.tokens.level + reserved - used)

    def _of(self, tenant: Tenant, now: float) -> TenantBuckets | None:
        """The tenant's buckets, brought up to date; new (full) ones when its limits changed."""
        if tenant.requests_per_minute is None and tenant.tokens_per_minute is None:
            return None
        known = self._tenants.get(tenant.name)
        if known is None or (known.requests_per_minute, known.tokens_per_minute) != (
                tenant.requests_per_minute, tenant.tokens_per_minute):
            self._tenants[tenant.name] = tenant
            self._buckets[tenant.name] = TenantBuckets(
                Bucket.full(tenant.requests_per_minute, now) if tenant.requests_per_minute else None,
                Bucket.full(tenant.tokens_per_minute, now) if tenant.tokens_per_minute else None)
        buckets = self._buckets[tenant.name]
        for bucket in (buckets.requests, buckets.tokens):
            if bucket is not None:
                bucket.refill(now)
        return buckets


def duration(seconds: float) -> str:
    """OpenAI's reset format: "1s", "6m0s", "1.5s"."""
    if seconds < 60:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def estimate_tokens(text_chars: int, n_token_ids: int, max_tokens: int | None, n: int) -> int:
    """A request's tokens before it is tokenized: its prompt's characters / 4 (or its token ids)
    and, for each of its ``n`` choices, its ``max_tokens`` (256 when unbounded: a guess, settled later)."""
    return math.ceil(text_chars / CHARS_PER_TOKEN) + n_token_ids + n * (max_tokens if max_tokens is not None else 256)

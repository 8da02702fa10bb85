"""Tenants' quotas as token buckets, on a fake clock: reserve, refuse with when to come back,
settle with the real count, refill, and refuse outright what could never fit."""

from __future__ import annotations

import pytest

from llamactor.base.errors import InvalidRequestError, RateLimitError
from llamactor.base.tenants import Tenant
from llamactor.scheduling.rate_limits import RateLimits, duration, estimate_tokens

pytestmark = pytest.mark.pure


def test_requests_per_minute_refuse_the_next_one_and_say_when_it_may_come() -> None:
    limits, alice = RateLimits(), Tenant("alice", requests_per_minute=2)
    limits.reserve(alice, 10, 0.0)
    left = limits.reserve(alice, 10, 0.0).headers()
    assert left["x-ratelimit-limit-requests"] == "2" and left["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RateLimitError) as refused:
        limits.reserve(alice, 10, 1.0)
    assert refused.value.retry_after == 29 and refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    limits.reserve(alice, 10, 31.0)  # half a minute refilled one request
    limits.reserve(Tenant("bob"), 10_000_000, 31.0)  # no limits: never refused


def test_tokens_are_reserved_by_estimate_and_settled_with_the_real_count() -> None:
    limits, alice = RateLimits(), Tenant("alice", tokens_per_minute=1000)
    limits.reserve(alice, 900, 0.0)
    with pytest.raises(RateLimitError):
        limits.reserve(alice, 200, 0.0)
    limits.settle(alice, reserved=900, used=100, now=0.0)  # the answer was short: 800 come back
    assert limits.reserve(alice, 200, 0.0).values["remaining-tokens"] == "700"
    limits.settle(alice, reserved=200, used=1500, now=0.0)  # longer than estimated: in debt
    with pytest.raises(RateLimitError) as refused:
        limits.reserve(alice, 1, 0.0)
    assert refused.value.retry_after >= 36  # (600 tokens of debt + 1) at 1000 a minute


def test_a_request_larger_than_a_minutes_tokens_is_a_bad_request_not_a_wait() -> None:
    with pytest.raises(InvalidRequestError, match="could never run"):
        RateLimits().reserve(Tenant("alice", tokens_per_minute=100), 101, 0.0)


def test_changed_limits_start_from_full_buckets() -> None:
    limits = RateLimits()
    limits.reserve(Tenant("alice", requests_per_minute=1), 1, 0.0)
    limits.reserve(Tenant("alice", requests_per_minute=5), 1, 0.0)  # a reloaded keys file raised it


def test_estimates_and_durations_read_as_openai_writes_them() -> None:
    assert estimate_tokens(text_chars=400, n_token_ids=0, max_tokens=50, n=2) == 200
    assert estimate_tokens(0, 7, None, 1) == 7 + 256
    assert [duration(s) for s in (0.0, 1.0, 0.25, 59.5, 60, 360)] == ["0s", "1s", "0.3s", "59.5s", "1m0s", "6m0s"]

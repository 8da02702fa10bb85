"""Tenants and their keys, model-free: the keys file's tables, lookups by key (digests only, every
entry compared), the priority ceiling, and what the typed request and the API do with a tenant."""

from __future__ import annotations

import hashlib

import pytest

import llamactor
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.errors import InvalidRequestError
from llamactor.base.request import GenerationRequest
from llamactor.base.tenants import KeyTable, Tenant, tenant_named

pytestmark = pytest.mark.pure

FILE = {"keys": [
    {"key": "sk-alice-1234", "tenant": "alice", "weight": 2, "requests_per_minute": 60, "cache_scope": "team"},
    {"key_sha256": hashlib.sha256(b"sk-alice-other").hexdigest(), "tenant": "alice", "weight": 2,
     "requests_per_minute": 60, "cache_scope": "team"},
    {"key": "sk-bob-12345", "tenant": "bob", "max_priority": "normal"},
    {"key": "sk-root-1234", "tenant": "ops", "admin": True}]}


def test_a_keys_file_maps_each_key_or_its_digest_to_its_tenant_and_nothing_else() -> None:
    table = KeyTable.from_toml(FILE, "keys.toml")
    assert table.find("sk-alice-1234") == table.find("sk-alice-other") == Tenant(
        "alice", weight=2, requests_per_minute=60, cache_scope="team")
    assert table.find("sk-bob-12345").scope == "bob" and table.find("sk-root-1234").admin  # type: ignore[union-attr]
    assert table.find("sk-alice-123") is None and table.find("") is None and table.find(None) is None
    assert [t.name for t in table.tenants] == ["alice", "bob", "ops"] and table.required
    assert b"sk-alice" not in repr(table).encode()  # digests only: the secret is not kept
    open_table = KeyTable()
    assert open_table.find(None) == Tenant(admin=True) and not open_table.required


@pytest.mark.parametrize(("tables", "message"), [
    ([{"key": "sk-1234567", "tenant": "a", "wieght": 2}], "#1: unknown key"),
    ([{"tenant": "a"}], "give key or key_sha256"),
    ([{"key": "short", "tenant": "a"}], "at least 8"),
    ([{"key_sha256": "abc", "tenant": "a"}], "64 hex digits"),
    ([{"key": "sk-1234567"}], "tenant is required"),
    ([{"key": "sk-1234567", "tenant": "a"}, {"key": "sk-1234567", "tenant": "b"}], "#2: the same key"),
    ([{"key": "sk-1234567", "tenant": "a"}, {"key": "sk-7654321", "tenant": "a", "weight": 3}], "differently"),
    ([{"key": "sk-1234567", "tenant": "a", "weight": 0}], "weight"),
    ([{"key": "sk-1234567", "tenant": "a b"}], "name"),
    ([], "no \\[\\[keys\\]\\] tables"),
])
def test_a_wrong_keys_file_is_refused_naming_the_file_and_the_table(tables: list, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as refused:
        KeyTable.from_toml({"keys": tables}, "keys.toml")
    assert str(refused.value).startswith("keys.toml")


def test_the_priority_ceiling_lowers_what_a_request_asks_and_the_request_carries_its_tenant() -> None:
    bob = Tenant("bob", max_priority="normal")
    request = GenerationRequest.build(SamplingParams(), prompt="hi", priority="high", tenant=bob)
    assert request.priority == 1 and request.tenant is bob
    assert GenerationRequest.build(SamplingParams(), prompt="hi", priority="low", tenant=bob).priority == 2
    [msg] = request.generate_messages("r", [llamactor.base.messages.ReplyChannel()], 0.0)
    assert msg.tenant is bob


def test_the_api_names_tenants_configured_or_not() -> None:
    config = Config(tenants=[{"name": "alice", "weight": 3}])
    assert tenant_named("alice", config.tenants).weight == 3
    assert tenant_named("carol", config.tenants) == Tenant("carol")  # not configured: the defaults
    assert tenant_named(None).name == "default"
    with pytest.raises(InvalidRequestError, match="distinct"):
        Config(tenants=[Tenant("a"), Tenant("a")])

"""Tenants: the callers that do not trust each other, and the keys that say who a caller is (pure).

A ``Tenant`` carries what the engine does differently for it: its fair-share ``weight``, its
limits (requests and tokens per minute, sequences at once, the most urgent priority it may ask
for, batch jobs at once, files and their bytes), whether it is an ``admin`` (reads metrics, manages models), and its ``cache_scope``: tenants
with the same scope share cached prefixes, anyone else's are invisible to them (default: the
tenant alone). Every request has one; a caller that names none is the ``default`` tenant.

A ``KeyTable`` maps API keys to tenants. It holds only SHA-256 digests (a keys file may give the
digest instead of the key) and compares a presented key's digest with every entry's in constant
time, whichever matches, so neither a timing nor a log line tells anything about the keys.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from llamactor.base.errors import InvalidRequestError, require as _require
from llamactor.base.priority import parse_priority

DEFAULT_TENANT = "default"
_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


def _limit(value: Any, name: str) -> None:
    _require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
             f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str = DEFAULT_TENANT
    weight: float = 1.0  # fair-share weight: backlogged tenants are served tokens in proportion
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + generated tokens
    max_running: int | None = None  # sequences decoded at once
    max_priority: int | None = None  # the most urgent priority its requests get (more urgent is lowered to it)
    admin: bool = False
    cache_scope: str | None = None  # None: its own name
    # Batch jobs and files (the daemon's data dir): jobs not finished at once (each has a worker
    # thread), files kept (uploads and batch outputs) and their bytes together; None: no cap.
    max_batch_jobs: int | None = 16
    max_files: int | None = 1000
    max_file_bytes: int | None = 10 * 2**30

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and bool(_NAME.match(self.name)),
                 f"a tenant's name is 1-64 letters, digits or _.:@-, got {self.name!r}")
        _require(isinstance(self.weight, (int, float)) and not isinstance(self.weight, bool)
                 and math.isfinite(self.weight) and 0 < self.weight <= 1000,
                 f"weight must be in (0, 1000], got {self.weight!r}")
        for name in ("requests_per_minute", "tokens_per_minute", "max_running", "max_batch_jobs", "max_files",
                     "max_file_bytes"):
            _limit(getattr(self, name), name)
        if self.max_priority is not None:
            object.__setattr__(self, "max_priority", parse_priority(self.max_priority))
        _require(self.cache_scope is None or (isinstance(self.cache_scope, str) and bool(self.cache_scope)),
                 "cache_scope must be a non-empty string")

    @property
    def scope(self) -> str:
        """The namespace of the caches it may hit."""
        return self.cache_scope or self.name

    def priority(self, asked: int) -> int:
        """``asked``, lowered to the tenant's ceiling (lower is more urgent)."""
        return asked if self.max_priority is None else max(asked, self.max_priority)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], where: str) -> Tenant:
        """A tenant from a TOML table's fields (``where`` names it in errors)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        _require(not unknown, f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        try:
            return cls(**{k: v for k, v in table.items() if k in known})
        except (InvalidRequestError, TypeError) as e:
            raise InvalidRequestError(f"{where}: {e}") from e


DEFAULT = Tenant()


def tenant_named(name: str | Tenant | None, configured: Iterable[Tenant] = ()) -> Tenant:
    """The tenant a caller names: a configured one, else one with the defaults (a service may
    pass its users' ids without configuring each); None: the default tenant."""
    if isinstance(name, Tenant):
        return name
    if name is None:
        name = DEFAULT_TENANT
    return next((t for t in configured if t.name == name), None) or Tenant(name)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True)
class KeyTable:
    """API keys (as SHA-256 digests) -> tenants. Empty: keys are not required (everyone is the
    default tenant, an admin: the daemon without ``--api-key`` or ``--keys``)."""

    entries: tuple[tuple[bytes, Tenant], ...] = ()

    @property
    def required(self) -> bool:
        return bool(self.entries)

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        """Each tenant once (several keys may name one)."""
        seen: dict[str, Tenant] = {}
        for _, tenant in self.entries:
            seen.setdefault(tenant.name, tenant)
        return tuple(seen.values())

    def find(self, key: str | None) -> Tenant | None:
        """The tenant of ``key``, or None. Every entry is compared, in constant time each."""
        if not self.entries:
            return Tenant(admin=True)
        digest = key_digest(key or "")
        found = None
        for entry_digest, tenant in self.entries:
            if hmac.compare_digest(entry_digest, digest) and key:
                found = tenant
        return found

    @classmethod
    def single(cls, api_key: str) -> KeyTable:
        """``--api-key``: one key, the default tenant, an admin."""
        return cls(((key_digest(api_key), Tenant(admin=True)),))

    @classmethod
    def from_toml(cls, data: Mapping[str, Any], where: str) -> KeyTable:
        """``[[keys]]`` tables: ``key`` or ``key_sha256`` (hex), ``tenant``, and the tenant's
        fields. Tables naming one tenant must agree on its fields."""
        unknown = sorted(set(data) - {"keys"})
        _require(not unknown, f"{where}: unknown key(s) {', '.join(unknown)} (a keys file holds [[keys]] tables)")
        tables = data.get("keys")
        if not isinstance(tables, list) or not tables or not all(isinstance(t, Mapping) for t in tables):
            raise InvalidRequestError(f"{where}: no [[keys]] tables")
        entries: list[tuple[bytes, Tenant]] = []
        tenants: dict[str, Tenant] = {}
        digests: set[bytes] = set()
        for i, table in enumerate(tables):
            at = f"{where}: [[keys]] #{i + 1}"
            digest = _entry_digest(table, at)
            _require(digest not in digests, f"{at}: the same key is given twice")
            digests.add(digest)
            fields_ = {("name" if k == "tenant" else k): v for k, v in table.items() if k not in ("key", "key_sha256")}
            _require("name" in fields_, f"{at}: tenant is required")
            tenant = Tenant.from_mapping(fields_, at)
            _require(tenants.setdefault(tenant.name, tenant) == tenant,
                     f"{at}: tenant {tenant.name!r} is configured differently by another key")
            entries.append((digest, tenant))
        return cls(tuple(entries))


def _entry_digest(table: Mapping[str, Any], where: str) -> bytes:
    key, hexed = table.get("key"), table.get("key_sha256")
    _require((key is None) != (hexed is None), f"{where}: give key or key_sha256, one of them")
    if key is not None:
        _require(isinstance(key, str) and len(key) >= 8, f"{where}: key must be a string of at least 8 characters")
        return key_digest(key)
    if not isinstance(hexed, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hexed):
        raise InvalidRequestError(f"{where}: key_sha256 must be 64 hex digits (sha256sum of the key)")
    return bytes.fromhex(hexed)

"""A daemon's keys file (``llamactor serve --keys``): one ``[[keys]]`` table per API key."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

# Each API key's table: its tenant and whatever else it sets (admin, cache_scope, limits).
KeyTables = Mapping[str, Mapping[str, object]]


def keys_toml(keys: KeyTables) -> str:
    """The TOML of ``keys`` (API key -> its table's other fields); JSON's scalars are TOML's."""
    tables = ({"key": key, **table} for key, table in keys.items())
    return "\n".join("[[keys]]\n" + "".join(f"{name} = {json.dumps(value)}\n" for name, value in t.items()) for t in tables)


def write_keys_file(folder: Path, keys: KeyTables) -> Path:
    """``folder``/keys.toml holding ``keys`` (written again if there), and its path."""
    path = folder / "keys.toml"
    path.write_text(keys_toml(keys))
    return path

"""A KV disk-tier file's parts, in whichever format the tier writes (read from the file itself,
so that a test tells what a file planted in that format does), and a file rewritten as one who
cannot read the cache folder's secret would (used by tests/tree/test_private_data.py and
tests/tree/test_data_at_rest.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamactor.tree.tiers import disk as disk_tier


def split(path: Path) -> tuple[bytes, dict[str, Any], bytes, bytes]:
    """(magic and length prefix, header, MAC or b"", payload)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<I", data[14:18])
    mac_len = getattr(disk_tier, "MAC_BYTES", 0)
    return data[:14], json.loads(data[18:18 + n]), data[18 + n:18 + n + mac_len], data[18 + n + mac_len:]


def rewrite(source: Path, target: Path, change: Callable[[dict[str, Any]], None], secret: bytes | None) -> None:
    """``target``: ``source`` with its header changed by ``change``, its payload checksum
    recomputed, and (``secret``) a MAC made with it -- else the old MAC kept (one who cannot
    read the secret cannot make one)."""
    magic, header, mac, payload = split(source)
    change(header)
    header["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    raw = json.dumps(header).encode()
    head = magic + struct.pack("<I", len(raw)) + raw
    if mac and secret is not None:
        mac = hmac.digest(secret, head, "sha256")
    target.write_bytes(head + mac + payload)


def secret_of(folder: Path) -> bytes | None:
    path = folder / "cache.secret"
    return path.read_bytes() if path.exists() else None

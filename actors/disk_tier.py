"""The disk tier of the prefix cache: sequence states in files under ``cache_dir``, found again
by token prefix after a restart.

One file per entry: a fixed magic, a JSON header (what makes the KV valid, the cache scope it
belongs to, the tokens, the payload's layout and SHA-256), then the payload (``SeqState``'s bytes). A file counts only when
its header's ``validity`` equals this context's: the model file (size, mtime, a hash of its first
MiB), the context and KV settings, the llama.cpp build, the file format. A file that is
truncated, corrupt, unreadable or made for another model or settings is removed when it is found
(at start, or when it fails its checksum on load): never a wrong answer, never a crash. Writes go
to a temporary file that is fsynced and renamed, so a file is whole or absent. The directory is
bounded by ``budget_bytes``, least recently used first out (a file's mtime is its last use).

Runs on the batcher's thread, under ``CacheTiers``' lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llamactor.base.logging import get_logger
from llamactor.base.tenants import DEFAULT_TENANT
from llamactor.native.kv_state import SeqState
from llamactor.scheduling.tier_index import TierIndex, TierMatch

log = get_logger("llamactor.disk_tier")

MAGIC = b"LLAMACTOR-KV\x00\x01"
FORMAT = 1
SUFFIX = ".kv"


def model_identity(model_path: str) -> dict[str, Any]:
    """What identifies a model file without hashing all of it."""
    stat = os.stat(model_path)
    with open(model_path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head_sha256": head}


class DiskTier:
    def __init__(self, directory: str, budget_bytes: int, validity: dict[str, Any]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.validity = {**validity, "format": FORMAT}
        self.prefix = hashlib.sha256(json.dumps(self.validity, sort_keys=True).encode()).hexdigest()[:16]
        self.index = TierIndex(budget_bytes)
        self.counters = {"written": 0, "loaded": 0, "removed_invalid": 0, "removed_lru": 0}
        self._scan()

    # -- finding entries -----------------------------------------------------------------------

    def lookup(self, scope: str, tokens: Sequence[int]) -> TierMatch:
        return self.index.lookup(scope, tokens)

    def load(self, key: str) -> SeqState | None:
        """The entry's state, or None (and the file removed) when it does not check out."""
        path = self.dir / key
        try:
            header, offset = _read_header(path)
            data = path.read_bytes()[offset:]
            if hashlib.sha256(data).hexdigest() != header["payload_sha256"] or len(data) != sum(header["lengths"]):
                raise ValueError("payload does not match its checksum")
            full_len, *window_lens = header["lengths"]
            windows, at = [], full_len
            for n in window_lens:
                windows.append(data[at:at + n])
                at += n
            state = SeqState(header["n_tokens"], data[:full_len], tuple(windows))
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            self._remove_invalid(path, str(e))
            return None
        self.index.touch(key)
        os.utime(path)
        self.counters["loaded"] += 1
        return state

    # -- writing entries -----------------------------------------------------------------------

    def put(self, scope: str, tokens: Sequence[int], state: SeqState) -> None:
        """Write an entry of cache scope ``scope`` (unless one of its scope already starts with
        these tokens), then keep within budget."""
        covering = self.index.covers(scope, tokens)
        if covering is not None:
            self.index.touch(covering)
            os.utime(self.dir / covering)
            return
        payload = [state.full, *state.windows]
        digest = hashlib.sha256()
        for part in payload:
            digest.update(part)
        header = json.dumps({"validity": self.validity, "scope": scope, "n_tokens": state.n_tokens,
                             "tokens": list(tokens), "lengths": [len(p) for p in payload],
                             "payload_sha256": digest.hexdigest()}).encode()
        name = hashlib.sha256(scope.encode() + b"\x00" + struct.pack(f"{len(tokens)}i", *tokens)).hexdigest()[:24]
        key = f"{self.prefix}-{name}{SUFFIX}"
        path, tmp = self.dir / key, self.dir / (key + ".tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            for part in payload:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: readers see the whole file or none
        _fsync_dir(self.dir)
        if key in self.index:  # the same tokens written again (an entry that came back and left)
            self.index.remove(key)
        for gone in self.index.add(key, scope, tokens, path.stat().st_size):
            self.counters["removed_lru"] += 1
            (self.dir / gone).unlink(missing_ok=True)
        self.counters["written"] += 1

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self.index), "bytes": self.index.bytes_used, "budget_bytes": self.index.budget_bytes,
                **self.counters}

    # -- internals -----------------------------------------------------------------------------

    def _scan(self) -> None:
        """Index the valid files, oldest use first; remove everything else of ours."""
        found = []
        for path in self.dir.iterdir():
            if path.name.endswith(SUFFIX + ".tmp"):
                path.unlink(missing_ok=True)  # a write that a crash cut short
                continue
            if not path.name.endswith(SUFFIX) or not path.is_file():
                continue
            try:
                header, offset = _read_header(path)
                if header["validity"] != self.validity:
                    raise ValueError("made for another model, context or llama.cpp build")
                if path.stat().st_size != offset + sum(header["lengths"]):
                    raise ValueError("truncated")
                # a file written before tenants existed is the default tenant's (everyone's then)
                scope = str(header.get("scope", DEFAULT_TENANT))
                found.append((path.stat().st_mtime_ns, path.name, scope, header["tokens"], path.stat().st_size))
            except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
                self._remove_invalid(path, str(e))
        for _, name, scope, tokens, size in sorted(found):
            if self.index.covers(scope, tokens) is None:
                for gone in self.index.add(name, scope, tokens, size):
                    self.counters["removed_lru"] += 1
                    (self.dir / gone).unlink(missing_ok=True)
            else:
                (self.dir / name).unlink(missing_ok=True)
        log.info("disk_tier_opened", dir=str(self.dir), entries=len(self.index), bytes=self.index.bytes_used,
                 removed_invalid=self.counters["removed_invalid"])

    def _remove_invalid(self, path: Path, reason: str) -> None:
        log.warning("disk_tier_file_removed", file=path.name, reason=reason)
        self.counters["removed_invalid"] += 1
        if path.name in self.index:
            self.index.remove(path.name)
        path.unlink(missing_ok=True)


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a llamactor cache file")
        (n,) = struct.unpack("<I", f.read(4))
        if n > 64 << 20:
            raise ValueError("header too long")
        raw = f.read(n)
        if len(raw) != n:
            raise ValueError("truncated header")
    header = json.loads(raw)
    if not isinstance(header, dict) or not isinstance(header.get("tokens"), list) or not header["tokens"]:
        raise ValueError("header without tokens")
    return header, len(MAGIC) + 4 + n


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

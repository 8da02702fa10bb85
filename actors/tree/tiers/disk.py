"""The disk tier of the prefix cache: sequence states in files under ``cache_dir``, found again
by token prefix after a restart.

One file per entry: a fixed magic, a JSON header (what makes the KV valid, the cache scope it
belongs to, the tokens, the payload's layout and SHA-256), the header's HMAC-SHA256, then the
payload (``SeqState``'s bytes). The HMAC's key is this cache folder's secret (``cache.secret``,
32 random bytes made 0600 on first use, beside the files: ``read_or_create_secret``), and the
header it authenticates carries the payload's SHA-256: a file written by anyone without the
secret (planted, copied from another installation, made by an older llamactor) is not ours. A
file counts only when its MAC checks out, its header is well formed (scope, token ids in range,
``n_tokens`` the number of tokens, the sizes the file's) and its ``validity`` equals this
context's: the model file (size, mtime, a hash of its first MiB), the context and KV settings,
the llama.cpp build, the file format. Any other file ending in ``.kv`` is removed when it is
found (at start, or when it fails a check on load), with a ``disk_tier_file_removed`` warning
naming why: never a wrong answer, never an exception. Files are 0600 in a 0700 folder
(``private_files``): they hold tenants' token ids. Writes go to a temporary file that is
fsynced and renamed, so a file is whole or absent. The directory is bounded by
``budget_bytes``, least recently used first out (a file's mtime is its last use).

Runs on the batcher's thread, under ``CacheTiers``' lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llamactor.base.logging import get_logger
from llamactor.base.private_files import open_private, private_dir, read_or_create_secret
from llamactor.native.kv_state import SeqState
from llamactor.scheduling.tier_index import TierIndex, TierMatch

log = get_logger("llamactor.tree.tiers.disk")

MAGIC = b"LLAMACTOR-KV\x00\x02"  # \x01: the unauthenticated files of older versions (removed as not ours)
FORMAT = 2
SUFFIX = ".kv"
SECRET = "cache.secret"
MAC_BYTES = 32
MAX_HEADER = 64 << 20
MAX_TOKEN = (1 << 31) - 1  # llama_token is an int32


class BadFile(ValueError):
    """A cache file that fails a check (the message says which)."""


def model_identity(model_path: str) -> dict[str, Any]:
    """What identifies a model file without hashing all of it."""
    stat = os.stat(model_path)
    with open(model_path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head_sha256": head}


class DiskTier:
    def __init__(self, directory: str, budget_bytes: int, validity: dict[str, Any]) -> None:
        self.dir = private_dir(directory)  # the cache folder holds only llamactor's files: 0700
        self.secret = read_or_create_secret(self.dir / SECRET)
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
        entry = self.index.entry(key)
        try:
            header, offset = self._read_header(path)
            if header["scope"] != entry.scope or tuple(header["tokens"]) != entry.tokens:
                raise BadFile("replaced since it was indexed")
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            if len(data) != sum(header["lengths"]) or hashlib.sha256(data).hexdigest() != header["payload_sha256"]:
                raise BadFile("payload does not match its checksum")
            full_len, *window_lens = header["lengths"]
            windows, at = [], full_len
            for n in window_lens:
                windows.append(data[at:at + n])
                at += n
            state = SeqState(header["n_tokens"], data[:full_len], tuple(windows))
        except Exception as e:  # noqa: BLE001 - whatever a file holds, it costs a miss, never the batcher
            self._remove_invalid(path, _reason(e))
            return None
        self.index.touch(key)
        with contextlib.suppress(OSError):  # its last use, for the LRU after a restart: not worth a miss
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
        head = MAGIC + struct.pack("<I", len(header)) + header
        name = hashlib.sha256(scope.encode() + b"\x00" + struct.pack(f"{len(tokens)}i", *tokens)).hexdigest()[:24]
        key = f"{self.prefix}-{name}{SUFFIX}"
        path, tmp = self.dir / key, self.dir / (key + ".tmp")
        with open_private(tmp) as f:
            f.write(head + hmac.digest(self.secret, head, "sha256"))
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
                header, _ = self._read_header(path)
                found.append((path.stat().st_mtime_ns, path.name, header["scope"], tuple(header["tokens"]),
                              path.stat().st_size))
            except Exception as e:  # noqa: BLE001 - whatever a file holds, it costs a miss, never the start
                self._remove_invalid(path, _reason(e))
        for _, name, scope, tokens, size in sorted(found):
            if self.index.covers(scope, tokens) is None:
                for gone in self.index.add(name, scope, tokens, size):
                    self.counters["removed_lru"] += 1
                    (self.dir / gone).unlink(missing_ok=True)
            else:
                (self.dir / name).unlink(missing_ok=True)
        log.info("disk_tier_opened", dir=str(self.dir), entries=len(self.index), bytes=self.index.bytes_used,
                 removed_invalid=self.counters["removed_invalid"])

    def _read_header(self, path: Path) -> tuple[dict[str, Any], int]:
        """The header of ``path``, authenticated and checked, and where its payload starts."""
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise BadFile("not a llamactor cache file of this version")
            raw_n = f.read(4)
            (n,) = struct.unpack("<I", raw_n) if len(raw_n) == 4 else (-1,)
            if not 0 < n <= MAX_HEADER:
                raise BadFile("truncated or overlong header")
            raw, mac = f.read(n), f.read(MAC_BYTES)
            size = os.fstat(f.fileno()).st_size
        if len(raw) != n or len(mac) != MAC_BYTES:
            raise BadFile("truncated header")
        if not hmac.compare_digest(mac, hmac.digest(self.secret, MAGIC + raw_n + raw, "sha256")):
            raise BadFile("its MAC does not check out (not written with this cache folder's secret)")
        header = json.loads(raw)  # parsed only once authenticated
        offset = len(MAGIC) + 4 + n + MAC_BYTES
        _check_header(header, self.validity, size - offset)
        return header, offset

    def _remove_invalid(self, path: Path, reason: str) -> None:
        log.warning("disk_tier_file_removed", file=path.name, reason=reason)
        self.counters["removed_invalid"] += 1
        if path.name in self.index:
            self.index.remove(path.name)
        try:
            path.unlink(missing_ok=True)
        except OSError as e:  # a folder we may not write (not ours): the file stays, unindexed, a miss still
            log.warning("disk_tier_file_not_removed", file=path.name, error=str(e))


def _check_header(header: Any, validity: dict[str, Any], payload_size: int) -> None:
    """Raise ``BadFile`` unless ``header`` is well formed, valid here, and sized as its payload.
    (Only our own bugs could write a bad header with a good MAC: the checks keep even those a miss.)"""
    if not isinstance(header, dict):
        raise BadFile("header is not an object")
    if header.get("validity") != validity:
        raise BadFile("made for another model, context or llama.cpp build")
    tokens, scope, lengths = header.get("tokens"), header.get("scope"), header.get("lengths")
    if not isinstance(scope, str) or not scope:
        raise BadFile("header without a cache scope")
    if not isinstance(tokens, list) or not tokens or not all(_is_int(t) and 0 <= t <= MAX_TOKEN for t in tokens):
        raise BadFile("header's tokens are not token ids")
    if not _is_int(header.get("n_tokens")) or header["n_tokens"] != len(tokens):
        raise BadFile("header's n_tokens is not the number of its tokens")
    if (not isinstance(lengths, list) or not lengths or not all(_is_int(n) and n >= 0 for n in lengths)
            or lengths[0] == 0):
        raise BadFile("header's payload lengths are malformed")
    if sum(lengths) != payload_size:
        raise BadFile("truncated: the payload is not the size its header says")
    if not isinstance(header.get("payload_sha256"), str):
        raise BadFile("header without a payload checksum")


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON's true/false are bools, not token ids or sizes


def _reason(error: Exception) -> str:
    return str(error) if isinstance(error, (BadFile, OSError)) else f"{type(error).__name__}: {error}"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

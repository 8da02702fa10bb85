"""The disk tier's files without a model: found again by token prefix, bounded, and every bad file
(truncated, corrupt, foreign, half-written) ignored and removed. Restores from disk on the real
model, across a daemon restart: tests/tree/test_cache_restart.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamactor.tree.tiers.disk import DiskTier
from llamactor.native.kv_state import SeqState

pytestmark = pytest.mark.pure

VALIDITY = {"model": {"size": 1, "mtime_ns": 2, "head_sha256": "ab"}, "n_ctx": 4096, "kv_type": "f16"}


def state(n_tokens: int, fill: int, size: int = 1000) -> SeqState:
    return SeqState(n_tokens, bytes([fill]) * size, (bytes([fill + 1]) * 300, bytes([fill + 2]) * 200))


def test_an_entry_written_is_found_by_prefix_after_reopening_with_the_same_bytes(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    tier.put("t", [1, 2, 3, 4], state(4, 7))
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".kv", ".secret"]  # no temporary file left behind
    reopened = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    match = reopened.lookup("t", [1, 2, 3, 9])
    assert match.n_tokens == 3 and match.n_entry == 4 and match.key is not None
    assert reopened.load(match.key) == state(4, 7)


def test_truncated_corrupt_foreign_and_half_written_files_are_ignored_and_removed(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    for i, tokens in enumerate([[1, 2], [3, 4], [5, 6], [7, 8]]):
        tier.put("t", tokens, state(2, 10 * i))
    files = {tier.lookup("t", t).key: t for t in ([1, 2], [3, 4], [5, 6], [7, 8])}
    by_tokens = {tuple(t): tmp_path / str(k) for k, t in files.items()}
    with open(by_tokens[(1, 2)], "r+b") as f:  # truncated
        f.truncate(os.path.getsize(by_tokens[(1, 2)]) - 10)
    data = bytearray(by_tokens[(3, 4)].read_bytes())  # one payload byte flipped
    data[-5] ^= 0xFF
    by_tokens[(3, 4)].write_bytes(bytes(data))
    by_tokens[(5, 6)].write_bytes(b"not a cache file at all")
    (tmp_path / "x.kv.tmp").write_bytes(b"a write cut short")
    (tmp_path / "notes.txt").write_text("not ours")

    reopened = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    assert reopened.lookup("t", [1, 2]).n_tokens == 0 and reopened.lookup("t", [5, 6]).n_tokens == 0  # removed at start
    assert not by_tokens[(1, 2)].exists() and not by_tokens[(5, 6)].exists()
    assert not (tmp_path / "x.kv.tmp").exists() and (tmp_path / "notes.txt").exists()
    corrupt = reopened.lookup("t", [3, 4])  # its header is fine: found, then refused on load
    assert corrupt.key is not None and reopened.load(corrupt.key) is None
    assert not by_tokens[(3, 4)].exists() and reopened.lookup("t", [3, 4]).n_tokens == 0
    assert reopened.load(reopened.lookup("t", [7, 8]).key or "") == state(2, 30)

    foreign = DiskTier(str(tmp_path), 1 << 20, {**VALIDITY, "n_ctx": 8192})  # other settings
    assert foreign.lookup("t", [7, 8]).n_tokens == 0 and not by_tokens[(7, 8)].exists()


def test_the_directory_keeps_within_its_budget_least_recently_used_first(tmp_path: Path) -> None:
    tier = DiskTier(str(tmp_path), 4000, VALIDITY)
    for i in range(3):
        tier.put("t", [i, i], state(2, i))  # ~1.8 kB each: two fit
    assert tier.lookup("t", [0, 0]).n_tokens == 0 and tier.lookup("t", [2, 2]).n_tokens == 2
    assert len(list(tmp_path.glob("*.kv"))) == 2
    assert tier.stats()["removed_lru"] == 1 and tier.stats()["bytes"] <= 4000

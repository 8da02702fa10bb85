"""Data at rest without a model: every KV disk-tier file that fails a check (its MAC, its header,
its token ids, ``n_tokens``, its sizes) is a miss, logged and removed -- at open and at lookup,
never an exception -- and a file planted without this cache folder's secret (re-scoped to
another tenant, copied from another installation, written by an older llamactor) is never
served. Files are 0600 in 0700 folders. On the real engine and daemon: tests/tree/test_data_at_rest.py."""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamactor.base.private_files import open_private, private_dir, read_or_create_secret
from llamactor.tree.tiers.ram import CacheTiers
from llamactor.tree.tiers.disk import DiskTier
from llamactor.jobs.journal import JobStore
from llamactor.native.kv_state import SeqState

from tests.support.cache_files import rewrite, secret_of, split

pytestmark = pytest.mark.pure

VALIDITY = {"model": {"size": 1, "mtime_ns": 2, "head_sha256": "ab"}, "n_ctx": 4096, "kv_type": "f16"}
TOKENS = [5, 6, 7, 8]


def state(n_tokens: int, fill: int = 3) -> SeqState:
    return SeqState(n_tokens, bytes([fill]) * 1000, (bytes([fill + 1]) * 300,))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)  # what most systems run with: files 0644 and folders 0755 unless made private
    yield
    os.umask(old)


def written(folder: Path, scope: str = "alice", tokens: list[int] = TOKENS) -> Path:
    tier = DiskTier(str(folder), 1 << 20, VALIDITY)
    tier.put(scope, tokens, state(len(tokens)))
    return folder / str(tier.lookup(scope, tokens).key)


def test_a_file_re_scoped_to_another_tenant_without_the_secret_is_never_served(tmp_path: Path) -> None:
    good = written(tmp_path)
    planted = tmp_path / "planted.kv"
    rewrite(good, planted, lambda h: h.update(scope="bob"), secret=None)  # bob's scope, alice's KV

    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    assert tier.lookup("bob", TOKENS).key is None and not planted.exists()
    assert tier.stats()["removed_invalid"] == 1
    assert tier.load(str(tier.lookup("alice", TOKENS).key)) == state(4)  # the real one still serves


def test_a_file_from_another_installation_is_removed(tmp_path: Path) -> None:
    theirs = written(tmp_path / "theirs")
    ours = tmp_path / "ours"
    DiskTier(str(ours), 1 << 20, VALIDITY)  # this installation's secret
    (ours / theirs.name).write_bytes(theirs.read_bytes())  # same model and settings, their secret

    tier = DiskTier(str(ours), 1 << 20, VALIDITY)
    assert tier.lookup("alice", TOKENS).key is None and not (ours / theirs.name).exists()


@pytest.mark.parametrize("tokens", [["a", "b", "c", "d"], [5, 6, -1, 8], [5, 6, 7, 1 << 40], [5, 6, True, 8], []])
def test_token_ids_that_are_not_token_ids_cost_the_file_not_the_tier(tmp_path: Path, tokens: list[Any]) -> None:
    good = written(tmp_path, tokens=[5, 6, 9])  # another entry of the same scope: bisected against
    rewrite(good, tmp_path / "odd.kv", lambda h: h.update(tokens=tokens, n_tokens=len(tokens)), secret_of(tmp_path))

    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)  # before: a TypeError here, the model could not load
    assert not (tmp_path / "odd.kv").exists() and tier.stats()["removed_invalid"] == 1
    assert tier.lookup("alice", [5, 6, 9]).n_tokens == 3


@pytest.mark.parametrize("n_tokens", [5, 3, 0, "4", None])
def test_a_wrong_n_tokens_is_a_miss_at_lookup_not_an_exception_on_the_batcher(
        tmp_path: Path, n_tokens: Any) -> None:
    good = written(tmp_path)
    tiers = CacheTiers(1 << 20, DiskTier(str(tmp_path), 1 << 20, VALIDITY))
    rewrite(good, good, lambda h: h.update(n_tokens=n_tokens), secret_of(tmp_path))  # changed after the scan

    assert tiers.lookup("alice", TOKENS + [1, 2]).key is None  # before: ValueError on the batcher thread
    assert not good.exists() and tiers.disk is not None and tiers.disk.stats()["removed_invalid"] == 1


def test_a_file_swapped_for_another_valid_one_after_the_scan_is_a_miss(tmp_path: Path) -> None:
    alice = written(tmp_path)
    bob = written(tmp_path, scope="bob", tokens=[1, 2, 3])
    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    os.replace(bob, alice)  # a valid file (MAC and all) under alice's entry's name

    assert tier.load(str(tier.lookup("alice", TOKENS).key)) is None and not alice.exists()


@pytest.mark.parametrize("cut", [16, 30, -1010, -10])  # in the header, in the MAC, in the payload
def test_truncated_files_are_removed(tmp_path: Path, cut: int) -> None:
    good = written(tmp_path)
    data = good.read_bytes()
    good.write_bytes(data[:cut] if cut > 0 else data[:len(data) + cut])
    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    assert tier.lookup("alice", TOKENS).key is None and not good.exists()


def test_files_of_an_older_version_without_a_mac_are_removed(tmp_path: Path) -> None:
    good = written(tmp_path)
    _, header, _, payload = split(good)
    raw = json.dumps({**header, "validity": {**VALIDITY, "format": 1}}).encode()
    old = tmp_path / "old.kv"
    old.write_bytes(b"LLAMACTOR-KV\x00\x01" + struct.pack("<I", len(raw)) + raw + payload)

    tier = DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    assert not old.exists() and tier.stats()["removed_invalid"] == 1 and len(tier.index) == 1


def test_cache_files_and_their_secret_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    good = written(folder)
    assert mode(folder) == 0o700 and mode(good) == 0o600 and mode(folder / "cache.secret") == 0o600

    folder.chmod(0o755)  # an older version's folder
    DiskTier(str(folder), 1 << 20, VALIDITY)
    assert mode(folder) == 0o700


def test_a_secret_others_could_read_or_replace_is_replaced_and_the_files_it_signed_go(tmp_path: Path) -> None:
    good = written(tmp_path)
    secret = tmp_path / "cache.secret"
    first = secret.read_bytes()
    assert read_or_create_secret(secret) == first  # the same secret on every start
    secret.chmod(0o644)
    DiskTier(str(tmp_path), 1 << 20, VALIDITY)
    assert secret.read_bytes() != first and mode(secret) == 0o600 and not good.exists()

    secret.unlink()
    secret.symlink_to(tmp_path / "elsewhere")  # a planted link is not followed
    (tmp_path / "elsewhere").write_bytes(b"x" * 32)
    assert len(read_or_create_secret(secret)) == 32 and not secret.is_symlink()


def test_private_helpers_make_0600_files_in_0700_folders_whatever_the_umask(tmp_path: Path) -> None:
    folder = private_dir(tmp_path / "a" / "b")
    assert mode(tmp_path / "a") == 0o700 and mode(folder) == 0o700
    old = folder / "old"
    old.write_text("made 0644 by an older version")
    with open_private(old, "w") as f:
        f.write("now private")
    assert mode(old) == 0o600 and old.read_text() == "now private"
    user_folder = tmp_path / "users"
    user_folder.mkdir(mode=0o755)
    private_dir(user_folder, tighten=False)  # a folder that is not llamactor's alone is left as it is
    assert mode(user_folder) == 0o755


def test_the_batch_jobs_journal_and_files_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = JobStore.in_data_dir(data)
    row = store.add_file(b'{"custom_id": "a tenant\'s prompt"}\n', "in.jsonl", "batch", tenant="alice")
    made = [data / "jobs.sqlite3", data / "jobs.sqlite3-wal", data / "jobs.sqlite3-shm", data / "jobs.sqlite3.lock",
            store.file_path(row["id"])]
    assert mode(data) == 0o700 and mode(data / "files") == 0o700
    assert {p.name: mode(p) for p in made} == {p.name: 0o600 for p in made}
    store.close()

    for p in [data, data / "files", *(p for p in made if p.exists())]:  # an older version's data dir
        p.chmod(0o755 if p.is_dir() else 0o644)
    JobStore.in_data_dir(data).close()
    assert mode(data) == 0o700 and mode(data / "files") == 0o700 and mode(data / "jobs.sqlite3") == 0o600


def test_a_bad_file_that_cannot_be_removed_is_still_only_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = written(tmp_path)
    tiers = CacheTiers(1 << 20, DiskTier(str(tmp_path), 1 << 20, VALIDITY))
    rewrite(good, good, lambda h: h.update(n_tokens=2), secret_of(tmp_path))

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))  # a folder this user may not write
    monkeypatch.setattr(Path, "unlink", refuse)
    assert tiers.lookup("alice", TOKENS).key is None and tiers.lookup("alice", TOKENS).key is None

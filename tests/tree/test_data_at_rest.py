"""Data at rest on the real engine and daemon: cache files planted or damaged in ``cache_dir``
(another tenant's scope without the secret, string token ids, another installation's secret, a
truncated file, an older version's file, a wrong ``n_tokens`` swapped in after the start) cost a
miss: the model loads, each is removed, and every request answers as computed. A daemon that ran
a batch job and saved its cache leaves every file 0600 in 0700 folders. Without a model:
tests/tree/test_private_data.py."""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from llamactor.native.engine import Engine

from tests.conftest import assert_equal_up_to_near_tie
from tests.support.batch_api import chat_line, finished, jsonl, upload
from tests.support.cache_files import rewrite, secret_of, split
from tests.support.chat_prompts import chat_tokens
from tests.support.daemon import MODEL_ID, start_daemon

ASK = dict(max_tokens=8, temperature=0)
# long enough that restoring it pays (``restore_pays``), short enough for a loaded 2-core machine
TURN = [{"role": "user", "content": "Once upon a time, in a small harbour town, there lived a clockmaker who "
                                    "repaired the lighthouse lamp every spring, and the fishermen paid him in "
                                    "herring. Who repaired the lamp, and what was he paid?"}]


def plant(good: Path, secret: bytes) -> dict[str, Callable[[], None]]:
    """Files that put alice's KV (``good``) in each tenant's scope, each failing another check."""
    folder = good.parent

    def scoped(tenant: str, key: bytes | None, **change: Any) -> Path:
        target = folder / f"{tenant}.kv"
        rewrite(good, target, lambda h: h.update(scope=tenant, **change), key)
        return target

    def truncated() -> None:
        path = scoped("erin", secret)
        path.write_bytes(path.read_bytes()[:-1000])

    def older_version() -> None:  # what llamactor wrote before its files had a MAC
        _, header, _, payload = split(good)
        raw = json.dumps({**header, "scope": "frank", "validity": {**header["validity"], "format": 1}}).encode()
        (folder / "frank.kv").write_bytes(b"LLAMACTOR-KV\x00\x01" + struct.pack("<I", len(raw)) + raw + payload)

    return {"bob": lambda: scoped("bob", None) and None,  # no secret: alice's MAC kept
            "carol": lambda: scoped("carol", secret, tokens=[str(t) for t in split(good)[1]["tokens"]]) and None,
            "dave": lambda: scoped("dave", os.urandom(32)) and None,  # another installation's secret
            "erin": truncated, "frank": older_version}


def test_planted_and_damaged_cache_files_cost_a_miss_and_every_answer_is_as_computed(
        start_llm, tmp_path: Path, reference_engine: Engine) -> None:
    options = dict(n_parallel=6, n_ctx=2048, cache_dir=str(tmp_path))
    prompt = chat_tokens(reference_engine, TURN)
    writer = start_llm(**options)
    first = writer.chat(TURN, tenant="alice", **ASK)
    writer.close()
    [good] = tmp_path.glob("*.kv")
    planted = plant(good, secret_of(tmp_path) or b"")
    for make in planted.values():
        make()

    reader = start_llm(**options)  # before: string token ids made the model fail to load
    disk = reader.stats()["cache_ram"]["disk"]
    assert (disk["entries"], disk["removed_invalid"]) == (1, len(planted)) and list(tmp_path.glob("*.kv")) == [good]
    with ThreadPoolExecutor(len(planted)) as pool:  # each tenant asks at once: one batch
        answers = dict(zip(planted, pool.map(lambda tenant: reader.chat(TURN, tenant=tenant, **ASK), planted)))
    for tenant, again in answers.items():
        assert again.usage.cached_tokens == 0, f"{tenant} was served a planted file"
        assert_equal_up_to_near_tie(reference_engine, prompt, first, again)

    # alice's own file, swapped after the start for one whose n_tokens is wrong (its MAC good):
    # before, a ValueError on the batcher thread at lookup, and the supervisor's restarts replayed it
    rewrite(good, good, lambda h: h.update(n_tokens=h["n_tokens"] - 1), secret_of(tmp_path))
    again = reader.chat(TURN, tenant="alice", **ASK)
    assert again.usage.cached_tokens == 0 and not good.exists()
    assert reader.stats()["cache_ram"]["disk"]["removed_invalid"] == len(planted) + 1
    assert (reader.stats()["state"], reader.stats()["restarts"]) == ("ready", 0)
    assert_equal_up_to_near_tie(reference_engine, prompt, first, again)


def test_a_daemon_that_ran_a_batch_job_and_saved_its_cache_leaves_every_file_private(tmp_path: Path) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    umask = os.umask(0o022)  # the daemon inherits the usual umask: 0644 files unless made private
    try:
        d = start_daemon("--n-parallel", "2", "--data-dir", str(data), "--cache-dir", str(cache))
    finally:
        os.umask(umask)
    try:
        client = d.client()
        batch = client.batches.create(input_file_id=upload(client, jsonl([chat_line("q0", "What is 2 plus 2?")])),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        assert finished(d, batch.id).status == "completed"
        client.chat.completions.create(model=MODEL_ID, messages=TURN, max_tokens=4)  # type: ignore[arg-type]
    finally:
        assert d.stop() == 0  # SIGTERM: the cache is saved to disk
    assert list(cache.glob("*.kv")) and list((data / "files").iterdir()) and (data / "jobs.sqlite3").exists()
    made = [data, cache, *data.rglob("*"), *cache.rglob("*")]
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in made}
    assert modes == {str(p.relative_to(tmp_path)): "0o700" if p.is_dir() else "0o600" for p in made}

"""Batch jobs' tenants and expiry, model-free: the ``JobStore`` on a fake clock (expired files gone
at once and swept later, a running batch's input kept, a journal of the old schema opened), and
the ``JobService``'s scoping and its sweeper thread, no model started. Over HTTP with two
tenants' keys: tests/http/test_batch_tenants.py."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamactor.base.errors import InvalidRequestError
from llamactor.jobs import records
from llamactor.jobs.service import JobService, NotFound
from llamactor.jobs.journal import JobStore

pytestmark = pytest.mark.pure
HOUR = 3600
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}\n'

# The tables as llamactor made them before tenants and expiry (a journal an upgrade must open).
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL,
                                  bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, status TEXT NOT NULL, created_at INTEGER NOT NULL,
                                    data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, rank INTEGER NOT NULL,
                                  custom_id TEXT, body TEXT, state TEXT NOT NULL, result TEXT,
                                  PRIMARY KEY (batch_id, line_no));
CREATE INDEX IF NOT EXISTS lines_by_state ON lines (batch_id, state, rank);
CREATE TABLE IF NOT EXISTS runs (batch_id TEXT NOT NULL, run_no INTEGER NOT NULL, pid INTEGER NOT NULL,
                                 started_at REAL NOT NULL, tokens_computed INTEGER NOT NULL DEFAULT 0,
                                 PRIMARY KEY (batch_id, run_no));
"""


class Clock:
    """The store's clock, moved by the test."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "jobs.sqlite3", tmp_path / "files", clock=clock)
    yield s
    s.close()


def test_an_expired_file_is_gone_from_get_list_and_delete_at_once_and_the_sweep_deletes_its_bytes(
        store: JobStore, clock: Clock) -> None:
    short = store.add_file(b"short\n", "a.jsonl", "batch", expires_after_s=HOUR)
    kept = store.add_file(b"kept\n", "b.jsonl", "batch", expires_after_s=2 * HOUR)
    assert short["expires_at"] == short["created_at"] + HOUR
    clock.now += HOUR  # expires_at itself is past: OpenAI's file is gone at that second
    assert store.file(short["id"]) is None and not store.delete_file(short["id"])
    assert [f["id"] for f in store.files()] == [kept["id"]]
    assert store.file_path(short["id"]).exists()  # only the sweep deletes bytes
    assert store.sweep() == [short["id"]]
    assert not store.file_path(short["id"]).exists() and store.file_path(kept["id"]).exists()
    assert store.sweep() == []


def test_the_sweep_keeps_a_running_batchs_input_until_the_batch_ends(store: JobStore, clock: Clock) -> None:
    row = store.add_file(LINE, "in.jsonl", "batch", expires_after_s=HOUR)
    store.create_batch(records.batch_object("batch_x", row["id"], "/v1/chat/completions", "24h", 0, None, None))
    clock.now += 2 * HOUR
    assert store.file(row["id"]) is None  # expired to its owner already
    assert store.sweep() == [] and store.file_path(row["id"]).read_bytes() == LINE  # the batch still reads it
    store.update_batch("batch_x", "failed")
    assert store.sweep() == [row["id"]] and not store.file_path(row["id"]).exists()


def test_files_and_batches_are_their_tenants_and_a_batch_needs_its_tenants_live_input(
        store: JobStore, clock: Clock) -> None:
    mine = store.add_file(LINE, "in.jsonl", "batch", tenant="alice", expires_after_s=HOUR)
    assert store.file(mine["id"], "bob") is None and store.files(tenant="bob") == []
    assert not store.delete_file(mine["id"], "bob") and store.file(mine["id"], "alice") is not None
    with pytest.raises(KeyError):
        store.create_batch(records.batch_object("batch_b", mine["id"], "/v1/completions", "24h", 0, None, None), "bob")
    store.create_batch(records.batch_object("batch_a", mine["id"], "/v1/completions", "24h", 0, None, None), "alice")
    assert store.batch("batch_a", "bob") is None and store.batch_ids(tenant="bob") == []
    assert store.batch_ids(tenant="alice") == ["batch_a"] and store.owner("batch_a") == "alice"
    clock.now += HOUR
    with pytest.raises(KeyError):  # expired: no new batch on it
        store.create_batch(records.batch_object("batch_c", mine["id"], "/v1/completions", "24h", 0, None, None),
                           "alice")


def test_a_journal_of_the_old_schema_opens_with_every_row_the_default_tenants(tmp_path: Path, clock: Clock) -> None:
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO files VALUES ('file-old', 'in.jsonl', 'batch', 5, 10)")
    db.execute("""INSERT INTO batches VALUES ('batch_old', 'completed', 10, '{"id": "batch_old", "status": "completed"}')""")
    db.execute("INSERT INTO lines VALUES ('batch_old', 0, 0, 'a', '{}', 'done', '{\"ok\": 1}')")
    db.commit()
    db.close()
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "file-old").write_bytes(b"old!\n")
    store = JobStore(tmp_path / "jobs.sqlite3", tmp_path / "files", clock=clock)
    try:
        old = store.file("file-old", "default")
        assert old is not None and old["tenant"] == "default" and old["bytes"] == 5
        assert old["expires_at"] == clock.now + records.FILE_TTL_S  # counted from the upgrade: nothing lost at once
        assert store.batch_ids(tenant="default") == ["batch_old"] and store.batch("batch_old", "alice") is None
        assert list(store.results("batch_old", "done")) == ['{"ok": 1}']
        assert store.sweep() == [] and store.file_path("file-old").read_bytes() == b"old!\n"
    finally:
        store.close()
    JobStore(tmp_path / "jobs.sqlite3", tmp_path / "files", clock=clock).close()  # migrated once: opens again


def test_expiry_policies_follow_openais_bounds() -> None:
    assert records.expiry_seconds(None, "expires_after") == 30 * 24 * HOUR
    assert records.expiry_seconds({"anchor": "created_at", "seconds": "7200"}, "expires_after") == 7200  # a form's text
    for bad in ({"anchor": "created_at", "seconds": 60}, {"anchor": "created_at", "seconds": 31 * 24 * HOUR},
                {"anchor": "last_active_at", "seconds": HOUR}, {"anchor": "created_at"},
                {"anchor": "created_at", "seconds": True}, {"anchor": "created_at", "seconds": "1e4"}, "1h"):
        with pytest.raises(InvalidRequestError):
            records.expiry_seconds(bad, "expires_after")  # type: ignore[arg-type]


def test_the_service_answers_another_tenant_as_it_answers_an_unknown_id(store: JobStore) -> None:
    jobs = JobService(store)  # never started: the batch's worker waits, and close() ends it
    try:
        file = jobs.add_file(LINE, "in.jsonl", "batch", tenant="alice",
                             expires_after={"anchor": "created_at", "seconds": HOUR})
        assert file["expires_at"] == file["created_at"] + HOUR
        batch = jobs.create(file["id"], "/v1/chat/completions", tenant="alice",
                            output_expires_after={"anchor": "created_at", "seconds": 2 * HOUR})
        for call in (lambda: jobs.file(file["id"], tenant="bob"), lambda: jobs.file_content(file["id"], tenant="bob"),
                     lambda: jobs.delete_file(file["id"], tenant="bob"), lambda: jobs.get(batch["id"], tenant="bob"),
                     lambda: jobs.cancel(batch["id"], tenant="bob")):
            with pytest.raises(NotFound):
                call()
        with pytest.raises(InvalidRequestError) as theirs:
            jobs.create(file["id"], "/v1/chat/completions", tenant="bob")
        with pytest.raises(InvalidRequestError) as unknown:
            jobs.create("file-nope", "/v1/chat/completions", tenant="bob")
        assert str(theirs.value).replace(file["id"], "file-nope") == str(unknown.value)
        assert jobs.files(tenant="bob") == [] and jobs.list_batches(tenant="bob")["data"] == []
        assert [b["id"] for b in jobs.list_batches(tenant="alice")["data"]] == [batch["id"]]
        assert jobs.file_content(file["id"], tenant="alice") == LINE
        with pytest.raises(InvalidRequestError):
            jobs.create(file["id"], "/v1/chat/completions", tenant="alice",
                        output_expires_after={"anchor": "created_at", "seconds": 10})
    finally:
        jobs.close()


class CountingStore(JobStore):
    """Counts the sweeps, for a test to wait on (a condition, not a poll)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sweeps = 0
        self.swept = threading.Condition()

    def sweep(self) -> list[str]:
        gone = super().sweep()
        with self.swept:
            self.sweeps += 1
            self.swept.notify_all()
        return gone


def test_create_answers_the_batch_as_created_however_far_its_worker_got_meanwhile(
        store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # The worst order a loaded machine can give: the worker runs the whole job before create
    # answers (here every line names no served model, so the job needs none and ends at once).
    spawn = JobService._spawn

    def spawn_and_finish(self: JobService, batch_id: str) -> None:
        spawn(self, batch_id)
        with self._lock:
            worker = self._workers.get(batch_id)
        if worker is not None:
            worker[0].join(30)

    def no_model(name: str | None) -> Any:
        raise InvalidRequestError(f"no model {name!r} is served")
    monkeypatch.setattr(JobService, "_spawn", spawn_and_finish)
    jobs = JobService(store)
    try:
        jobs.start(no_model)
        file = jobs.add_file(LINE, "in.jsonl", "batch")
        batch = jobs.create(file["id"], "/v1/chat/completions")
        assert jobs.get(batch["id"])["status"] == "completed"  # the job ran to its end first
        assert batch["status"] == "validating" and batch["in_progress_at"] is None
    finally:
        jobs.close()


def test_the_sweeper_thread_sweeps_at_start_then_periodically_and_close_stops_it(tmp_path: Path, clock: Clock) -> None:
    store = CountingStore(tmp_path / "jobs.sqlite3", tmp_path / "files", clock=clock)
    row = store.add_file(b"x\n", "in.jsonl", "batch", expires_after_s=HOUR)
    clock.now += HOUR
    jobs = JobService(store, sweep_every_s=0.05)
    jobs.start(lambda name: pytest.fail("no job runs"))
    try:
        with store.swept:
            assert store.swept.wait_for(lambda: store.sweeps >= 1, 10)
        assert not store.file_path(row["id"]).exists()
        with store.swept:
            assert store.swept.wait_for(lambda: store.sweeps >= 3, 10)  # and again, every sweep_every_s
    finally:
        jobs.close()
    sweeper = jobs._sweeper
    assert sweeper is not None and not sweeper.is_alive()


def test_close_ends_the_sweepers_wait_at_once(tmp_path: Path) -> None:
    jobs = JobService(CountingStore(tmp_path / "jobs.sqlite3", tmp_path / "files"), sweep_every_s=3600)
    jobs.start(lambda name: pytest.fail("no job runs"))
    jobs.close(timeout_s=10)
    sweeper = jobs._sweeper
    assert sweeper is not None and not sweeper.is_alive()  # an hour's wait did not hold close() up

"""The batch jobs over a front end's link (``link_jobs``), both ends in this process over a
``socketpair``, with a real ``JobService`` on a data dir of the test's own and no model started:
an upload written by the front end and adopted by the engine, a refused one leaving nothing
behind, a download read from the folder after the engine said whose it is, another tenant's
files and batches a ``NotFound`` as in one process, and nothing but the service's routes callable.
The daemon with two front ends and the real model: tests/http/test_frontend_jobs.py."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamactor.base.errors import InvalidRequestError
from llamactor.base.tenants import Tenant
from llamactor.http.engine_link import EngineLink
from llamactor.http.link_client import EngineConnection
from llamactor.http.link_jobs import JOBS, LinkJobs, job_calls
from llamactor.jobs.files import STALE_TMP_S, write_upload
from llamactor.jobs.files_api import NotFound
from llamactor.jobs.journal import JobStore
from llamactor.jobs.service import JobService

pytestmark = pytest.mark.pure
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}\n'


@pytest.fixture
def service(tmp_path: Path) -> Iterator[JobService]:
    jobs = JobService(JobStore.in_data_dir(tmp_path))
    jobs.tenant = lambda name: Tenant(name=name, max_files=2)
    yield jobs
    jobs.close()


@pytest.fixture
def front(service: JobService, tmp_path: Path) -> Iterator[LinkJobs]:
    """The front end's ``LinkJobs`` over a link whose engine end answers from ``service``."""
    ours, theirs = socket.socketpair()
    EngineLink(ours, "frontend-test", calls={JOBS: job_calls(service)})
    connection = EngineConnection(theirs, lambda views: None, lambda: None)
    connection.read_in_thread()
    yield LinkJobs(connection.call, JobStore.files_dir_of(tmp_path))
    theirs.close()


def temporaries(jobs: LinkJobs) -> list[Path]:
    return sorted(jobs.files_dir.glob("*.tmp"))


def test_an_upload_is_adopted_by_the_engine_and_read_back_by_the_front_end(front: LinkJobs,
                                                                          service: JobService) -> None:
    made = front.add_file(LINE, "in.jsonl", "batch", tenant="alice")
    assert made["bytes"] == len(LINE) and made["filename"] == "in.jsonl" and temporaries(front) == []
    assert service.file(made["id"], tenant="alice") == made  # the engine's own record
    assert front.file(made["id"], tenant="alice") == made and front.files(tenant="alice") == [made]
    assert front.file_content(made["id"], tenant="alice") == LINE
    for call in (front.file, front.file_content, front.delete_file):
        with pytest.raises(NotFound):
            call(made["id"], tenant="bob")
    assert front.files(tenant="bob") == []
    assert front.delete_file(made["id"], tenant="alice")["deleted"]
    with pytest.raises(NotFound):
        front.file_content(made["id"], tenant="alice")


def test_a_refused_upload_leaves_no_file_behind(front: LinkJobs) -> None:
    with pytest.raises(InvalidRequestError, match="purpose must be 'batch'"):
        front.add_file(LINE, "in.jsonl", "fine-tune", tenant="alice")
    for _ in range(2):
        front.add_file(LINE, "in.jsonl", "batch", tenant="alice")
    with pytest.raises(InvalidRequestError, match="max_files=2"):  # the engine's quota, checked as in one process
        front.add_file(LINE, "in.jsonl", "batch", tenant="alice")
    assert temporaries(front) == [] and len(front.files(tenant="alice")) == 2


def test_batches_are_created_read_listed_and_cancelled_over_the_link_per_tenant(front: LinkJobs) -> None:
    file_id = front.add_file(LINE, "in.jsonl", "batch", tenant="alice")["id"]
    with pytest.raises(InvalidRequestError, match="names no file"):  # another tenant's file, as an unknown one
        front.create(file_id, "/v1/chat/completions", tenant="bob")
    batch = front.create(file_id, "/v1/chat/completions", metadata={"k": "v"}, tenant="alice")
    assert batch["status"] == "validating" and batch["metadata"] == {"k": "v"}  # (no model: its worker waits)
    assert front.get(batch["id"], tenant="alice")["id"] == batch["id"]
    assert [b["id"] for b in front.list_batches(tenant="alice")["data"]] == [batch["id"]]
    assert front.list_batches(tenant="bob")["data"] == []
    assert [b["id"] for b in front.unfinished_batches()] == [batch["id"]]
    with pytest.raises(NotFound):
        front.cancel(batch["id"], tenant="bob")
    assert front.cancel(batch["id"], tenant="alice")["status"] == "cancelling"


def test_nothing_but_the_routes_methods_can_be_called(front: LinkJobs, service: JobService) -> None:
    call: Any = front._call  # (the link's own call, as a front end could make any)
    with pytest.raises(ValueError, match="unknown jobs call 'close'"):
        call(JOBS, None, "close", (), {})
    assert service.files(tenant="alice") == []  # still open


def test_the_sweep_deletes_a_temporary_file_left_an_hour_ago_and_keeps_a_fresh_one(tmp_path: Path) -> None:
    store = JobStore.in_data_dir(tmp_path)
    try:
        assert store.files_dir is not None
        left, fresh = write_upload(store.files_dir, LINE), write_upload(store.files_dir, LINE)
        long_ago = time.time() - STALE_TMP_S - 60
        os.utime(left, (long_ago, long_ago))
        store.sweep()
        assert not left.exists() and fresh.exists()
        with pytest.raises(KeyError):  # a name not an upload's: never adopted from outside the folder
            store.upload_path("../jobs.sqlite3")
    finally:
        store.close()

"""Files and batches belong to their tenant, and files expire, against ``llamactor serve --keys``
on the real model with the stock ``openai`` client: another tenant's file, batch and batch output
are a 404 (a batch on another's file is refused as one on an unknown file is) and absent from
its lists; ``expires_after`` and ``output_expires_after`` set the files' ``expires_at``. One
daemon, two tenants' keys, for the module. The store's side on a fake clock:
tests/jobs/test_tenants.py."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.batch_api import chat_line, jsonl, upload
from tests.support.daemon import Daemon, start_daemon
from tests.support.keys import write_keys_file

ALICE, BOB = "alice-key-0001", "bob-key-000001"
KEY_TABLES = {ALICE: {"tenant": "alice"}, BOB: {"tenant": "bob"}}
DAY = 24 * 3600


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    where = tmp_path_factory.mktemp("tenants")
    keys = write_keys_file(where, KEY_TABLES)
    d = start_daemon("--keys", str(keys), "--n-parallel", "2", "--data-dir", str(where / "data"))
    yield d
    assert d.stop() == 0


def finished(d: Daemon, batch_id: str, timeout: float = 120) -> None:
    """Until the job has logged ``job_finished`` (an event, not a poll)."""
    assert d.wait_for_log(lambda line: line.get("event") == "job_finished" and line.get("batch_id") == batch_id,
                          timeout), f"{batch_id} did not finish"


def refused(call: Callable[[], Any], error: type[openai.APIStatusError]) -> str:
    """The message of the error ``call`` must raise."""
    with pytest.raises(error) as e:
        call()
    return str(e.value.message)


def test_another_tenant_gets_404_for_files_batches_and_outputs_and_sees_none_of_them(daemon: Daemon) -> None:
    alice, bob = daemon.client(api_key=ALICE), daemon.client(api_key=BOB)
    file_id = upload(alice, jsonl([chat_line("a", "Say hi.", 4), chat_line("b", "Say bye.", 4)]))
    batch = alice.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: bob.files.retrieve(file_id), lambda: bob.files.content(file_id),
                 lambda: bob.files.delete(file_id), lambda: bob.batches.retrieve(batch.id),
                 lambda: bob.batches.cancel(batch.id)):
        refused(call, openai.NotFoundError)
    theirs = refused(lambda: bob.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                completion_window="24h"), openai.BadRequestError)
    unknown = refused(lambda: bob.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                                                 completion_window="24h"), openai.BadRequestError)
    assert theirs.replace(file_id, "file-nope") == unknown  # tells bob nothing about alice's files
    assert file_id not in [f.id for f in bob.files.list()] and batch.id not in [b.id for b in bob.batches.list()]
    assert file_id in [f.id for f in alice.files.list()] and batch.id in [b.id for b in alice.batches.list()]

    finished(daemon, batch.id)
    done = alice.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id is not None
    assert alice.files.content(done.output_file_id).text.count("\n") == 2
    refused(lambda: bob.files.retrieve(done.output_file_id or ""), openai.NotFoundError)
    refused(lambda: bob.files.content(done.output_file_id or ""), openai.NotFoundError)
    assert done.output_file_id not in [f.id for f in bob.files.list()]
    assert alice.files.retrieve(file_id).id == file_id  # bob's delete deleted nothing


def test_files_report_when_they_expire_and_policies_outside_openais_bounds_are_refused(daemon: Daemon) -> None:
    alice = daemon.client(api_key=ALICE)
    data = jsonl([chat_line("a", "Say hi.", 4)])
    hour = alice.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch",
                              expires_after={"anchor": "created_at", "seconds": 3600})
    assert hour.expires_at == hour.created_at + 3600
    assert alice.files.retrieve(hour.id).expires_at == hour.expires_at
    plain = alice.files.retrieve(upload(alice, data))
    assert plain.expires_at == plain.created_at + 30 * DAY  # the default, as OpenAI's batch files
    assert "expires_after[seconds]" in refused(lambda: alice.files.create(
        file=("in.jsonl", io.BytesIO(data)), purpose="batch", expires_after={"anchor": "created_at", "seconds": 60}),
        openai.BadRequestError)

    refused(lambda: alice.batches.create(input_file_id=hour.id, endpoint="/v1/chat/completions",
                                         completion_window="24h",
                                         output_expires_after={"anchor": "created_at", "seconds": 10}),
            openai.BadRequestError)
    batch = alice.batches.create(input_file_id=hour.id, endpoint="/v1/chat/completions", completion_window="24h",
                                 output_expires_after={"anchor": "created_at", "seconds": 2 * 3600})
    assert batch.expires_at == batch.created_at + DAY  # the batch's completion window, as OpenAI reports it
    finished(daemon, batch.id)
    output_file_id = alice.batches.retrieve(batch.id).output_file_id
    assert output_file_id is not None
    output = alice.files.retrieve(output_file_id)
    assert output.purpose == "batch_output" and output.expires_at == output.created_at + 2 * 3600

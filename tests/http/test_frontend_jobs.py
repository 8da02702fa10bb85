"""Batch jobs behind two front-end processes (``llamactor serve --frontend-processes 2``), with the
official OpenAI SDK on the real model: every Files and Batch route answers on either front end
(the other one stopped with SIGSTOP, so that only one can accept the connection), tenants still
see only their own; a job runs in the engine's process, so killing front ends mid-job loses and
doubles no line; the engine reads the keys its jobs run by again on SIGHUP; a killed engine
resumes its job on the next start, each line done once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types import Batch

from tests.support.batch_api import chat_line, jsonl, lines_of, upload
from tests.support.daemon import Daemon, start_daemon, wait_until
from tests.support.keys import write_keys_file

pytestmark = pytest.mark.timeout(300)
ALICE, BOB = "alice-key-0001", "bob-key-000001"
FRONT_ENDS = 2


def start_split_daemon(data_dir: Path, keys: Path, *extra: str) -> Daemon:
    d = start_daemon("--keys", str(keys), "--n-parallel", "4", "--data-dir", str(data_dir),
                     "--frontend-processes", str(FRONT_ENDS), *extra)
    assert d.wait_for_log(lambda _: len({e["pid"] for e in d.events("frontend_ready")}) >= FRONT_ENDS, 60), \
        d.log_lines[-5:]
    return d


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_keys_file(tmp_path_factory.mktemp("keys"), {ALICE: {"tenant": "alice"}, BOB: {"tenant": "bob"}})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def daemon(data_dir: Path, keys: Path) -> Iterator[Daemon]:
    d = start_split_daemon(data_dir, keys)
    try:
        yield d
    finally:
        assert d.stop() == 0


def finished(d: Daemon, client: openai.OpenAI, batch_id: str, timeout: float = 120) -> Batch:
    """The batch once its job has logged ``job_finished`` (an event, not a poll)."""
    assert d.wait_for_log(lambda line: line.get("event") == "job_finished" and line.get("batch_id") == batch_id,
                          timeout), f"{batch_id} did not finish"
    return client.batches.retrieve(batch_id)


def frontend_pids(d: Daemon) -> list[int]:
    """Each front end's current process (the last started for its index)."""
    return list({e["frontend"]: e["pid"] for e in d.events("frontend_started")}.values())


@contextlib.contextmanager
def only(d: Daemon, pid: int) -> Iterator[None]:
    """Every front end but ``pid``'s stopped (SIGSTOP): a new connection can be accepted by it alone."""
    others = [p for p in frontend_pids(d) if p != pid]
    for p in others:
        os.kill(p, signal.SIGSTOP)
    try:
        yield
    finally:
        for p in others:
            os.kill(p, signal.SIGCONT)


def line_runs(d: Daemon, batch_id: str) -> Counter[tuple[str, str]]:
    """How often the engine finished each line's request, and how: (``<batch_id>-<line_no>``, its
    finish reason) counted (the request's id is the line's, prefixed as its endpoint does)."""
    pattern = re.compile(r"(?:[a-z]+-)?(" + re.escape(batch_id) + r"-\d+)")
    return Counter((m.group(1), e["finish_reason"]) for e in d.events("request_finished")
                   if (m := pattern.fullmatch(str(e.get("request_id")))) is not None)


def each_once(batch_id: str, n: int) -> Counter[str]:
    return Counter(f"{batch_id}-{i}" for i in range(n))


def test_every_batch_route_answers_on_either_front_end_and_tenants_see_only_their_own(
        daemon: Daemon, data_dir: Path) -> None:
    first, second = frontend_pids(daemon)
    n = 6
    with only(daemon, first):  # (a new client: a connection of its own, which only `first` can accept)
        alice = daemon.client(ALICE)
        file_id = upload(alice, jsonl([chat_line(f"q{i}", f"What is {i} plus {i}?") for i in range(n)]))
        batch = alice.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating"
    with only(daemon, second):
        alice, bob = daemon.client(ALICE), daemon.client(BOB)
        assert alice.batches.retrieve(batch.id).input_file_id == file_id
        assert batch.id in [b.id for b in alice.batches.list()] and file_id in [f.id for f in alice.files.list()]
        with pytest.raises(openai.NotFoundError):
            bob.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            bob.files.content(file_id)
        assert bob.batches.list().data == [] and bob.files.list().data == []
        done = finished(daemon, alice, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
        output = lines_of(alice, done.output_file_id)
    assert [o["custom_id"] for o in output] == [f"q{i}" for i in range(n)]  # input order, each once
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["choices"] for o in output)
    assert Counter(rid for rid, _ in line_runs(daemon, batch.id).elements()) == each_once(batch.id, n)
    with only(daemon, first):
        alice = daemon.client(ALICE)
        assert lines_of(alice, done.output_file_id) == output  # the same bytes from the other front end
        with pytest.raises(openai.NotFoundError):
            daemon.client(BOB).files.delete(file_id)
        assert alice.files.delete(file_id).deleted
    with only(daemon, second), pytest.raises(openai.NotFoundError):
        daemon.client(ALICE).files.retrieve(file_id)
    assert not list((data_dir / "files").glob("*.tmp"))  # no upload's temporary file left behind


def running_job(client: openai.OpenAI, lines: list[dict[str, object]], completed: int) -> Batch:
    """A chat-completions batch of ``lines``, once ``completed`` of them are done (the Batch API
    offers nothing to wait on but its counts)."""
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)), endpoint="/v1/chat/completions",
                                  completion_window="24h")

    def done_enough() -> bool:
        counts = client.batches.retrieve(batch.id).request_counts
        return counts is not None and counts.completed >= completed
    wait_until(done_enough, f"{completed} lines of the job", timeout=120, poll_s=0.1)
    return batch


def test_killing_the_front_ends_mid_job_loses_and_doubles_no_line(daemon: Daemon) -> None:
    n = 24
    alice = daemon.client(ALICE)
    batch = running_job(alice, [chat_line(f"k{i}", f"Tell me about {i}.", 48, ignore_eos=True) for i in range(n)],
                        completed=1)
    counts = alice.batches.retrieve(batch.id).request_counts
    assert counts is not None and counts.completed < n, "the job ended before the kill: make it longer"
    killed = frontend_pids(daemon)
    for pid in killed:  # every front end at once, the one that created the job among them
        os.kill(pid, signal.SIGKILL)
    for pid in killed:
        assert daemon.wait_for_log(lambda e, pid=pid: e.get("event") == "frontend_died" and e.get("pid") == pid)
    assert daemon.wait_for_log(lambda _: len({e["pid"] for e in daemon.events("frontend_ready")} - set(killed))
                               == FRONT_ENDS, 60)
    done = finished(daemon, daemon.client(ALICE), batch.id, timeout=240)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
    output = lines_of(daemon.client(ALICE), done.output_file_id)
    assert Counter(o["custom_id"] for o in output) == Counter(f"k{i}" for i in range(n))  # each exactly once
    # the engine ran each line's request once, to its end: none cancelled with a front end, none again
    runs = line_runs(daemon, batch.id)
    # (On a failure, say how each line ended and what the job did: two clean clones under load saw
    # a line run twice, the job stepping aside for its own just-ended lines, which a step-old
    # snapshot still counted: ``InteractiveWatch.saw_end``.)
    story = (sorted(runs.items()), [line for line in daemon.log_lines if str(line.get("event", "")).startswith("job_")])
    assert Counter(rid for rid, _ in runs.elements()) == each_once(batch.id, n), story
    assert "cancelled" not in {reason for _, reason in runs}


def test_a_sighup_reloads_the_keys_the_engines_jobs_run_by(daemon: Daemon, keys: Path) -> None:
    dave = "dave-key-000001"
    with pytest.raises(openai.AuthenticationError):
        daemon.client(dave).files.list()
    write_keys_file(keys.parent, {ALICE: {"tenant": "alice"}, BOB: {"tenant": "bob"},
                                  dave: {"tenant": "dave", "max_files": 1}})
    daemon.process.send_signal(signal.SIGHUP)  # the engine reads the file, and passes the signal on
    assert daemon.wait_for_log(lambda _: len(daemon.events("keys_reloaded")) >= FRONT_ENDS
                               and bool(daemon.events("engine_keys_reloaded")))
    upload(daemon.client(dave), jsonl([chat_line("d", "Hi.")]))
    with pytest.raises(openai.BadRequestError, match="max_files=1"):  # dave's quota, as the engine now reads it
        upload(daemon.client(dave), jsonl([chat_line("d", "Hi.")]))


@pytest.mark.timeout(600)  # two daemons
def test_a_killed_engine_resumes_its_job_on_the_next_start_each_line_done_once(tmp_path: Path, keys: Path) -> None:
    n = 12
    d = start_split_daemon(tmp_path, keys)
    try:
        batch = running_job(d.client(ALICE), [chat_line(f"e{i}", f"Name {i} animals.", 24, ignore_eos=True)
                                              for i in range(n)], completed=2)
    finally:
        d.process.send_signal(signal.SIGKILL)  # the engine's process: the front ends end with it
        d.process.wait(30)
    assert d.wait_for_log(lambda _: len(d.events("frontend_engine_lost")) == FRONT_ENDS)

    d = start_split_daemon(tmp_path, keys)
    try:
        assert d.wait_for_log(lambda e: e.get("event") == "job_resumed" and e.get("batch_id") == batch.id, 60)
        done = finished(d, d.client(ALICE), batch.id, timeout=400)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
        output = lines_of(d.client(ALICE), done.output_file_id)
        assert Counter(o["custom_id"] for o in output) == Counter(f"e{i}" for i in range(n))  # each exactly once
        resumed = Counter(rid for rid, _ in line_runs(d, batch.id).elements())  # what the last left, each once
        assert 0 < sum(resumed.values()) <= n - 2 and set(resumed.values()) == {1}
    finally:
        assert d.stop() == 0

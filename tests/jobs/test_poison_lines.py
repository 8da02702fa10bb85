"""A batch line in flight when the process died of a fault, twice, is poison: it fails once with
``poison_request`` and the job goes on; a kill or a stop is not the line's doing and counts against
none. The journal (``jobs/journal.py``) and the runner (``jobs/runner.py``), model-free: the
processes that die are real, the client answering the lines is a fake."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llamactor.base.messages import Generate
from llamactor.jobs.journal import JobStore
from llamactor.jobs.runner import JobRunner

from tests.support.jobs import CHAT, FakeClient, answer, line, new_batch, run_in_thread

DIE_RUNNING = """
import os, signal, sys
from llamactor.jobs.journal import JobStore
store = JobStore(sys.argv[1])
store.start_run(sys.argv[2])
for line_no in sys.argv[4:]:
    store.mark_running(sys.argv[2], int(line_no))
os.abort() if sys.argv[3] == "fault" else os.kill(os.getpid(), signal.SIGKILL)
"""


def die_running(journal: Path, batch_id: str, how: str, *line_nos: int) -> None:
    """A process takes the journal, has these lines in flight, and dies: of a ``fault`` (SIGABRT,
    as llama.cpp's aborts and segfaults kill it) or ``kill``-ed (SIGKILL: an operator, the OOM killer)."""
    proc = subprocess.run([sys.executable, "-c", DIE_RUNNING, str(journal), batch_id, how, *map(str, line_nos)],
                          timeout=120, capture_output=True)
    assert proc.returncode == (-signal.SIGABRT if how == "fault" else -signal.SIGKILL), proc.stderr


@pytest.fixture
def journal(tmp_path: Path) -> tuple[Path, str, list[int]]:
    """A journal holding a 4-line batch, closed; and the batch's line numbers in run order."""
    store = JobStore(tmp_path / "jobs.sqlite3")
    b = new_batch(store, *(line(f"q{i}", f"question {i}") for i in range(4)))
    order = [n for n, _, _ in store.unfinished(b)]
    store.close()
    return tmp_path / "jobs.sqlite3", b, order


def line_of(msg: Generate, batch_id: str) -> int:
    return int(msg.request_id.removeprefix(f"chatcmpl-{batch_id}-"))


@pytest.mark.pure
def test_lines_in_flight_at_a_fault_run_first_and_alone_and_a_kill_or_a_stop_counts_against_no_line(journal) -> None:
    path, b, order = journal
    die_running(path, b, "kill", order[0], order[1])  # not the lines' doing: given back, uncounted
    die_running(path, b, "fault", order[1], order[2])
    store = JobStore(path)
    try:
        assert store.crashes(b) == {order[1]: 1, order[2]: 1}
        client = FakeClient()
        thread, result = run_in_thread(JobRunner(store, b, CHAT, client, "m", max_in_flight=4))
        for i, suspect in enumerate(order[1:3]):  # one at a time: the next goes once the one before is done
            msg = client.next_message(i)
            assert line_of(msg, b) == suspect and client.most_outstanding == 1
            answer(msg)
        rest = [client.next_message(i) for i in (2, 3)]  # then the others, together
        assert client.outstanding == 2
        for msg in rest:
            answer(msg)
        thread.join(10)
        assert result == [True] and store.counts(b).completed == 4 and store.crashes(b) == {}
        # A run that is stopped gives its lines back: nothing is counted against them.
        b2 = new_batch(store, *(line(f"r{i}", f"again {i}") for i in range(2)), batch_id="batch_2")
        stop, client = threading.Event(), FakeClient()
        thread, result = run_in_thread(JobRunner(store, b2, CHAT, client, "m", max_in_flight=2, stop=stop))
        client.next_message(1)
        stop.set()
        thread.join(10)
        assert result == [False] and store.crashes(b2) == {}
    finally:
        store.close()


@pytest.mark.pure
def test_a_line_in_flight_at_two_faults_fails_once_with_poison_request_and_the_job_goes_on(journal) -> None:
    path, b, order = journal
    innocent, poison = order[0], order[1]
    die_running(path, b, "fault", innocent, poison)
    die_running(path, b, "fault", poison)  # the next run had it alone in flight (a suspect runs alone)
    store = JobStore(path)
    try:
        for _ in range(2):  # the run that quarantines it, and one more start: it fails once, never runs again
            client = FakeClient()
            thread, result = run_in_thread(JobRunner(store, b, CHAT, client, "m", max_in_flight=4))
            for i in range(sum(n != poison for n, _, _ in store.unfinished(b))):
                answer(client.next_message(i))
            thread.join(10)
            assert result == [True] and poison not in {line_of(m, b) for m in client.sent}
        assert store.counts(b).as_dict() == {"total": 4, "completed": 3, "failed": 1}
        (failed,) = [json.loads(r) for r in store.results(b, "failed")]
        assert failed["response"]["request_id"] == f"{b}-{poison}"
        assert failed["response"]["status_code"] == 422
        assert failed["response"]["body"]["error"]["code"] == "poison_request"
    finally:
        store.close()

"""Batch jobs' pure parts and their journal, model-free: input validation and the run order
(``llamactor.jobs.input_lines``), the Batch lifecycle (``llamactor.jobs.lifecycle``), the SQLite
journal and its files (``llamactor.jobs.journal``, ``llamactor.jobs.files``), and the runner's
bookkeeping on a fake client whose futures the test resolves (``llamactor.jobs.runner``). The
same behaviours on the real model: tests/http/test_batch_api.py and tests/cli/test_batch.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamactor.base.errors import InvalidRequestError
from llamactor.jobs import records
from llamactor.jobs.endpoints import check_body
from llamactor.jobs.input_lines import NotJsonlError, rank_by_prefix, read_input_lines
from llamactor.jobs.lifecycle import check_transition, resumable
from llamactor.jobs.runner import JobRunner, LineCounts
from llamactor.scheduling.interactive_watch import InteractiveWatch
from llamactor.jobs.database import StoreLockedError
from llamactor.jobs.journal import JobStore

from tests.support.jobs import CHAT, FakeClient, answer, line, new_batch, read, run_in_thread

pytestmark = pytest.mark.pure


# -- input lines --------------------------------------------------------------------------

def test_each_kind_of_bad_line_gets_its_own_error_code_and_good_lines_get_a_body() -> None:
    read_lines = read(line("a"), "{broken", line(None), line("a"), line("b", url="/v1/embeddings"),
                   line("c", temprature=1), line("d", stream=True), json.dumps({"custom_id": "e", "url": CHAT,
                                                                              "method": "GET", "body": {}}),
                   line("f", response_format={"type": "json_schema"}))
    assert read_lines[0].body is not None and read_lines[0].error is None
    assert [p.error[0] if p.error else None for p in read_lines] == [
        None, "invalid_json_line", "missing_custom_id", "duplicate_custom_id", "mismatched_url", "invalid_body",
        "invalid_body", "invalid_method", "invalid_body"]
    assert "temprature" in read_lines[5].error[1]
    assert "json_schema is required" in read_lines[8].error[1]  # the handler's own check, before anything runs


def test_a_file_with_no_json_object_or_no_text_is_not_jsonl_and_blank_lines_are_skipped() -> None:
    for data, code in ((b"just some text\nmore text\n", "invalid_json_lines"), (b"\xff\xfe\x00bin", "invalid_json_lines"),
                       (b"\n  \n", "empty_file"), (b"[1, 2]\n3\n", "invalid_json_lines")):
        with pytest.raises(NotJsonlError) as e:
            read_input_lines(data, CHAT, check_body)
        assert e.value.code == code
    assert [p.line_no for p in read_input_lines(f"\n{line('a')}\n\n{line('b')}\n".encode(), CHAT, check_body)] == [0, 1]


def test_lines_sharing_a_system_prompt_get_neighbouring_ranks_whatever_their_input_order() -> None:
    systems = ["You are a pirate.", "You are a poet."]
    read_lines = read(*(line(f"q{i}", f"question {i}", systems[i % 2]) for i in range(8)))
    by_rank = sorted(read_lines, key=lambda p: p.rank)
    groups = [p.body["messages"][0]["content"] for p in by_rank]
    assert groups == sorted(groups) and groups[:4] == [systems[0]] * 4  # each system prompt's lines in one run
    assert sorted(p.rank for p in read_lines) == list(range(8))
    within = [p.line_no for p in by_rank if p.body["messages"][0]["content"] == systems[0]]
    assert within == sorted(within)  # equal prefixes keep their input order


def test_failed_lines_rank_after_every_line_that_runs() -> None:
    read_lines = rank_by_prefix(read("{bad", line("a", "zzz"), line("b", "aaa")), CHAT)
    assert [p.rank for p in read_lines] == [2, 1, 0]


def test_the_batch_lifecycle_allows_only_openai_transitions() -> None:
    check_transition("validating", "in_progress")
    check_transition("in_progress", "cancelling")
    check_transition("cancelling", "cancelled")
    for old, new in (("completed", "in_progress"), ("cancelled", "in_progress"), ("validating", "completed"),
                     ("cancelling", "completed")):
        with pytest.raises(ValueError):
            check_transition(old, new)
    assert [s for s in ("validating", "in_progress", "finalizing", "cancelling", "completed", "cancelled", "failed")
            if resumable(s)] == ["validating", "in_progress", "finalizing", "cancelling"]


# -- store ----------------------------------------------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.in_data_dir(tmp_path)
    yield s
    s.close()


def test_a_second_store_on_the_same_journal_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = JobStore(tmp_path / "j.sqlite3")
    with pytest.raises(StoreLockedError):
        JobStore(tmp_path / "j.sqlite3")
    first.close()
    JobStore(tmp_path / "j.sqlite3").close()


def test_unfinished_lines_come_in_run_order_and_a_finished_line_is_never_written_twice(store: JobStore) -> None:
    b = new_batch(store, line("x", "b"), "{bad", line("y", "a"))
    assert store.batch(b)["status"] == "in_progress"  # type: ignore[index]
    assert [n for n, _, _ in store.unfinished(b)] == [2, 0]
    store.mark_running(b, 2)
    assert [n for n, _, _ in store.unfinished(b)] == [2, 0]  # running (its result not committed) is unfinished
    store.finish_line(b, 2, "done", {"first": True})
    store.finish_line(b, 2, "failed", {"second": True})  # a late duplicate result changes nothing
    assert list(store.results(b, "done")) == ['{"first": true}']
    assert store.counts(b).as_dict() == {"total": 3, "completed": 1, "failed": 1}
    assert json.loads(next(store.results(b, "failed")))["error"]["code"] == "invalid_json_line"


def test_a_file_is_recorded_only_once_written_whole_and_deleting_removes_it(store: JobStore) -> None:
    row = store.add_file(b"data\n", "in.jsonl", "batch")
    path = store.file_path(row["id"])
    assert path.read_bytes() == b"data\n" and not path.with_name(path.name + ".tmp").exists()
    assert [f["id"] for f in store.files("batch")] == [row["id"]]
    assert store.delete_file(row["id"]) and not path.exists() and store.file(row["id"]) is None
    with pytest.raises(KeyError):
        store.file_path("../escape")


def test_status_changes_set_their_timestamps_and_refuse_going_back(store: JobStore) -> None:
    b = new_batch(store, line("x"))
    assert store.batch(b)["in_progress_at"] is not None  # type: ignore[index]
    done = store.update_batch(b, "finalizing", output_file_id="file-1")
    assert done["finalizing_at"] is not None and done["output_file_id"] == "file-1"
    with pytest.raises(ValueError):
        store.update_batch(b, "in_progress")


# -- runner on a fake client ------------------------------------------------------------------

def test_the_runner_keeps_at_most_max_in_flight_and_journals_every_line_once(store: JobStore) -> None:
    b = new_batch(store, *(line(f"q{i}", f"question {i:02d}") for i in range(7)))
    client, progress = FakeClient(), []
    runner = JobRunner(store, b, CHAT, client, "m", max_in_flight=3, on_progress=progress.append)
    thread, result = run_in_thread(runner)
    for i in range(7):
        client.next_message(min(i + 2, 6))  # three in flight before the first is answered
        msg = client.next_message(i)
        assert msg.priority > 0  # low: after interactive requests
        answer(msg, f"answer {i}")
    thread.join(10)
    assert result == [True] and client.most_outstanding == 3
    assert [m.request_id for m in client.sent] == [f"chatcmpl-{records.request_id(b, i)}" for i in range(7)]  # run order (as the endpoint names its requests)
    out = [json.loads(r) for r in store.results(b, "done")]
    assert [o["custom_id"] for o in out] == [f"q{i}" for i in range(7)]
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "answer 0"
    assert progress[-1] == LineCounts(7, 7, 0, 7, progress[-1].elapsed_s)


def test_a_stopped_runner_leaves_its_in_flight_lines_for_the_next_run_which_does_only_those(store: JobStore) -> None:
    b = new_batch(store, *(line(f"q{i}", f"question {i}") for i in range(4)))
    client, stop = FakeClient(), threading.Event()
    thread, result = run_in_thread(JobRunner(store, b, CHAT, client, "m", max_in_flight=2, stop=stop))
    answer(client.next_message(0))
    client.next_message(2)  # the third line is in flight
    stop.set()
    thread.join(10)
    assert result == [False] and store.counts(b).completed == 1
    again = FakeClient()
    thread, result = run_in_thread(JobRunner(store, b, CHAT, again, "m", max_in_flight=4))
    for i in range(3):
        answer(again.next_message(i))
    thread.join(10)
    assert result == [True] and len(again.sent) == 3  # the finished line is not computed again
    assert sorted(json.loads(r)["custom_id"] for r in store.results(b, "done")) == ["q0", "q1", "q2", "q3"]


def test_a_full_queue_is_retried_and_a_refused_request_fails_only_its_line(store: JobStore) -> None:
    b = new_batch(store, line("a", "a"), line("b", "b"))
    client = FakeClient(refuse_first=2)
    thread, result = run_in_thread(JobRunner(store, b, CHAT, client, "m", max_in_flight=1))
    client.next_message(0).reply.future.set_exception(InvalidRequestError("prompt too long"))
    answer(client.next_message(1))
    thread.join(10)
    assert result == [True]
    failed = [json.loads(r) for r in store.results(b, "failed")]
    assert [(f["custom_id"], f["response"]["status_code"]) for f in failed] == [("a", 400)]
    assert failed[0]["response"]["body"]["error"]["message"] == "prompt too long"
    assert [json.loads(r)["custom_id"] for r in store.results(b, "done")] == ["b"]


def test_a_stale_snapshot_still_counting_a_line_the_job_saw_end_does_not_make_it_step_aside(
        store: JobStore) -> None:
    b = new_batch(store, *(line(f"q{i}", f"question {i}") for i in range(4)))
    client, published = FakeClient(), [(0, 0)]
    runner = JobRunner(store, b, CHAT, client, "m", max_in_flight=3, yield_in_flight=1,
                       model_load=lambda: published[-1], watch=InteractiveWatch(confirm_steps=0, hold_s=0.0))
    thread, result = run_in_thread(runner)
    first = [client.next_message(i) for i in range(3)]
    published.append((3, 1))  # the job's three lines, as the batcher publishes them
    answer(first[0])          # ... and the snapshot stays a step old: it still counts the first
    fourth = client.next_message(3)
    assert fourth.request_id == f"chatcmpl-{records.request_id(b, 3)}"  # the fourth line, not one stepped aside
    assert not any(m.reply.future.cancelled() for m in first[1:])
    published.append((3, 2))
    for msg in (*first[1:], fourth):
        answer(msg)
    thread.join(10)
    assert result == [True] and len(client.sent) == 4


def test_while_others_have_work_the_runner_keeps_only_its_yield_share_in_flight(store: JobStore) -> None:
    b = new_batch(store, *(line(f"q{i}", f"question {i}") for i in range(6)))
    client, busy = FakeClient(), threading.Event()
    busy.set()
    runner = JobRunner(store, b, CHAT, client, "m", max_in_flight=4, yield_in_flight=1,
                       model_load=lambda: (client.outstanding + (5 if busy.is_set() else 0), 0),
                       watch=InteractiveWatch(confirm_steps=0, hold_s=0.0))
    thread, result = run_in_thread(runner)
    for i in range(3):
        answer(client.next_message(i))
    assert client.most_outstanding == 1      # one at a time while the others' five sequences run
    busy.clear()
    for i in range(3, 6):
        answer(client.next_message(i))
    thread.join(10)
    assert result == [True]


def test_when_others_start_work_the_runner_cancels_its_newest_lines_and_runs_them_again_later(
        store: JobStore) -> None:
    b = new_batch(store, *(line(f"q{i}", f"question {i}") for i in range(4)))
    client, busy = FakeClient(), threading.Event()
    runner = JobRunner(store, b, CHAT, client, "m", max_in_flight=3, yield_in_flight=1,
                       model_load=lambda: (client.outstanding + (2 if busy.is_set() else 0), 0),
                       watch=InteractiveWatch(confirm_steps=0, hold_s=0.0))
    thread, result = run_in_thread(runner)
    first = [client.next_message(i) for i in range(3)]  # three in flight: nobody else is there
    ended, changed = [], threading.Condition()

    def note(_f: object) -> None:  # (concurrent.futures.wait does not wake for a cancelled future)
        with changed:
            ended.append(_f)
            changed.notify_all()
    for msg in first[1:]:
        msg.reply.future.add_done_callback(note)
    busy.set()
    with changed:
        assert changed.wait_for(lambda: len(ended) == 2, 10)
    assert first[1].reply.future.cancelled() and first[2].reply.future.cancelled()
    assert not first[0].reply.future.done()  # the oldest line keeps its sequence
    busy.clear()
    answer(first[0])
    for i in range(3, 6):  # the two cancelled lines again, then the fourth
        answer(client.next_message(i))
    thread.join(10)
    assert result == [True]
    assert [m.request_id for m in client.sent[3:]] == [f"chatcmpl-{records.request_id(b, i)}" for i in (1, 2, 3)]
    assert sorted(json.loads(r)["custom_id"] for r in store.results(b, "done")) == ["q0", "q1", "q2", "q3"]


def test_a_batch_usage_adds_up_the_tokens_of_every_successful_line_whatever_its_endpoint() -> None:
    chat = records.success_line("batch_x", 0, "a", {"usage": {"prompt_tokens": 10, "completion_tokens": 3,
                                                              "prompt_tokens_details": {"cached_tokens": 8}}})
    responses = records.success_line("batch_x", 1, "b", {"usage": {"input_tokens": 5, "output_tokens": 2}})
    usage = records.batch_usage([json.dumps(chat), json.dumps(responses)])
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (15, 5, 20)
    assert usage["input_tokens_details"]["cached_tokens"] == 8

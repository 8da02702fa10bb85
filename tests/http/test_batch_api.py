"""OpenAI's Files and Batch API against ``llamactor serve`` on the real model, with the stock
``openai`` client: a job end to end, bad lines in the error file, a file that is not JSONL, and a
daemon killed (``kill -9``) mid-job that resumes its unfinished job and keeps a cancelled one
cancelled. Each test starts its own daemon on a data directory of its own."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.support.batch_api import SYSTEM, chat_line, finished, jsonl, lines_of, upload
from tests.support.daemon import MODEL_ID, start_daemon, wait_until


def test_the_openai_client_runs_a_batch_job_end_to_end_and_downloads_its_output(tmp_path: Path) -> None:
    d = start_daemon("--n-parallel", "4", "--data-dir", str(tmp_path))
    try:
        client = d.client()
        questions = [f"What is {i} plus {i}?" for i in range(6)]
        good = [chat_line(f"q{i}", q) for i, q in enumerate(questions)]
        bad = [chat_line("typo", "hi", temprature=0.5),                       # an unknown field: the endpoint's 400
               {**chat_line("elsewhere", "hi"), "url": "/v1/completions"},   # another endpoint
               "{not json"]
        file_id = upload(client, jsonl([*good[:3], *bad, *good[3:]]))
        assert client.files.retrieve(file_id).purpose == "batch"
        assert file_id in [f.id for f in client.files.list()]
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                      metadata={"job": "test"})
        assert batch.status == "validating" and batch.metadata == {"job": "test"}  # as created, whatever since
        done = finished(d, batch.id)
        assert done.status == "completed" and done.completed_at is not None and done.in_progress_at is not None
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (9, 6, 3)
        assert batch.id in [b.id for b in client.batches.list()]
        assert done.model == MODEL_ID and done.usage is not None and done.usage.output_tokens > 0

        output = lines_of(client, done.output_file_id)
        assert [o["custom_id"] for o in output] == [f"q{i}" for i in range(6)]  # input order, each once
        direct = client.chat.completions.create(model=MODEL_ID, messages=good[0]["body"]["messages"], max_tokens=8,
                                                temperature=0)
        for o in output:
            assert o["response"]["status_code"] == 200 and o["error"] is None
            body = ChatCompletion.model_validate(o["response"]["body"])
            assert body.model == MODEL_ID and body.choices[0].message.content
            assert body.usage is not None and body.usage.completion_tokens <= 8
        first = ChatCompletion.model_validate(output[0]["response"]["body"])
        assert first.usage is not None and direct.usage is not None
        assert first.usage.prompt_tokens == direct.usage.prompt_tokens  # the same request the endpoint makes

        errors = lines_of(client, done.error_file_id)
        assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
            ("typo", "invalid_body"), ("elsewhere", "mismatched_url"), (None, "invalid_json_line")]
        assert "temprature" in errors[0]["error"]["message"]

        assert client.files.delete(file_id).deleted
        try:
            client.files.retrieve(file_id)
            raise AssertionError("a deleted file is still there")
        except openai.NotFoundError:
            pass
    finally:
        assert d.stop() == 0


def test_completions_embeddings_and_responses_batches_answer_as_their_endpoints_do(tmp_path: Path) -> None:
    d = start_daemon("--n-parallel", "2", "--data-dir", str(tmp_path))
    try:
        client = d.client()
        completions = client.batches.create(input_file_id=upload(client, jsonl([
            {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": MODEL_ID, "prompt": f"Count: {i},", "max_tokens": 4, "temperature": 0}}
            for i in range(3)])), endpoint="/v1/completions", completion_window="24h")
        embeddings = client.batches.create(input_file_id=upload(client, jsonl([
            {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": MODEL_ID, "input": [f"text {i}", "another"]}} for i in range(2)])),
            endpoint="/v1/embeddings", completion_window="24h")
        responses = client.batches.create(input_file_id=upload(client, jsonl([
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
             "body": {"model": MODEL_ID, "instructions": SYSTEM, "input": f"Name {i} colours.", "max_output_tokens": 6,
                      "temperature": 0}}  # greedy: a sampled answer may be empty text, which the check below reads
            for i in range(2)] + [{"custom_id": "chained", "method": "POST", "url": "/v1/responses",
                                   "body": {"input": "go on", "previous_response_id": "resp_x"}}])),
            endpoint="/v1/responses", completion_window="24h")
        done = finished(d, completions.id)
        texts = lines_of(client, done.output_file_id)
        assert [t["custom_id"] for t in texts] == ["c0", "c1", "c2"]
        assert all(t["response"]["body"]["object"] == "text_completion" for t in texts)
        vectors = lines_of(client, finished(d, embeddings.id).output_file_id)
        assert [len(v["response"]["body"]["data"]) for v in vectors] == [2, 2]
        direct = client.embeddings.create(model=MODEL_ID, input=["text 0", "another"])
        assert len(vectors[0]["response"]["body"]["data"][0]["embedding"]) == len(direct.data[0].embedding)
        answered = finished(d, responses.id)
        bodies = [Response.model_validate(r["response"]["body"]) for r in lines_of(client, answered.output_file_id)]
        assert all(b.status in ("completed", "incomplete") and b.output_text for b in bodies) and len(bodies) == 2
        [chained] = lines_of(client, answered.error_file_id)
        assert chained["custom_id"] == "chained" and "previous_response_id" in chained["error"]["message"]
    finally:
        assert d.stop() == 0


def test_a_file_that_is_not_jsonl_fails_the_batch_with_a_clear_error(tmp_path: Path) -> None:
    d = start_daemon("--n-parallel", "2", "--data-dir", str(tmp_path))
    try:
        client = d.client()
        batch = client.batches.create(input_file_id=upload(client, b"a plain text file\nnot JSON at all\n"),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        assert d.wait_for_log(lambda line: line.get("event") == "job_failed" and line.get("batch_id") == batch.id, 60)
        failed = client.batches.retrieve(batch.id)
        assert failed.status == "failed" and failed.failed_at is not None and failed.errors is not None
        assert failed.errors.data is not None and failed.errors.data[0].code == "invalid_json_lines"
        assert "not JSONL" in (failed.errors.data[0].message or "")
        try:
            client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
            raise AssertionError("a batch of an unknown file was accepted")
        except openai.BadRequestError as e:
            assert "file-nope" in str(e)
    finally:
        assert d.stop() == 0


@pytest.mark.timeout(600)  # two daemons, two jobs
def test_after_kill_9_the_daemon_resumes_the_unfinished_job_and_a_cancelled_one_stays_cancelled(
        tmp_path: Path) -> None:
    d = start_daemon("--n-parallel", "2", "--data-dir", str(tmp_path))
    n = 16
    try:
        client = d.client()
        cancelled = client.batches.create(
            input_file_id=upload(client, jsonl([chat_line(f"a{i}", f"Tell me about {i}.", 24, ignore_eos=True)
                                                for i in range(40)])),
            endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(cancelled.id).request_counts.completed >= 1,  # type: ignore[union-attr]
                   "the first job's first line", timeout=120, poll_s=0.1)
        assert client.batches.cancel(cancelled.id).status in ("cancelling", "cancelled")
        assert finished(d, cancelled.id).status == "cancelled"
        resumed = client.batches.create(
            input_file_id=upload(client, jsonl([chat_line(f"b{i}", f"Name {i} animals.", 8)
                                                for i in range(n)])),
            endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(resumed.id).request_counts.completed >= 3,  # type: ignore[union-attr]
                   "three lines of the second job", timeout=120, poll_s=0.1)
    finally:
        d.process.send_signal(signal.SIGKILL)
        d.process.wait(30)

    d = start_daemon("--n-parallel", "2", "--data-dir", str(tmp_path))
    try:
        client = d.client()
        assert d.wait_for_log(lambda line: line.get("event") == "job_resumed" and line.get("batch_id") == resumed.id, 60)
        done = finished(d, resumed.id, timeout=400)  # one line at a time (3/4 of 2 sequences)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
        output = lines_of(client, done.output_file_id)
        assert Counter(o["custom_id"] for o in output) == Counter(f"b{i}" for i in range(n))  # each exactly once
        assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["choices"] for o in output)
        still = client.batches.retrieve(cancelled.id)
        assert still.status == "cancelled" and still.request_counts is not None
        assert not any(line.get("batch_id") == cancelled.id and line.get("event") == "job_resumed"
                       for line in d.log_lines)
        partial = lines_of(client, still.output_file_id)  # finished output stays downloadable
        assert len(partial) == still.request_counts.completed >= 1
    finally:
        assert d.stop() == 0

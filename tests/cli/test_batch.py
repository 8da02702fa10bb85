"""``llamactor batch`` and ``run_batch()`` on the real model: progress, bad lines, a request the model
refuses, Ctrl-C and rerun, and ``kill -9`` at random points, resumed each time, with every
``custom_id`` exactly once in the output."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import llamactor
from llamactor.jobs import LineCounts, run_batch
from llamactor.jobs.journal import JobStore

SYSTEM = "You are a terse assistant. Answer in a few words."
PROGRESS = re.compile(r"^batch: (\d+)/(\d+) done")


def chat_line(custom_id: str, question: str, max_tokens: int = 6) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "any", "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}}


def write_input(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def custom_ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines()]


def start_cli(inp: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "llamactor.cli", "batch", str(inp), "-o", str(out),
                             "--n-parallel", "4", "--n-ctx", "2048"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_progress(proc: subprocess.Popen[str], at_least: int) -> int:
    """Read the CLI's progress lines (stderr is not a terminal: one line per percent) until one
    shows ``at_least`` lines finished; returns that count."""
    assert proc.stderr is not None
    for raw in proc.stderr:
        if (m := PROGRESS.match(raw)) and int(m.group(1)) >= at_least:
            return int(m.group(1))
    raise AssertionError(f"the batch ended (status {proc.wait()}) before {at_least} lines were finished")


def finished_in_journal(journal: Path) -> int:
    store = JobStore(journal)  # the lock is free again: its holder was killed
    try:
        return store.counts("batch_local").finished
    finally:
        store.close()


@pytest.mark.timeout(900)  # five processes each load the model; a loaded machine makes that slow
def test_killed_with_sigkill_at_random_points_the_cli_resumes_and_writes_every_custom_id_once(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    n = 40
    inp = write_input(tmp_path / "in.jsonl", [chat_line(f"q{i}", f"What is {i} times two?") for i in range(n)])
    out, journal = tmp_path / "out.jsonl", tmp_path / "out.jsonl.journal"
    finished = 0
    # a kill at a random moment (loading, planning or running), then three at random progress points
    proc = start_cli(inp, out)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=rng.uniform(0.5, 4.0))
    proc.kill()
    proc.wait()
    # On a quiet machine the first process may finish most lines (all, even) before its kill:
    # the kills below land only at progress points still ahead.
    finished = finished_in_journal(journal) if journal.exists() else 0
    processes = 1
    for kill in range(3):
        if finished + 1 > n - 12 + kill:
            continue
        proc = start_cli(inp, out)
        processes += 1
        target = rng.randint(finished + 1, n - 12 + kill)
        shown = wait_for_progress(proc, target)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now = finished_in_journal(journal)
        assert now >= shown >= finished, f"seed {seed}: the journal lost finished lines"
        finished = now
        assert not out.exists(), f"seed {seed}: an output file before every line was done"
    proc = start_cli(inp, out)
    processes += 1
    assert proc.wait(timeout=300) == 0, f"seed {seed}"
    ids = custom_ids(out)
    assert ids == [f"q{i}" for i in range(n)], f"seed {seed}: not every custom_id exactly once, in input order"
    assert max(Counter(ids).values()) == 1
    store = JobStore(journal)
    try:
        # every process that reached the runner recorded its run (the first may have died loading)
        assert len(store.runs("batch_local")) >= processes - 1
    finally:
        store.close()


@pytest.mark.timeout(600)
def test_ctrl_c_stops_cleanly_and_the_same_command_resumes_where_it_stopped(tmp_path: Path) -> None:
    n = 24
    inp = write_input(tmp_path / "in.jsonl", [chat_line(f"q{i}", f"Name a colour, {i}.") for i in range(n)])
    out = tmp_path / "out.jsonl"
    proc = start_cli(inp, out)
    wait_for_progress(proc, 4)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert proc.stderr is not None and "run the same command again to resume" in proc.stderr.read()
    stopped_at = finished_in_journal(tmp_path / "out.jsonl.journal")
    assert 4 <= stopped_at < n and not out.exists()
    again = start_cli(inp, out)
    first = wait_for_progress(again, 0)  # the first line it shows counts what the first run finished
    assert again.wait(timeout=300) == 0
    assert first == stopped_at
    assert custom_ids(out) == [f"q{i}" for i in range(n)]


def test_run_batch_reports_progress_and_puts_bad_and_refused_lines_in_the_error_file(
        llm: llamactor.LLM, tmp_path: Path) -> None:
    too_long = {**chat_line("long", "word " * 6000), "custom_id": "long"}
    inp = write_input(tmp_path / "in.jsonl", [chat_line("a", "Say hi."), "not json", too_long,
                                               chat_line("b", "Say bye."), {**chat_line("a", "again")}])
    seen: list[LineCounts] = []
    result = run_batch(inp, tmp_path / "out.jsonl", llm=llm, on_progress=seen.append)
    assert result.finished and (result.total, result.completed, result.failed) == (5, 2, 3)
    assert [p.finished for p in seen] == sorted(p.finished for p in seen) and seen[-1].finished == 5
    assert custom_ids(result.output_path) == ["a", "b"]
    assert result.errors_path is not None
    errors = [json.loads(line) for line in result.errors_path.read_text().splitlines()]
    assert [e["custom_id"] for e in errors] == [None, "long", "a"]
    assert errors[0]["error"]["code"] == "invalid_json_line" and errors[2]["error"]["code"] == "duplicate_custom_id"
    refused = errors[1]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["code"] == "exceed_context_size_error"


def test_an_input_that_is_not_jsonl_or_a_journal_of_other_input_is_refused_clearly(
        llm: llamactor.LLM, tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("a plain text file\n")
    with pytest.raises(llamactor.InvalidRequestError, match="not JSONL"):
        run_batch(text, tmp_path / "out.jsonl", llm=llm)
    first = write_input(tmp_path / "one.jsonl", [chat_line("a", "Say hi.")])
    assert run_batch(first, tmp_path / "out.jsonl", llm=llm).completed == 1
    other = write_input(tmp_path / "two.jsonl", [chat_line("b", "Say bye.")])
    with pytest.raises(llamactor.InvalidRequestError, match="journal of another input"):
        run_batch(other, tmp_path / "out.jsonl", llm=llm)
    cli = subprocess.run([sys.executable, "-m", "llamactor.cli", "batch", str(text), "-o", str(tmp_path / "x.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "not JSONL" in cli.stderr

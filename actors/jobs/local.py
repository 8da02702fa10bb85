"""``run_batch()``: a batch job in this process, no daemon: what ``llamactor batch`` runs.

The input and output are OpenAI's batch file formats; the journal is a ``JobStore`` next to the
output (``OUTPUT.journal``), so running the same call again after a crash or Ctrl-C resumes
where it stopped: finished lines are never computed again, and the output file, written whole
(temporary name, then rename) once every line is finished, holds each ``custom_id`` once.
Runs on the caller's thread; the progress callback is called there too.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamactor.base.errors import InvalidRequestError
from llamactor.launch import start
from llamactor.handles.client import Client
from llamactor.handles.llm import LLM
from llamactor.jobs import records
from llamactor.jobs.endpoints import check_body
from llamactor.jobs.input_lines import ENDPOINTS, NotJsonlError, read_input_lines
from llamactor.jobs.runner import JobRunner, LineCounts
from llamactor.jobs.journal import JobStore

LOCAL_BATCH_ID = "batch_local"


@dataclass(frozen=True, slots=True)
class BatchResult:
    """How a ``run_batch`` call ended: ``finished`` False when ``stop`` ended it first (the journal
    keeps the rest for the next call)."""

    finished: bool
    total: int
    completed: int
    failed: int
    output_path: Path
    errors_path: Path | None  # None when no line failed
    journal_path: Path


def run_batch(input_path: str | os.PathLike[str], output_path: str | os.PathLike[str], *,
              llm: Client | None = None, errors_path: str | os.PathLike[str] | None = None,
              journal_path: str | os.PathLike[str] | None = None, endpoint: str | None = None,
              max_in_flight: int | None = None, on_progress: Callable[[LineCounts], None] | None = None,
              stop: threading.Event | None = None, **start_options: Any) -> BatchResult:
    """Run every line of ``input_path`` (OpenAI batch input JSONL) and write ``output_path`` (and
    ``errors_path``, default ``OUTPUT.errors.jsonl``, when some line failed).

    ``llm``: a started model (any ``Client``); without one, ``start(**start_options)`` loads one
    for the call. ``endpoint``: the lines' ``url`` (default: the first line's). ``max_in_flight``:
    lines in flight at once (default: the model's ``n_parallel``). ``on_progress(LineCounts)``
    after each finished line. ``stop``: set it (from a signal handler, another thread) to end
    the call early and cleanly; call again to resume. ``InvalidRequestError`` if the input is
    not JSONL, or the journal belongs to another input.
    """
    input_path, output_path = Path(input_path), Path(output_path)
    errors = Path(errors_path) if errors_path else output_path.with_name(output_path.name.removesuffix(".jsonl")
                                                                           + ".errors.jsonl")
    journal = Path(journal_path) if journal_path else output_path.with_name(output_path.name + ".journal")
    data = input_path.read_bytes()
    endpoint = endpoint or _first_url(data)
    store = JobStore(journal)  # StoreLockedError if another process runs this journal
    try:
        _prepare(store, data, endpoint, input_path)
        finished = not store.unfinished(LOCAL_BATCH_ID) or _run(store, endpoint, llm, max_in_flight, on_progress,
                                                                 stop, start_options)
        counts = store.counts(LOCAL_BATCH_ID)
        if finished:
            _write(output_path, store.results(LOCAL_BATCH_ID, "done"))
            if counts.failed:
                _write(errors, store.results(LOCAL_BATCH_ID, "failed"))
            else:
                errors.unlink(missing_ok=True)
        return BatchResult(finished, counts.total, counts.completed, counts.failed, output_path,
                           errors if finished and counts.failed else None, journal)
    finally:
        store.close()


def _run(store: JobStore, endpoint: str, llm: Client | None, max_in_flight: int | None,
         on_progress: Callable[[LineCounts], None] | None, stop: threading.Event | None,
         start_options: dict[str, Any]) -> bool:
    """Run the unfinished lines on ``llm`` (or a model started for them); True when all finished."""
    client: Client = start(**start_options) if llm is None else llm
    try:
        return JobRunner(store, LOCAL_BATCH_ID, endpoint, client, _model_name(client),
                         max_in_flight=max_in_flight or client.config.n_parallel, stop=stop,
                         on_progress=on_progress, tokens_computed=_tokens_computed(client)).run()
    finally:
        if llm is None:
            client.close()  # type: ignore[attr-defined]


def _first_url(data: bytes) -> str:
    for raw in data.splitlines():
        try:
            url = json.loads(raw).get("url")
        except (ValueError, AttributeError):
            continue
        if url in ENDPOINTS:
            return str(url)
    return ENDPOINTS[0]


def _prepare(store: JobStore, data: bytes, endpoint: str, input_path: Path) -> None:
    """Journal the input's lines, once: a journal made for other input is refused."""
    digest = hashlib.sha256(data).hexdigest()
    batch = store.batch(LOCAL_BATCH_ID)
    if batch is not None and (batch["input_sha256"] != digest or batch["endpoint"] != endpoint):
        raise InvalidRequestError(f"{store.db_path} is the journal of another input ({batch['input_path']}); "
                                  "delete it, or write the output elsewhere")
    if batch is not None and store.has_lines(LOCAL_BATCH_ID):
        return  # a resumed run
    try:
        lines = read_input_lines(data, endpoint, check_body)
    except NotJsonlError as e:
        raise InvalidRequestError(f"{input_path}: {e}") from None
    if batch is None:
        store.create_batch({"id": LOCAL_BATCH_ID, "object": "batch", "endpoint": endpoint, "status": "validating",
                            "created_at": int(time.time()), "input_sha256": digest, "input_path": str(input_path)})
    invalid = {ln.line_no: records.invalid_line(LOCAL_BATCH_ID, ln.line_no, ln.custom_id, *ln.error)
               for ln in lines if ln.error is not None}
    store.add_lines(LOCAL_BATCH_ID, lines, invalid)


def _write(path: Path, lines: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _model_name(client: Client) -> str:
    """The name a line's response gives its model, as the daemon's answers name it."""
    name = getattr(client, "name", None)  # a ModelClient's
    if isinstance(name, str):
        return name
    info = client.info if isinstance(client, LLM) else None
    return Path(info.model_path).name.removesuffix(".gguf") if info else "llamactor"


def _tokens_computed(client: Client) -> Callable[[], int] | None:
    """Tokens the engine has computed (prompt + generated), when the handle publishes them."""
    if not isinstance(client, LLM):
        return None

    def read() -> int:
        stats = client.published_stats()
        return int(stats.get("prompt_tokens_computed", 0)) + int(stats.get("tokens_generated", 0))
    return read

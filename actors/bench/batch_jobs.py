"""The *batch* workload of ``llamactor bench``: durable batch jobs (``llamactor.jobs``).

Three legs on one input, chat requests sharing a system prompt (400 of them; 100 in a quick run):

* throughput: the requests as a job (``run_batch``, its lines in flight ``n_parallel`` at a
  time) against the same requests sent by 16 threads through ``chat()``, each on a fresh tree;
* interactive TTFT: chat requests arriving at 1/s, alone and while a job runs beside them (the
  daemon's default: three quarters of the sequences in flight, at low priority);
* kill -9: ``llamactor batch`` killed twice (at a third and two thirds of the lines) and run
  again to the end: every ``custom_id`` exactly once, and the tokens the three processes
  computed (each run's count, journaled with its results and at least every 0.5 s) against the
  uninterrupted job of the first leg.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llamactor
from llamactor.bench.generation import SYSTEM_PROMPT
from llamactor.bench.measure import percentile
from llamactor.bench.prompts import ANIMALS
from llamactor.bench.settings import BenchSettings
from llamactor.jobs import run_batch
from llamactor.jobs.local import LOCAL_BATCH_ID
from llamactor.jobs.journal import JobStore

N_PARALLEL = 16
PROGRESS = re.compile(r"^batch: (\d+)/(\d+) done")


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Customer {i}: can I order a {ANIMALS[i % 16]}-shaped cake for day {i}?"}]


def _write_input(path: Path, n: int, max_tokens: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": _messages(i), "max_tokens": max_tokens, "temperature": 0}}) + "\n")


def _tokens_of_runs(journal: Path) -> list[int]:
    store = JobStore(journal)
    try:
        return [r["tokens_computed"] for r in store.runs(LOCAL_BATCH_ID)]
    finally:
        store.close()


def bench_batch(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n, mt = (100, s.max_tokens) if s.quick else (400, s.max_tokens)
    kw = {"n_parallel": N_PARALLEL, "n_threads": s.n_threads, "n_ctx": s.n_ctx}
    out: dict[str, Any] = {"requests": n, "max_tokens": mt, "n_parallel": N_PARALLEL}
    with tempfile.TemporaryDirectory(prefix="llamactor-bench-batch-") as tmp:
        folder = Path(tmp)
        inp = folder / "in.jsonl"
        _write_input(inp, n, mt)
        out["throughput"] = _throughput(s, inp, folder, n, mt, kw)
        tick()
        out["interactive"] = _interactive(s, inp, folder, kw)
        tick()
        out["kill"] = _kill_twice(s, inp, folder, n, out["throughput"]["job_tokens_computed"])
        tick()
    out["throughput_ratio"] = out["throughput"]["job_tok_s"] / out["throughput"]["threads_tok_s"]
    out["ttft_p50_ratio"] = out["interactive"]["with_job"]["ttft_p50_ms"] / out["interactive"]["alone"]["ttft_p50_ms"]
    out["exactly_once"] = 1.0 if out["kill"]["exactly_once"] else 0.0
    out["tokens_ratio"] = out["kill"]["tokens_ratio"]
    return out


def _throughput(s: BenchSettings, inp: Path, folder: Path, n: int, mt: int, kw: dict[str, Any]) -> dict[str, Any]:
    with llamactor.start(s.model_path, **kw) as llm:
        llm.ask("warm up", max_tokens=2)
        start = time.perf_counter()
        result = run_batch(inp, folder / "throughput.jsonl", llm=llm, max_in_flight=N_PARALLEL)
        job_s = time.perf_counter() - start
    job_tokens = sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"]
                     for line in (folder / "throughput.jsonl").read_text().splitlines())
    with llamactor.start(s.model_path, **kw) as llm:
        llm.ask("warm up", max_tokens=2)
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            done = list(pool.map(lambda i: llm.chat(_messages(i), max_tokens=mt, temperature=0), range(n)))
        threads_s = time.perf_counter() - start
    thread_tokens = sum(c.usage.completion_tokens for c in done)
    return {"job_s": job_s, "job_tok_s": job_tokens / job_s, "job_completed": result.completed,
            "threads_s": threads_s, "threads_tok_s": thread_tokens / threads_s,
            "job_tokens_computed": sum(_tokens_of_runs(folder / "throughput.jsonl.journal"))}


def _interactive(s: BenchSettings, inp: Path, folder: Path, kw: dict[str, Any]) -> dict[str, Any]:
    n_requests = 10 if s.quick else 20
    out: dict[str, Any] = {"requests": n_requests, "rate_per_s": 1.0, "job_max_in_flight": N_PARALLEL * 3 // 4}
    for leg in ("alone", "with_job"):
        with llamactor.start(s.model_path, **kw) as llm:
            llm.ask("warm up", max_tokens=2)
            stop = threading.Event()
            job = None
            if leg == "with_job":
                job = threading.Thread(target=run_batch, args=(inp, folder / f"{leg}.jsonl"), daemon=True,
                                       kwargs={"llm": llm, "max_in_flight": N_PARALLEL * 3 // 4, "stop": stop})
                job.start()
                time.sleep(2.0)  # the job fills its sequences before the first interactive request
            futures, due = [], time.perf_counter()
            for i in range(n_requests):
                time.sleep(max(0.0, due - time.perf_counter()))  # the arrival process itself
                due += 1.0
                futures.append(llm.submit_chat([{"role": "user", "content": f"Name a {ANIMALS[i % 16]} sound."}],
                                               max_tokens=16, temperature=0))
            ttfts = [f.result().timings.ttft_ms for f in futures]
            stop.set()
            if job is not None:
                job.join()
        out[leg] = {"ttft_p50_ms": percentile(ttfts, 50), "ttft_p99_ms": percentile(ttfts, 99)}
    return out


def _kill_twice(s: BenchSettings, inp: Path, folder: Path, n: int, uninterrupted_tokens: int) -> dict[str, Any]:
    out_path = folder / "killed.jsonl"
    cmd = [sys.executable, "-m", "llamactor.cli", "batch", str(inp), "-o", str(out_path), "--model", s.model_path,
           "--n-parallel", str(N_PARALLEL), "--n-threads", str(s.n_threads), "--n-ctx", str(s.n_ctx)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for fraction in (1 / 3, 2 / 3):
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        assert proc.stderr is not None
        for raw in proc.stderr:  # progress lines: one per percent
            if (m := PROGRESS.match(raw)) and int(m.group(1)) >= n * fraction:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    final = subprocess.run(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, timeout=3600)
    if final.returncode != 0:
        raise RuntimeError(f"the resumed batch failed: {final.stderr[-500:]}")
    ids = Counter(json.loads(line)["custom_id"] for line in out_path.read_text().splitlines())
    runs = _tokens_of_runs(folder / "killed.jsonl.journal")
    return {"kills": 2, "runs_tokens_computed": runs, "uninterrupted_tokens_computed": uninterrupted_tokens,
            "exactly_once": ids == Counter(f"req-{i}" for i in range(n)),
            "tokens_ratio": sum(runs) / max(uninterrupted_tokens, 1)}

"""The *speculation* workload of ``llamactor bench``: drafted tokens verified in the step, against the
same requests without drafts, in the same run, on both installed models (the bench's and
SmolLM2-135M-Instruct).

Three legs, each greedy, the two sides of a ratio interleaved on one tree (no prefix cache, so the
second side gets no cache hit from the first), best of the rounds kept (a busy host slows one
round, not one side):

- *edit*: a ~300-token code block re-emitted with one small change (the chat asks for the block
  with its default retries changed; a base model gets the same words as a plain prompt), the
  original block as the prediction (OpenAI's Predicted Outputs), at 1 to 16 streams. Greedy
  outputs must be the same token ids with and without; where they part, a lone decode of the
  common prefix tells whether the two best tokens nearly tie (``resilience.NEAR_TIE``: drafted
  rows are another batch shape, as a resumed stream's are).
- *copy*: a summary quoting its input (``speculation="ngram"``: prompt lookup), one stream.
- *uniform*: the uniform workload's prompts with n-gram drafts on vs off, at the run's
  concurrencies (up to 64 in a full run): drafts must not cost throughput where they do not pay.

A quick run measures the bench's model only, the edit at 1 and 2 streams. ``report_lines``
renders its section; a ratio below its goal prints the per-step profile of both
sides (docs/performance.md, *Speculation*).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import llamactor
from llamactor.base.models import instruct_model_path
from llamactor.bench.measure import step_ms_cell
from llamactor.bench.prompts import uniform_prompts
from llamactor.bench.resilience import NEAR_TIE, top2_margin
from llamactor.bench.settings import BenchSettings
from llamactor.bench.speculation_texts import COPY_INSTRUCTION, EDIT_INSTRUCTION, code_block, report_text
from llamactor.native.engine import Engine

EDIT_STREAMS, QUICK_EDIT_STREAMS = (1, 2, 4, 8, 16), (1, 2)
COPY_TOKENS = 160
# The goals, as report.TARGETS has them (read from ``summary``'s figures): the report prints the
# per-step profile of each row below its own.
GOALS = {"edit_c1": 2.0, "edit": 0.97, "copy": 1.2, "uniform": 0.97}

Request = dict[str, Any]  # "prompt" or "messages", and per-request sampling ("prediction")




def n_ticks(s: BenchSettings) -> int:
    return 3 * len(model_paths(s))  # per model: edit, copy, uniform


def model_paths(s: BenchSettings) -> dict[str, str]:
    """Both installed models; a quick run only the bench's."""
    return {"bench": s.model_path} if s.quick else {"bench": s.model_path, "instruct": instruct_model_path()}


def bench_speculation(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rounds(s), "models": {}}
    for role, path in model_paths(s).items():
        out["models"][role] = _model_legs(s, path, tick)
    out.update(summary(out["models"]))
    return out


def rounds(s: BenchSettings) -> int:
    return 1 if s.quick else 3 if s.full else 2


def _model_legs(s: BenchSettings, path: str, tick: Callable[[], None]) -> dict[str, Any]:
    edit_streams = QUICK_EDIT_STREAMS if s.quick else EDIT_STREAMS
    n_parallel = max(max(edit_streams), max(s.concurrencies))
    legs: dict[str, Any] = {"model": Path(path).name}
    with llamactor.start(path, n_parallel=n_parallel, n_ctx=max(s.n_ctx, 16384), n_threads=s.n_threads,
                         n_gpu_layers=s.n_gpu_layers, prefix_cache=False) as llm:
        llm.ask("warm up", max_tokens=2)
        base = llm.info.looks_like_base_model
        legs["edit"] = {str(c): _edit_leg(s, llm, path, c, base) for c in edit_streams}
        tick()
        legs["copy"] = _copy_leg(s, llm, path, base)
        tick()
        legs["uniform"] = {str(c): _uniform_leg(s, llm, c) for c in s.concurrencies}
        tick()
    return legs


def edit_requests(n: int, base: bool) -> tuple[list[Request], list[str]]:
    """``n`` edit requests (distinct blocks) and each one's prediction: its original block."""
    blocks = [code_block(i) for i in range(n)]
    fenced = [f"{EDIT_INSTRUCTION}\n\n```python\n{block}```" for block in blocks]
    if base:  # the answer's fence opened in the prompt: the code follows at once, the fence ends it
        return [{"prompt": f"{text}\n\nAnswer:\n```python\n", "stop": ["```"]} for text in fenced], blocks
    return [{"messages": [{"role": "user", "content": text}]} for text in fenced], blocks


def copy_request(base: bool) -> Request:
    text = f"{COPY_INSTRUCTION}\n\n{report_text(0)}"
    return {"prompt": f"{text}\n\nSummary:\n"} if base else {"messages": [{"role": "user", "content": text}]}


def _edit_leg(s: BenchSettings, llm: llamactor.LLM, path: str, c: int, base: bool) -> dict[str, Any]:
    requests, blocks = edit_requests(c, base)
    max_tokens = max(len(llm.tokenize(b, add_special=False).token_ids) for b in blocks) + 32
    with_prediction = [{**r, "prediction": b} for r, b in zip(requests, blocks)]
    row = _compare(s, llm, requests, with_prediction, max_tokens=max_tokens)
    row.update(_agreement(s, llm, path, requests, row.pop("ids")))
    return row


def _copy_leg(s: BenchSettings, llm: llamactor.LLM, path: str, base: bool) -> dict[str, Any]:
    request = copy_request(base)
    row = _compare(s, llm, [request], [{**request, "speculation": "ngram"}], max_tokens=COPY_TOKENS)
    row.update(_agreement(s, llm, path, [request], row.pop("ids")))
    return row


def _uniform_leg(s: BenchSettings, llm: llamactor.LLM, c: int) -> dict[str, Any]:
    requests = [{"prompt": p, "ignore_eos": True} for p in uniform_prompts(c)]
    row = _compare(s, llm, requests, [{**r, "speculation": "ngram"} for r in requests], max_tokens=s.max_tokens)
    row.pop("ids")
    return row


def _compare(s: BenchSettings, llm: llamactor.LLM, off: list[Request], on: list[Request],
             **sampling: Any) -> dict[str, Any]:
    """Both sides' rounds interleaved, the best of each kept, and their ratio on / off; ``ids``:
    each request's token ids per side (the first round's)."""
    best: dict[str, dict[str, Any]] = {}
    ids: dict[str, list[tuple[int, ...]]] = {}
    for _ in range(rounds(s)):
        for side, requests in (("off", off), ("on", on)):
            burst = _burst(llm, requests, **sampling)
            ids.setdefault(side, burst.pop("ids"))
            if side not in best or burst["tokens_per_s"] > best[side]["tokens_per_s"]:
                best[side] = burst
    return {"streams": len(off), **best, "ratio": best["on"]["tokens_per_s"] / best["off"]["tokens_per_s"],
            "decode_ratio": best["on"]["decode_tokens_per_s"] / (best["off"]["decode_tokens_per_s"] or float("nan")),
            "ids": (ids["off"], ids["on"])}


def _burst(llm: llamactor.LLM, requests: list[Request], **sampling: Any) -> dict[str, Any]:
    """Every request at once, greedy: tokens/s over the burst's wall time, the drafts the
    completions report, and the per-step profile from the batcher's counters."""
    before = llm.stats()
    start = time.perf_counter()
    futures = [_submit(llm, r, sampling) for r in requests]
    done = [f.result() for f in futures]
    wall = time.perf_counter() - start
    return {"tokens_per_s": sum(c.usage.completion_tokens for c in done) / wall,
            # after each request's first token (its prompt's prefill is the same work on both sides)
            "decode_tokens_per_s": sum(c.timings.decode_tokens_per_s for c in done) / len(done),
            "tokens": sum(c.usage.completion_tokens for c in done),
            "accepted": sum(c.usage.accepted_prediction_tokens for c in done),
            "rejected": sum(c.usage.rejected_prediction_tokens for c in done),
            **step_profile(before, llm.stats()), "ids": [c.token_ids for c in done]}


def _submit(llm: llamactor.LLM, request: Request, sampling: dict[str, Any]) -> Future[llamactor.Completion]:
    options = {k: v for k, v in request.items() if k not in ("prompt", "messages")}
    options = {"temperature": 0.0, **sampling, **options}
    if "messages" in request:
        return llm.submit_chat(request["messages"], **options)
    return llm.submit(request["prompt"], **options)


def step_profile(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Steps taken and the average step's profile (ms per part) between two ``stats()``."""
    steps = max(after["steps"] - before["steps"], 1)
    return {"steps": after["steps"] - before["steps"],
            "step_ms": {k: round((after["step_ms"][k] - before["step_ms"].get(k, 0.0)) / steps, 3)
                        for k in after["step_ms"]}}


def _agreement(s: BenchSettings, llm: llamactor.LLM, path: str, requests: list[Request],
               ids: tuple[list[tuple[int, ...]], list[tuple[int, ...]]]) -> dict[str, int]:
    """How many requests' token ids are the same with and without drafts, and of those that part,
    how many at a near-tie of a lone decode."""
    out = {"identical": 0, "near_tie": 0, "unexplained": 0}
    parted = [(r, a, b) for r, a, b in zip(requests, *ids) if a != b]
    out["identical"] = len(requests) - len(parted)
    if not parted:
        return out
    engine = Engine(path, n_ctx=4096, n_batch=512, n_ubatch=512, n_seq_max=1,
                    n_threads=s.n_threads)
    try:
        for request, a, b in parted:
            prompt = list(llm.tokenize(request.get("messages") or request["prompt"]).token_ids)
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            margin = top2_margin(engine, prompt + list(a[:first]))
            out["near_tie" if margin < NEAR_TIE else "unexplained"] += 1
    finally:
        engine.close()
    return out


def summary(models: dict[str, dict[str, Any]]) -> dict[str, float | int]:
    """The goals' figures over both models: the lowest ratio of each leg, parted outputs."""
    legs = list(models.values())
    edits = [row for m in legs for row in m["edit"].values()]
    return {"edit_c1_ratio": min(m["edit"]["1"]["ratio"] for m in legs),
            "edit_min_ratio": min(row["ratio"] for row in edits),
            "copy_ratio": min(m["copy"]["ratio"] for m in legs),
            "uniform_min_ratio": min(row["ratio"] for m in legs for row in m["uniform"].values()),
            "parted": sum(row["near_tie"] + row["unexplained"] for row in edits + [m["copy"] for m in legs]),
            "unexplained": sum(row["unexplained"] for row in edits + [m["copy"] for m in legs])}


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: each leg's tok/s without and with drafts, their ratio, the drafts
    accepted, the outputs identical; the per-step profile of a row below its goal."""
    r = results.get("speculation")
    if not isinstance(r, dict) or "models" not in r:
        return []
    lines = [f"Speculation ({r['rounds']} rounds, best kept): tok/s without and with drafts, greedy; edit: "
             "a prediction of a ~300-token code block; copy: n-gram drafts on a summary quoting its input; uniform: "
             "n-gram drafts on the uniform prompts. *decode on / off*: the same after each request's first token "
             "(a stream's mean), without the prompt's prefill, which both sides pay alike.", "",
             "| model | leg | streams | off tok/s | on tok/s | on / off | decode on / off | drafts accepted / rejected | same ids |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    missed = []
    for m in r["models"].values():
        for leg, rows in (("edit", m["edit"]), ("copy", {"1": m["copy"]}), ("uniform", m["uniform"])):
            for c, row in rows.items():
                same = f"{row['identical']}/{row['streams']}" if "identical" in row else "-"
                lines.append(f"| {m['model']} | {leg} | {c} | {row['off']['tokens_per_s']:.1f} | "
                             f"{row['on']['tokens_per_s']:.1f} | {row['ratio']:.2f} | {row.get('decode_ratio', float('nan')):.2f} | "
                             f"{row['on']['accepted']} / {row['on']['rejected']} | {same} |")
                if row["ratio"] < goal(leg, c):
                    missed.append(f"- {m['model']} {leg} at {c}: {row['ratio']:.2f}× (goal {goal(leg, c):g}×); "
                                  f"step ms decode / sample / other, off: {step_ms_cell(row['off']['step_ms'])} "
                                  f"({row['off']['steps']} steps), on: {step_ms_cell(row['on']['step_ms'])} "
                                  f"({row['on']['steps']} steps)")
    return lines + [""] + (["Below goal, per-step profile:", *missed, ""] if missed else [])


def goal(leg: str, streams: str) -> float:
    if leg == "edit":
        return GOALS["edit_c1"] if streams == "1" else GOALS["edit"]
    return GOALS[leg]

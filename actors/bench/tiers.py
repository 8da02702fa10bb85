"""The cache tiers' legs of ``llamactor bench``.

*many_users*: 64 users × 4 turns on 8 sequences and 8192 cells, the history re-sent every turn
(the cells hold about a third of the conversations, so most histories are evicted between two
turns): the host-RAM tier on vs off, in the same run. *warm_restart*: 8 users' first turns on a
daemon with ``--cache-dir``, the daemon stopped with SIGTERM and started again on the same
directory, then every user's next turn at once (streamed, TTFT to the first piece) against the
same turns on a cold daemon. *one_off*: short requests that never come back (distinct ~30-token
prompts, 8 new tokens, 8 callers on 8 sequences and 10 seq_ids: every admission evicts a cached entry), the
host-RAM tier on vs off, interleaved repeats: the tier's cost model must keep saving them from
costing throughput (docs/performance.md, *Tiering that pays for itself*). ``report_lines``
renders them in the report.
"""

from __future__ import annotations

import concurrent.futures
import tempfile
import time
from collections.abc import Callable
from typing import Any

import openai

import llamactor
from llamactor.bench.conversations import QUESTIONS, persona
from llamactor.bench.measure import median_ratio, percentile
from llamactor.bench.prefix import multiturn_run
from llamactor.bench.servers import running_server, serve_command
from llamactor.bench.settings import BenchSettings

MODEL_NAME = "bench"
ONE_OFF_TARGET = 0.97  # tok/s with the tier on / off (the report's goal)


def bench_many_users(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n_users, n_turns, n_parallel, n_ctx = (16, 3, 4, 2048) if s.quick else (64, 4, 8, 8192)
    row: dict[str, Any] = {"users": n_users, "turns": n_turns, "n_parallel": n_parallel, "n_ctx": n_ctx}
    for ram in (True, False):
        with llamactor.start(s.model_path, n_parallel=n_parallel, n_ctx=n_ctx, n_threads=s.n_threads,
                             cache_ram_mib=1024 if ram else 0) as llm:
            llm.ask("warm up", max_tokens=2)
            run = multiturn_run(llm, n_users, n_turns, 32)
            if ram:
                run["tier"] = llm.stats()["cache_ram"]
            row["ram_on" if ram else "ram_off"] = run
        tick()
    row["ttft_later_p50_ratio"] = row["ram_on"]["ttft_later_p50_ms"] / row["ram_off"]["ttft_later_p50_ms"]
    row["wall_ratio"] = row["ram_on"]["wall_s"] / row["ram_off"]["wall_s"]
    return row


def _one_off_prompts(n: int, first: int) -> list[str]:
    """Prompts that share no more than their opening with one another."""
    return [f"Note {i}: " + " ".join(f"item{i * 31 + k}" for k in range(12)) for i in range(first, first + n)]


def _one_off_leg(s: BenchSettings, ram: bool, n_requests: int, first: int) -> dict[str, Any]:
    # 10 seq_ids for 8 sequences (the fewest allowed): every admission evicts a cached entry
    with llamactor.start(s.model_path, n_parallel=8, n_seq_ids=10, n_ctx=2048, n_threads=s.n_threads,
                         cache_ram_mib=1024 if ram else 0) as llm:
        llm.ask("warm up", max_tokens=2)
        before = llm.stats()
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda p: llm.ask(p, max_tokens=8, temperature=0, ignore_eos=True),
                                    _one_off_prompts(n_requests, first)))
        wall = time.perf_counter() - start
        after = llm.stats()
    steps = max(after["steps"] - before["steps"], 1)
    leg = {"wall_s": wall, "tok_s": sum(a.usage.completion_tokens for a in answers) / wall,
           "step_ms": {k: round((after["step_ms"][k] - before["step_ms"][k]) / steps, 3) for k in after["step_ms"]}}
    if ram:
        leg["tier"] = after["cache_ram"]
    return leg


def bench_one_off(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    """Tier on and off, alternated ``repeats`` times (the medians' ratio)."""
    n_requests, repeats = (32, 2) if s.quick else (64, 3)
    legs: dict[str, list[dict[str, Any]]] = {"ram_on": [], "ram_off": []}
    for r in range(repeats):
        for ram in (True, False):
            legs["ram_on" if ram else "ram_off"].append(_one_off_leg(s, ram, n_requests, r * n_requests))
        tick()
    out: dict[str, Any] = {"requests": n_requests, "repeats": repeats, **legs}
    out["tok_s_ratio"] = median_ratio([leg["tok_s"] for leg in legs["ram_on"]], [leg["tok_s"] for leg in legs["ram_off"]])
    return out


def _first_turn(user: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": persona(user)}, {"role": "user", "content": QUESTIONS[user % len(QUESTIONS)]}]


def _ttft_ms(client: openai.OpenAI, messages: Any) -> float:
    start = time.perf_counter()
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0,
                                            stream=True)
    ttft = None
    for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = (time.perf_counter() - start) * 1000
    return ttft if ttft is not None else (time.perf_counter() - start) * 1000


def _next_turns(url: str, conversations: list[list[dict[str, str]]]) -> list[float]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(len(conversations)) as pool:
        return list(pool.map(lambda m: _ttft_ms(client, m), conversations))


def bench_warm_restart(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n_users = 4 if s.quick else 8
    options = ("--n-parallel", "8", "--n-ctx", "8192", "--n-threads", str(s.n_threads))
    out: dict[str, Any] = {"users": n_users}
    with tempfile.TemporaryDirectory() as cache_dir:
        warm_command = serve_command(s.model_path, MODEL_NAME, *options, "--cache-dir", cache_dir)
        with running_server(warm_command) as (url, _):  # left with SIGTERM: the cache is written
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0)
            conversations = []
            for user in range(n_users):
                messages: Any = _first_turn(user)
                answer = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=32,
                                                        temperature=0)
                conversations.append(messages + [{"role": "assistant", "content": answer.choices[0].message.content or ""},
                                                 {"role": "user", "content": QUESTIONS[(user + 1) % len(QUESTIONS)]}])
        tick()
        with running_server(warm_command) as (url, _):
            warm = _next_turns(url, conversations)
        tick()
    with running_server(serve_command(s.model_path, MODEL_NAME, *options)) as (url, _):
        cold = _next_turns(url, conversations)
    tick()
    out.update(warm_ttft_p50_ms=percentile(warm, 50), cold_ttft_p50_ms=percentile(cold, 50),
               warm_ttft_p90_ms=percentile(warm, 90), cold_ttft_p90_ms=percentile(cold, 90))
    out["ttft_p50_ratio"] = out["warm_ttft_p50_ms"] / out["cold_ttft_p50_ms"]
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's section: one line for many_users, one for warm_restart."""
    lines = []
    if mu := results.get("many_users"):
        on, off = mu["ram_on"], mu["ram_off"]
        lines += [f"Many users: {mu['users']} users × {mu['turns']} turns on {mu['n_parallel']} sequences, n_ctx "
                  f"{mu['n_ctx']}, history re-sent: history tokens from cache {on['history_from_cache']:.1%} with the "
                  f"host-RAM tier vs {off['history_from_cache']:.1%} without; later-turn TTFT p50 "
                  f"{on['ttft_later_p50_ms']:.0f} vs {off['ttft_later_p50_ms']:.0f} ms ({mu['ttft_later_p50_ratio']:.2f}×), "
                  f"wall {on['wall_s']:.1f} vs {off['wall_s']:.1f} s; {on['tier']['restored']} restores of "
                  f"{on['tier']['restored_tokens']} tokens ({on['tier']['restore_ms']:.0f} ms), {on['tier']['saved']} "
                  f"saves ({on['tier']['save_ms']:.0f} ms).", ""]
    if oo := results.get("one_off"):
        on, off = oo["ram_on"][-1], oo["ram_off"][-1]
        lines += [f"One-off requests: {oo['requests']} short prompts × 8 new tokens from 8 callers, {oo['repeats']} "
                  f"repeat(s): host-RAM tier on / off {oo['tok_s_ratio']:.3f}× tok/s ({on['tok_s']:.1f} vs "
                  f"{off['tok_s']:.1f} in the last repeat); evicted entries {on['tier']['saved']} saved "
                  f"({on['tier']['save_ms']:.0f} ms), cost model {on['tier'].get('save_cost', {})}.", ""]
        if oo["tok_s_ratio"] < ONE_OFF_TARGET:  # where the steps' time went, tier on vs off
            lines += [f"Per-step ms, tier on: {on['step_ms']}; off: {off['step_ms']}.", ""]
    if wr := results.get("warm_restart"):
        lines += [f"Warm restart: {wr['users']} users' next turn at once after the daemon was stopped (SIGTERM) and "
                  f"started on its --cache-dir: TTFT p50 {wr['warm_ttft_p50_ms']:.0f} ms vs {wr['cold_ttft_p50_ms']:.0f} "
                  f"ms on a cold daemon ({wr['ttft_p50_ratio']:.2f}×), p90 {wr['warm_ttft_p90_ms']:.0f} vs "
                  f"{wr['cold_ttft_p90_ms']:.0f} ms.", ""]
    return lines

"""The peer leg of ``llamactor bench``: multi-turn chat over HTTP, ``llamactor serve`` vs ``llama-server``.

Runs only when the path of a ``llama-server`` binary is given (``--peer-server`` or
``$LLAMACTOR_PEER_SERVER``; ``../shared/tools/build-llama-server.sh`` builds one from the llama.cpp
that our llama-cpp-python vendors). Both servers get the same model, threads, parallel sequences
and KV cells, one after the other; each user re-sends its whole plain-transcript history to
``/v1/completions`` every turn (llama-server keeps each slot's last prompt in KV: ``cache_prompt``).
``report_lines`` renders its line in the report.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import openai

from llamactor.bench.conversations import QUESTIONS, persona
from llamactor.bench.measure import percentile
from llamactor.bench.servers import running_server, serve_command
from llamactor.bench.settings import BenchSettings

N_USERS, N_TURNS, N_PARALLEL, MAX_TOKENS = 8, 6, 8, 32


def _conversation(client: openai.OpenAI, user: int, n_turns: int) -> list[tuple[int, float]]:
    """(turn, TTFT ms) of each turn of user ``user``'s conversation."""
    history, out = persona(user) + "\n", []
    for t in range(n_turns):
        history += f"User: {QUESTIONS[(user + t) % len(QUESTIONS)]}\nAssistant:"
        start, first, text = time.perf_counter(), None, ""
        for chunk in client.completions.create(model="peer", prompt=history, max_tokens=MAX_TOKENS, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].text:
                first = first or time.perf_counter()
                text += chunk.choices[0].text
        out.append((t, ((first or time.perf_counter()) - start) * 1000))
        history += text + "\n"
    return out


def multiturn_http(client: openai.OpenAI, n_users: int, n_turns: int) -> dict[str, float]:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n_users) as pool:
        turns = [t for conv in pool.map(lambda u: _conversation(client, u, n_turns), range(n_users)) for t in conv]
    later = [ms for t, ms in turns if t > 0]
    return {"wall_s": time.perf_counter() - start, "ttft_turn1_p50_ms": percentile([ms for t, ms in turns if t == 0], 50),
            "ttft_later_p50_ms": percentile(later, 50), "ttft_later_p90_ms": percentile(later, 90)}


def bench_peer(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n_users, n_turns = (4, 3) if s.quick else (N_USERS, N_TURNS)
    ours = serve_command(s.model_path, "peer", "--n-parallel", str(N_PARALLEL), "--n-ctx", str(s.n_ctx),
                         "--n-threads", str(s.n_threads))
    theirs = [s.peer_server or "", "-m", s.model_path, "-np", str(N_PARALLEL), "-c", str(s.n_ctx), "-t", str(s.n_threads),
              "-tb", str(s.n_threads), "-kvu", "--host", "127.0.0.1"]
    out: dict[str, Any] = {"users": n_users, "turns": n_turns, "n_parallel": N_PARALLEL}
    for name, command in (("llama_server", lambda port: [*theirs, "--port", str(port)]),
                          ("llamactor", ours)):
        with running_server(command) as (url, _pid):
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600)
            client.completions.create(model="peer", prompt="warm up", max_tokens=2)
            out[name] = multiturn_http(client, n_users, n_turns)
        tick()
    out["wall_ratio"] = out["llamactor"]["wall_s"] / out["llama_server"]["wall_s"]
    out["ttft_later_p50_ratio"] = out["llamactor"]["ttft_later_p50_ms"] / out["llama_server"]["ttft_later_p50_ms"]
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's line: wall time and later-turn TTFT, llamactor vs llama-server."""
    if not (p := results.get("peer")):
        return []
    ours, theirs = p["llamactor"], p["llama_server"]
    return [f"Against llama.cpp's llama-server (same engine, {p['n_parallel']} parallel, unified KV): {p['users']} users "
            f"× {p['turns']} turns over `/v1/completions`, plain transcripts, history re-sent, 32 tokens a turn. "
            f"Wall {ours['wall_s']:.1f} s llamactor vs {theirs['wall_s']:.1f} s llama-server ({p['wall_ratio']:.2f}×); "
            f"later-turn TTFT p50 {ours['ttft_later_p50_ms']:.0f} vs {theirs['ttft_later_p50_ms']:.0f} ms "
            f"({p['ttft_later_p50_ratio']:.2f}×), p90 {ours['ttft_later_p90_ms']:.0f} vs "
            f"{theirs['ttft_later_p90_ms']:.0f} ms.", ""]

"""The frame of the benchmark's report: the header, the workloads' sections in order, the goals
table, and the files (JSON, markdown, plot; optionally docs/performance.md's generated section).

Each workload module renders its own section (its ``report_lines(results)``: nothing when its
workloads did not run); this module orders them and owns the goals (``TARGETS``), each a ratio
or count the workloads measured in the same run.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llamactor.bench import (
    daemon,
    embeddings,
    generation,
    kept_cells,
    host,
    host_cap_report,
    peer,
    prefix,
    replicas,
    rerank,
    scheduling,
    speculation,
    sim_device,
    streams,
    structured,
    tiers,
    two_models,
)

Section = Callable[[dict[str, Any]], list[str]]

# The report's order; workloads with only goals (sampled, batch, the memory legs...) have no section.
SECTIONS: tuple[Section, ...] = (
    generation.report_lines, daemon.report_lines, prefix.report_lines, tiers.report_lines, kept_cells.report_lines,
    peer.report_lines, scheduling.report_lines, structured.report_lines, embeddings.report_lines, rerank.report_lines,
    replicas.report_lines, host.report_lines, host_cap_report.report_lines, sim_device.report_lines,
    streams.report_lines, two_models.report_lines, speculation.report_lines)

# (name, how to read it from the results, comparison, target)
TARGETS: list[tuple[str, str, str, float]] = [
    ("uniform c=16: llamactor / ceiling", "uniform[16].vs_ceiling", ">=", 0.93),
    ("uniform c=16: llamactor / sequential", "uniform[16].vs_sequential", ">=", 2.8),
    ("uniform c=8: llamactor / ceiling", "uniform[8].vs_ceiling", ">=", 0.93),
    # --full runs only: the raw batched decode at 64 sequences, measured in the same run
    ("uniform c=64: llamactor / ceiling", "uniform[64].vs_ceiling", ">=", 0.95),
    ("host c=64, greedy: host ms per step (schedule + postprocess)", "host.real.c64.greedy.host_ms", "<=", 2.0),
    ("host c=64, default sampler chain: host ms per step", "host.real.c64.default.host_ms", "<=", 2.0),
    # the decode replayed at no cost: what the host side carries (in-process, and over HTTP against it)
    ("host cap c=126: in-process tok/s", "host_cap.c126.submit.tokens_per_s", ">=", 25_000.0),
    ("host cap c=64: HTTP non-streamed / in-process", "host_cap.c64.http.vs_in_process", ">=", 0.9),
    ("host cap c=64: HTTP SSE / in-process", "host_cap.c64.sse.vs_in_process", ">=", 0.9),
    ("host cap c=126: HTTP non-streamed / in-process", "host_cap.c126.http.vs_in_process", ">=", 0.9),
    ("host cap c=126: HTTP SSE / in-process", "host_cap.c126.sse.vs_in_process", ">=", 0.9),
    ("host cap c=64: front-end process, non-streamed / in-process", "host_cap.c64.http_fp.vs_in_process", ">=", 0.9),
    ("host cap c=64: front-end process, SSE / in-process", "host_cap.c64.sse_fp.vs_in_process", ">=", 0.9),
    ("host cap c=126: front-end process, non-streamed / in-process", "host_cap.c126.http_fp.vs_in_process", ">=", 0.9),
    ("host cap c=126: front-end process, SSE / in-process", "host_cap.c126.sse_fp.vs_in_process", ">=", 0.9),
    ("sim_device: device busy share with overlapped steps, lowest over 16/64/126 streams",
     "sim_device.min_busy_overlapped", ">=", 0.95),
    ("sim_device over HTTP (SSE): device busy share with overlapped steps, lowest over 16/64/126 streams",
     "sim_device.min_busy_overlapped_sse", ">=", 0.95),
    ("streams: tok/s, llamactor / llama-server -bs, lowest over N and samplers", "streams.min_ratio_vs_bs",
     ">=", 1.0),
    ("single: TTFT - sequential TTFT (ms)", "single.ttft_delta_ms", "<=", 25.0),
    ("single: tok/s / sequential tok/s", "single.tok_s_ratio", ">=", 0.97),
    ("sampled c=16: tok/s, default filters / greedy", "sampled.sampled_ratio", ">=", 0.95),
    ("sampled c=16: tok/s, with 5 alternatives' logprobs / greedy", "sampled.logprobs_ratio", ">=", 0.9),
    ("shared prompt c=16: TTFT p50 shared / inlined", "shared_prefix.ttft_p50_ratio", "<=", 0.5),
    ("shared prompt c=16: throughput shared / inlined", "shared_prefix.throughput_ratio", ">=", 1.5),
    ("idle: CPU % of the started tree", "single.idle_cpu_percent", "<", 1.0),
    ("idle: CPU % of the daemon", "daemon_idle.cpu_percent", "<", 1.0),
    # multiturn rows: 8 users x 6 turns, then 32 users on 8 sequences (quick runs: 4 x 3 on 4 only)
    ("multiturn 8×6: later-turn TTFT p50, cache / no cache", "multiturn[0].ttft_later_p50_ratio", "<=", 0.35),
    ("multiturn 8×6: wall time, cache / no cache", "multiturn[0].wall_ratio", "<=", 0.6),
    ("multiturn 8×6: prompt tokens computed / new tokens", "multiturn[0].computed_vs_new", "<=", 1.5),
    ("multiturn 32 users on 8: history tokens from cache", "multiturn[1].cache_on.history_from_cache", ">=", 0.8),
    ("multiturn over HTTP: wall time, llamactor / llama-server", "peer.wall_ratio", "<=", 1.0),
    ("priorities: high-priority TTFT p99, priority / fcfs", "priorities.high_ttft_p99_ratio", "<=", 0.3),
    ("priorities: throughput, priority / fcfs", "priorities.throughput_ratio", ">=", 0.97),
    ("overcommit: failed requests", "overcommit.tight.failed", "<=", 0),
    ("structured c=16: throughput, JSON Schema / unconstrained", "structured.throughput_ratio", ">=", 0.90),
    ("structured c=16: constrained outputs valid", "structured.valid_fraction", ">=", 1.0),
    ("embeddings: inputs/s, 16 callers packed / one at a time (Llama.embed)", "embeddings.throughput_ratio", ">=", 4.0),
    ("embeddings: generation tok/s under embedding load / alone", "embeddings.generation_ratio", ">=", 0.8),
    ("scoring: lm-eval requests/s, 8 callers / Llama(logits_all=True) one at a time", "scoring.throughput_ratio",
     ">=", 3.0),
    ("scoring: peak RSS while scoring / while generating", "scoring.memory_ratio", "<=", 1.3),
    ("scoring: generation tok/s beside a scoring load / alone", "scoring.generation_ratio", ">=", 0.8),
    ("rerank: documents/s, one request / Llama(logits_all=True) one judging prompt at a time", "rerank.throughput_ratio",
     ">=", 4.0),
    ("rerank: one request's seconds, prefix sharing off / on", "rerank.prefix_sharing_speedup", ">", 1.0),
    ("rerank: chat tok/s beside 8 rerank callers / 8 chat streams alone", "rerank.chat_ratio", ">=", 0.8),
    ("rerank quality: top-1 on the labelled set, lower of both models", "rerank.quality_top1_min", ">=", 0.5),
    ("rerank quality: max |score - llama-cpp-python's P(yes) / (P(yes) + P(no))|, both models, the same kernels "
     "(batch-invariant mode's)", "rerank.quality_exact_max_score_diff", "<=", 1e-3),
    ("many users 64×4 on 8: history tokens from cache, RAM tier", "many_users.ram_on.history_from_cache", ">=", 0.95),
    ("many users 64×4 on 8: later-turn TTFT p50, RAM tier / none", "many_users.ttft_later_p50_ratio", "<=", 0.3),
    ("warm restart: next-turn TTFT p50, restarted on --cache-dir / cold", "warm_restart.ttft_p50_ratio", "<=", 0.25),
    ("one-off requests: tok/s, RAM tier on / off", "one_off.tok_s_ratio", ">=", 0.97),
    # a cache full of idle one-off prefixes: the rent on / off (docs/performance.md, "Kept cells pay rent")
    ("kept cells: SmolLM2's lone stream tok/s after a burst of one-off prompts, rent on / off",
     "kept_cells.instruct.lone_ratio", ">=", 1.2),
    ("kept cells: lone stream tok/s after the burst, rent on / off, lower of both models", "kept_cells.min_lone_ratio",
     ">=", 1.0),
    ("kept cells: 8 streams' tok/s after the burst, rent on / off, lower of both models",
     "kept_cells.min_streams_ratio", ">=", 0.97),
    ("kept cells: the burst's prompts/s over all legs' time, rent on / off, lower of both models", "kept_cells.min_burst_ratio",
     ">=", 0.97),
    # no absolute target on 2 cores (the replicas share them); affinity must beat the shortest queue on cache
    ("replicas multiturn: history from cache, prefix_affinity - shortest_queue", "replicas.multiturn.hit_rate_gain",
     ">", 0.0),
    ("batch: throughput, job / 16 threads through chat()", "batch.throughput_ratio", ">=", 0.95),
    ("batch: interactive TTFT p50 at 1/s, with a job / without", "batch.ttft_p50_ratio", "<=", 1.5),
    ("batch: killed twice and resumed, every custom_id exactly once", "batch.exactly_once", ">=", 1.0),
    ("batch: killed twice and resumed, tokens computed / uninterrupted", "batch.tokens_ratio", "<=", 1.1),
    ("crash under streams: 16 streams, 3 batcher crashes: streams broken", "crash_streams.broken", "<=", 0),
    ("crash under streams: texts parting from an uninterrupted run beyond a near-tie", "crash_streams.unexplained",
     "<=", 0),
    ("crash under streams: streams whose pieces differ from their text", "crash_streams.pieces_mismatch", "<=", 0),
    ("kv q8_0: KV bytes per token, q8_0 / f16", "kv_q8.kv_bytes_ratio", "<=", 0.55),
    ("kv q8_0: tok/s at 16 streams, q8_0 / f16", "kv_q8.tok_s_ratio", ">=", 0.9),
    ("memory: daemon RSS after one request (16 seqs, 8k), llamactor / llama-server", "memory.rss_ratio", "<=", 1.2),
    ("tenants: quiet tenant's latency beside a 48-request flood on 8 / alone", "tenants.quiet_latency_ratio",
     "<=", 2.5),
    ("tenants: throughput, two backlogged tenants / one", "tenants.two_tenant_throughput_ratio", ">=", 0.97),
    ("tenants: service shares of backlogged tenants, largest error vs weights", "tenants.share_error", "<=", 0.10),
    ("adapters c=16: tok/s, half under a LoRA adapter / all on the base model", "adapters.mixed_ratio", ">=", 0.5),
    # what bit-exact numbers cost at 8 streams (each mode in its own process)
    ("batch-invariant c=8: uniform tok/s, invariant / default", "batch_invariant.uniform_ratio", ">=", 0.7),
    ("batch-invariant c=8: scoring requests/s, invariant / default", "batch_invariant.scoring_ratio", ">=", 0.7),
    # drafts vs none, the lowest over both models (docs/performance.md, "Speculation")
    ("speculation edit c=1: tok/s, with the prediction / without", "speculation.edit_c1_ratio", ">=", 2.0),
    ("speculation edit c=1..16: tok/s, with the prediction / without, lowest", "speculation.edit_min_ratio", ">=", 0.97),
    ("speculation: greedy outputs parting with drafts beyond a near-tie", "speculation.unexplained", "<=", 0),
    ("speculation copy c=1: tok/s, n-gram drafts / none", "speculation.copy_ratio", ">=", 1.2),
    ("speculation uniform: tok/s, n-gram drafts / none, lowest over streams", "speculation.uniform_min_ratio", ">=", 0.97),
]


def lookup(results: dict[str, Any], path: str) -> float | None:
    """``section.key`` or ``section[i].key.subkey``; ``uniform[c]`` picks the row of concurrency c."""
    head, *keys = path.split(".")
    name, _, index = head.partition("[")
    node: Any = results.get(name)
    if isinstance(node, dict) and "error" in node:
        return None
    if index and node is not None:
        i = int(index[:-1])
        rows = node if name != "uniform" else [r for r in node if r["concurrency"] == i]
        node = rows[0] if name == "uniform" and rows else (rows[i] if name != "uniform" and i < len(rows) else None)
    for key in keys:
        node = None if node is None else node.get(key)
    return node


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal with its measured value and whether it is met (``None`` for both when not measured)."""
    out = []
    for name, path, op, target in TARGETS:
        value = lookup(results, path)
        ok = None if value is None else {">=": value >= target, "<=": value <= target, "<": value < target,
                                      ">": value > target}[op]
        out.append({"target": name, "value": value, "goal": f"{op} {target:g}", "met": ok})
    return out


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report: header, the workloads' sections, the failed workloads, the measured goals' table."""
    lines = [f"Run {meta['timestamp']} on {meta['machine']}, model {meta['model']}, "
             f"{meta['settings']['n_threads']} threads, {meta['settings']['max_tokens']} new tokens per request "
             f"({run_kind(meta['settings'])} run).", ""]
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    ok = {k: v for k, v in results.items() if k not in failed}
    for section in SECTIONS:
        lines += section(ok)
    lines += [f"**{name} failed**: {error}" for name, error in failed.items()] + ([""] if failed else [])
    measured = [v for v in verdicts(results) if v["value"] is not None]  # not the workloads left out
    if measured:
        lines += ["| target | value | goal | met |", "|---|---:|---|---|"]
    for v in measured:
        lines.append(f"| {v['target']} | {v['value']:.3f} | {v['goal']} | {'yes' if v['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def run_kind(settings: dict[str, Any]) -> str:
    """How thorough the run was: quick (the smoke run), full (up to 64 streams), or default."""
    return "quick" if settings["quick"] else "full" if settings.get("full") else "default"


def seconds_line(seconds: dict[str, float]) -> str:
    """Each workload's wall seconds and their sum, one line for the console."""
    return "seconds: " + ", ".join(f"{name} {s:.1f}" for name, s in seconds.items()) + f"; total {sum(seconds.values()):.1f}"


def plot(results: dict[str, Any], path: Path) -> bool:
    """The uniform workload's tok/s against concurrency and the arrivals' latencies, as a PNG (False:
    those workloads did not run, or matplotlib is missing)."""
    if not isinstance(results.get("uniform"), list) or "tokens_per_s" not in results.get("arrivals", {}):
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = results["uniform"]
    cs = [r["concurrency"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("sequential_tok_s", "sequential (create_completion)"), ("ceiling_tok_s", "ceiling (raw batched decode)"),
                       ("llamactor_tok_s", "llamactor (submit from N threads)")):
        ax1.plot(cs, [r[key] for r in rows], marker="o", label=label)
    ax1.set(xscale="log", xlabel="concurrent requests", ylabel="generated tokens / s", title="uniform workload")
    ax1.set_xticks(cs, [str(c) for c in cs])
    ax1.legend()
    ar = results["arrivals"]
    ax2.bar(["TTFT p50", "TTFT p99", "latency p50", "latency p99"],
            [ar["ttft_p50_ms"], ar["ttft_p99_ms"], ar["latency_p50_ms"], ar["latency_p99_ms"]])
    ax2.set(ylabel="ms", title=f"arrivals: Poisson {ar['rate_per_s']:g}/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write(results: dict[str, Any], settings: dict[str, Any], model: str, out_dir: Path) -> tuple[Path, str]:
    """Write ``<timestamp>.json`` (+ ``.md``, ``.png``) under ``out_dir``; return the JSON path and table."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = {"timestamp": stamp, "machine": f"{platform.machine()} {os.cpu_count()} cores {platform.system()}",
            "python": platform.python_version(), "model": model, "settings": settings}
    out_dir.mkdir(parents=True, exist_ok=True)
    table = markdown(results, meta)
    path = out_dir / f"{stamp}.json"
    path.write_text(json.dumps({"meta": meta, "results": results, "targets": verdicts(results)}, indent=2))
    (out_dir / f"{stamp}.md").write_text(table)
    plot(results, out_dir / f"{stamp}.png")
    return path, table


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def update_docs(table: str, plot_path: Path, docs_dir: Path) -> None:
    """Replace the generated section of docs/performance.md and copy the plot beside it."""
    doc = docs_dir / "performance.md"
    text = doc.read_text() if doc.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    image = ""
    if plot_path.exists():
        (docs_dir / "performance.png").write_bytes(plot_path.read_bytes())
        image = "\n![tokens/s against concurrency; arrivals latency](performance.png)\n"
    doc.write_text(f"{head}{BEGIN}\n{table}{image}{END}{tail}")

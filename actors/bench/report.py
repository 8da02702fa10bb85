"""Turning benchmark results into the table, the JSON file, the plot, and the targets' verdicts."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from llamactor.bench.report_host import host_lines, streams_lines
from llamactor.bench.two_models import model_lines

# (name, how to read it from the results, comparison, target)
TARGETS: list[tuple[str, str, str, float]] = [
    ("uniform c=16: llamactor / ceiling", "uniform[16].vs_ceiling", ">=", 0.93),
    ("uniform c=16: llamactor / sequential", "uniform[16].vs_sequential", ">=", 2.8),
    ("uniform c=8: llamactor / ceiling", "uniform[8].vs_ceiling", ">=", 0.93),
    # issue 28 (--full runs): the raw batched decode at 64 sequences, measured in the same run
    ("uniform c=64: llamactor / ceiling", "uniform[64].vs_ceiling", ">=", 0.95),
    ("host c=64, greedy: host ms per step (schedule + postprocess)", "host.real.c64.greedy.host_ms", "<=", 2.0),
    ("host c=64, default sampler chain: host ms per step", "host.real.c64.default.host_ms", "<=", 2.0),
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
    # multiturn rows: 8 users x 6 turns, then 32 users on 8 sequences (quick runs: 4 x 3, 8 on 4)
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
    ("many users 64×4 on 8: history tokens from cache, RAM tier", "many_users.ram_on.history_from_cache", ">=", 0.95),
    ("many users 64×4 on 8: later-turn TTFT p50, RAM tier / none", "many_users.ttft_later_p50_ratio", "<=", 0.3),
    ("warm restart: next-turn TTFT p50, restarted on --cache-dir / cold", "warm_restart.ttft_p50_ratio", "<=", 0.25),
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
    # issue 30: what bit-exact numbers cost at 8 streams (each mode in its own process)
    ("batch-invariant c=8: uniform tok/s, invariant / default", "batch_invariant.uniform_ratio", ">=", 0.7),
    ("batch-invariant c=8: scoring requests/s, invariant / default", "batch_invariant.scoring_ratio", ">=", 0.7),
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
    out = []
    for name, path, op, target in TARGETS:
        value = lookup(results, path)
        ok = None if value is None else {">=": value >= target, "<=": value <= target, "<": value < target,
                                      ">": value > target}[op]
        out.append({"target": name, "value": value, "goal": f"{op} {target:g}", "met": ok})
    return out


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"Run {meta['timestamp']} on {meta['machine']}, model {meta['model']}, "
             f"{meta['settings']['n_threads']} threads, {meta['settings']['max_tokens']} new tokens per request "
             f"({'quick' if meta['settings']['quick'] else 'full'} run).", ""]
    failed = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    ok = {k: v for k, v in results.items() if k not in failed}
    for section in (_uniform, _others, _daemon, _multiturn, _few_shot, _tiers, _peer, _scheduling, host_lines,
                    streams_lines, model_lines):
        lines += section(ok)
    lines += [f"**{name} failed**: {error}" for name, error in failed.items()] + ([""] if failed else [])
    measured = [v for v in verdicts(results) if v["value"] is not None]  # not the workloads left out
    if measured:
        lines += ["| target | value | goal | met |", "|---|---:|---|---|"]
    for v in measured:
        lines.append(f"| {v['target']} | {v['value']:.3f} | {v['goal']} | {'yes' if v['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _uniform(results: dict[str, Any]) -> list[str]:
    if "uniform" not in results:
        return []
    lines = ["| concurrency | sequential tok/s | ceiling tok/s | llamactor tok/s | vs ceiling | vs sequential "
             "| step ms: decode / sample / other |", "|---:|---:|---:|---:|---:|---:|---|"]
    for r in results["uniform"]:
        lines.append(f"| {r['concurrency']} | {r['sequential_tok_s']:.1f} | {r['ceiling_tok_s']:.1f} | "
                     f"{r['llamactor_tok_s']:.1f} | {r['vs_ceiling']:.3f} | {r['vs_sequential']:.2f} | "
                     f"{_step_ms(r['step_ms'])} |")
    return lines + [""]


def _step_ms(ms: dict[str, float]) -> str:
    return f"{ms['decode']:.1f} / {ms['sample']:.2f} / {ms['schedule'] + ms['postprocess'] - ms['sample']:.2f}"


def _others(results: dict[str, Any]) -> list[str]:
    lines = []
    if sp := results.get("shared_prefix"):
        lines.append(f"Shared system prompt ({sp['system_prompt_tokens']} tokens), {sp['concurrency']} concurrent: "
                     f"TTFT p50 {sp['shared']['ttft_p50_ms']:.0f} ms shared vs {sp['inlined']['ttft_p50_ms']:.0f} ms "
                     f"inlined ({sp['ttft_p50_ratio']:.2f}×); throughput {sp['shared']['tokens_per_s']:.1f} vs "
                     f"{sp['inlined']['tokens_per_s']:.1f} tok/s ({sp['throughput_ratio']:.2f}×), both without the "
                     f"prefix cache; inlined with the prefix cache: TTFT p50 {sp['cached']['ttft_p50_ms']:.0f} ms, "
                     f"{sp['cached']['tokens_per_s']:.1f} tok/s.")
    if ar := results.get("arrivals"):
        lines.append(f"Arrivals ({ar['requests']} requests, Poisson {ar['rate_per_s']:g}/s, prompts 16–512 words, "
                     f"16–256 new tokens): {ar['tokens_per_s']:.1f} tok/s, TTFT p50/p99 {ar['ttft_p50_ms']:.0f}/"
                     f"{ar['ttft_p99_ms']:.0f} ms, latency p50/p99 {ar['latency_p50_ms']:.0f}/{ar['latency_p99_ms']:.0f} ms.")
    if si := results.get("single"):
        lines.append(f"Single request: TTFT {si['llamactor_ttft_ms']:.1f} ms vs {si['sequential_ttft_ms']:.1f} ms "
                     f"sequential; {si['llamactor_tok_s']:.1f} vs {si['sequential_tok_s']:.1f} tok/s. "
                     f"Idle CPU {si['idle_cpu_percent']:.2f}%.")
    return lines + [""] if lines else []


def _daemon(results: dict[str, Any]) -> list[str]:
    if "daemon" not in results:
        return []
    lines = ["Streamed chat completions, N threads: in-process `stream_chat` vs the daemon over loopback HTTP.", "",
             "| concurrency | in-process tok/s | daemon tok/s | daemon / in-process | TTFT p50 in-process / daemon ms |",
             "|---:|---:|---:|---:|---|"]
    for r in results["daemon"]:
        lines.append(f"| {r['concurrency']} | {r['in_process_tok_s']:.1f} | {r['daemon_tok_s']:.1f} | "
                     f"{r['daemon_vs_in_process']:.3f} | {r['in_process_ttft_p50_ms']:.0f} / {r['daemon_ttft_p50_ms']:.0f} |")
    return lines + [""]


def _multiturn(results: dict[str, Any]) -> list[str]:
    if "multiturn" not in results:
        return []
    lines = ["Multi-turn chat: U users at once, each its own ~300-token persona, the history re-sent every turn "
             "through `LLM.chat`, 32 new tokens a turn, greedy; prefix cache on vs off.", "",
             "| users × turns (sequences, n_ctx) | cache | wall s | TTFT p50/p90 turn 1 ms | TTFT p50/p90 later ms "
             "| prompt tokens sent / computed / new | history from cache | step ms: decode / sample / other |",
             "|---|---|---:|---|---|---|---:|---|"]
    for r in results["multiturn"]:
        for key in ("cache_on", "cache_off"):
            m = r[key]
            lines.append(f"| {r['users']} × {r['turns']} ({r['n_parallel']}, {r['n_ctx']}) | {key[6:]} | "
                         f"{m['wall_s']:.1f} | {m['ttft_turn1_p50_ms']:.0f} / {m['ttft_turn1_p90_ms']:.0f} | "
                         f"{m['ttft_later_p50_ms']:.0f} / {m['ttft_later_p90_ms']:.0f} | {m['prompt_tokens_sent']} / "
                         f"{m['prompt_tokens_computed']} / {m['prompt_tokens_new']} | {m['history_from_cache']:.1%} | "
                         f"{_step_ms(m['step_ms'])} |")
    return lines + [""]


def _few_shot(results: dict[str, Any]) -> list[str]:
    if not (fs := results.get("few_shot")):
        return []
    on, off = fs["cache_on"], fs["cache_off"]
    return [f"Few-shot: {fs['requests']} requests at once sharing a {fs['shared_prefix_tokens']}-token prefix, distinct "
            f"questions: TTFT p50 {on['ttft_p50_ms']:.0f} ms with the cache vs {off['ttft_p50_ms']:.0f} ms without "
            f"({fs['ttft_p50_ratio']:.2f}×), wall {on['wall_s']:.1f} vs {off['wall_s']:.1f} s ({fs['wall_ratio']:.2f}×), "
            f"prompt tokens computed {on['prompt_tokens_computed']} vs {off['prompt_tokens_computed']} "
            f"(of {on['prompt_tokens_sent']} sent).", ""]


def _tiers(results: dict[str, Any]) -> list[str]:
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
    if wr := results.get("warm_restart"):
        lines += [f"Warm restart: {wr['users']} users' next turn at once after the daemon was stopped (SIGTERM) and "
                  f"started on its --cache-dir: TTFT p50 {wr['warm_ttft_p50_ms']:.0f} ms vs {wr['cold_ttft_p50_ms']:.0f} "
                  f"ms on a cold daemon ({wr['ttft_p50_ratio']:.2f}×), p90 {wr['warm_ttft_p90_ms']:.0f} vs "
                  f"{wr['cold_ttft_p90_ms']:.0f} ms.", ""]
    return lines


def _peer(results: dict[str, Any]) -> list[str]:
    if not (p := results.get("peer")):
        return []
    ours, theirs = p["llamactor"], p["llama_server"]
    return [f"Against llama.cpp's llama-server (same engine, {p['n_parallel']} parallel, unified KV): {p['users']} users "
            f"× {p['turns']} turns over `/v1/completions`, plain transcripts, history re-sent, 32 tokens a turn. "
            f"Wall {ours['wall_s']:.1f} s llamactor vs {theirs['wall_s']:.1f} s llama-server ({p['wall_ratio']:.2f}×); "
            f"later-turn TTFT p50 {ours['ttft_later_p50_ms']:.0f} vs {theirs['ttft_later_p50_ms']:.0f} ms "
            f"({p['ttft_later_p50_ratio']:.2f}×), p90 {ours['ttft_later_p90_ms']:.0f} vs "
            f"{theirs['ttft_later_p90_ms']:.0f} ms.", ""]


def _scheduling(results: dict[str, Any]) -> list[str]:
    lines = []
    if pr := results.get("priorities"):
        lines += [f"Priorities: {pr['requests']} Poisson arrivals at {pr['rate_per_s']:g}/s (20% high, 80% low), "
                  f"{pr['max_tokens']} tokens each, {pr['n_parallel']} sequences (a queue builds).", "",
                  "| policy | high TTFT p50 / p99 ms | low TTFT p50 / p99 ms | tok/s | step ms: decode / sample / other |",
                  "|---|---|---|---:|---|"]
        for policy in ("fcfs", "priority"):
            m = pr[policy]
            lines.append(f"| {policy} | {m['high']['ttft_p50_ms']:.0f} / {m['high']['ttft_p99_ms']:.0f} | "
                         f"{m['low']['ttft_p50_ms']:.0f} / {m['low']['ttft_p99_ms']:.0f} | {m['tokens_per_s']:.1f} | "
                         f"{_step_ms(m['step_ms'])} |")
        lines.append("")
    if oc := results.get("overcommit"):
        t, r = oc["tight"], oc["roomy"]
        lines += [f"Overcommit: {oc['requests']} sequences × {oc['max_tokens']} tokens at once in {t['n_ctx']} KV cells "
                  f"(they need ~{oc['requests'] * (oc['max_tokens'] + 15)} at full length): {t['failed']} failed, "
                  f"{t['preemptions']} preemptions, {t['tokens_recomputed']} tokens recomputed, {t['tokens_per_s']:.1f} "
                  f"tok/s vs {r['tokens_per_s']:.1f} tok/s in {r['n_ctx']} cells ({oc['throughput_ratio']:.2f}×).", ""]
    if st := results.get("structured"):
        c, u, ms = st["constrained"], st["unconstrained"], st["step_ms"]
        lines += [f"Structured: {st['requests']} concurrent requests constrained by a JSON Schema ({st['rounds']} "
                  f"rounds, {st['tokens']} tokens) vs the same token counts unconstrained: {c['tokens_per_s']:.1f} vs "
                  f"{u['tokens_per_s']:.1f} tok/s ({st['throughput_ratio']:.2f}×), "
                  f"{st['valid_fraction']:.0%} of the constrained outputs valid; {st['rows_masked']:.0%} of the constrained "
                  f"draws needed the full mask. Per step (both runs): decode {ms['decode']:.1f} ms, masks "
                  f"{ms['mask']:.2f} ms, sampling {ms['sample']:.2f} ms.", ""]
    if em := results.get("embeddings"):
        ours, theirs, gen = em["llamactor"], em["one_at_a_time"], em["generation"]
        lines += [f"Embeddings: {em['texts']} texts of 8-64 words, from {em['callers']} concurrent callers one text per "
                  f"call: {ours['inputs_per_s']:.1f} inputs/s, {ours['tokens_per_s']:.0f} tokens/s "
                  f"({ours['steps']} steps of {ours['ms_per_step']:.0f} ms, {ours['inputs_per_step']:.1f} inputs and "
                  f"{ours['packing_efficiency']:.0%} of n_batch per step) vs {theirs['inputs_per_s']:.1f} inputs/s, "
                  f"{theirs['tokens_per_s']:.0f} tokens/s one at a time through Llama.embed "
                  f"({em['throughput_ratio']:.2f}×). Generation of 16 × 64 tokens: {gen['alone_tokens_per_s']:.1f} "
                  f"tok/s alone, {gen['under_load_tokens_per_s']:.1f} tok/s while 16 callers keep embedding "
                  f"({em['generation_ratio']:.2f}×; {gen['texts_embedded_meanwhile']} texts embedded meanwhile).", ""]
    if rp := results.get("replicas"):
        t, mt = rp["throughput"], rp["multiturn"]
        pa, sq = mt["prefix_affinity"], mt["shortest_queue"]
        lines += [f"Replicas: 16 concurrent uniform requests on 2 replicas × 8 sequences (1 thread each) "
                  f"{t['two_replicas']['tokens_per_s']:.1f} tok/s vs one tree × 16 (2 threads) "
                  f"{t['one_tree']['tokens_per_s']:.1f} tok/s ({t['ratio']:.2f}×; TTFT p50 "
                  f"{t['two_replicas']['ttft_p50_ms']:.0f} vs {t['one_tree']['ttft_p50_ms']:.0f} ms). "
                  f"{mt['users']} users × {mt['turns']} turns on 2 replicas: prefix_affinity "
                  f"{pa['history_from_cache']:.0%} of history from cache, later-turn TTFT p50 "
                  f"{pa['ttft_later_p50_ms']:.0f} ms, wall {pa['wall_s']:.1f} s; shortest_queue "
                  f"{sq['history_from_cache']:.0%}, {sq['ttft_later_p50_ms']:.0f} ms, {sq['wall_s']:.1f} s.", ""]
    return lines


def plot(results: dict[str, Any], path: Path) -> bool:
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

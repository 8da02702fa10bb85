"""The ``host_cap`` workload's section of the report (``host_cap``): per size and leg its tokens/s,
the ratio to in-process, the batcher's work and the wall time per step, the CPU per token; where a
goal is missed, where the step's time went."""

from __future__ import annotations

from typing import Any

GOAL_IN_PROCESS_TOK_S = 25_000.0  # at 126 streams
GOAL_HTTP_RATIO = 0.9  # http and sse / submit, at 64 and 126 streams
LEGS = ("submit", "stream", "http", "sse", "http_fp", "sse_fp")  # and http_fpN, sse_fpN for N front ends


def legs_of(row: dict[str, Any]) -> list[str]:
    """A size's legs in the report's order: ``LEGS``, then those through more front ends."""
    more = sorted((k for k in row if k.startswith(("http_fp", "sse_fp")) and k not in LEGS),
                  key=lambda k: (int(k.rsplit("fp", 1)[1]), k))
    return [leg for leg in LEGS if leg in row] + more


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's table: per size and leg, tokens/s, the ratio to *submit*, the batcher's work
    and the wall time per step; where a goal is missed, where the step's time went."""
    if not (h := results.get("host_cap")) or "error" in h:
        return []
    lines = ["Host cap: N chat completions at once on the replayed decode (the host workload's null leg), "
             "in-process (`submit_chat` futures, `stream_async`) and through the daemon's app on uvicorn "
             "(non-streamed, SSE; the client in a process of its own), and *_fp*: the same through the front end "
             "in a process of its own (`--frontend-processes 1`; its CPU is that whole process's), *_fpN*: through N such "
             "processes on one socket (their CPU together). Batcher ms: its own work per step; "
             "wall ms: per step; the rest is what a step waited for outside the batcher.", "",
             "| streams | new tokens | leg | tok/s | / in-process | batcher ms | wall ms "
             "| CPU µs/token: batcher | front end |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    sizes = sorted(int(k[1:]) for k in h if k.startswith("c"))
    for n in sizes:
        row = h[f"c{n}"]
        for leg in legs_of(row):
            m = row[leg]
            ratio = f"{m['vs_in_process']:.2f}" if "vs_in_process" in m else "1"
            lines.append(f"| {n} | {row['max_tokens']} | {leg} | {m['tokens_per_s']:,.0f} | {ratio} | "
                         f"{m['batcher_ms']:.2f} | {m['wall_ms']:.2f} | {_cpu(m, 'batcher')} | {_cpu(m, 'front')} |")
    return lines + [""] + link_lines(h, sizes) + missed_goals(h) + [""]


def link_lines(h: dict[str, Any], sizes: list[int]) -> list[str]:
    """The CPU the engine's end of the front-end process's link took per token (its reader and
    sender threads, beside the batcher on the engine's GIL), where the split legs ran."""
    figures = [f"{leg} at {n}: {_cpu(h[f'c{n}'][leg], 'link')} µs" for n in sizes for leg in legs_of(h[f"c{n}"])
               if "_fp" in leg and "link_us_per_token" in h[f"c{n}"][leg]]
    return [f"- the engine's link to the front-end process, CPU per token: {', '.join(figures)}"] if figures else []


def _cpu(m: dict[str, Any], role: str) -> str:
    value = m.get(f"{role}_us_per_token")
    return "" if value is None else f"{value:.1f}"


def missed_goals(h: dict[str, Any]) -> list[str]:
    """One line per goal missed, saying where the time of a step went."""
    out = []
    if (c126 := h.get("c126")) and c126["submit"]["tokens_per_s"] < GOAL_IN_PROCESS_TOK_S:
        m = c126["submit"]
        out.append(f"- missed: in-process {m['tokens_per_s']:,.0f} tok/s at 126 streams (goal "
                   f"{GOAL_IN_PROCESS_TOK_S:,.0f}): the batcher's own work is {m['batcher_ms']:.2f} of "
                   f"{m['wall_ms']:.2f} ms a step")
    for n in (64, 126):
        row = h.get(f"c{n}") or {}
        for leg in (leg for leg in legs_of(row) if leg.startswith(("http", "sse"))):
            if row[leg]["vs_in_process"] < GOAL_HTTP_RATIO:
                m, ref = row[leg], row["submit"]
                out.append(f"- missed: {leg} at {n} streams, {m['vs_in_process']:.2f}× in-process (goal "
                           f"{GOAL_HTTP_RATIO}×): a step took {m['wall_ms']:.2f} ms against {ref['wall_ms']:.2f} "
                           f"in-process; the batcher's own work {m['batcher_ms']:.2f} ms (in-process "
                           f"{ref['batcher_ms']:.2f}), so {m['wall_ms'] - m['batcher_ms']:.2f} ms of each step went "
                           "to the front end (the event loop holding the GIL) and the hops to it; CPU per token: "
                           f"front end {_cpu(m, 'front')} µs, batcher {_cpu(m, 'batcher')} µs "
                           f"(in-process {_cpu(ref, 'batcher')} µs)")
    return out

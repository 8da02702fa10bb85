"""The report's sections for issue 28's workloads: ``host`` (host ms per step, real and null
decode) and ``streams`` (N callers against llamactor and llama-server with and without ``-bs``)."""

from __future__ import annotations

from typing import Any


def host_lines(results: dict[str, Any]) -> list[str]:
    if not (h := results.get("host")):
        return []
    lines = [f"Host work per step (issue 28): N sequences at once, {h['max_tokens']} new tokens each, greedy and with "
             "the default sampler chain, sampled inside llama.cpp's graph; the batcher's counters per step (host = "
             "schedule + postprocess). *real*: "
             "llama.cpp decodes; *null*: the real batcher replaying recorded logits "
             f"({h['recorded_rows']} distinct rows), no decode, no KV. Beyond {h['max_real_sequences']} sequences "
             "only the null leg runs: a llama.cpp context holds 256 sequence ids, halved by the shadow ids.", "",
             "| sequences | sampler | leg | host ms | schedule | sample | mask + score | other postprocess "
             "| decode ms | wall ms | tok/s |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    sizes = sorted({int(c[1:]) for leg in ("real", "null") for c in h[leg]})
    for n in sizes:
        for sampler in ("greedy", "default"):
            for leg in ("real", "null"):
                if (m := h[leg].get(f"c{n}", {}).get(sampler)) is not None:
                    lines.append(f"| {n} | {sampler} | {leg} | {m['host_ms']:.2f} | {m['schedule_ms']:.2f} | "
                                 f"{m['sample_ms']:.2f} | {m['mask_ms'] + m['score_ms']:.2f} | "
                                 f"{m['post_other_ms']:.2f} | {m['decode_ms']:.2f} | {m['wall_ms']:.2f} | "
                                 f"{m['tokens_per_s']:.0f} |")
    return lines + [""]


def streams_lines(results: dict[str, Any]) -> list[str]:
    if not (st := results.get("streams")):
        return []
    lines = [f"Streams: N callers, each {st['rounds']} non-streamed `/v1/completions` of ~{st['prompt_words']} prompt "
             f"tokens and {st['max_tokens']} new (EOG ignored), against `llamactor serve` ({st['n_parallel']} "
             f"sequences) and llama-server `-np {st['n_parallel']} -kvu`, without and with `-bs`; n_ctx {st['n_ctx']}, "
             f"{st['n_gpu_layers']} GPU layers. Aggregate tok/s (p50 latency ms).", "",
             "| N | sampler | llamactor | llama-server | llama-server -bs | llamactor / -bs |",
             "|---:|---|---:|---:|---:|---:|"]
    for sampler, by_n in st["vs_bs"].items():
        for n, ratio in by_n.items():
            cells = [f"{st[name][sampler][n]['tokens_per_s']:.0f} ({st[name][sampler][n]['latency_p50_ms']:.0f})"
                     for name in ("llamactor", "llama_server", "llama_server_bs")]
            lines.append(f"| {n} | {sampler} | {' | '.join(cells)} | {ratio:.3f} |")
    return lines + [""]

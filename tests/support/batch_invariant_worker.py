"""The in-process half of tests/tree/test_batch_invariant.py, run in a fresh process of its own:
``python -m tests.support.batch_invariant_worker MODEL_PATH`` prints one JSON object of scenarios, each a
list of ``[got, expected]`` pairs that batch-invariant mode promises equal bit for bit.

Why a process of its own: ggml reads ``GGML_CPU_TILED_MM`` once per process, at its first
matmul, and the test process has loaded models long before (the rest of the suite keeps the
default kernels). Here ``llamactor.start(batch_invariant=True)`` sets the variable itself, as a
caller's fresh process would. Each scenario's reference is the same requests one at a time on a
tree without the prefix cache; floats go through JSON exactly (``repr`` round-trips).
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import llamactor
from llamactor.base.completion import Completion, TokenLogprob

from tests.conftest import NotAMessage, batcher_ref

PROMPTS = ["The quick brown fox jumps over the lazy dog, and then it", "Once upon a time in a small village",
           "def fibonacci(n):\n    return", "The capital of France is", "1, 2, 3, 4, 5, 6,",
           "Water boils at a temperature of", "In the beginning was the word", "Rain fell all night on the"]
LENGTHS = [6 + i for i in range(len(PROMPTS))]  # requests finish apart: their cached prefixes stay put
PRESSURE = [f"Story {i}: the old ship" for i in range(8)]
STORY = ("In a quiet village at the edge of a dark forest there lived an old clockmaker who repaired every "
         "clock in the valley, and each morning the children")  # long enough that a restore pays
GREEDY = {"temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "prompt_logprobs": 2}
# Prompt scores need every row's logits, so their KV is not taken from a tier (the score cache is
# what spares a scored prompt's rows, and it does not outlive its tree): restores are seen without.
UNSCORED = {k: v for k, v in GREEDY.items() if k != "prompt_logprobs"}


def _entry(e: TokenLogprob | None) -> Any:
    return None if e is None else [e.token_id, e.logprob, list(e.top_ids), list(e.top)]


def numbers(c: Completion) -> dict[str, Any]:
    """Everything of a completion that depends on the logits: tokens, their logprobs and alternatives,
    the prompt's logprobs."""
    return {"token_ids": list(c.token_ids), "logprobs": [_entry(e) for e in c.logprobs or ()],
            "prompt_logprobs": [_entry(e) for e in c.prompt_logprobs or ()]}


def run(model: str) -> dict[str, Any]:
    common = {"model": model, "batch_invariant": True, "n_ctx": 4096, "watchdog_timeout_s": 0}
    out: dict[str, Any] = {}
    with llamactor.start(n_parallel=8, prefix_cache=False, **common) as fresh:
        alone = {p: numbers(fresh.ask(p, max_tokens=LENGTHS[i], **GREEDY)) for i, p in enumerate(PROMPTS)}
        follow = PROMPTS[0] + " ran into the barn"
        alone[follow] = numbers(fresh.ask(follow, max_tokens=12, **GREEDY))
        alone[STORY + " ran"] = numbers(fresh.ask(STORY + " ran", max_tokens=12, **UNSCORED))
        crash_ref = numbers(fresh.ask(PROMPTS[1], max_tokens=24, **GREEDY))
        unpressured = [numbers(f.result(timeout=300)) for f in
                       [fresh.submit(p, max_tokens=32, **GREEDY) for p in PRESSURE]]
        out["mode_reported"] = [fresh.info.batch_invariant, fresh.stats()["batch_invariant"]]
    with llamactor.start(n_parallel=8, **common) as llm:
        batch = [llm.submit(p, max_tokens=LENGTHS[i], **GREEDY) for i, p in enumerate(PROMPTS)]
        out["batched_vs_alone"] = [[numbers(f.result(timeout=300)), alone[p]] for f, p in zip(batch, PROMPTS)]
        hit = llm.ask(follow, max_tokens=12, **GREEDY)  # PROMPTS[0]'s KV is a cached prefix now
        out["cached_tokens"] = hit.usage.cached_tokens
        out["cached_vs_recomputed"] = [[numbers(hit), alone[follow]]]
        stream = llm.stream(PROMPTS[1], max_tokens=24, **GREEDY)
        pieces = iter(stream)
        next(pieces)  # running now: the crash catches it mid-generation
        batcher_ref(llm).tell(NotAMessage())
        list(pieces)
        out["restarts"] = llm.stats()["restarts"]
        out["across_a_crash"] = [[numbers(stream.completion), crash_ref]]
    with llamactor.start(n_parallel=4, n_seq_ids=7, **common) as few_ids:  # 3 seq_ids for cached prefixes
        batch = [few_ids.submit(p, max_tokens=LENGTHS[i], **GREEDY) for i, p in enumerate(PROMPTS)]
        out["seq_id_pressure_vs_alone"] = [[numbers(f.result(timeout=300)), alone[p]] for f, p in zip(batch, PROMPTS)]
        out["seq_id_pressure_flushes"] = few_ids.stats()["kv_flushes"]
    with tempfile.TemporaryDirectory() as cache_dir:  # the second tree restores the first one's prefix from disk
        with llamactor.start(n_parallel=8, cache_dir=cache_dir, **common) as first:
            first.ask(STORY, max_tokens=4, **UNSCORED)
        with llamactor.start(n_parallel=8, cache_dir=cache_dir, **common) as second:
            from_disk = second.ask(STORY + " ran", max_tokens=12, **UNSCORED)
            out["disk_restored"] = second.stats()["cache_ram"]["restored"]
        out["disk_restore_vs_recomputed"] = [[numbers(from_disk), alone[STORY + " ran"]]]
    for ram_tier, name in ((True, "preempted_vs_not"), (False, "preempted_recomputed_vs_not")):
        # 8 x ~40 tokens > 256 cells: flushed, resumed from the RAM tier or (without one) recomputed
        with llamactor.start(n_parallel=8, batch_timeout_ms=50, **{**common, "n_ctx": 256},
                             cache_ram_mib=1024 if ram_tier else 0) as tight:
            pressured = [tight.submit(p, max_tokens=32, **GREEDY) for p in PRESSURE]
            out[name] = [[numbers(f.result(timeout=300)), u] for f, u in zip(pressured, unpressured)]
            stats = tight.stats()
            out[f"{name}_stats"] = {"preemptions": stats["preemptions"], "kv_flushes": stats["kv_flushes"],
                                    "restored": stats.get("cache_ram", {}).get("restored", 0)}
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))

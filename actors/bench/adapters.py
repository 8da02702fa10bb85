"""The *adapters* leg of ``llamactor bench``: a mixed base/LoRA load vs the same load on the
base model alone, in the same run.

A random rank-8 LoRA adapter for the bench model's attention (q and v of every layer) is written
with the ``gguf`` package into a temporary folder (none ships with a model), and one tree loads
it. The same 16 requests (8 in ``--quick``), each asking exactly ``max_tokens`` (``ignore_eos``),
in three loads: all on the base model, all under the adapter (the LoRA's own compute), and half
and half (the cost of decoding one adapter set per step: the two groups take turns, so each step
carries half the sequences). The loads alternate, 3 rounds each (2 of 16 tokens in ``--quick``), best kept.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llamactor
from llamactor.bench.prompts import ANIMALS
from llamactor.bench.settings import BenchSettings

RANK, MAGNITUDE = 8, 0.05


def write_adapter(model_path: str, path: Path) -> Path:
    """A random LoRA adapter (llama.cpp's GGUF format) on ``model_path``'s attn_q and attn_v."""
    import gguf  # the bench extra's; only this leg needs it
    import numpy as np

    reader = gguf.GGUFReader(model_path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(RANK))
    rng = np.random.default_rng(0)
    for t in reader.tensors:
        if t.name.endswith(("attn_q.weight", "attn_v.weight")) and len(t.shape) == 2:
            n_in, n_out = (int(x) for x in t.shape)  # ggml order; numpy's is the reverse
            writer.add_tensor(f"{t.name}.lora_a", (rng.standard_normal((RANK, n_in)) * MAGNITUDE).astype(np.float32))
            writer.add_tensor(f"{t.name}.lora_b", (rng.standard_normal((n_out, RANK)) * MAGNITUDE).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _round(llm: llamactor.LLM, prompts: list[str], loras: list[dict[str, float] | None], max_tokens: int,
           ) -> dict[str, float]:
    before = llm.stats()["steps"]
    start = time.perf_counter()
    futures = [llm.submit(p, max_tokens=max_tokens, ignore_eos=True, temperature=0, lora=lora)
               for p, lora in zip(prompts, loras)]
    tokens = sum(f.result().usage.completion_tokens for f in futures)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "tokens_per_s": tokens / wall, "steps": llm.stats()["steps"] - before}


def n_ticks(s: BenchSettings) -> int:
    return 3 * (2 if s.quick else 3)


def bench_adapters(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n, repeats = (8, 2) if s.quick else (16, 3)  # repeats: as n_ticks counts them
    prompts = [f"User: Tell me about the {ANIMALS[i % 16]}.\nAssistant:" for i in range(n)]
    style = {"style": 1.0}
    loads: dict[str, list[dict[str, float] | None]] = {
        "base": [None] * n, "adapter": [style] * n, "mixed": [style if i % 2 else None for i in range(n)]}
    max_tokens = 16 if s.quick else s.max_tokens
    out: dict[str, Any] = {"requests": n, "max_tokens": max_tokens, "repeats": repeats}
    with tempfile.TemporaryDirectory(prefix="llamactor-bench-lora-") as folder:
        adapter = write_adapter(s.model_path, Path(folder) / "style.gguf")
        with llamactor.start(s.model_path, n_parallel=n, batch_size=n, n_threads=s.n_threads, n_ctx=s.n_ctx,
                             n_gpu_layers=s.n_gpu_layers, loras=[("style", str(adapter))], prefix_cache=False) as llm:
            _round(llm, prompts, loads["mixed"], 8)  # warm up: the first n-wide batches are slower either way
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in loads}
            for _ in range(repeats):  # interleaved, best of each: a busy host slows one round, not one load
                for name, loras in loads.items():
                    runs[name].append(_round(llm, prompts, loras, max_tokens))
                    tick()
    for name, rounds in runs.items():
        out[name] = max(rounds, key=lambda r: r["tokens_per_s"])
    out["adapter_ratio"] = out["adapter"]["tokens_per_s"] / out["base"]["tokens_per_s"]
    out["mixed_ratio"] = out["mixed"]["tokens_per_s"] / out["base"]["tokens_per_s"]
    return out

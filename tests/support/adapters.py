"""LoRA adapters written for the tests with the ``gguf`` package, in llama.cpp's format:
``general.type`` adapter, ``adapter.type`` lora, ``adapter.lora.alpha``, and per adapted weight
``<weight>.lora_a`` (ne [n_in, r]) and ``<weight>.lora_b`` (ne [r, n_out]); numpy shapes are the
reverse. Random, but seeded, and strong enough to change what the model says."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from llamactor.native.engine import Engine

from tests.conftest import NEAR_TIE, decode_prompt

RANK = 8
# Found by trying seeds: SmolLM2 answers "The capital of France is" differently under this
# adapter (" Paris." without it), and fluently, not with noise.
SEED, MAGNITUDE = 3, 0.1
TARGETS = ("attn_q.weight", "attn_v.weight")


@functools.lru_cache(maxsize=4)
def model_shapes(model_path: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The model's architecture and its tensors' shapes (ne order: [n_in, n_out])."""
    reader = gguf.GGUFReader(model_path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return arch, {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}


def write_lora(path: Path, model_path: str, *, seed: int = SEED, magnitude: float = MAGNITUDE,
               arch: str | None = None, targets: tuple[str, ...] = TARGETS, dtype: type = np.float32) -> Path:
    """A LoRA adapter for ``model_path``'s ``targets`` weights in every layer (``arch``: claim
    another architecture)."""
    model_arch, shapes = model_shapes(model_path)
    writer = gguf.GGUFWriter(str(path), arch or model_arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(RANK))  # alpha / rank = 1: the scale is the request's
    rng = np.random.default_rng(seed)
    for name, ne in shapes.items():
        if len(ne) == 2 and name.endswith(targets):
            n_in, n_out = ne
            writer.add_tensor(f"{name}.lora_a", (rng.standard_normal((RANK, n_in)) * magnitude).astype(dtype))
            writer.add_tensor(f"{name}.lora_b", (rng.standard_normal((n_out, RANK)) * magnitude).astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_truncated(path: Path, good: Path) -> Path:
    """``good`` cut in the middle of its tensor data: a damaged download."""
    data = good.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def greedy_reference(llama: Any, prompt: list[int], n: int, is_eog: Any) -> list[int]:
    """llama-cpp-python's greedy tokens after ``prompt`` (a ``Llama``, with or without
    ``lora_path``), up to ``n`` or the first end-of-generation token (not included)."""
    out: list[int] = []
    llama.reset()
    for token in llama.generate(prompt, temp=0.0, top_k=1, reset=True):
        if is_eog(token) or len(out) == n:
            break
        out.append(int(token))
    return out


def top2(engine: Engine, tokens: list[int]) -> tuple[int, int, float]:
    """The best and second-best next token after ``tokens`` decoded alone on ``engine`` (under
    whatever adapters it has set), and their logit gap."""
    engine.clear()
    engine.prefill(0, tokens[:-1])
    logits = decode_prompt(engine, 0, tokens[-1:], n_past=len(tokens) - 1)
    second, best = (int(i) for i in np.argsort(logits)[-2:])
    return best, second, float(logits[best] - logits[second])


def assert_same_up_to_near_tie(engine: Engine, prompt: list[int], got: tuple[int, ...], want: list[int]) -> None:
    """``got`` equals the reference ``want`` or first differs where the reference engine saw a
    near-tie (conftest.NEAR_TIE) between ``want``'s token and ``got``'s, its top two (in either
    order: the engines differ that much): a divergence to any other token, as a request decoded
    under the wrong adapters would show, fails."""
    n = min(len(got), len(want))
    i = next((k for k in range(n) if got[k] != want[k]), None)
    if i is None:  # equal, or one ended (end of generation) where the other went on: a near-tie there
        assert len(got) == len(want) or top2(engine, prompt + want[:n])[2] < NEAR_TIE, f"{got} vs {want}"
        return
    best, second, margin = top2(engine, prompt + want[:i])
    assert {best, second} == {want[i], got[i]} and margin < NEAR_TIE, (
        f"token {i}: got {got[i]}, the reference {want[i]} (its top two {best}, {second}, margin {margin:.3f})")

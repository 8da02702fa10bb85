"""The *structured* leg of ``llamactor bench``: JSON-Schema-constrained requests vs the same
requests unconstrained, in the same run.

16 concurrent requests each constrained by a JSON Schema run first; the unconstrained baseline
then asks, for each request, exactly as many tokens as its constrained twin produced (``ignore_eos``),
so both runs decode the same tokens in the same batch shapes and the ratio isolates the cost of
constraining: the grammar vocabulary, the masks and masked sampling. ``report_lines`` renders its
line in the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import pydantic

import llamactor
from llamactor.bench.prompts import ANIMALS
from llamactor.bench.settings import BenchSettings


class Animal(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    species: str = pydantic.Field(max_length=16)
    age: int = pydantic.Field(ge=0, le=100)
    friendly: bool
    colours: list[Annotated[str, pydantic.Field(max_length=12)]] = pydantic.Field(max_length=3)


def _burst(llm: llamactor.LLM, prompts: list[str], per_request: list[dict[str, Any]]) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    futures = [llm.submit(p, temperature=0.8, seed=i, **extra) for i, (p, extra) in enumerate(zip(prompts, per_request))]
    done = [f.result() for f in futures]
    return time.perf_counter() - start, done


def _valid(text: str) -> bool:
    try:
        Animal.model_validate_json(text)
        return True
    except pydantic.ValidationError:
        return False


def bench_structured(s: BenchSettings, tick: Callable[[], None]) -> dict[str, Any]:
    n, rounds = 16, 1 if s.quick else 3
    prompts = [f"User: Describe the {ANIMALS[i % 16]} called {chr(65 + i)} as JSON.\nAssistant:" for i in range(n)]
    out: dict[str, Any] = {"requests": n, "rounds": rounds}
    with llamactor.start(s.model_path, n_parallel=n, n_threads=s.n_threads, n_ctx=s.n_ctx) as llm:
        llm.ask("warm up", json_schema=Animal, max_tokens=4)  # builds the grammar vocabulary (once per model)
        _burst(llm, prompts, [{"max_tokens": 8}] * n)  # the first 16-wide batch is slower either way
        walls = {"constrained": 0.0, "unconstrained": 0.0}
        tokens, valid, total = 0, 0, 0
        before = llm.stats()
        for _ in range(rounds):
            wall, done = _burst(llm, prompts, [{"json_schema": Animal, "max_tokens": 160}] * n)
            walls["constrained"] += wall
            valid += sum(c.finish_reason == "stop" and _valid(c.text) for c in done)
            total += len(done)
            lengths = [c.usage.completion_tokens for c in done]
            tokens += sum(lengths)
            wall, _ = _burst(llm, prompts, [{"max_tokens": k, "ignore_eos": True} for k in lengths])
            walls["unconstrained"] += wall
        after = llm.stats()
        steps = max(after["steps"] - before["steps"], 1)
        out["step_ms"] = {k: round((after["step_ms"][k] - before["step_ms"][k]) / steps, 3) for k in after["step_ms"]}
        out["rows_masked"] = (after["grammar_rows_masked"] - before["grammar_rows_masked"]) / max(
            after["grammar_rows"] - before["grammar_rows"], 1)
    tick()
    for name, wall in walls.items():
        out[name] = {"wall_s": wall, "tokens_per_s": tokens / wall}
    out["tokens"] = tokens
    out["valid_fraction"] = valid / total
    out["throughput_ratio"] = out["constrained"]["tokens_per_s"] / out["unconstrained"]["tokens_per_s"]
    return out


def report_lines(results: dict[str, Any]) -> list[str]:
    """The report's line: throughput constrained vs not, valid outputs, and the per-step costs."""
    if not (st := results.get("structured")):
        return []
    c, u, ms = st["constrained"], st["unconstrained"], st["step_ms"]
    return [f"Structured: {st['requests']} concurrent requests constrained by a JSON Schema ({st['rounds']} "
            f"rounds, {st['tokens']} tokens) vs the same token counts unconstrained: {c['tokens_per_s']:.1f} vs "
            f"{u['tokens_per_s']:.1f} tok/s ({st['throughput_ratio']:.2f}×), "
            f"{st['valid_fraction']:.0%} of the constrained outputs valid; {st['rows_masked']:.0%} of the constrained "
            f"draws needed the full mask. Per step (both runs): decode {ms['decode']:.1f} ms, masks "
            f"{ms['mask']:.2f} ms, sampling {ms['sample']:.2f} ms.", ""]

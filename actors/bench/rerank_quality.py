"""The *quality* leg of the ``rerank`` workload: top-1 accuracy on the labelled set
(``llamactor.bench.rerank_set``) and each score against llama-cpp-python's P(yes) / (P(yes) + P(no))
on the same judging prompts (``baselines.label_scores_one_at_a_time``, each prompt alone), on both
bundled models.

Each labelled case is one rerank, one after another, flash attention on for both sides. In the
default configuration a document's rows share a step (and llama.cpp's tiled kernels) with the
others', and the reference computes each prompt in one physical batch of up to 512 rows: the two
differ by llama.cpp's own kernel choice (llama-cpp-python's scores of one prompt move by up to
0.04 between ``n_ubatch`` 32 and 512; docs/performance.md, "Rerank"). So the scores are compared a
second time with the same kernels on both sides (``exact``): our engine in batch-invariant mode,
the reference with its kernels (plain weights, 32-row batches), in a process of its own (tiled
matmuls off). ``judging_prompts``
gives the tokens ``LLM.rerank`` scores, for any yardstick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llamactor
from llamactor.base.models import default_model_path, instruct_model_path
from llamactor.base.rerank import RerankArgs
from llamactor.bench import baselines
from llamactor.bench.rerank_set import RERANK_SET, RerankCase
from llamactor.handles import rerank as rerank_handle

Labels = tuple[tuple[int, ...], tuple[int, ...]]


def judging_prompts(llm: llamactor.LLM, query: str, docs: Sequence[str]) -> tuple[list[list[int]], Labels]:
    """Each document's whole judging prompt, token for token what ``LLM.rerank`` scores (the
    handle's own ``rerank_prompt``: its shared context, then the document's continuation), and the
    yes/no label groups."""
    args = RerankArgs(query, tuple(docs), None, llm.config.rerank_max_tokens_per_doc, True, None)
    prompt = rerank_handle.rerank_prompt(llm, args).result(timeout=120)
    return [prompt.context + list(c) for c in prompt.continuations], prompt.labels


def _scores_in_order(llm: llamactor.LLM, case: RerankCase) -> list[float]:
    ranked = llm.rerank(case.query, list(case.documents)).results
    return [r.relevance_score for r in sorted(ranked, key=lambda r: r.index)]


def _scored(model_path: str, n_threads: int, cases: Sequence[RerankCase], **options: Any) -> tuple[list[list[float]], list[list[int]], Labels]:
    """Each case reranked on an engine started with ``options``, and the judging prompts it scored."""
    with llamactor.start(model_path, n_parallel=16, n_threads=n_threads, n_ctx=8192, flash_attn="on", **options) as llm:
        scores = [_scores_in_order(llm, case) for case in cases]
        built = [judging_prompts(llm, case.query, case.documents) for case in cases]
    return scores, [p for ps, _ in built for p in ps], built[0][1]


def one_model(model_path: str, n_threads: int, cases: Sequence[RerankCase], exact_cases: int) -> dict[str, Any]:
    """Top-1 hits, the largest |score - reference| in the default configuration, the nearest tie (the
    smallest gap between a case's best and second score: a drift larger than it can flip a top-1),
    and the largest |score - reference| of ``exact_cases`` cases in batch-invariant mode (``exact``)."""
    scores, prompts, labels = _scored(model_path, n_threads, cases)
    _, reference = baselines.label_scores_one_at_a_time(model_path, prompts, labels, n_threads, flash_attn=True)
    ours = [x for s in scores for x in s]
    return {"model": Path(model_path).name, "cases": len(cases),
            "top1": sum(max(range(len(s)), key=s.__getitem__) == c.answer for s, c in zip(scores, cases)),
            "max_score_diff": max(abs(a - b) for a, b in zip(ours, reference, strict=True)),
            "nearest_tie": min(sorted(s)[-1] - sorted(s)[-2] for s in scores),
            **({"exact_cases": exact_cases, "exact_max_score_diff": _exact_in_a_process(model_path, n_threads, exact_cases)}
               if exact_cases else {})}


def exact(model_path: str, n_threads: int, n_cases: int) -> float:
    """The largest |score - reference| when both sides compute the same thing: our engine in
    batch-invariant mode (each row by llama.cpp's one-row kernels, wherever it sits in a step) and
    llama-cpp-python with the same kernels (plain weights, 32-row batches), tiled matmuls off in
    this process (``GGML_CPU_TILED_MM=0``, read once per process)."""
    scores, prompts, labels = _scored(model_path, n_threads, RERANK_SET[:n_cases], batch_invariant=True)
    _, reference = baselines.label_scores_one_at_a_time(model_path, prompts, labels, n_threads, invariant=True)
    return max(abs(a - b) for a, b in zip([x for s in scores for x in s], reference, strict=True))


def _exact_in_a_process(model_path: str, n_threads: int, n_cases: int) -> float:
    env = {**os.environ, "GGML_CPU_TILED_MM": "0"}
    run = subprocess.run([sys.executable, "-m", "llamactor.bench.rerank_quality", model_path, str(n_threads),
                          str(n_cases)], capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"the exact rerank leg failed: {run.stderr[-2000:]}")
    return float(json.loads(run.stdout.splitlines()[-1]))


def both_models(model_path: str, n_threads: int, n_cases: int | None = None, exact_cases: int = 3) -> dict[str, Any]:
    """``one_model`` on the bench's model and on the other bundled one, by role."""
    cases = RERANK_SET[:n_cases]
    other = instruct_model_path() if Path(model_path) == Path(default_model_path()) else default_model_path()
    return {role: one_model(path, n_threads, cases, exact_cases) for role, path in (("bench", model_path), ("other", other))}


def summary(quality: dict[str, Any]) -> dict[str, float]:
    """The goals' figures over both models (pure): the lower top-1 share, the largest score drift in
    the default configuration and, where measured, in batch-invariant mode."""
    legs = list(quality.values())
    out = {"quality_top1_min": min(q["top1"] / q["cases"] for q in legs),
           "quality_max_score_diff": max(q["max_score_diff"] for q in legs)}
    if all("exact_max_score_diff" in q for q in legs):
        out["quality_exact_max_score_diff"] = max(q["exact_max_score_diff"] for q in legs)
    return out


def report_lines(quality: dict[str, Any]) -> list[str]:
    """One line per model: top-1 and the drift from llama-cpp-python."""
    return [f"Rerank quality, {q['model']}: top-1 {q['top1']}/{q['cases']}; scores vs llama-cpp-python's "
            f"P(yes) / (P(yes) + P(no)) on the same prompts at most {q['max_score_diff']:.2g} apart; nearest tie "
            f"{q['nearest_tie']:.4f}"
            + (f"; in batch-invariant mode against llama-cpp-python with the same kernels ({q['exact_cases']} cases) at most "
               f"{q['exact_max_score_diff']:.2g} apart." if "exact_max_score_diff" in q else ".") for q in quality.values()]


if __name__ == "__main__":
    model_arg, threads_arg, cases_arg = sys.argv[1:4]
    print(json.dumps(exact(model_arg, int(threads_arg), int(cases_arg))))

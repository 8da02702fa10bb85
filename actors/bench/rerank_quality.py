"""The *quality* leg of the ``rerank`` workload: top-1 accuracy on the labelled set
(``llamactor.bench.rerank_set``) and each score against llama-cpp-python's P(yes) / (P(yes) + P(no))
on the same judging prompts, on both bundled models.

Flash attention on for both sides (llama.cpp's one-row kernel is placement-independent:
docs/architecture.md, "Scoring prompts"), each labelled case one rerank, one after another (the
batch-invariant mode needs a process of its own: the ``batch_invariant`` workload); the reference scores each prompt alone
(``baselines.label_scores_one_at_a_time``). ``judging_prompts`` gives the tokens ``LLM.rerank``
scores, for any yardstick.
"""

from __future__ import annotations

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


def one_model(model_path: str, n_threads: int, cases: Sequence[RerankCase]) -> dict[str, Any]:
    """Top-1 hits, the largest |score - reference| and the nearest tie (the smallest gap between a
    case's best and second score: a drift larger than it can flip a top-1)."""
    with llamactor.start(model_path, n_parallel=16, n_threads=n_threads, n_ctx=8192, flash_attn="on") as llm:
        scores = [_scores_in_order(llm, case) for case in cases]
        built = [judging_prompts(llm, case.query, case.documents) for case in cases]
    _, reference = baselines.label_scores_one_at_a_time(model_path, [p for ps, _ in built for p in ps], built[0][1],
                                                       n_threads, flash_attn=True)
    ours = [x for s in scores for x in s]
    return {"model": Path(model_path).name, "cases": len(cases),
            "top1": sum(max(range(len(s)), key=s.__getitem__) == c.answer for s, c in zip(scores, cases)),
            "max_score_diff": max(abs(a - b) for a, b in zip(ours, reference, strict=True)),
            "nearest_tie": min(sorted(s)[-1] - sorted(s)[-2] for s in scores)}


def both_models(model_path: str, n_threads: int, n_cases: int | None = None) -> dict[str, Any]:
    """``one_model`` on the bench's model and on the other bundled one, by role."""
    cases = RERANK_SET[:n_cases]
    other = instruct_model_path() if Path(model_path) == Path(default_model_path()) else default_model_path()
    return {role: one_model(path, n_threads, cases) for role, path in (("bench", model_path), ("other", other))}


def summary(quality: dict[str, Any]) -> dict[str, float]:
    """The goals' figures over both models (pure): the lower top-1 share, the largest score drift."""
    legs = list(quality.values())
    return {"quality_top1_min": min(q["top1"] / q["cases"] for q in legs),
            "quality_max_score_diff": max(q["max_score_diff"] for q in legs)}


def report_lines(quality: dict[str, Any]) -> list[str]:
    """One line per model: top-1 and the drift from llama-cpp-python."""
    return [f"Rerank quality, {q['model']}: top-1 {q['top1']}/{q['cases']}; scores vs llama-cpp-python's "
            f"P(yes) / (P(yes) + P(no)) on the same prompts at most {q['max_score_diff']:.2g} apart; nearest tie "
            f"{q['nearest_tie']:.4f}." for q in quality.values()]

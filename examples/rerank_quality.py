"""Top-1 accuracy of ``llm.rerank`` on the labelled set (``llamactor.bench.rerank_set``) with both
bundled models, the built-in judging prompt or ``--rerank-template``-style TEMPLATE given as the
first argument (docs/performance.md, "Rerank quality").

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python examples/rerank_quality.py ["TEMPLATE with {query} {document}"]

Prints per model: top-1 hits of 20, the seconds the 20 reranks took one after another, and the
smallest gap between a best and a second score (how near the nearest tie is).
"""

from __future__ import annotations

import sys
import time

import llamactor
from llamactor.base.models import default_model_path, instruct_model_path
from llamactor.bench.rerank_set import RERANK_SET


def main(template: str | None) -> None:
    for name, path in (("Gemma 3 270M", default_model_path()), ("SmolLM2-135M-Instruct", instruct_model_path())):
        with llamactor.start(path, n_parallel=16, n_ctx=8192, rerank_template=template) as llm:
            started = time.perf_counter()
            results = [llm.rerank(case.query, list(case.documents)) for case in RERANK_SET]
            seconds = time.perf_counter() - started
        hits = sum(r.results[0].index == case.answer for r, case in zip(results, RERANK_SET, strict=True))
        gap = min(r.results[0].relevance_score - r.results[1].relevance_score for r in results)
        print(f"{name}: top-1 {hits}/{len(RERANK_SET)}, {seconds:.1f} s, nearest tie {gap:.4f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)

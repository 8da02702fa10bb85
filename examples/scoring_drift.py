"""lm-evaluation-harness against ``llamactor serve --flash-attn off`` on the tests' 24-choice task, each
choice's log-likelihood against llama-cpp-python's ``Llama(logits_all=True)`` on the same tokens
(docs/performance.md, "Scoring drift under lm-eval").

    RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 .venv/bin/python examples/scoring_drift.py 8 [serve options]

The first argument is lm-eval's ``num_concurrent``; the rest go to ``llamactor serve`` (e.g.
``--no-prefix-cache``). Prints each choice's |difference|, then the median, p95, max and how many
are equal (within 1e-4). ``price`` instead of a number: the bench's scoring questions from 8
callers in one process, a scored prompt attaching its cached prefix or computed whole, alternated.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from llamactor.base.models import default_model_path  # noqa: E402
from tests.support.daemon import API_KEY, MODEL_ID, start_daemon  # noqa: E402
from tests.support.scoring import EXACT, Reference, run_lm_eval  # noqa: E402


def price() -> None:
    import llamactor
    from llamactor.bench.scoring import _score_all, lm_eval_requests, questions
    from llamactor.scheduling.scheduler import Scheduler

    with llamactor.start(default_model_path(), n_parallel=16, n_threads=2, n_ctx=4096, flash_attn="off",
                         cache_ram_mib=0) as llm:
        for round_ in range(2):
            for attach in (True, False):
                Scheduler.scoring_attaches_kv = attach  # read at each admission
                requests = lm_eval_requests(llm, questions(8, seed=100 + 2 * round_ + attach))  # nothing cached
                before = llm.stats()
                seconds = _score_all(llm, requests)
                after = llm.stats()
                work = {k: after[k] - before[k] for k in ("prompt_tokens_computed", "prompt_rows_scored", "steps")}
                print(f"attach={attach} {len(requests) / seconds:.2f} requests/s {work}")


def main(num_concurrent: int, serve_options: list[str]) -> None:
    daemon = start_daemon("--n-parallel", "8", "--api-key", API_KEY, "--flash-attn", "off", *serve_options)

    def tokenize(text: str) -> list[int]:
        r = httpx.post(f"{daemon.url}/tokenize", json={"prompt": text, "add_special_tokens": False},
                       headers={"Authorization": f"Bearer {API_KEY}"})
        return list(r.json()["tokens"])

    try:
        docs = run_lm_eval(daemon.url, MODEL_ID, API_KEY, Path(tempfile.mkdtemp()), num_concurrent)
        ref, differences = Reference(default_model_path()), []
        for doc in docs:
            for i, arguments in enumerate(doc["arguments"].values()):
                # lm-eval's split: the whole text tokenized once, the continuation what follows the context
                whole = tokenize(arguments["arg_0"] + arguments["arg_1"])
                n_context = len(tokenize(arguments["arg_0"]))
                expected = sum(ref.logprobs(whole)[0][n_context - 1:])
                differences.append(abs(float(doc["resps"][i][0][0]) - expected))
                print(doc["doc_id"], i, f"{differences[-1]:.5f}")
    finally:
        daemon.stop()
    d = np.array(differences)
    print(f"num_concurrent={num_concurrent} {' '.join(serve_options)}: median {np.median(d):.4f} "
          f"p95 {np.percentile(d, 95):.3f} max {d.max():.3f} equal {(d <= EXACT).sum()}/{len(d)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["price"]:
        price()
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 8, sys.argv[2:])

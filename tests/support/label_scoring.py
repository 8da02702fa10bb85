"""Label scoring's test data -- a judging query and documents, as a reranker's prompt would hold
them -- and the in-process half of tests/tree/test_label_scoring.py's batch-invariant check, run
in a fresh process (ggml reads ``GGML_CPU_TILED_MM`` once per process: see
batch_invariant_worker.py): ``python -m tests.support.label_scoring MODEL_PATH`` prints one JSON
object, each document's label probabilities as ``n`` continuations sharing one cached prompt,
and alone on a tree without the prefix cache (floats round-trip through JSON exactly)."""

from __future__ import annotations

import json
import sys

import llamactor

QUERY = ("Judge whether the document answers the query. Answer only yes or no.\n"
         "Query: which animal says moo and gives milk on the farm?\n")
DOCS = [" The cow says moo and gives milk.", " Paris is the capital of France.", " Dogs bark at night.",
        " Milk comes from cows on farms.", " Rain falls from clouds.", " A cow is a farm animal.",
        " Farms grow wheat and corn.", " A duck quacks on the pond."]


def main(path: str) -> None:
    shared_tree = llamactor.start(path, n_ctx=4096, n_parallel=8, batch_invariant=True)
    alone_tree = llamactor.start(path, n_ctx=4096, n_parallel=2, batch_invariant=True, prefix_cache=False)
    try:
        def ids(text: str, bos: bool = False) -> list[int]:
            return list(shared_tree.tokenize(text, add_special=bos).token_ids)
        groups = [[ids(" yes")[0], ids(" Yes")[0]], [ids(" no")[0], ids(" No")[0]]]
        context, conts = ids(QUERY, bos=True), [ids(f"Document:{d}\nAnswer:") for d in DOCS]
        shared = [f.result(timeout=300) for f in shared_tree.submit(
            shared_tree.request(context, n=len(conts), continuations=conts, label_token_ids=groups))]
        alone = [alone_tree.submit(alone_tree.request(context + c, label_token_ids=groups))[0].result(timeout=300)
                 for c in conts]
        print(json.dumps({"cached_tokens": [c.usage.cached_tokens for c in shared],
                          "shared": [list(c.label_probs or ()) for c in shared],
                          "alone": [list(c.label_probs or ()) for c in alone]}))
    finally:
        shared_tree.close()
        alone_tree.close()


if __name__ == "__main__":
    main(sys.argv[1])

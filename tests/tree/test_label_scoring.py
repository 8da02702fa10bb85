"""Label requests (``label_token_ids``, what rerank asks the engine) on the real models: the last
prompt row's groups of token ids against llama-cpp-python's row for the same ids, the shared
prompt of ``n`` continuations computed once, fairness beside a chat, bad ids, a batcher crash.

Numerics (docs/architecture.md, "Scoring prompts"): computed whole and alone, a document's
probabilities equal llama-cpp-python's with flash attention off. On a cached shared prompt a
document's own tokens are computed in another decode shape than the reference's whole prompt,
and llama.cpp's CPU kernels sum in another order there: measured up to 0.04 (Gemma 3 270M) and
0.02 (SmolLM2 135M) in probability on the prompts below, some documents exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from llamactor.base.errors import InvalidRequestError

from tests.conftest import NotAMessage, batcher_ref
from tests.support.scoring import EXACT, Reference

QUERY = ("Judge whether the document answers the query. Answer only yes or no.\n"
         "Query: which animal says moo and gives milk on the farm?\n")
DOCS = [" The cow says moo and gives milk.", " Paris is the capital of France.", " Dogs bark at night.",
        " Milk comes from cows on farms.", " Rain falls from clouds.", " A cow is a farm animal.",
        " Farms grow wheat and corn.", " A duck quacks on the pond."]
SHARED_PREFIX_DRIFT = 0.06  # the measured drift above, with room: a wrong row or id moves it by far more


@pytest.fixture(scope="module", params=["model_path", "instruct_path"])
def model(request: pytest.FixtureRequest) -> Iterator[tuple[str, Reference]]:
    """Each bundled model, with llama-cpp-python on it (flash attention off, one prompt at a time)."""
    path = request.getfixturevalue(request.param)
    ref = Reference(path)
    yield path, ref
    ref.close()


def ids(llm: Any, text: str, bos: bool = False) -> list[int]:
    return list(llm.tokenize(text, add_special=bos).token_ids)


def yes_no_groups(llm: Any) -> list[list[int]]:
    """The single-token spellings of yes and of no in the model's vocabulary (rerank's groups)."""
    return [sorted({ids(llm, w)[0] for w in (f" {word}", f" {word.title()}", word) if len(ids(llm, w)) == 1})
            for word in ("yes", "no")]


def reference_probs(ref: Reference, tokens: Sequence[int], groups: list[list[int]]) -> list[float]:
    """The whole vocabulary's softmax at the last position, each group's probabilities summed,
    renormalized over the groups: the definition, computed another way than the engine's."""
    ref.llama.reset()
    ref.llama.eval(list(tokens))
    row = np.array(ref.llama.scores[len(tokens) - 1], dtype=np.float64)
    p = np.exp(row - row.max())
    mass = [p[g].sum() for g in groups]
    return [float(m / sum(mass)) for m in mass]


def documents(llm: Any) -> tuple[list[int], list[list[int]]]:
    return ids(llm, QUERY, bos=True), [ids(llm, f"Document:{d}\nAnswer:") for d in DOCS]


def test_a_prompt_read_alone_gives_llama_cpp_pythons_probabilities(start_llm: Any, model: tuple[str, Reference]) -> None:
    path, ref = model
    llm = start_llm(path, flash_attn="off", n_parallel=2, prefix_cache=False)  # each prompt computed whole
    groups = yes_no_groups(llm)
    assert all(groups) and len(groups[0]) >= 2
    context, conts = documents(llm)
    before = llm.stats()
    for cont in conts[:3]:
        [c] = [f.result(timeout=60) for f in llm.submit(llm.request(context + cont, label_token_ids=groups))]
        assert c.finish_reason == "length" and c.text == "" and c.token_ids == () and c.usage.completion_tokens == 0
        assert c.usage.prompt_tokens == len(context + cont) and c.prompt_logprobs is None
        expected = reference_probs(ref, context + cont, groups)
        assert max(abs(a - b) for a, b in zip(c.label_probs, expected)) <= EXACT
        assert sum(c.label_probs) == pytest.approx(1.0)
    assert llm.stats()["label_rows"] - before["label_rows"] == 3


def test_n_continuations_compute_the_shared_prompt_once(start_llm: Any, model: tuple[str, Reference]) -> None:
    path, ref = model
    llm = start_llm(path, flash_attn="off", n_parallel=8, n_ctx=4096)
    groups = yes_no_groups(llm)
    context, conts = documents(llm)
    before = llm.stats()
    done = [f.result(timeout=120) for f in llm.submit(llm.request(context, n=len(conts), continuations=conts,
                                                                   label_token_ids=groups))]
    after = llm.stats()
    assert [c.usage.prompt_tokens for c in done] == [len(context) + len(c) for c in conts]
    assert done[0].usage.cached_tokens == 0 and all(c.usage.cached_tokens >= len(context) for c in done[1:])
    computed = after["prompt_tokens_computed"] - before["prompt_tokens_computed"]
    assert computed == sum(c.usage.prompt_tokens - c.usage.cached_tokens for c in done)
    assert computed <= len(context) + sum(len(c) for c in conts)  # the shared prompt once, not per document
    assert after["label_rows"] - before["label_rows"] == len(conts)
    assert after["prompt_rows_scored"] == before["prompt_rows_scored"]  # no per-token rows
    drift = [abs(c.label_probs[0] - reference_probs(ref, context + cont, groups)[0]) for c, cont in zip(done, conts)]
    assert drift[0] <= EXACT  # the first computed its prompt whole, alone in its step
    assert max(drift) <= SHARED_PREFIX_DRIFT, drift

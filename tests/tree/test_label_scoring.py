"""Label requests (``label_token_ids``, what rerank asks the engine) on the real models: the last
prompt row's groups of token ids against llama-cpp-python's row for the same ids, the shared
prompt of ``n`` continuations computed once, fairness beside a chat, bad ids, a batcher crash.

Numerics (docs/architecture.md, "Scoring prompts"): alone in its step a document's probabilities
equal llama-cpp-python's -- computed whole with flash attention off, or on its attached prompt
with flash attention on. Beside other documents in one step llama.cpp's CPU kernels sum in
another order: measured up to 0.04 (Gemma 3 270M) and 0.02 (SmolLM2 135M) in probability on
the prompts below, some documents exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamactor.base.errors import InvalidRequestError
from llamactor.native import invariance
from llamactor.scheduling.prompt_scores import ScoreState
from llamactor.scheduling.sequence import Chunk, StepPlan
from llamactor.tree.output_rows import OutputRows, record_labels

from tests.support.label_scoring import DOCS, QUERY
from tests.support.scheduling import make_seq
from tests.support.scoring import EXACT, Reference

ROOT = Path(__file__).resolve().parents[2]
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


def test_with_flash_attention_a_document_on_the_attached_prompt_alone_in_its_step_is_exact(
        start_llm: Any, model: tuple[str, Reference]) -> None:
    # The attachment itself moves nothing here: flash attention's one-row kernel does not depend
    # on where the cells sit. What moves a document is its step's company (the next test).
    import llama_cpp

    path, _ = model
    llm = start_llm(path, flash_attn="on", n_parallel=2, n_ctx=4096)
    groups = yes_no_groups(llm)
    context, conts = documents(llm)
    ref = Reference.__new__(Reference)
    ref.llama = llama_cpp.Llama(path, n_ctx=2048, n_batch=512, logits_all=True, verbose=False, n_threads=2,
                                flash_attn=True)
    try:
        for i, cont in enumerate(conts[:4]):
            [c] = [f.result(timeout=60) for f in llm.submit(llm.request(context + cont, label_token_ids=groups))]
            assert i == 0 or c.usage.cached_tokens >= len(context)
            assert max(abs(a - b) for a, b in zip(c.label_probs, reference_probs(ref, context + cont, groups))) <= EXACT
    finally:
        ref.close()


def test_a_chat_is_read_at_the_answer_position_its_template_renders(start_llm: Any, model: tuple[str, Reference]) -> None:
    path, ref = model
    llm = start_llm(path, flash_attn="off", n_parallel=2, prefix_cache=False)
    groups = yes_no_groups(llm)
    messages = [{"role": "system", "content": "Answer only yes or no."},
                {"role": "user", "content": "Does a cow give milk?"}]
    [c] = [f.result(timeout=60) for f in llm.submit(llm.request(messages=messages, label_token_ids=groups))]
    rendered = list(llm.tokenize(messages).token_ids)  # the chat as the engine renders it, answer prompt included
    assert c.usage.prompt_tokens == len(rendered)
    assert max(abs(a - b) for a, b in zip(c.label_probs, reference_probs(ref, rendered, groups))) <= EXACT


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


def rerank_continuations(llm: Any, n: int) -> list[list[int]]:
    return [ids(llm, f"Document {i}:{DOCS[i % len(DOCS)]}\nAnswer:") for i in range(n)]


@pytest.mark.timeout(300)
def test_a_rerank_sized_label_request_lets_a_streaming_chat_through_long_before_it_ends(start_llm: Any) -> None:
    llm = start_llm(n_parallel=4, n_ctx=4096)
    groups = yes_no_groups(llm)
    context = ids(llm, QUERY, bos=True)
    futures = llm.submit(llm.request(context, n=64, continuations=rerank_continuations(llm, 64), label_token_ids=groups))
    futures[0].result(timeout=120)  # the rerank runs, every sequence taken by its documents
    stream = llm.stream("Once upon a time", max_tokens=12, temperature=0, ignore_eos=True)
    pieces = iter(stream)
    next(pieces)  # the chat's first piece
    # Label sequences are scoring work: a chat of their tenant is admitted at the next step (a
    # document preempted for it) instead of after the documents queued before it.
    assert sum(f.done() for f in futures) <= 32
    "".join(pieces)
    assert stream.completion.usage.completion_tokens == 12
    done = [f.result(timeout=240) for f in futures]
    assert all(c.label_probs is not None and 0.0 < c.label_probs[0] < 1.0 for c in done)


def test_a_label_id_outside_the_vocabulary_fails_that_request_alone_naming_the_parameter(start_llm: Any) -> None:
    llm = start_llm(n_parallel=4)
    other = llm.submit("The sky is", max_tokens=4, temperature=0, ignore_eos=True)
    bad = llm.submit(llm.request("Query: sky\nDocument:", n=2, continuations=[" blue", " red"],
                                 label_token_ids=[[1], [2, llm.info.n_vocab]]))
    for future in bad:
        with pytest.raises(InvalidRequestError, match=rf"label_token_ids holds {llm.info.n_vocab}") as caught:
            future.result(timeout=60)
        assert caught.value.details["param"] == "label_token_ids"
    assert other.result(timeout=60).usage.completion_tokens == 4
    with pytest.raises(InvalidRequestError, match="at least two groups"):  # and one group, on the caller's thread
        llm.request("Query", label_token_ids=[[1, 2]])


def test_label_requests_in_flight_when_the_batcher_crashes_start_over_and_answer(start_llm: Any) -> None:
    llm = start_llm(n_parallel=2, n_ctx=4096)
    groups = yes_no_groups(llm)
    context = ids(llm, QUERY, bos=True)
    futures = llm.submit(llm.request(context, n=32, continuations=rerank_continuations(llm, 32), label_token_ids=groups))
    futures[0].result(timeout=120)
    assert llm.inject_crash()
    done = [f.result(timeout=240) for f in futures]
    assert llm.stats()["restarts"] == 1
    # resumed from a checkpoint, a label sequence would have lost its groups and answered None
    assert all(c.label_probs is not None and c.finish_reason == "length" for c in done)


@pytest.mark.timeout(600)
def test_in_the_batch_invariant_mode_a_document_on_the_shared_prompt_gets_the_numbers_it_gets_alone(
        model_path: str) -> None:
    run = subprocess.run([sys.executable, "-m", "tests.support.label_scoring", model_path],
                         capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != invariance.TILED_MM_VAR})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["cached_tokens"][0] == 0 and min(out["cached_tokens"][1:]) > 20  # the prompt attached
    assert out["shared"] == out["alone"]  # bit for bit


@pytest.mark.pure
def test_output_rows_find_each_label_row_where_the_batch_flags_it() -> None:
    def seq(rid: str, n: int, seq_id: int, n_past: int, labels: bool = False, max_tokens: int = 8) -> Any:
        q = make_seq(0, tokens=list(range(100, 100 + n)), rid=rid, max_tokens=0 if labels else max_tokens)
        q.seq_id, q.n_past, q.prompt_only = seq_id, n_past, labels
        q.labels = ((1,), (2,)) if labels else ()
        return q
    decoding = seq("gen", 6, 0, 5)
    label_end = seq("doc", 9, 1, 4, labels=True)
    label_mid = seq("doc-mid", 30, 2, 0, labels=True)
    scored_label = seq("doc-scored", 8, 3, 0, labels=True)
    scored_label.scoring = ScoreState(start=5, n_prompt=8, n_top=1)  # rows 4..6, then its label row 7
    failed = seq("doc-failed", 5, 4, 2, labels=True)
    plan = StepPlan(chunks=[Chunk(label_end, 5), Chunk(decoding, 1), Chunk(label_mid, 10), Chunk(scored_label, 8, 4, 7),
                            Chunk(failed, 3)])
    wants = plan.rows()[3]
    flagged = [i for i, w in enumerate(wants) if w]  # batch entry of each output row, in order
    out = OutputRows.of(plan, frozenset({failed.seq_id}))
    ends = np.cumsum([c.n_tokens for c in plan.chunks]) - 1  # each chunk's last batch entry
    assert [(q.request_id, flagged[row]) for q, row in out.label_rows] == [("doc", ends[0]), ("doc-scored", ends[3])]
    assert [flagged[row] for row in out.sample_rows] == [ends[1]] and out.to_sample == [decoding]
    [(chunk, first)] = out.scored
    assert chunk.seq is scored_label and flagged[first:first + 3] == [ends[2] + 1 + 4 + i for i in range(3)]
    assert len(flagged) == 1 + 1 + 3 + 1 + 1  # the failed document's row is flagged, not read
    logits = np.zeros((len(flagged), 4), np.float32)
    logits[out.label_rows[0][1], 1] = np.log(3.0)
    assert record_labels(out.label_rows, logits) == 2
    assert label_end.label_probs == pytest.approx((0.75, 0.25)) and scored_label.label_probs == pytest.approx((0.5, 0.5))

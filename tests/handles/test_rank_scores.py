"""Ranking-head GGUFs served: ``Client.submit_rank_scores`` on a tiny random BERT reranker written
with ``gguf`` (``tests/support/rank_gguf.py``), checked against llama-cpp-python on the same file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import llamactor
from llamactor import InvalidRequestError
from llamactor.handles.rank_pairs import rank_pair_tokens

from tests.support.rank_gguf import (CLS, N_CTX_TRAIN, SEP, reference_outputs, reference_scores, vocab_tokenizer,
                                     write_qwen3_rank_gguf, write_rank_gguf)

QUERY = "what is the capital of france?"
DOCUMENTS = ["paris is the capital of france.", "the cat sat on the mat.", "a dog in paris, on a river",
             "the capital city of france is paris ."]


@pytest.fixture(scope="module")
def rank_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rank_gguf(tmp_path_factory.mktemp("rank") / "tiny-rank.gguf")


@pytest.fixture(scope="module")
def ranker(rank_path: Path) -> Iterator[llamactor.LLM]:
    handle = llamactor.start(str(rank_path), n_ctx=512, n_parallel=2, batch_timeout_ms=5)
    yield handle
    handle.close()


def _pairs(ranker: llamactor.LLM) -> list[list[int]]:
    tokenizer = vocab_tokenizer(ranker.info.model_path)
    return [rank_pair_tokens(tokenizer, None, QUERY, d, None, True) for d in DOCUMENTS]


def test_the_model_is_known_as_a_ranking_model_and_gets_no_generation_kv(ranker: llamactor.LLM) -> None:
    assert ranker.info.ranking
    assert ranker.info.rerank_template is None
    assert ranker.info.n_ctx < 512  # asked for 512 cells; it reads at most its 128 positions and never generates


def test_scores_equal_llama_cpp_pythons_for_the_same_file_and_tokens(ranker: llamactor.LLM, rank_path: Path) -> None:
    pairs = _pairs(ranker)
    assert all(p[0] == CLS and SEP in p for p in pairs)  # [CLS] q [SEP] d: a BERT pair as llama-server lays it
    scores = ranker.submit_rank_scores(pairs).result(60)
    np.testing.assert_allclose(scores, reference_scores(rank_path, pairs), rtol=0, atol=1e-5)
    assert all(0.0 < s < 1.0 for s in scores) and len(set(scores)) == len(scores)


def test_pairs_packed_in_one_step_score_as_they_do_one_at_a_time(ranker: llamactor.LLM) -> None:
    pairs = _pairs(ranker)
    steps = ranker.stats()["embedding_steps"]
    together = ranker.submit_rank_scores(pairs).result(60)
    assert ranker.stats()["embedding_steps"] == steps + 1  # all four in one llama_decode
    alone = [ranker.submit_rank_scores([p]).result(60)[0] for p in pairs]
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-6)


def test_a_generation_request_ends_with_a_typed_error_and_the_model_keeps_serving(ranker: llamactor.LLM) -> None:
    with pytest.raises(InvalidRequestError, match="ranking model"):
        ranker.ask("the cat sat", max_tokens=4, timeout=60)
    with pytest.raises(InvalidRequestError, match="ranking model"):
        ranker.chat([{"role": "user", "content": "the cat"}], max_tokens=4, timeout=60)
    assert len(ranker.submit_rank_scores(_pairs(ranker)[:2]).result(60)) == 2
    vectors = ranker.embed(["the cat sat", "paris is a city"], timeout=60).vectors  # embeddings work: mean pooling
    assert vectors.shape == (2, 16) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_pair_longer_than_the_encoders_positions_is_refused_before_it_is_queued(ranker: llamactor.LLM) -> None:
    too_long = [CLS] + [5] * N_CTX_TRAIN
    with pytest.raises(InvalidRequestError, match=f"positions for {N_CTX_TRAIN} tokens"):
        ranker.submit_rank_scores([[CLS, 5, SEP, 6], too_long]).result(60)
    assert ranker.stats()["embedding_waiting"] == 0
    assert len(ranker.submit_rank_scores([too_long[:N_CTX_TRAIN]]).result(60)) == 1  # exactly the limit fits


def test_inputs_that_are_not_token_lists_are_refused_on_the_callers_thread(ranker: llamactor.LLM) -> None:
    for bad in ([], "the cat", [[]], [["the"]], [[1, True]]):
        with pytest.raises(InvalidRequestError, match="inputs"):
            ranker.submit_rank_scores(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="token ids"):  # out of the vocabulary: the batcher's check
        ranker.submit_rank_scores([[CLS, 10_000]]).result(60)


def test_a_generative_model_refuses_rank_scores(llm: llamactor.LLM) -> None:
    assert not llm.info.ranking
    with pytest.raises(InvalidRequestError, match="no ranking head"):
        llm.submit_rank_scores([[2, 100, 200]]).result(60)


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[llamactor.LLM]:
    """The ranking model with a ``rerank`` template in its GGUF (and other weights)."""
    path = write_rank_gguf(tmp_path_factory.mktemp("rank") / "templated.gguf", template=TEMPLATE, seed=1)
    handle = llamactor.start(str(path), n_ctx=512, n_parallel=2, batch_timeout_ms=5)
    yield handle
    handle.close()


TEMPLATE = "[CLS] {query} [SEP] the {document} [SEP]"


def test_pairs_given_as_texts_are_laid_out_by_the_batcher_with_the_ggufs_template(templated: llamactor.LLM) -> None:
    assert templated.info.rerank_template == TEMPLATE
    vocab = vocab_tokenizer(templated.info.model_path)
    pairs = [rank_pair_tokens(vocab, TEMPLATE, QUERY, d, None, True) for d in DOCUMENTS]
    answer = templated.submit_rank_pairs(QUERY, DOCUMENTS).result(60)
    assert answer.scores == tuple(templated.submit_rank_scores(pairs).result(60))
    np.testing.assert_allclose(answer.scores, reference_scores(Path(templated.info.model_path), pairs), atol=1e-5)
    assert answer.prompt_tokens == sum(map(len, pairs))
    plain = templated.submit_rank_pairs(QUERY, DOCUMENTS, template="{query} [SEP] {document}").result(60)
    assert plain.scores != answer.scores  # an operator's template over the GGUF's


def test_a_long_document_is_cut_to_max_doc_tokens_or_refused(templated: llamactor.LLM) -> None:
    vocab = vocab_tokenizer(templated.info.model_path)
    cut = rank_pair_tokens(vocab, TEMPLATE, QUERY, DOCUMENTS[0], 3, True)
    assert templated.submit_rank_pairs(QUERY, DOCUMENTS[:1], max_doc_tokens=3).result(60).scores == \
        tuple(templated.submit_rank_scores([cut]).result(60))
    with pytest.raises(InvalidRequestError, match=r"documents\[[0-9]\] has .* more than the 3 .* .max_tokens_per_doc."):
        templated.submit_rank_pairs(QUERY, DOCUMENTS, max_doc_tokens=3, truncation=False).result(60)
    for bad in ({"query": "", "documents": ["d"]}, {"query": "q", "documents": []},
                {"query": "q", "documents": [3]}, {"query": "q", "documents": ["d"], "max_doc_tokens": 0}):
        with pytest.raises(InvalidRequestError):
            templated.submit_rank_pairs(**bad)  # type: ignore[arg-type]


def test_a_head_with_two_labels_scores_the_softmax_of_label_zero(tmp_path: Path) -> None:
    path = write_rank_gguf(tmp_path / "two-labels.gguf", labels=("yes", "no"), seed=2)
    pairs = [[CLS, 10, 11, SEP, 11, 13], [CLS, 16, SEP, 15, 17, 20, 21]]
    outputs = reference_outputs(path, pairs)
    assert outputs.shape == (2, 2)
    ranker = llamactor.start(str(path), n_ctx=512, n_parallel=1)
    try:
        scores = ranker.submit_rank_scores(pairs).result(60)
    finally:
        ranker.close()
    expected = np.exp(outputs[:, 0]) / np.exp(outputs).sum(axis=1)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-5)


def test_rank_tokens_count_against_a_tenants_token_rate(rank_path: Path) -> None:
    ranker = llamactor.start(str(rank_path), n_ctx=512, n_parallel=1,
                             tenants=[{"name": "metered", "tokens_per_minute": 40}])
    try:
        pair = [CLS, 10, 11, SEP, 11, 13, 14, 15, 16, 17]
        assert len(ranker.submit_rank_scores([pair, pair, pair], tenant="metered").result(60)) == 3  # 30 tokens
        with pytest.raises(llamactor.RateLimitError):
            ranker.submit_rank_scores([pair, pair], tenant="metered")
        assert len(ranker.submit_rank_scores([pair, pair]).result(60)) == 2  # another tenant's share is untouched
    finally:
        ranker.close()


def test_a_qwen3_reranker_head_gives_its_in_graph_softmax_as_it_is(tmp_path: Path) -> None:
    path = write_qwen3_rank_gguf(tmp_path / "qwen3-rank.gguf")
    vocab = vocab_tokenizer(path)
    template = "<|im_start|>user\n{query}\n{document}<|im_end|>\n<|im_start|>assistant\n"
    pairs = [rank_pair_tokens(vocab, template, "what is the cat?", d, None, True) for d in DOCUMENTS]
    outputs = reference_outputs(path, pairs)
    np.testing.assert_allclose(outputs.sum(axis=1), 1.0, atol=1e-6)  # llama.cpp's softmax over yes/no
    ranker = llamactor.start(str(path), n_ctx=512, n_parallel=1)
    try:
        assert ranker.info.ranking
        scores = ranker.submit_rank_scores(pairs).result(60)
    finally:
        ranker.close()
    np.testing.assert_allclose(scores, outputs[:, 0], rtol=0, atol=1e-5)  # not a softmax of the softmax

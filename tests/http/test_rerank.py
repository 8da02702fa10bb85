"""Rerank and score through the real daemon, as each client library sends and reads them: Cohere's
SDK (``Client``: v1, ``ClientV2``: v2), LlamaIndex's ``JinaRerank`` and ``CohereRerank``,
LangChain's ``CohereRerank`` and community ``JinaRerank``, Open WebUI's external reranker (its
request replayed), TEI's and vLLM's bodies and Ollama's ``/api/rerank`` with httpx. Each client
gets every document it asked for, best first, with probabilities in [0, 1] that agree across the
routes; and each refusal as that client's own exception: a 400 for a bad body, a 404 for an
unknown model -- never a 5xx, which LlamaIndex's ``CohereRerank`` would retry for minutes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
import requests
from langchain_cohere import CohereRerank as LangChainCohereRerank
from langchain_community.document_compressors import jina_rerank
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.postprocessor.cohere_rerank import CohereRerank
from llama_index.postprocessor.jinaai_rerank import JinaRerank

from llamactor.handles.rank_pairs import rank_pair_tokens

from tests.support.daemon import API_KEY, Daemon, metric, start_daemon
from tests.support.keys import write_keys_file
from tests.support.rerank_scores import assert_ranked, same_score
from tests.support.rank_gguf import reference_scores, vocab_tokenizer, write_rank_gguf

MODEL = "ranker"
MAX_DOCUMENTS = 8
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital and largest city of France.", "Bananas are a yellow fruit rich in potassium.",
        "The Eiffel Tower stands in Paris.", "Berlin is the capital of Germany."]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
METERED_KEY, TOKENS_PER_MINUTE = "sk-rerank-metered-01", 100_000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_path: str) -> Iterator[Daemon]:
    where = tmp_path_factory.mktemp("rerank")
    # a second model (never loaded): with one, any name finds it (as llama-server's does); with two,
    # an unknown one is a 404
    (where / "models.toml").write_text(f'[[models]]\nname = "{MODEL}"\npath = "{model_path}"\n'
                                       f"max_rerank_documents = {MAX_DOCUMENTS}\n"
                                       f'[[models]]\nname = "cold"\npath = "{model_path}"\npreload = false\n')
    keys = write_keys_file(where, {API_KEY: {"tenant": "ops", "admin": True},
                                   METERED_KEY: {"tenant": "metered", "tokens_per_minute": TOKENS_PER_MINUTE}})
    d = start_daemon("--config", str(where / "models.toml"), "--keys", str(keys), "--n-parallel", "4")
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def reference(daemon: Daemon) -> dict[int, float]:
    """Every document's score by index, from one plain Jina-shaped request."""
    r = httpx.post(f"{daemon.url}/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS},
                   headers=HEADERS, timeout=120)
    assert r.status_code == 200, r.text
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


def test_the_reference_scores_every_document_with_a_probability(reference: dict[int, float]) -> None:
    assert sorted(reference) == list(range(len(DOCS))) and all(0.0 <= s <= 1.0 for s in reference.values())


def test_cohere_v1_ranks_objects_by_their_rank_fields_and_returns_them(daemon: Daemon,
                                                                       reference: dict[int, float]) -> None:
    co = cohere.Client(api_key=API_KEY, base_url=daemon.url, timeout=120)
    docs: list[Any] = [DOCS[0], {"text": DOCS[1], "source": "fruit"}, DOCS[2], DOCS[3]]
    answer = co.rerank(model=MODEL, query=QUERY, documents=docs, top_n=2, return_documents=True)
    assert_ranked([(r.index, r.relevance_score) for r in answer.results], reference, 2)
    assert all(r.document is not None and r.document.text == DOCS[r.index] for r in answer.results)
    titled = co.rerank(model=MODEL, query=QUERY, documents=[{"title": "t", "text": d} for d in DOCS],
                       rank_fields=["title", "text"], max_chunks_per_doc=10)
    assert sorted(r.index for r in titled.results) == list(range(len(DOCS)))


def test_cohere_v2_gets_every_document_by_default_and_its_meta(daemon: Daemon, reference: dict[int, float]) -> None:
    co = cohere.ClientV2(api_key=API_KEY, base_url=daemon.url, timeout=120)
    answer = co.rerank(model=MODEL, query=QUERY, documents=DOCS, max_tokens_per_doc=512)
    assert_ranked([(r.index, r.relevance_score) for r in answer.results], reference, len(DOCS))
    assert answer.meta is not None and answer.meta.api_version.version == "2"
    assert answer.meta.billed_units.search_units == 1


def test_cohere_clients_see_a_bad_body_as_400_and_an_unknown_model_as_404(daemon: Daemon) -> None:
    co = cohere.ClientV2(api_key=API_KEY, base_url=daemon.url, timeout=120)
    with pytest.raises(cohere.BadRequestError):
        co.rerank(model=MODEL, query=QUERY, documents=[])
    with pytest.raises(cohere.BadRequestError, match="max_rerank_documents"):
        co.rerank(model=MODEL, query=QUERY, documents=["x"] * (MAX_DOCUMENTS + 1))
    with pytest.raises(cohere.BadRequestError, match="top_n"):
        co.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=-2)
    with pytest.raises(cohere.NotFoundError):
        co.rerank(model="no-such-model", query=QUERY, documents=DOCS)
    with pytest.raises(cohere.BadRequestError):  # v1: a string query is required
        cohere.Client(api_key=API_KEY, base_url=daemon.url).rerank(query="", documents=DOCS)


def test_llama_index_jina_and_cohere_postprocessors_keep_the_best_nodes(daemon: Daemon,
                                                                        reference: dict[int, float]) -> None:
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i))) for i, d in enumerate(DOCS)]
    for post in (JinaRerank(top_n=2, model=MODEL, base_url=f"{daemon.url}/v1", api_key=API_KEY),
                 CohereRerank(top_n=2, model=MODEL, api_key=API_KEY, base_url=daemon.url, max_retries=1)):
        kept = post.postprocess_nodes(nodes, query_str=QUERY)
        assert_ranked([(int(n.node.node_id), n.score or 0.0) for n in kept], reference, 2)
        assert all(n.node.get_content() == DOCS[int(n.node.node_id)] for n in kept)


def test_llama_index_jina_reads_the_detail_of_a_refusal(daemon: Daemon) -> None:
    post = JinaRerank(top_n=2, model="no-such-model", base_url=f"{daemon.url}/v1", api_key=API_KEY)
    with pytest.raises(RuntimeError, match="no-such-model"):
        post.postprocess_nodes([NodeWithScore(node=TextNode(text="a"))], query_str=QUERY)


def test_langchain_cohere_and_jina_compressors_score_the_documents(daemon: Daemon, reference: dict[int, float],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [Document(page_content=d, metadata={"i": i}) for i, d in enumerate(DOCS)]
    lc = LangChainCohereRerank(model=MODEL, cohere_api_key=API_KEY, base_url=daemon.url, top_n=3)
    assert_ranked([(x["index"], x["relevance_score"]) for x in lc.rerank(DOCS, QUERY)], reference, 3)
    kept = lc.compress_documents(docs, QUERY)
    assert_ranked([(d.metadata["i"], d.metadata["relevance_score"]) for d in kept], reference, 3)
    monkeypatch.setattr(jina_rerank, "JINA_API_URL", f"{daemon.url}/v1/rerank")
    jina = jina_rerank.JinaRerank(jina_api_key=API_KEY, model=MODEL, top_n=3)
    kept = jina.compress_documents(docs, QUERY)
    assert_ranked([(d.metadata["i"], d.metadata["relevance_score"]) for d in kept], reference, 3)
    with pytest.raises(RuntimeError, match="text"):  # dicts go through as they are: one without a text is a 400
        jina_rerank.JinaRerank(jina_api_key=API_KEY, model=MODEL).rerank([{"title": "no text"}], QUERY)


def test_open_webui_external_reranker_gets_a_score_for_every_document(daemon: Daemon,
                                                                      reference: dict[int, float]) -> None:
    """Open WebUI's ``ExternalReranker.predict``, replayed: sorted by index, one score per document."""
    payload = {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": len(DOCS)}
    r = requests.post(f"{daemon.url}/v1/rerank", json=payload, timeout=120,
                      headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    r.raise_for_status()
    scores = [x["relevance_score"] for x in sorted(r.json()["results"], key=lambda x: x["index"])]
    assert len(scores) == len(DOCS)
    assert all(same_score(s, reference[i]) for i, s in enumerate(scores))


def test_vllm_score_answers_pairs_in_order_and_refuses_a_mismatch(daemon: Daemon,
                                                                  reference: dict[int, float]) -> None:
    one_to_many = httpx.post(f"{daemon.url}/v1/score", json={"model": MODEL, "text_1": QUERY, "text_2": DOCS},
                             headers=HEADERS, timeout=120).json()
    assert [d["index"] for d in one_to_many["data"]] == list(range(len(DOCS)))
    assert all(same_score(d["score"], reference[d["index"]]) for d in one_to_many["data"])
    pairwise = httpx.post(f"{daemon.url}/score", json={"model": MODEL, "text_1": [QUERY, QUERY],
                                                       "text_2": DOCS[:2]}, headers=HEADERS, timeout=120).json()
    assert all(same_score(d["score"], reference[d["index"]]) for d in pairwise["data"])
    assert pairwise["usage"]["prompt_tokens"] > 0 and pairwise["object"] == "list"
    bad = httpx.post(f"{daemon.url}/v1/score", json={"model": MODEL, "text_1": [QUERY, QUERY], "text_2": DOCS},
                     headers=HEADERS, timeout=120)
    assert bad.status_code == 400 and "1:N" in bad.json()["detail"]


def test_tei_texts_get_teis_list_and_ollama_gets_its_shape(daemon: Daemon, reference: dict[int, float]) -> None:
    tei = httpx.post(f"{daemon.url}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True},
                     headers=HEADERS, timeout=120).json()
    assert isinstance(tei, list) and [set(x) for x in tei] == [{"index", "score", "text"}] * len(DOCS)
    assert all(same_score(x["score"], reference[x["index"]]) and x["text"] == DOCS[x["index"]] for x in tei)
    ollama = httpx.post(f"{daemon.url}/api/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS,
                                                          "top_n": 1}, headers=HEADERS, timeout=120).json()
    assert ollama["model"] == MODEL
    assert_ranked([(x["index"], x["relevance_score"]) for x in ollama["results"]], reference, 1)
    missing = httpx.post(f"{daemon.url}/api/rerank", json={"query": QUERY, "documents": DOCS}, headers=HEADERS)
    assert missing.status_code == 400 and missing.json() == {"error": "model is required",
                                                             "detail": "model is required"}


def test_a_document_too_long_without_truncation_is_a_400_and_cut_with_it(daemon: Daemon) -> None:
    long_doc = "Paris is the capital of France. " * 40
    body = {"model": MODEL, "query": QUERY, "documents": [long_doc], "max_tokens_per_doc": 16}
    refused = httpx.post(f"{daemon.url}/v1/rerank", json={**body, "truncation": False}, headers=HEADERS, timeout=120)
    assert refused.status_code == 400 and refused.json()["detail"]
    cut = httpx.post(f"{daemon.url}/v1/rerank", json=body, headers=HEADERS, timeout=120)
    full = httpx.post(f"{daemon.url}/v1/rerank", json={**body, "max_tokens_per_doc": 4096}, headers=HEADERS,
                      timeout=120)
    assert cut.status_code == 200 and full.status_code == 200
    assert cut.json()["usage"]["prompt_tokens"] < full.json()["usage"]["prompt_tokens"]


def test_a_tenants_rerank_is_charged_the_tokens_it_computed(daemon: Daemon) -> None:
    r = httpx.post(f"{daemon.url}/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS},
                   headers={"Authorization": f"Bearer {METERED_KEY}"}, timeout=120)
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == str(TOKENS_PER_MINUTE)
    used = r.json()["usage"]["prompt_tokens"]
    assert used > 0 and daemon.wait_for_log(lambda line: line.get("event") == "rate_limit_settled"
                                            and line.get("tenant") == "metered" and line.get("used") == used)


def test_a_rerank_counts_as_its_tenants_request_and_its_tokens_as_prompt_tokens(daemon: Daemon) -> None:
    def counted() -> list[float]:
        scraped = httpx.get(f"{daemon.url}/metrics", headers=HEADERS).text  # an admin's key
        by_dialect = r'llamactor_prompt_tokens_total\{dialect="%s",model="' + MODEL + r'"\}'
        return [metric(scraped, by_dialect % "rerank"), metric(scraped, by_dialect % "ollama"),
                metric(scraped, r'llamactor_tenant_prompt_tokens_total\{tenant="metered"\}'),
                metric(scraped, r'llamactor_tenant_prompt_tokens_total\{tenant="ops"\}'),
                metric(scraped, r'llamactor_tenant_requests_total\{tenant="metered"\}'),
                metric(scraped, r'llamactor_tenant_requests_total\{tenant="ops"\}')]
    before = counted()
    cohere_shaped = httpx.post(f"{daemon.url}/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS},
                               headers={"Authorization": f"Bearer {METERED_KEY}"}, timeout=120)
    ollama_shaped = httpx.post(f"{daemon.url}/api/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS[:2]},
                               headers=HEADERS, timeout=120)
    # vLLM's N:N score: two pairs, two reranks inside, one request of the tenant's
    pairs = httpx.post(f"{daemon.url}/v1/score", json={"model": MODEL, "text_1": [QUERY, QUERY], "text_2": DOCS[:2]},
                       headers={"Authorization": f"Bearer {METERED_KEY}"}, timeout=120)
    assert cohere_shaped.status_code == ollama_shaped.status_code == pairs.status_code == 200
    rerank_tokens, ollama_tokens = cohere_shaped.json()["usage"]["prompt_tokens"], ollama_shaped.json()["prompt_eval_count"]
    pair_tokens = pairs.json()["usage"]["prompt_tokens"]
    assert rerank_tokens > ollama_tokens > 0 and pair_tokens > 0
    assert [a - b for a, b in zip(counted(), before)] == [rerank_tokens + pair_tokens, ollama_tokens,
                                                         rerank_tokens + pair_tokens, ollama_tokens, 2, 1]


def test_a_client_that_disconnects_cancels_its_rerank(daemon: Daemon) -> None:
    long_docs = [f"Document {i}. " + "Paris is the capital of France and its largest city. " * 90
                 for i in range(MAX_DOCUMENTS)]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{daemon.url}/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": long_docs},
                   headers={**HEADERS, "X-Request-Id": "abandoned-rerank"}, timeout=httpx.Timeout(60, read=0.5))
    assert daemon.wait_for_log(lambda e: e.get("client_request_id") == "abandoned-rerank")  # logged once it ended
    line = next(e for e in daemon.events("http_request") if e.get("client_request_id") == "abandoned-rerank")
    assert line["status"] == 499
    # the batcher ends its work: a group being prepared (nothing else in this module is ever cancelled)
    # or one already running
    assert daemon.wait_for_log(lambda e: e.get("event") == "request_cancelled_in_preparation" or (
        e.get("event") == "request_finished" and str(e.get("request_id", "")).startswith(f"rerank-{line['request_id']}")
        and e.get("finish_reason") == "cancelled"))


@pytest.fixture(scope="module")
def ranking_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    path = write_rank_gguf(tmp_path_factory.mktemp("rank") / "tiny-rank.gguf")
    d = start_daemon("--model", str(path), "--n-parallel", "2")
    yield d, path
    assert d.stop() == 0


def test_a_ranking_head_gguf_answers_llama_server_clients_with_llama_cpp_pythons_scores(
        ranking_daemon: tuple[Daemon, Path]) -> None:
    """llama-server's own clients (a converted bge-reranker behind ``/rerank``): its Jina and TEI shapes."""
    daemon, path = ranking_daemon
    query, docs = "what is the capital of france?", ["the cat sat on the mat.", "paris is the capital of france.",
                                                     "a dog in paris."]
    tokenizer = vocab_tokenizer(path)
    expected = reference_scores(path, [rank_pair_tokens(tokenizer, None, query, d, None, True) for d in docs])
    tei = httpx.post(f"{daemon.url}/rerank", json={"query": query, "texts": docs}, timeout=60).json()
    assert [x["index"] for x in tei] == sorted(range(len(docs)), key=lambda i: -expected[i])
    np.testing.assert_allclose([x["score"] for x in sorted(tei, key=lambda x: x["index"])], expected, atol=1e-5)
    jina = httpx.post(f"{daemon.url}/v1/reranking", json={"model": "bge", "query": query, "documents": docs,
                                                         "top_n": 1}, timeout=60).json()
    assert [r["index"] for r in jina["results"]] == [int(np.argmax(expected))]
    [best] = jina["results"]
    assert jina["usage"]["prompt_tokens"] > 0 and best["document"]["text"] == docs[best["index"]]

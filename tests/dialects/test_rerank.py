"""The rerank dialect without a model: every body of the union as the clients send it (Cohere's
SDK sends null for what it was not given), each refusal a 400 naming its field before any model
is touched, vLLM's score pairings, and the answers read back by Cohere's own response parser."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from cohere.core.unchecked_base_model import construct_type
from cohere.types import RerankResponse
from cohere.v2.types import V2RerankResponse

from llamactor.base.errors import InvalidRequestError, ModelNotFoundError
from llamactor.dialects.errors import ErrorInfo
from llamactor.dialects.rerank.call import rerank_call, score_calls
from llamactor.dialects.rerank.replies import ollama_reply, rerank_reply, score_reply
from llamactor.dialects.rerank.schema import RerankBody, ScoreBody
from llamactor.http.errors import error_response

from tests.support.dialects import CTX

pytestmark = pytest.mark.pure
MAX = 1000


@dataclass(frozen=True)
class Result:
    index: int
    relevance_score: float


@dataclass(frozen=True)
class Ranking:
    results: tuple[Result, ...]
    prompt_tokens: int


def call_of(**body: Any) -> Any:
    return rerank_call(RerankBody.model_validate({"query": "q", **body}), MAX)


# -- what a body asks for -----------------------------------------------------------------------

def test_cohere_v1_objects_rank_their_text_or_their_rank_fields_and_come_back_whole() -> None:
    docs = [{"text": "a", "title": "t1"}, "b", {"title": "t3", "text": "c", "id": 7}]
    plain = call_of(documents=docs)
    assert plain.documents == ("a", "b", "c") and plain.echoed == ({"text": "a", "title": "t1"}, {"text": "b"}, docs[2])
    fields = call_of(documents=docs, rank_fields=["title", "text"])
    assert fields.documents == ("title: t1\ntext: a", "b", "title: t3\ntext: c")
    assert call_of(documents=[{"title": "only"}], rank_fields=["title"]).documents == ("only",)


def test_cohere_sends_null_for_what_it_was_not_given_and_that_means_the_defaults() -> None:
    nulls = dict.fromkeys(("model", "top_n", "return_documents", "max_tokens_per_doc", "max_chunks_per_doc",
                           "rank_fields", "priority", "truncation", "instruct"))
    call = call_of(documents=["a", "b"], **nulls)
    assert (call.top_n, call.return_documents, call.max_tokens_per_doc, call.truncation, call.instruction,
            call.ignored) == (None, True, None, True, None, [])


@pytest.mark.parametrize(("top_n", "kept"), [(None, None), (0, None), (2, 2), (3, None), (50, None)])
def test_top_n_null_zero_or_past_the_end_keeps_every_document(top_n: int | None, kept: int | None) -> None:
    assert call_of(documents=["a", "b", "c"], top_n=top_n).top_n == kept


def test_truncation_fields_of_each_client_map_to_one_flag_and_one_cap() -> None:
    assert call_of(documents=["a"], truncate=False).truncation is False  # TEI
    assert call_of(documents=["a"], max_tokens_per_doc=64, truncate_prompt_tokens=32).max_tokens_per_doc == 32
    assert call_of(documents=["a"], truncate_prompt_tokens=-1).max_tokens_per_doc is None
    assert call_of(documents=["a"], instruct="Find the answer").instruction == "Find the answer"
    assert call_of(documents=["a"], instruction="  ").instruction is None
    assert call_of(documents=["a"], priority="low").priority == 2


def test_fields_that_change_nothing_are_named_for_the_warning() -> None:
    call = call_of(documents=["a"], max_chunks_per_doc=10, relevant_spans={"mode": "enabled"}, surprise=1)
    assert call.ignored == ["max_chunks_per_doc", "relevant_spans", "surprise"]


@pytest.mark.parametrize(("body", "param"), [
    ({"query": " ", "documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["a"], "texts": ["a"]}, "documents"),
    ({"query": "q", "documents": [{"title": "x"}]}, "documents[0]"),
    ({"query": "q", "documents": ["a", {"text": 3}]}, "documents[1].text"),
    ({"query": "q", "documents": ["a"] * (MAX + 1)}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "truncation": True, "truncate": False}, "truncation"),
    ({"query": "q", "documents": ["a"], "truncation": False, "truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),
    ({"query": "q", "documents": ["a\ud800"]}, "documents[0]"),
])
def test_a_bad_body_is_a_400_naming_its_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        rerank_call(RerankBody.model_validate(body), MAX)
    assert e.value.http_status == 400 and (e.value.details.get("param") == param or param in str(e.value))


@pytest.mark.parametrize("body", [{"documents": ["a"]}, {"query": 3, "documents": ["a"]},
                                  {"query": "q", "documents": [1]}, {"query": "q", "documents": "a"},
                                  {"query": "q", "documents": ["a"], "top_n": True},
                                  {"query": "q", "documents": ["a"], "priority": 1.5}])
def test_a_body_of_the_wrong_types_is_refused_by_its_schema(body: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        RerankBody.model_validate(body)


def test_vllm_score_pairs_one_to_many_in_one_rerank_and_many_to_many_pairwise() -> None:
    [one] = score_calls(ScoreBody(text_1="q", text_2=["a", "b"]), MAX)
    assert (one.query, one.documents, one.top_n) == ("q", ("a", "b"), None)
    assert [(c.query, c.documents) for c in score_calls(ScoreBody(text_1=["q1", "q2"], text_2=["a", "b"]), MAX)] == [
        ("q1", ("a",)), ("q2", ("b",))]
    assert [c.query for c in score_calls(ScoreBody(queries="q", documents="a"), MAX)] == ["q"]
    for bad in (ScoreBody(text_1=["q1", "q2"], text_2=["a", "b", "c"]), ScoreBody(text_1=["q1", "q2"], text_2="a"),
                ScoreBody(text_1=[], text_2=["a"]), ScoreBody(text_1="q"), ScoreBody(),
                ScoreBody(text_1="q", text_2="a", data_1="q", data_2="a")):
        with pytest.raises(InvalidRequestError):
            score_calls(bad, MAX)


# -- the answers, as the clients read them ------------------------------------------------------

RANKING = Ranking((Result(1, 0.9), Result(0, 0.25)), prompt_tokens=42)


def test_the_superset_answer_parses_as_cohere_v1_and_v2_and_names_usage_as_jina_does() -> None:
    call = call_of(documents=["a", {"text": "b", "title": "t"}])
    body = json.loads(json.dumps(rerank_reply(call, RANKING, CTX, "2")))
    v1 = construct_type(type_=RerankResponse, object_=body)
    assert [(r.index, r.relevance_score, r.document.text) for r in v1.results] == [(1, 0.9, "b"), (0, 0.25, "a")]
    assert body["results"][0]["document"] == {"text": "b", "title": "t"}  # Cohere v1 keeps the object's fields
    v2 = construct_type(type_=V2RerankResponse, object_=body)
    assert v2.meta.api_version.version == "2" and v2.meta.billed_units.search_units == 1
    assert body["usage"] == {"prompt_tokens": 42, "total_tokens": 42} and body["object"] == "list"
    assert body["model"] == CTX.model and body["id"] == CTX.id("rerank-")
    bare = rerank_reply(call_of(documents=["a", "b"], return_documents=False), RANKING, CTX)
    assert [set(r) for r in bare["results"]] == [{"index", "relevance_score"}] * 2


def test_a_tei_body_gets_teis_bare_list_with_text_only_when_asked() -> None:
    assert rerank_reply(call_of(texts=["a", "b"]), RANKING, CTX) == [{"index": 1, "score": 0.9},
                                                                     {"index": 0, "score": 0.25}]
    with_text = rerank_reply(call_of(texts=["a", "b"], return_text=True), RANKING, CTX)
    assert [r["text"] for r in with_text] == ["b", "a"]


def test_vllm_scores_come_in_the_pairs_order_and_ollama_gets_the_jina_shape() -> None:
    calls = score_calls(ScoreBody(text_1="q", text_2=["a", "b"]), MAX)
    body = score_reply(calls, [RANKING], CTX)
    assert [(d["index"], d["score"], d["object"]) for d in body["data"]] == [(0, 0.25, "score"), (1, 0.9, "score")]
    assert body["usage"] == {"prompt_tokens": 42, "total_tokens": 42, "completion_tokens": 0}
    ollama = ollama_reply(call_of(documents=["a", "b"]), RANKING, "gemma3:270m")
    assert ollama["model"] == "gemma3:270m" and ollama["results"][0] == {"index": 1, "relevance_score": 0.9,
                                                                         "document": {"text": "b"}}


def test_rerank_errors_carry_detail_beside_the_dialects_own_shape() -> None:
    error = ErrorInfo.of(InvalidRequestError("top_n must be a positive integer"))
    for path in ("/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score"):
        body = json.loads(error_response(path, error).body)
        assert body["detail"] == "top_n must be a positive integer" and body["error"]["type"] == "invalid_request_error"
    ollama = json.loads(error_response("/api/rerank", ErrorInfo.of(ModelNotFoundError("no such model"))).body)
    assert ollama == {"error": "no such model", "detail": "no such model"}
    assert "detail" not in json.loads(error_response("/v1/chat/completions", error).body)

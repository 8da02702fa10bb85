"""A rerank's arguments are checked on the caller's thread, each refusal naming the argument at
fault; results are ranked by score, ties by index, cut to ``top_n``."""

from __future__ import annotations

from typing import Any

import pytest

from llamactor.base.config import Config
from llamactor.base.errors import InvalidRequestError
from llamactor.base.rerank import RerankArgs, Reranking, ranked

pytestmark = pytest.mark.pure


def check(query: Any = "q", documents: Any = ("a", "b"), **options: Any) -> RerankArgs:
    options = {"top_n": None, "max_tokens_per_doc": 16, "truncation": True, "instruction": None,
               "max_documents": 3, **options}
    return RerankArgs.check(query, documents, **options)


@pytest.mark.parametrize(("query", "documents", "options", "param"), [
    ("", ["a"], {}, "query"),
    ("   ", ["a"], {}, "query"),
    (None, ["a"], {}, "query"),
    ("q", [], {}, "documents"),
    ("q", "a single string", {}, "documents"),
    ("q", None, {}, "documents"),
    ("q", ["a", "b", "c", "d"], {}, "documents"),  # more than max_documents
    ("q", ["a", 3], {}, "documents[1]"),
    ("q", ["a", {"text": "b"}], {}, "documents[1]"),
    ("q", ["a"], {"top_n": 0}, "top_n"),
    ("q", ["a"], {"top_n": -1}, "top_n"),
    ("q", ["a"], {"top_n": 1.5}, "top_n"),
    ("q", ["a"], {"top_n": True}, "top_n"),
    ("q", ["a"], {"max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ("q", ["a"], {"truncation": "yes"}, "truncation"),
    ("q", ["a"], {"instruction": ""}, "instruction"),
    ("q", ["a"], {"instruction": 5}, "instruction"),
])
def test_each_bad_argument_is_refused_naming_it(query: Any, documents: Any, options: dict[str, Any],
                                                param: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        check(query, documents, **options)
    assert e.value.details["param"] == param


def test_a_lone_surrogate_in_a_document_is_refused_where_it_is() -> None:
    with pytest.raises(InvalidRequestError, match=r"documents\[1\]"):
        check(documents=["fine", "broken \ud800"])


def test_good_arguments_pass_as_given() -> None:
    args = check(documents=["a", "b", "c"], top_n=2, instruction="find")
    assert args.documents == ("a", "b", "c") and args.top_n == 2 and args.instruction == "find"


def test_results_are_by_score_descending_ties_by_index_cut_to_top_n() -> None:
    docs = ["a", "b", "c", "d"]
    results = ranked(docs, [0.2, 0.9, 0.2, 0.5], None)
    assert [r.index for r in results] == [1, 3, 0, 2]
    assert [(r.index, r.document) for r in ranked(docs, [0.2, 0.9, 0.2, 0.5], 2)] == [(1, "b"), (3, "d")]
    assert len(ranked(docs, [0.1] * 4, 10)) == 4
    body = Reranking(results, 7, "m").to_dict()
    assert body["results"][0] == {"index": 1, "relevance_score": 0.9, "document": "b"} and body["prompt_tokens"] == 7


@pytest.mark.parametrize("options", [{"max_rerank_documents": 0}, {"rerank_max_tokens_per_doc": 0},
                                     {"rerank_template": "no slots"}, {"rerank_template": "{query} only"}])
def test_config_refuses_bad_rerank_options(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        Config(**options)

"""``llamactor rerank``: documents from a file or stdin, ranked as a table or JSON (CliRunner)."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from llamactor.base.rerank import Reranking, RerankResult
from llamactor.cli.commands import main
from llamactor.cli.rerank import read_documents, table

DOCUMENTS = ["France is famous for its wine and cheese.", "Paris is the capital of France.",
             "A capital letter starts every sentence."]


@pytest.mark.pure
def test_documents_are_the_non_empty_lines() -> None:
    assert read_documents(io.StringIO("one\n\n  \ntwo\r\nthree")) == ["one", "two", "three"]


@pytest.mark.pure
def test_the_table_has_index_score_and_document_best_first() -> None:
    text = table(Reranking((RerankResult(12, 0.93456, "x" * 100), RerankResult(3, 0.1, "short")), 40), width=20)
    lines = text.splitlines()
    assert lines[0].split() == ["INDEX", "SCORE", "DOCUMENT"]
    assert lines[1].split() == ["12", "0.9346", "x" * 19 + "…"] and lines[2].split() == ["3", "0.1000", "short"]


@pytest.mark.pure
def test_no_documents_is_a_usage_error_before_any_model_loads() -> None:
    result = CliRunner().invoke(main, ["rerank", "a query"], input="\n\n")
    assert result.exit_code == 2 and "no documents" in result.output


def test_rerank_reads_stdin_or_a_file_and_prints_json_or_a_table(instruct_path: str, tmp_path) -> None:
    runner = CliRunner()
    piped = runner.invoke(main, ["rerank", "What is the capital of France?", "--model", instruct_path, "--json",
                                 "--n-ctx", "2048"], input="\n".join(DOCUMENTS) + "\n")
    assert piped.exit_code == 0, piped.output
    data = json.loads(piped.output)
    assert sorted(r["index"] for r in data["results"]) == [0, 1, 2] and data["prompt_tokens"] > 0
    assert all(0.0 <= r["relevance_score"] <= 1.0 and r["document"] == DOCUMENTS[r["index"]] for r in data["results"])
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(DOCUMENTS))
    best = runner.invoke(main, ["rerank", "What is the capital of France?", str(path), "--model", instruct_path,
                                "--top-n", "1", "--n-ctx", "2048"])
    assert best.exit_code == 0, best.output
    lines = best.output.strip().splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == str(data["results"][0]["index"])


def test_a_document_over_the_cap_without_truncation_is_a_one_line_error(instruct_path: str) -> None:
    result = CliRunner().invoke(main, ["rerank", "q", "--model", instruct_path, "--max-tokens-per-doc", "2",
                                       "--no-truncation", "--n-ctx", "2048"], input="a much longer document\n")
    assert result.exit_code == 1 and "InvalidRequestError" in result.output and "documents[0]" in result.output

"""``llamactor rerank QUERY [DOCUMENTS]``: the documents (one per line of the file, or of stdin)
ranked by their relevance to QUERY (``Client.rerank``), as a table or JSON.

    printf 'Paris is the capital of France.\\nFrance is famous for cheese.\\n' | \\
        llamactor rerank "What is the capital of France?" --model smol.gguf --top-n 1

Empty lines are skipped; a result's index counts the documents read, not the file's lines.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import click

import llamactor
from llamactor.base.errors import LlamactorError
from llamactor.base.rerank import Reranking
from llamactor.cli.options import engine_options, tree_options


def read_documents(stream: TextIO) -> list[str]:
    """The stream's non-empty lines, without their line ends."""
    return [line.rstrip("\r\n") for line in stream if line.strip()]


def table(reranking: Reranking, width: int = 80) -> str:
    """``INDEX  SCORE  DOCUMENT`` rows, best first; a document longer than ``width`` ends in "…"."""
    rows = [(str(r.index), f"{r.relevance_score:.4f}",
             r.document if len(r.document) <= width else r.document[:width - 1] + "…") for r in reranking.results]
    index_width = max([len("INDEX"), *(len(i) for i, _, _ in rows)])
    lines = [f"{'INDEX'.ljust(index_width)}  SCORE   DOCUMENT"]
    lines += [f"{i.ljust(index_width)}  {score}  {doc}" for i, score, doc in rows]
    return "\n".join(lines)


@click.command()
@click.argument("query")
@click.argument("documents", type=click.File("r", encoding="utf-8"), default="-")
@click.option("--top-n", type=click.IntRange(1), default=None, help="Print only the best N (default: all).")
@click.option("--max-tokens-per-doc", type=click.IntRange(1), default=None,
              help="A document's tokens at most (default: --rerank-max-tokens-per-doc).")
@click.option("--truncation/--no-truncation", default=True, show_default=True,
              help="Cut a longer document (else it is an error).")
@click.option("--instruction", default=None, help="The task the judge is told (default: web search relevance).")
@click.option("--json", "as_json", is_flag=True, help="Print the results, token count and model as JSON.")
@engine_options
def rerank(query: str, documents: TextIO, top_n: int | None, max_tokens_per_doc: int | None, truncation: bool,
           instruction: str | None, as_json: bool, **opts: Any) -> None:
    """Rank DOCUMENTS (a file, one document per line; '-' or none: stdin) by relevance to QUERY."""
    docs = read_documents(documents)
    if not docs:
        raise click.UsageError("no documents: give a file with one document per line, or pipe them in")
    try:
        with llamactor.start(**tree_options(opts)) as llm:
            result = llm.rerank(query, docs, top_n=top_n, max_tokens_per_doc=max_tokens_per_doc,
                                truncation=truncation, instruction=instruction)
    except LlamactorError as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    click.echo(json.dumps(result.to_dict(), ensure_ascii=False) if as_json else table(result))


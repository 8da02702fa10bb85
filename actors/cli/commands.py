"""The ``llamactor`` command: ``chat`` (REPL), ``ask``, ``serve``, ``batch``, ``models``, ``rerank``, ``info``, ``bench``.

The engine and sampling options are generated from ``Config`` and ``SamplingParams``
(``llamactor.cli.options``), so ``--help`` shows the library's own defaults. Every option can
also come from an environment variable (``LLAMACTOR_MODEL``, ``LLAMACTOR_N_PARALLEL``, ...) or a
TOML file given with ``--config`` (keys are the option names with underscores; unknown keys are
refused); the command line wins over the environment, which wins over the file, which wins over
the library's default. Logging is configured here, once, for the whole process (the CLI is its
entry point; the library itself never configures logging).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import llamactor
from llamactor.base import logging as llamactor_logging
from llamactor.base.sampling_defaults import described, sources
from llamactor.cli.options import engine_options, sampling_options, tree_options
from llamactor.cli.batch import batch
from llamactor.cli.models import models
from llamactor.cli.rerank import rerank
from llamactor.cli.serve import serve
from llamactor.cli.top import top
from llamactor.base.errors import LlamactorError


def start_tree(opts: dict[str, Any], quiet: bool = False, default_model: str | None = None) -> llamactor.LLM:
    """Configure logging, then start the actor tree from the engine options in ``opts``
    (``default_model``: the GGUF when neither ``--model``, ``$LLAMACTOR_MODEL`` nor a config file names one)."""
    opts = tree_options(opts)  # sampling options among them become the tree's defaults
    if default_model is not None and not opts.get("model"):
        opts["model"] = default_model
    status = contextlib.nullcontext() if quiet else _Status(
        f"loading {opts.get('model') or 'the default model (Gemma 3 270M)'} …")
    with status:
        return llamactor.start(**opts)


class _Status:
    """A one-line status on stderr while something slow happens (only on a terminal)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tty = sys.stderr.isatty()

    def __enter__(self) -> None:
        if self.tty:
            click.echo(f"⠿ {self.text}", err=True, nl=False)

    def __exit__(self, *exc: object) -> None:
        if self.tty:
            click.echo("\r\033[K", err=True, nl=False)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LlamactorError as e:
            raise click.ClickException(f"{type(e).__name__}: {e}") from e
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="llamactor")
def main() -> None:
    """Serve one local GGUF model to many concurrent callers with batched llama.cpp decodes."""


@main.command()
@engine_options
@sampling_options
@handle_errors
def chat(**opts: Any) -> None:
    """Interactive chat (REPL) with streaming answers. /help lists the commands.

    Without --model it opens SmolLM2-135M-Instruct, the instruct model installed with llamactor:
    the base Gemma 3 270M rarely answers a plain question at the default sampling (README, Models)."""
    from llamactor.base.models import instruct_model_path
    from llamactor.cli.repl import Repl

    Repl(start_tree(opts, default_model=instruct_model_path())).run()


@main.command()
@click.argument("prompt")
@click.option("--json", "as_json", is_flag=True, help="Print the whole Completion as JSON.")
@click.option("--chat/--raw", "as_chat", default=False, help="Apply the chat template (default: raw completion).")
@click.option("--prediction-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Text the answer is expected to repeat (a file being edited): drafted from and verified, "
                   "the answer unchanged (--json shows the usage's accepted/rejected_prediction_tokens).")
@engine_options
@sampling_options
@handle_errors
def ask(prompt: str, as_json: bool, as_chat: bool, prediction_file: Path | None, **opts: Any) -> None:
    """One completion of PROMPT to stdout, streamed ('-' reads the prompt from stdin)."""
    if prompt == "-":
        prompt = sys.stdin.read()
    per_request = {"prediction": prediction_file.read_text(encoding="utf-8")} if prediction_file else {}
    with start_tree(opts, quiet=True) as llm:
        stream = (llm.stream_chat([{"role": "user", "content": prompt}], **per_request) if as_chat
                  else llm.stream(prompt, **per_request))
        if as_json:
            list(stream)
            click.echo(json.dumps(stream.completion.to_dict(), ensure_ascii=False))
            return
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()


@main.command()
@engine_options
@sampling_options  # unused here, but a --config file shared with chat/ask may set them
@handle_errors
def info(**opts: Any) -> None:
    """Model metadata, context sizes, the chat template and the default sampling in use, as JSON."""
    with start_tree(opts, quiet=True) as llm:
        data = dataclasses.asdict(llm.info)
        data["metadata"] = {k: v for k, v in data["metadata"].items() if len(v) < 200}  # not the vocab arrays
        cache = llm.stats().get("prefix_cache", {})
        data["n_parallel"] = llm.config.n_parallel
        # what a request that sets none gets, and from where: the options, the GGUF, llamactor
        data["sampling"] = described(llm.sampling_defaults(), sources(llm.config.sampling, llm.info.gguf_sampling))
        data["loras"] = [{"id": i, "name": name, "path": path} for i, (name, path) in enumerate(llm.config.loras)]
        data["prefix_cache"] = {"enabled": llm.config.prefix_cache, "max_cells": llm.config.prefix_cache_cells,
                                "rent": llm.config.cell_rent,
                                "max_entries": cache.get("max_entries"), "pinned_cells": cache.get("pinned_cells")}
        click.echo(json.dumps(data, indent=2))


@main.command()
@click.option("--quick", is_flag=True, help="A smoke run (under 3 minutes on 2 cores): a few workloads at small "
              "sizes, one repeat; with --only, those workloads at the small sizes.")
@click.option("--full", is_flag=True, help="The default run and the uniform workload at concurrencies 32 and 64.")
@click.option("--model", envvar="LLAMACTOR_MODEL")
@click.option("--n-threads", type=int, default=None)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-results", show_default=True)
@click.option("--docs", is_flag=True, help="Also write the table and plot into docs/performance.md.")
@click.option("--only", default=None, help="Comma-separated workloads, e.g. multiturn,few_shot (default: all).")
@click.option("--peer-server", envvar="LLAMACTOR_PEER_SERVER", type=click.Path(exists=True, dir_okay=False),
              default=None, help="A llama-server binary: also compare multi-turn chat and streams against it.")
@click.option("--n-gpu-layers", envvar="LLAMACTOR_N_GPU_LAYERS", type=int, default=None,
              help="Layers offloaded to the GPU in the uniform, host, kept_cells and streams workloads, by llamactor, "
              "its yardsticks and llama-server alike (default: Config's).")
@click.option("--frontend-processes", "frontend_processes", default="1,2", show_default=True,
              help="host_cap's split legs: comma-separated counts of front-end processes (1: http_fp, sse_fp; "
              "N: http_fpN, sse_fpN), e.g. 1,4 on a host with the cores for them.")
def bench(quick: bool, full: bool, model: str | None, n_threads: int | None, out_dir: str, docs: bool,
          only: str | None, peer_server: str | None, n_gpu_layers: int | None, frontend_processes: str) -> None:
    """Measure llamactor against sequential create_completion and the raw batched-decode ceiling."""
    from llamactor.bench import report, suite
    from llamactor.base.config import default_n_threads
    from llamactor.base.models import resolve_model_path
    from llamactor.native.devices import default_n_gpu_layers  # every layer on a GPU build, as Config's default

    if quick and full:
        raise click.BadParameter("a run is either --quick or --full", param_hint="--full")
    llamactor_logging.configure("auto", "warning")
    settings = suite.BenchSettings(model_path=resolve_model_path(model), quick=quick, full=full,
                                       n_threads=n_threads or default_n_threads(), peer_server=peer_server,
                                       n_gpu_layers=default_n_gpu_layers() if n_gpu_layers is None else n_gpu_layers,
                                       frontend_processes=front_end_counts(frontend_processes))
    names = only.split(",") if only else None
    unknown = set(names or ()) - set(suite.workloads(settings))
    if unknown:
        raise click.BadParameter(f"unknown workload(s) {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(suite.workloads(settings))}", param_hint="--only")
    if docs and names:
        raise click.BadParameter("--docs records a whole run; leave out --only", param_hint="--docs")
    with click.progressbar(length=suite.n_ticks(settings, names), label="benchmarking", file=sys.stderr) as bar:
        results = suite.run(settings, lambda: bar.update(1), names)
    meta = {"quick": quick, "full": full, "n_threads": settings.n_threads, "max_tokens": settings.max_tokens,
            "repeats": settings.repeats, "n_ctx": settings.n_ctx, "peer_server": peer_server,
            "n_gpu_layers": settings.n_gpu_layers, "seconds": settings.seconds}
    path, table = report.write(results, meta, Path(settings.model_path).name, Path(out_dir))
    click.echo(table)
    click.echo(report.seconds_line(settings.seconds))
    click.echo(f"results: {path}")
    if failed := suite.failures(results):
        raise click.ClickException("workload(s) failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    if docs:
        report.update_docs(table, path.with_suffix(".png"), Path("docs"))


main.add_command(serve)
main.add_command(batch)
main.add_command(models)
main.add_command(top)
main.add_command(rerank)

def front_end_counts(text: str) -> tuple[int, ...]:
    """``--frontend-processes 1,4``'s counts, each 1 to 64 (``Config.frontend_processes``'s bound)."""
    from llamactor.base.config import MAX_FRONTEND_PROCESSES

    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or not all(1 <= c <= MAX_FRONTEND_PROCESSES for c in counts):
        raise click.BadParameter(f"comma-separated counts from 1 to {MAX_FRONTEND_PROCESSES}, got {text!r}",
                                 param_hint="--frontend-processes")
    return tuple(dict.fromkeys(counts))


if __name__ == "__main__":
    main()

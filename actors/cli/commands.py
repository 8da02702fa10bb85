"""The ``llamactor`` command: ``chat`` (REPL), ``ask``, ``serve``, ``info``, ``bench``.

Every option can also come from an environment variable (``LLAMACTOR_MODEL``,
``LLAMACTOR_N_PARALLEL``, ...) or a TOML file given with ``--config`` (keys are the option names
with underscores); the command line wins over the environment, which wins over the file.
Logging is configured here, once, for the whole process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import llamactor
from llamactor import logging as llamactor_logging
from llamactor.errors import LlamactorError


def _load_config_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value:
        try:
            data = tomllib.loads(Path(value).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise click.BadParameter(str(e)) from e
        ctx.default_map = {**(ctx.default_map or {}), **{k.replace("-", "_"): v for k, v in data.items()}}
    return value


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options that shape the actor tree, shared by every subcommand that starts one."""
    options = [
        click.option("--config", type=click.Path(exists=True, dir_okay=False), is_eager=True, expose_value=False,
                     callback=_load_config_file, help="TOML file of option defaults."),
        click.option("--model", envvar="LLAMACTOR_MODEL", help="GGUF file (default: Gemma 3 270M Q4_K_M)."),
        click.option("--n-parallel", envvar="LLAMACTOR_N_PARALLEL", type=int, default=8, show_default=True,
                     help="Sequences decoded together."),
        click.option("--n-ctx", envvar="LLAMACTOR_N_CTX", type=int, default=8192, show_default=True,
                     help="KV cache cells shared by all sequences."),
        click.option("--n-threads", envvar="LLAMACTOR_N_THREADS", type=int, default=None, help="CPU threads."),
        click.option("--n-gpu-layers", envvar="LLAMACTOR_N_GPU_LAYERS", type=int, default=0, show_default=True),
        click.option("--batch-timeout-ms", envvar="LLAMACTOR_BATCH_TIMEOUT_MS", type=float, default=20.0,
                     show_default=True, help="How long a lone request waits for company."),
        click.option("--max-queue", envvar="LLAMACTOR_MAX_QUEUE", type=int, default=256, show_default=True),
        click.option("--system", "system_prompt", envvar="LLAMACTOR_SYSTEM_PROMPT", default=None,
                     help="System prompt shared by every request (its KV is computed once)."),
        click.option("--prefix-cache/--no-prefix-cache", envvar="LLAMACTOR_PREFIX_CACHE", default=True,
                     show_default=True, help="Keep finished requests' KV so later requests reuse shared prefixes."),
        click.option("--prefix-cache-cells", envvar="LLAMACTOR_PREFIX_CACHE_CELLS", type=int, default=None,
                     help="Most KV cells cached prefixes may hold (default: whatever running requests leave)."),
        click.option("--chat-template", "chat_template_file", envvar="LLAMACTOR_CHAT_TEMPLATE", default=None,
                     type=click.Path(exists=True, dir_okay=False),
                     help="A Jinja chat template file, used instead of the GGUF's (or the plain transcript)."),
        click.option("--schedule-policy", envvar="LLAMACTOR_SCHEDULE_POLICY", default="priority", show_default=True,
                     type=click.Choice(["fcfs", "priority", "lpm"]),
                     help="Admission order: by arrival, by priority with aging, or longest cached prefix first."),
        click.option("--priority-aging", "priority_aging_per_s", envvar="LLAMACTOR_PRIORITY_AGING", type=float,
                     default=0.1, show_default=True, help="Priority levels a waiting request gains per second."),
        click.option("--watchdog-timeout", "watchdog_timeout_s", envvar="LLAMACTOR_WATCHDOG_TIMEOUT", type=float,
                     default=60.0, show_default=True,
                     help="Abort a decode step running longer (seconds) and restart the batcher; 0: off."),
        click.option("--embedding-n-batch", "embedding_n_batch", envvar="LLAMACTOR_EMBEDDING_N_BATCH", type=int,
                     default=512, show_default=True, help="Tokens per embedding step, and the longest embedding input."),
        click.option("--embedding-time-share", "embedding_time_share", envvar="LLAMACTOR_EMBEDDING_TIME_SHARE",
                     type=float, default=0.10, show_default=True,
                     help="Most decode time embedding steps take while generation also waits."),
        click.option("--log-format", envvar="LLAMACTOR_LOG_FORMAT", type=click.Choice(["auto", "console", "json"]),
                     default="auto", show_default=True),
        click.option("--log-level", envvar="LLAMACTOR_LOG_LEVEL", default="warning", show_default=True,
                     type=click.Choice(["debug", "info", "warning", "error"])),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def sampling_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--temperature", envvar="LLAMACTOR_TEMPERATURE", type=float, default=0.7, show_default=True),
        click.option("--max-tokens", envvar="LLAMACTOR_MAX_TOKENS", type=int, default=512, show_default=True),
        click.option("--top-p", envvar="LLAMACTOR_TOP_P", type=float, default=0.95, show_default=True),
        click.option("--top-k", envvar="LLAMACTOR_TOP_K", type=int, default=40, show_default=True),
        click.option("--seed", envvar="LLAMACTOR_SEED", type=int, default=None),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def tree_options(opts: dict[str, Any]) -> dict[str, Any]:
    """Configure logging from the options, and return the rest as ``llamactor.start`` keywords."""
    opts = dict(opts)
    llamactor_logging.configure(opts.pop("log_format"), opts.pop("log_level"))
    if opts.get("n_threads") is None:
        opts.pop("n_threads", None)
    if template_file := opts.pop("chat_template_file", None):
        opts["chat_template"] = Path(template_file).read_text()
    opts["n_batch"] = max(512, opts["n_parallel"])  # every running sequence needs a token per step
    return opts


def start_tree(opts: dict[str, Any], quiet: bool = False) -> llamactor.LLM:
    """Configure logging, then start the actor tree from the engine options in ``opts``."""
    opts = tree_options(opts)  # sampling options among them become the tree's defaults
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
    """Interactive chat (REPL) with streaming answers. /help lists the commands."""
    from llamactor.cli.repl import Repl

    Repl(start_tree(opts)).run()


@main.command()
@click.argument("prompt")
@click.option("--json", "as_json", is_flag=True, help="Print the whole Completion as JSON.")
@click.option("--chat/--raw", "as_chat", default=False, help="Apply the chat template (default: raw completion).")
@engine_options
@sampling_options
@handle_errors
def ask(prompt: str, as_json: bool, as_chat: bool, **opts: Any) -> None:
    """One completion of PROMPT to stdout, streamed ('-' reads the prompt from stdin)."""
    if prompt == "-":
        prompt = sys.stdin.read()
    with start_tree(opts, quiet=True) as llm:
        stream = llm.stream_chat([{"role": "user", "content": prompt}]) if as_chat else llm.stream(prompt)
        if as_json:
            list(stream)
            click.echo(json.dumps(stream.completion.to_dict(), ensure_ascii=False))
            return
        for piece in stream:
            click.echo(piece, nl=False)
        click.echo()


@main.command()
@click.option("--host", envvar="LLAMACTOR_HOST", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="LLAMACTOR_PORT", type=int, default=8000, show_default=True)
@click.option("--uds", envvar="LLAMACTOR_UDS", default=None, help="Listen on this Unix socket instead.")
@click.option("--api-key", envvar="LLAMACTOR_API_KEY", default=None, help="Require 'Authorization: Bearer KEY'.")
@click.option("--drain-timeout", "drain_timeout_s", envvar="LLAMACTOR_DRAIN_TIMEOUT", type=float, default=30.0,
              show_default=True, help="Seconds SIGTERM waits for in-flight requests.")
@click.option("--max-body-bytes", envvar="LLAMACTOR_MAX_BODY_BYTES", type=int, default=4 * 1024 * 1024,
              show_default=True)
@click.option("--model-name", envvar="LLAMACTOR_MODEL_NAME", default=None,
              help="The model id clients send (default: the GGUF file name without .gguf).")
@engine_options
def serve(host: str, port: int, uds: str | None, api_key: str | None, drain_timeout_s: float, max_body_bytes: int,
          model_name: str | None, **opts: Any) -> None:
    """The OpenAI-compatible HTTP daemon (/v1/completions, /v1/chat/completions, /health, /metrics)."""
    from llamactor.http.daemon import serve as run_daemon

    sys.exit(run_daemon(host=host, port=port, uds=uds, api_key=api_key, drain_timeout_s=drain_timeout_s,
                        max_body_bytes=max_body_bytes, model_name=model_name, start_options=tree_options(opts)))


@main.command()
@engine_options
@handle_errors
def info(**opts: Any) -> None:
    """Model metadata, context sizes and the chat template in use, as JSON."""
    with start_tree(opts, quiet=True) as llm:
        data = dataclasses.asdict(llm.info)
        data["metadata"] = {k: v for k, v in data["metadata"].items() if len(v) < 200}  # not the vocab arrays
        cache = llm.stats().get("prefix_cache", {})
        data["n_parallel"] = llm.config.n_parallel
        data["prefix_cache"] = {"enabled": llm.config.prefix_cache, "max_cells": llm.config.prefix_cache_cells,
                                "max_entries": cache.get("max_entries"), "pinned_cells": cache.get("pinned_cells")}
        click.echo(json.dumps(data, indent=2))


@main.command()
@click.option("--quick", is_flag=True, help="A smoke run (under 3 minutes): fewer concurrencies and tokens.")
@click.option("--full", is_flag=True, help="Also concurrency 32.")
@click.option("--model", envvar="LLAMACTOR_MODEL")
@click.option("--n-threads", type=int, default=None)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-results", show_default=True)
@click.option("--docs", is_flag=True, help="Also write the table and plot into docs/performance.md.")
@click.option("--only", default=None, help="Comma-separated workloads, e.g. multiturn,few_shot (default: all).")
@click.option("--peer-server", envvar="LLAMACTOR_PEER_SERVER", type=click.Path(exists=True, dir_okay=False),
              default=None, help="A llama-server binary: also compare multi-turn chat against it.")
def bench(quick: bool, full: bool, model: str | None, n_threads: int | None, out_dir: str, docs: bool,
          only: str | None, peer_server: str | None) -> None:
    """Measure llamactor against sequential create_completion and the raw batched-decode ceiling."""
    from llamactor.bench import report, suite
    from llamactor.config import default_n_threads
    from llamactor.models import resolve_model_path

    llamactor_logging.configure("auto", "warning")
    settings = suite.BenchSettings(model_path=resolve_model_path(model), quick=quick, full=full,
                                       n_threads=n_threads or default_n_threads(), peer_server=peer_server)
    names = only.split(",") if only else None
    unknown = set(names or ()) - set(suite.workloads(settings))
    if unknown:
        raise click.BadParameter(f"unknown workload(s) {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(suite.workloads(settings))}", param_hint="--only")
    if docs and names:
        raise click.BadParameter("--docs records a full run; leave out --only", param_hint="--docs")
    with click.progressbar(length=suite.n_ticks(settings, names), label="benchmarking", file=sys.stderr) as bar:
        results = suite.run(settings, lambda: bar.update(1), names)
    meta = {"quick": quick, "full": full, "n_threads": settings.n_threads, "max_tokens": settings.max_tokens,
            "repeats": settings.repeats, "n_ctx": settings.n_ctx, "peer_server": peer_server}
    path, table = report.write(results, meta, Path(settings.model_path).name, Path(out_dir))
    click.echo(table)
    click.echo(f"results: {path}")
    if failed := suite.failures(results):
        raise click.ClickException("workload(s) failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    if docs:
        report.update_docs(table, path.with_suffix(".png"), Path("docs"))


if __name__ == "__main__":
    main()

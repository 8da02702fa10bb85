"""The options the ``llamactor`` subcommands share, and turning them into ``start()`` keywords.

Every option can also come from an environment variable or a TOML file given with ``--config``
(keys are the option names with underscores; ``serve`` also reads ``[[models]]`` tables from it).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from llamactor import logging as llamactor_logging

def _load_config_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value:
        try:
            data = tomllib.loads(Path(value).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise click.BadParameter(str(e)) from e
        ctx.default_map = {**(ctx.default_map or {}), **{k.replace("-", "_"): v for k, v in data.items()}}
    return value


MODEL_OPTION = click.option("--model", envvar="LLAMACTOR_MODEL", help="GGUF file (default: Gemma 3 270M Q4_K_M).")


def engine_options(fn: Callable[..., Any], model_option: Callable[..., Any] = MODEL_OPTION) -> Callable[..., Any]:
    """Options that shape the actor tree, shared by every subcommand that starts one."""
    options = [
        click.option("--config", type=click.Path(exists=True, dir_okay=False), is_eager=True, expose_value=False,
                     callback=_load_config_file, help="TOML file of option defaults (serve: also [[models]])."),
        model_option,
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

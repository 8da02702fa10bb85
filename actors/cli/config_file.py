"""``--config FILE``: option values from a TOML file, below the command line and the environment.

Top-level keys are the command's option names with underscores (``n_parallel = 8``,
``temperature = 0.2``, ``port = 8080``); ``serve`` also takes ``[[models]]`` tables
(``llamactor.serving.model_specs``). An unknown key is refused, naming the file and the key,
as the API and the HTTP bodies refuse unknown names: a typo must not be silently ignored.

The callback runs on the main thread while click parses the command line, before every other
option (``is_eager``): it fills ``ctx.default_map``, which click reads below the command line
and the environment, and keeps the ``[[models]]`` tables in ``ctx.meta``.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from llamactor.serving.model_specs import MODEL_KEYS

TOML_MODELS = "llamactor.toml_models"  # ctx.meta key: the [[models]] tables of --config
TOML_PATH = "llamactor.toml_path"  # ctx.meta key: that file, for error messages
# Legal in a [[models]] table from TOML: ModelSpec's keys and the Config/sampling fields, but not
# the nested ``sampling`` object (its fields go in the table itself) or test-only hooks.
TOML_MODEL_KEYS = MODEL_KEYS - {"sampling", "watchdog_test_hang"}


def unknown_key_message(where: str, key: str, known: Iterable[str]) -> str:
    """``x.toml: unknown key 'n_paralel' (did you mean 'n_parallel'?; known: ...)``."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?; " if close else ""
    return f"{where}: unknown key {key!r} ({hint}known: {', '.join(known)})"


def _option_names(command: click.Command) -> dict[str, click.Option]:
    """The options a file may set: the command's options that reach its function."""
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name and p.expose_value}


def check_models(path: str, tables: Any) -> list[dict[str, Any]]:
    """``[[models]]`` must be tables with known keys; ``click.BadParameter`` naming the file else."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise click.BadParameter(f"{path}: models must be [[models]] tables")
    for i, table in enumerate(tables):
        where = f"{path}: [[models]] {table['name']!r}" if "name" in table else f"{path}: [[models]] #{i + 1}"
        for key in table:
            if key not in TOML_MODEL_KEYS:
                raise click.BadParameter(unknown_key_message(where, key, TOML_MODEL_KEYS))
    return tables


def load(ctx: click.Context, path: str, *, models: bool) -> None:
    """Read ``path`` into ``ctx.default_map`` (and ``ctx.meta``), refusing unknown keys."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise click.BadParameter(f"{path}: {e}") from e
    options = _option_names(ctx.command)
    known = set(options) | ({"models"} if models else set())
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "models" and models:
            ctx.meta[TOML_MODELS] = check_models(path, value)
            continue
        option = options.get(name)
        if option is None:
            raise click.BadParameter(unknown_key_message(path, key, known))
        # click expects a list for a repeatable option; TOML users write one value as a string
        defaults[name] = [value] if option.multiple and isinstance(value, str) else value
    ctx.meta[TOML_PATH] = path
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def config_option(*, models: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The ``--config FILE`` option; ``models``: the file may also hold ``[[models]]`` (serve)."""
    def callback(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        if value:
            load(ctx, value, models=models)
        return value

    return click.option("--config", type=click.Path(exists=True, dir_okay=False), is_eager=True,
                        expose_value=False, callback=callback,
                        help="TOML file of option values" + (" and [[models]] tables." if models else "."))

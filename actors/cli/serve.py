"""``llamactor serve``: the OpenAI-compatible daemon over one or several models.

    llamactor serve                                   # the default model
    llamactor serve --model chat=/m/a.gguf --model small=/m/b.gguf --replicas 2
    llamactor serve --config models.toml              # [[models]] tables (llamactor.serving.model_specs)
    llamactor serve --ray --replicas 4                # replicas as Ray Serve deployment replicas
    llamactor serve --models-dir /m --max-loaded 2    # every /m/*.gguf by its stem, loaded on first request

Engine options (``--n-parallel``, ``--n-ctx`` ...) apply to every model unless its TOML table
sets them; ``--replicas``, ``--routing-policy`` and ``--idle-unload`` to the ``--model`` ones and
the ``--models-dir`` folder's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any

import click

from llamactor.cli.config_file import TOML_MODELS, TOML_PATH
from llamactor.cli.options import engine_options, sampling_options, transport_config, transport_options, tree_options
from llamactor.base.errors import InvalidRequestError, LlamactorError
from llamactor.serving.model_dir import scan_models_dir
from llamactor.serving.model_specs import ModelSpec, specs_from
from llamactor.base.models import resolve_model_path
from llamactor.serving.routing import POLICIES

option = functools.partial(click.option, show_envvar=True)  # --help names each option's variable
MODELS_OPTION = option("--model", envvar="LLAMACTOR_MODEL", multiple=True,
                             help="GGUF file, or NAME=PATH; repeat for several models (default: Gemma 3 270M).")
# --replicas, --routing-policy and --idle-unload default to ModelSpec's own defaults.
SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec)}


def split_model(value: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a plain path (even one holding '=') -> (None, PATH)."""
    name, sep, path = value.partition("=")
    if not sep or os.path.isfile(value) or "/" in name or not name:
        return None, value
    return name, path


def model_specs(values: tuple[str, ...], toml_models: list[Any], options: dict[str, Any], *,
                model_name: str | None, replicas: int, policy: str, idle_unload_s: float | None,
                toml_path: str | None = None, models_dir: str | None = None,
                pins: tuple[str, ...] = ()) -> list[ModelSpec]:
    """The specs of ``--model`` values (default: the default model, unless a file or folder names
    others), of TOML ``[[models]]`` and of the ``models_dir`` folder's files (after those, loaded
    on first request; a table without a path whose name is a file's stem sets that file's
    options); ``pins`` name the models kept loaded. ``options`` (the engine options a user set)
    are every model's defaults. An error in a ``[[models]]`` table names ``toml_path``."""
    from llamactor.http.daemon import model_id_for

    found = scan_models_dir(models_dir) if models_dir else None
    entries: list[dict[str, Any]] = []
    for value in values or (() if toml_models or found else (None,)):
        name, path = split_model(value) if value else (None, None)
        path = resolve_model_path(path)  # a missing file fails here, before the socket opens
        if name is None:
            name = model_name if model_name and len(values) <= 1 else model_id_for(path)
        entries.append({"name": name, "path": path, "replicas": replicas, "policy": policy,
                        "idle_unload_s": idle_unload_s})
    from_file: list[ModelSpec] = []
    for table in toml_models:
        if found is not None and "path" not in table and "model" not in table and found.path_of(table.get("name")):
            table = {**table, "path": found.path_of(table["name"])}
        try:
            from_file.append(ModelSpec.from_dict(table, options))
        except InvalidRequestError as e:
            raise InvalidRequestError(f"{toml_path}: {e}") from e
    named = {e["name"] for e in entries} | {s.name for s in from_file}
    entries += [{"name": m.name, "path": m.path, "replicas": replicas, "policy": policy, "preload": False,
                 "idle_unload_s": idle_unload_s} for m in (found.models if found else ()) if m.name not in named]
    return pinned(specs_from([*entries, *from_file], options), pins)


def pinned(specs: list[ModelSpec], pins: tuple[str, ...]) -> list[ModelSpec]:
    """``specs`` with ``pin`` set on the models ``--pin`` names (an unknown name is refused)."""
    names = [s.name for s in specs]
    if unknown := sorted(set(pins) - set(names)):
        raise InvalidRequestError(f"--pin {', '.join(unknown)}: no such model (models: {', '.join(names)})")
    return [dataclasses.replace(s, pin=True) if s.name in pins else s for s in specs]


@click.command()
@option("--host", envvar="LLAMACTOR_HOST", default="127.0.0.1", show_default=True)
@option("--port", envvar="LLAMACTOR_PORT", type=int, default=8000, show_default=True)
@option("--uds", envvar="LLAMACTOR_UDS", default=None, help="Listen on this Unix socket instead.")
@option("--api-key", envvar="LLAMACTOR_API_KEY", default=None, help="Require 'Authorization: Bearer KEY'.")
@option("--keys", "keys", envvar="LLAMACTOR_KEYS_FILE", type=click.Path(exists=True, dir_okay=False), default=None,
        help="A TOML file of [[keys]] tables: each key's tenant, fair-share weight, limits, cache scope "
             "(reloaded on SIGHUP).")
@option("--drain-timeout", "drain_timeout_s", envvar="LLAMACTOR_DRAIN_TIMEOUT", type=float, default=30.0,
        show_default=True, help="Seconds SIGTERM waits for in-flight requests.")
@option("--max-body-bytes", envvar="LLAMACTOR_MAX_BODY_BYTES", type=int, default=4 * 1024 * 1024, show_default=True)
@option("--model-name", envvar="LLAMACTOR_MODEL_NAME", default=None,
        help="The model id clients send for a single --model (default: the file name without .gguf).")
@option("--replicas", envvar="LLAMACTOR_REPLICAS", type=click.IntRange(1, 64), default=SPEC_DEFAULTS["replicas"],
        show_default=True, help="Actor trees per --model (they split --n-threads unless it is given).")
@option("--routing-policy", envvar="LLAMACTOR_ROUTING_POLICY", type=click.Choice(POLICIES),
        default=SPEC_DEFAULTS["policy"], show_default=True, help="How a request picks one of a model's replicas.")
@option("--max-loaded", envvar="LLAMACTOR_MAX_LOADED", type=click.IntRange(1), default=None,
        help="Models loaded at once; the least recently used idle one is unloaded for another.")
@option("--idle-unload", "idle_unload_s", envvar="LLAMACTOR_IDLE_UNLOAD", type=float,
        default=SPEC_DEFAULTS["idle_unload_s"],
        help="Unload a --model after this many idle seconds (it loads again on its next request).")
@option("--models-dir", envvar="LLAMACTOR_MODELS_DIR", type=click.Path(exists=True, file_okay=False), default=None,
        help="Serve every *.gguf in this folder as a model named by its file stem (adapters and projectors left "
             "out), each loaded on its first request.")
@option("--pin", envvar="LLAMACTOR_PIN", multiple=True,
        help="Keep this model loaded (at start, whatever --max-loaded and --idle-unload do to others); repeatable.")
@option("--data-dir", envvar="LLAMACTOR_DATA_DIR", type=click.Path(file_okay=False), default=None,
        help="Where batch jobs and their files live (default: the user's data folder).")
@click.option("--ray", "use_ray", is_flag=True,
              help="Run the replicas as Ray Serve deployment replicas (pip install 'llamactor[ray]'; RAY_ADDRESS).")
@functools.partial(engine_options, model_option=MODELS_OPTION)
@sampling_options
@transport_options
def serve(host: str, port: int, uds: str | None, api_key: str | None, keys: str | None, drain_timeout_s: float,
          max_body_bytes: int, model_name: str | None, replicas: int, routing_policy: str, max_loaded: int | None,
          idle_unload_s: float | None, models_dir: str | None, pin: tuple[str, ...], data_dir: str | None,
          use_ray: bool, model: tuple[str, ...], **opts: Any) -> None:
    """The HTTP daemon: OpenAI (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses,
    /v1/models, /v1/files, /v1/batches), Anthropic (/v1/messages), Ollama (/api/*), tokenizer endpoints, /health, /metrics.
    Engine and sampling options are every model's defaults."""
    ctx = click.get_current_context()
    try:
        transport = transport_config(opts)  # the edge's options, not the models'
        specs = model_specs(model, ctx.meta.get(TOML_MODELS, []), tree_options(opts), model_name=model_name,
                            replicas=replicas, policy=routing_policy, idle_unload_s=idle_unload_s,
                            toml_path=ctx.meta.get(TOML_PATH), models_dir=models_dir, pins=pin)
        key_table = None
        if keys:
            from llamactor.http.keys_file import load_keys

            key_table = load_keys(keys)  # a wrong file fails here, before the socket opens
    except LlamactorError as e:
        print(f"llamactor serve: {e}", file=sys.stderr)
        sys.exit(1)
    if opts.get("batch_invariant") or any(spec.config.batch_invariant for spec in specs):
        # ggml reads it once, at this process's (or a Ray worker's, which inherits it) first matmul
        os.environ["GGML_CPU_TILED_MM"] = "0"
    if use_ray:
        # Ray Serve's worker processes configure their logging from these (configure_from_env);
        # a local Ray instance started by this process inherits its environment.
        os.environ["LLAMACTOR_LOG_FORMAT"], os.environ["LLAMACTOR_LOG_LEVEL"] = opts["log_format"], opts["log_level"]
        from llamactor.rayserve.app import serve_on_ray
        sys.exit(serve_on_ray(specs, host=host, port=port, api_key=api_key, max_body_bytes=max_body_bytes,
                              keys=key_table, transport=transport))  # Ray's proxy: Host, Origin, body deadline
    from llamactor.http.daemon import serve as run_daemon

    if transport.frontend_processes:
        # the front ends configure their logging from these (configure_from_env)
        os.environ["LLAMACTOR_LOG_FORMAT"], os.environ["LLAMACTOR_LOG_LEVEL"] = opts["log_format"], opts["log_level"]
        from llamactor.http.split_daemon import serve_split as run_daemon
    sys.exit(run_daemon(host=host, port=port, uds=uds, api_key=api_key, drain_timeout_s=drain_timeout_s,
                        max_body_bytes=max_body_bytes, models=specs, max_loaded=max_loaded,
                        data_dir=data_dir, keys_file=keys, transport=transport))

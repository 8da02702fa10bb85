"""The engine and sampling options of the ``llamactor`` subcommands, generated from the fields
of ``Config`` and ``SamplingParams``: their defaults, shown by ``--help``, are the library's own.

Each exposed field ``name`` becomes ``--name`` (or the flag of ``TWEAKS``), read also from
``$LLAMACTOR_NAME`` (and the older names in ``TWEAKS``) and from a ``--config`` TOML file
(``llamactor.cli.config_file``); the command line beats the environment, which beats the file.
Only options that one of those set reach ``llamactor.start()``: for the rest the library's
default applies, so no default is written twice. The options are built once at import; the
values are turned into ``start()`` keywords on the main thread, when a command runs.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from llamactor.base import logging as llamactor_logging
from llamactor.base.adapters import parse_loras
from llamactor.base.errors import InvalidRequestError
from llamactor.base.config import FLASH_ATTN, KV_TYPES, Config
from llamactor.base.sampling import SamplingParams
from llamactor.base.priority import POLICIES
from llamactor.cli.config_file import config_option

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class Tweak:
    """How one field appears on the command line, where the generic rule does not fit."""

    help: str
    flag: str | None = None  # instead of --field-name
    param: str | None = None  # the click parameter (and TOML key) instead of the field name
    envvars: tuple[str, ...] = ()  # older names, documented before, read after $LLAMACTOR_<FIELD>
    type: click.ParamType | None = None  # instead of the one the annotation gives
    show_default: str | None = None  # for a default computed at run time


class LoraParam(click.ParamType):
    """``--lora NAME=PATH``: one adapter as a (name, path) pair (a TOML list item may be either)."""

    name = "NAME=PATH"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        try:
            return parse_loras([value])[0]
        except InvalidRequestError as e:
            self.fail(str(e).removeprefix("loras: "), param, ctx)


CONFIG_TWEAKS: dict[str, Tweak] = {
    "model": Tweak("GGUF file (default: Gemma 3 270M Q4_K_M)."),
    "n_ctx": Tweak("KV cache cells shared by all sequences."),
    "n_parallel": Tweak("Sequences decoded together (at most 254; 126 with sliding-window layers)."),
    "n_seq_ids": Tweak("Sequence ids: running + system prompt + cached prefixes; each costs a logits row "
                       "(2 MiB for a 262k vocabulary); at most 256, or 128 with sliding-window layers.",
                       show_default="n_parallel + 2 + max(n_parallel, 32), cut to the model's most"),
    "n_batch": Tweak("Token budget of one decode step (at least --n-parallel)."),
    "n_ubatch": Tweak("Tokens llama.cpp computes at once within a step (0: min(n_batch, 512))."),
    "n_threads": Tweak("CPU threads.", show_default="all cores"),
    "n_gpu_layers": Tweak("Layers offloaded to the GPU (-1: all).", show_default="all on a GPU build, else 0"),
    "kv_type": Tweak("KV cache element type: f16, or q8_0 (about half the memory) / q4_0 (a quarter); "
                     "quantized needs flash attention.", type=click.Choice(KV_TYPES)),
    "flash_attn": Tweak("llama.cpp's flash attention; off: f32 attention, slower prefill. Neither makes "
                        "log-probabilities batch-independent: --batch-invariant does.", type=click.Choice(FLASH_ATTN)),
    "sample_in_graph": Tweak("Sample inside llama.cpp's decode graph where a request's sampler chain allows "
                             "(only tokens cross to the host); grammars and logprobs stay on the host, and "
                             "greedy requests too unless this is set on outright.",
                             show_default="on with GPU layers, off on a CPU-only engine"),
    "batch_invariant": Tweak("Bit-exact logits, log-probabilities and greedy tokens whatever else runs beside "
                             "a request (evaluations, audits); CPU only, flash attention on, n_ubatch <= 32."),
    "overlap_steps": Tweak("Postprocess each step while the device computes the next.",
                           show_default="on with GPU layers, off on a CPU-only engine"),
    "batch_size": Tweak("Pending requests that flush at once.", show_default="--n-parallel"),
    "batch_timeout_ms": Tweak("How long a lone request waits for company."),
    "max_queue": Tweak("Waiting requests beyond which new ones are refused."),
    "system_prompt": Tweak("System prompt shared by every request (its KV is computed once).", flag="--system"),
    "chat_template": Tweak("A Jinja chat template file, used instead of the GGUF's (or the plain transcript).",
                           param="chat_template_file", type=click.Path(exists=True, dir_okay=False)),
    "prefix_cache": Tweak("Keep finished requests' KV so later requests reuse shared prefixes."),
    "prefix_cache_cells": Tweak("Most KV cells cached prefixes may hold.", show_default="what running requests leave"),
    "prefix_cache_rent": Tweak("Idle cached prefixes leave the KV cells (for the RAM tier) once the time they add to "
                               "every step outweighs what keeping them saves.",
                               show_default="on unless --flash-attn off"),
    "score_rows_per_step": Tweak("Logits rows one step may compute for prompt log-probabilities (1 MiB each "
                                 "with Gemma 3)."),
    "score_time_share": Tweak("What scoring may add to a step beside other callers' work, as a fraction of it."),
    "score_exact": Tweak("A prompt being scored computes its KV whole, equal to scoring it alone (off: it "
                         "attaches a cached prefix: faster, off by up to ~0.2 nats)."),
    "draft_max": Tweak("The most drafted tokens (a prediction's, n-gram lookup's) one sequence verifies in a step."),
    "cache_ram_mib": Tweak("Host RAM (MiB) keeping cached prefixes evicted from the KV cells; restored on a "
                           "hit. 0 turns it off."),
    "cache_dir": Tweak("A directory keeping cached prefixes across restarts (written at shutdown and as "
                       "entries leave RAM).", show_default="off"),
    "cache_dir_mib": Tweak("The most the cache directory holds (MiB); least recently used files go first."),
    "schedule_policy": Tweak("Admission order: by arrival, by priority with aging, or longest cached prefix first.",
                             type=click.Choice(POLICIES)),
    "priority_aging_per_s": Tweak("Priority levels a waiting request gains per second.", flag="--priority-aging",
                                  envvars=("LLAMACTOR_PRIORITY_AGING",)),
    "watchdog_timeout_s": Tweak("Abort a decode step running longer (seconds) and restart the batcher; 0: off.",
                                flag="--watchdog-timeout", envvars=("LLAMACTOR_WATCHDOG_TIMEOUT",)),
    "max_restarts": Tweak("Batcher restarts allowed within --restart-window-s before giving up."),
    "restart_window_s": Tweak("Seconds over which batcher restarts are counted."),
    "stats_interval_s": Tweak("How often a busy batcher logs a batcher_stats line (seconds)."),
    "embedding_n_batch": Tweak("Tokens per embedding step, and the longest embedding input."),
    "embedding_n_seq_max": Tweak("Inputs one embedding step packs."),
    "embedding_time_share": Tweak("Most decode time embedding steps take while generation also waits."),
    "loras": Tweak("A LoRA adapter loaded with the model, NAME=PATH; repeat for several (their ids follow this "
                   "order). Requests pick adapters by name or id, each with a scale.", flag="--lora",
                   type=LoraParam()),
    # -- tenant limits (docs/operations.md, *Tenants*)
    "max_sequences_per_request": Tweak("Most sequences (choices n x prompts) one request may ask for."),
    "load_on_request": Tweak("Who may load an unloaded model by sending it a request: admins or tenants.",
                             type=click.Choice(["admins", "tenants"])),
    # -- rerank (README.md, *Rerank*)
    "max_rerank_documents": Tweak("Most documents one rerank may have."),
    "rerank_max_tokens_per_doc": Tweak("A rerank document's tokens at most when the request does not say; a longer "
                                       "one is cut (or refused without truncation)."),
    "rerank_template": Tweak("The rerank judging prompt, with literal {query} and {document} (and {instruction}); "
                             "default: the GGUF's tokenizer.chat_template.rerank, else the built-in one."),
    "otlp_endpoint": Tweak("An OTLP/HTTP collector (http://host:4318) that gets a span per request; without it the "
                           "OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables decide (pip install 'llamactor[otel]')."),
}
# -- transport (docs/operations.md, *Threat model*, "The transport"): ``serve``'s alone (TRANSPORT_FIELDS)
TRANSPORT_TWEAKS: dict[str, Tweak] = {
    "body_timeout_s": Tweak("Seconds a request body may take to arrive; then 408 and the connection is closed.",
                            flag="--body-timeout"),
    "header_timeout_s": Tweak("Seconds a request's headers may take to arrive; then the connection is closed.",
                              flag="--header-timeout"),
    "keep_alive_s": Tweak("Seconds an idle keep-alive connection stays open.", flag="--keep-alive-timeout"),
    "limit_concurrency": Tweak("Connections and requests at once; beyond, 503."),
    "max_header_bytes": Tweak("The largest request line and headers accepted (bytes)."),
    "allowed_hosts": Tweak("Without keys, a Host name the daemon answers to besides localhost, IP addresses, "
                           "this machine's name and --host (DNS rebinding); comma list or repeated; * for any.",
                           flag="--allowed-hosts"),
    "frontend_processes": Tweak("Run the HTTP front end in this many processes of its own beside the engine's "
                                "(0: in the engine's process; at most 64), sharing its socket; the tenants' limits "
                                "and stored responses stay the engine's.", flag="--frontend-processes"),
    "allowed_origins": Tweak("A browser origin (https://app.example.com) allowed to call, with CORS, besides "
                             "loopback ones and the daemon's own pages; comma list or repeated; * for any.",
                             flag="--allowed-origins"),
}
SAMPLING_TWEAKS: dict[str, Tweak] = {
    "max_tokens": Tweak("Most tokens generated per answer."),
    "temperature": Tweak("0 is greedy."),
    "top_k": Tweak("0 disables."),
    "top_p": Tweak("1.0 disables."),
    "min_p": Tweak("0 disables."),
    "repeat_penalty": Tweak("Over the last --repeat-last-n tokens; 1.0 disables."),
    "repeat_last_n": Tweak("Tokens the repeat penalty looks back."),
    "presence_penalty": Tweak("In [-2, 2]."),
    "frequency_penalty": Tweak("In [-2, 2]."),
    "seed": Tweak("Sampling seed.", show_default="random"),
    "stop": Tweak("A string that ends the answer; repeat the option for several."),
    "ignore_eos": Tweak("Go on past the end-of-generation token."),
    "speculation": Tweak("Draft tokens from the sequence's own prompt and output and verify them in the step "
                         "('ngram', prompt lookup) or not ('off'); outputs are the same either way."),
}
# Not options: test hooks, the nested SamplingParams itself, and per-request values that have no
# meaning as a process-wide default or no command-line form (they stay API / HTTP fields).
# Tenants come from the daemon's keys file (--keys), or from Config in-process.
# The HTTP daemon's edge (the transport block): options of ``serve`` alone (``transport_options``),
# not engine options nor start() keywords.
TRANSPORT_FIELDS = ("body_timeout_s", "header_timeout_s", "keep_alive_s", "limit_concurrency", "max_header_bytes",
                    "allowed_hosts", "allowed_origins", "frontend_processes")
HIDDEN = frozenset({"watchdog_test_hang", "sampling", "given", "logprobs", "top_logprobs", "prompt_logprobs", "grammar", "logit_bias",
                    "prediction", "tenants", *TRANSPORT_FIELDS})


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """``int | None`` -> (int, False); ``tuple[str, ...]`` -> (str, True: a repeatable option)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is tuple:
        return typing.get_args(annotation)[0], True
    return annotation, False


def _option(field: dataclasses.Field[Any], annotation: Any, tweak: Tweak) -> Decorator:
    """The click option of one dataclass field; its default is the field's own."""
    name = tweak.param or field.name
    flag = tweak.flag or "--" + field.name.replace("_", "-")
    base, multiple = _base_type(annotation)
    envvars = [f"LLAMACTOR_{field.name.upper()}", *tweak.envvars]
    default = None if field.default is dataclasses.MISSING else field.default  # MISSING: a default_factory
    kwargs: dict[str, Any] = {"envvar": envvars, "show_envvar": True, "help": tweak.help, "multiple": multiple,
                              "show_default": tweak.show_default or default not in (None, ())}
    if base is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=default, **kwargs)
    return click.option(flag, name, type=tweak.type or base, default=default, **kwargs)


def _options(cls: type, tweaks: dict[str, Tweak], skip: Iterable[str] = (),
             only: Iterable[str] | None = None) -> list[Decorator]:
    """The options of ``cls``'s fields: ``only`` these (hidden or not), or all but HIDDEN and ``skip``."""
    hints = typing.get_type_hints(cls)
    wanted = (lambda name: name in only) if only is not None else (lambda name: name not in HIDDEN and name not in skip)
    return [_option(f, hints[f.name], tweaks.get(f.name) or Tweak("")) for f in dataclasses.fields(cls) if wanted(f.name)]


def _param_name(field_name: str) -> str:
    tweak = CONFIG_TWEAKS.get(field_name) or SAMPLING_TWEAKS.get(field_name)
    return (tweak.param if tweak else None) or field_name


# The click parameters that become start() keywords: every generated one (and --model).
START_PARAMS = frozenset(_param_name(f.name) for cls in (Config, SamplingParams)
                         for f in dataclasses.fields(cls) if f.name not in HIDDEN)
MODEL_OPTION = _options(Config, CONFIG_TWEAKS)[0]  # --model, the first Config field


def engine_options(fn: Callable[..., Any], model_option: Decorator | None = None) -> Callable[..., Any]:
    """Options that shape the actor tree, shared by every subcommand that starts one; ``serve``
    passes its own repeatable ``model_option``."""
    options = [
        config_option(models=model_option is not None),
        model_option or MODEL_OPTION,
        *_options(Config, CONFIG_TWEAKS, skip=("model",)),
        # The process's own logging, not the library's: these defaults are the CLI's.
        click.option("--log-format", envvar="LLAMACTOR_LOG_FORMAT", type=click.Choice(["auto", "console", "json"]),
                     default="auto", show_default=True, show_envvar=True),
        click.option("--log-level", envvar="LLAMACTOR_LOG_LEVEL", default="warning", show_default=True,
                     show_envvar=True, type=click.Choice(["debug", "info", "warning", "error"])),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def transport_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``serve``'s edge: time and size limits, connections, allowed hosts and origins."""
    for option in reversed(_options(Config, TRANSPORT_TWEAKS, only=TRANSPORT_FIELDS)):
        fn = option(fn)
    return fn


def transport_config(opts: dict[str, Any]) -> Config:
    """Take the transport options out of ``opts``: a ``Config`` holding them, checked
    (``InvalidRequestError`` names a wrong one)."""
    return Config(**{name: opts.pop(name) for name in TRANSPORT_FIELDS})


def sampling_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Default sampling of the tree's requests (per request, the API and HTTP bodies override them)."""
    for option in reversed(_options(SamplingParams, SAMPLING_TWEAKS)):
        fn = option(fn)
    return fn


def tree_options(opts: dict[str, Any]) -> dict[str, Any]:
    """Configure logging from the options (the CLI is the process's entry point), and return
    the ``llamactor.start`` keywords: the engine and sampling options a user set, no others.

    Called inside the running command (it asks click's current context where values came from)."""
    ctx = click.get_current_context()
    llamactor_logging.configure(opts["log_format"], opts["log_level"])
    chosen = {k: v for k, v in opts.items() if k in START_PARAMS and ctx.get_parameter_source(k) not in
              (ParameterSource.DEFAULT, None)}
    if "stop" in chosen:
        chosen["stop"] = tuple(chosen["stop"])
    if template_file := chosen.pop("chat_template_file", None):
        try:
            chosen["chat_template"] = Path(template_file).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise click.BadParameter(str(e), param_hint="--chat-template") from e
    return chosen

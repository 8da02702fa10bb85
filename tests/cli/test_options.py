"""The CLI's engine and sampling options: generated from Config / SamplingParams (their defaults
are the library's), layered command line > environment > TOML > library default, and a TOML
key the command does not know is refused. Model-free: ``llamactor.start`` and the daemon are
replaced by fakes that record what they were given."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import llamactor
from llamactor.base import logging as llamactor_logging
from llamactor.base.config import Config
from llamactor.base.sampling import SamplingParams
from llamactor.cli import options
from llamactor.cli.commands import main

pytestmark = pytest.mark.pure


def params_of(name: str) -> dict[str, click.Parameter]:
    command = main.commands[name]
    return {p.name: p for p in command.params if p.name}


@pytest.mark.parametrize("command", ["serve", "chat", "ask"])
def test_help_shows_the_library_defaults(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip().startswith("--")}
    for flag, value in [("--n-parallel", "16"), ("--n-ctx", "8192"), ("--temperature", "0.8"),
                        ("--max-tokens", "256"), ("--top-p", "0.95"), ("--priority-aging", "0.1"),
                        ("--watchdog-timeout", "60.0")]:
        assert f"default: {value}]" in lines[flag], lines[flag]
    assert "default: (all cores)]" in lines["--n-threads"]
    assert "--watchdog-test-hang" not in result.output and "--sampling" not in result.output


@pytest.mark.parametrize("command", ["serve", "chat", "ask", "info"])
def test_every_option_default_is_the_dataclass_field_default(command: str) -> None:
    params = params_of(command)
    for cls in (Config, SamplingParams):
        for field in dataclasses.fields(cls):
            if field.name in options.HIDDEN or field.name == "model":
                continue
            param = params[options._param_name(field.name)]
            expected = None if field.default is dataclasses.MISSING else field.default
            assert param.default == expected, (command, field.name)
            assert isinstance(param, click.Option) and param.envvar
            assert f"LLAMACTOR_{field.name.upper()}" == param.envvar[0]


def test_every_exposed_field_has_help_and_the_documented_env_var_names_still_work() -> None:
    for cls, tweaks in [(Config, options.CONFIG_TWEAKS), (SamplingParams, options.SAMPLING_TWEAKS)]:
        exposed = {f.name for f in dataclasses.fields(cls)} - options.HIDDEN
        assert exposed == set(tweaks), "a new field needs a help text here, or a place in HIDDEN"
        assert all(t.help for t in tweaks.values())
    params = params_of("serve")
    envvars: set[str] = set()
    for param in params.values():
        envvar = getattr(param, "envvar", None) or ()
        envvars.update([envvar] if isinstance(envvar, str) else envvar)
    for documented in ["LLAMACTOR_MODEL", "LLAMACTOR_N_PARALLEL", "LLAMACTOR_N_CTX", "LLAMACTOR_N_THREADS",
                       "LLAMACTOR_N_GPU_LAYERS", "LLAMACTOR_BATCH_TIMEOUT_MS", "LLAMACTOR_MAX_QUEUE",
                       "LLAMACTOR_SYSTEM_PROMPT", "LLAMACTOR_PREFIX_CACHE", "LLAMACTOR_PREFIX_CACHE_CELLS",
                       "LLAMACTOR_CHAT_TEMPLATE", "LLAMACTOR_SCHEDULE_POLICY", "LLAMACTOR_PRIORITY_AGING",
                       "LLAMACTOR_WATCHDOG_TIMEOUT", "LLAMACTOR_EMBEDDING_N_BATCH", "LLAMACTOR_EMBEDDING_TIME_SHARE",
                       "LLAMACTOR_LOG_FORMAT", "LLAMACTOR_LOG_LEVEL", "LLAMACTOR_TEMPERATURE",
                       "LLAMACTOR_MAX_TOKENS", "LLAMACTOR_TOP_P", "LLAMACTOR_TOP_K", "LLAMACTOR_SEED"]:
        assert documented in envvars, documented


class FakeLLM:
    """Stands in for the actor tree: ``info`` needs ``info``, ``config``, ``stats`` and
    ``sampling_defaults``."""

    def __init__(self, **kwargs: Any) -> None:
        self.config = Config.from_kwargs(**kwargs)  # the library's own validation still runs

    def __enter__(self) -> FakeLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def info(self) -> Any:
        @dataclasses.dataclass
        class Info:
            metadata: dict[str, str]
            gguf_sampling: dict[str, float]
        return Info({}, {})

    def sampling_defaults(self) -> Any:
        return self.config.sampling

    def stats(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Runs ``info`` against a fake tree; the list gets each ``llamactor.start`` call's keywords.
    Logging configuration (process-global) is skipped: the test process is not the CLI's."""
    calls: list[dict[str, Any]] = []

    def start(**kwargs: Any) -> FakeLLM:
        calls.append(kwargs)
        return FakeLLM(**kwargs)

    monkeypatch.setattr(llamactor, "start", start)
    monkeypatch.setattr(llamactor_logging, "configure", lambda fmt, level: None)
    for name in list(os.environ):
        if name.startswith("LLAMACTOR_"):
            monkeypatch.delenv(name)
    return calls


def test_only_the_options_a_user_set_reach_start(started: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    assert started == [{}]  # every default is the library's own
    assert FakeLLM().config.n_parallel == 16


def test_command_line_beats_environment_beats_toml_file(started: list[dict[str, Any]], tmp_path: Path) -> None:
    config = tmp_path / "llamactor.toml"
    config.write_text('n_parallel = 3\nn_ctx = 1024\nn_batch = 1024\nprefix_cache = false\nsystem_prompt = "file"\n')
    env = {"LLAMACTOR_N_CTX": "2048", "LLAMACTOR_SYSTEM_PROMPT": "env", "LLAMACTOR_PRIORITY_AGING": "0.5",
           "LLAMACTOR_WATCHDOG_TIMEOUT_S": "7"}
    result = CliRunner().invoke(main, ["info", "--config", str(config), "--n-ctx", "4096"], env=env)
    assert result.exit_code == 0, result.output
    assert started == [{"n_parallel": 3, "n_ctx": 4096, "n_batch": 1024, "prefix_cache": False,
                        "system_prompt": "env", "priority_aging_per_s": 0.5, "watchdog_timeout_s": 7.0}]


def test_sampling_options_and_the_chat_template_file(started: list[dict[str, Any]], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    config = tmp_path / "c.toml"
    config.write_text(f'temperature = 0.2\nstop = "END"\nchat_template_file = "{template}"\n')
    monkeypatch.setattr(FakeLLM, "stream", lambda self, prompt: iter(["ok"]), raising=False)
    result = CliRunner().invoke(main, ["ask", "hi", "--config", str(config), "--max-tokens", "5"],
                                env={"LLAMACTOR_TOP_K": "3"})
    assert result.exit_code == 0, result.output
    assert started == [{"temperature": 0.2, "stop": ("END",), "max_tokens": 5, "top_k": 3,
                        "chat_template": template.read_text()}]


def test_n_parallel_above_n_batch_is_a_clean_error(started: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(main, ["info", "--n-parallel", "100", "--n-batch", "64"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "n_batch (64, at most n_ctx) must be >= n_parallel (100)" in result.output


@pytest.mark.parametrize("command", ["ask", "info", "serve"])
def test_an_unknown_toml_key_is_refused_naming_the_file_and_the_key(command: str, tmp_path: Path) -> None:
    config = tmp_path / "x.toml"
    config.write_text("n_ctx = 2048\nn_paralel = 8\n")
    args = [command, *(["hi"] if command == "ask" else []), "--config", str(config)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert f"{config}: unknown key 'n_paralel' (did you mean 'n_parallel'?; known: " in result.output


def test_models_tables_are_for_serve_only_and_their_keys_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text('[[models]]\nname = "chat"\nn_ctx = 1024\n')
    result = CliRunner().invoke(main, ["info", "--config", str(config)])
    assert result.exit_code == 2 and "unknown key 'models'" in result.output
    config.write_text('max_loaded = 1\n[[models]]\nname = "chat"\nreplica = 2\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert result.exit_code == 2
    assert f"{config}: [[models]] 'chat': unknown key 'replica' (did you mean 'replicas'?" in result.output


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch, started: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``serve`` up to the daemon, which records its keywords instead of listening."""
    import llamactor.http.daemon

    calls: list[dict[str, Any]] = []
    def serve(**kwargs: Any) -> int:
        calls.append(kwargs)
        return 0

    monkeypatch.setattr(llamactor.http.daemon, "serve", serve)
    return calls


def test_serve_gives_the_options_a_user_set_to_every_model(daemon: list[dict[str, Any]], tmp_path: Path) -> None:
    gguf = tmp_path / "a.gguf"
    gguf.write_bytes(b"")
    config = tmp_path / "serve.toml"
    config.write_text(f'max_loaded = 1\nn_ctx = 1024\ntemperature = 0.3\n'
                      f'[[models]]\nname = "b"\npath = "{gguf}"\nn_ctx = 512\nreplicas = 2\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(config), "--model", f"a={gguf}", "--n-parallel", "4"])
    assert result.exit_code == 0, result.output
    (call,) = daemon
    a, b = call["models"]
    assert call["max_loaded"] == 1 and (a.name, b.name) == ("a", "b")
    assert (a.config.n_ctx, a.config.n_parallel, a.config.sampling.temperature) == (1024, 4, 0.3)
    assert (b.config.n_ctx, b.config.n_parallel, b.replicas) == (512, 4, 2)
    assert a.config.n_batch == Config().n_batch and a.config.sampling.max_tokens == SamplingParams().max_tokens


def test_a_bad_value_in_a_models_table_names_the_file(daemon: list[dict[str, Any]], tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[models]]\nname = "b"\nn_parallel = 0\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(config)])
    assert result.exit_code == 1 and not daemon
    assert f"llamactor serve: {config}: model 'b': n_parallel must be in" in result.output


def test_model_spec_from_dict_refuses_unknown_keys_naming_the_model() -> None:
    with pytest.raises(llamactor.InvalidRequestError, match=r"model 'chat': unknown key\(s\) 'n_paralel'"):
        llamactor.ModelSpec.from_dict({"name": "chat", "n_paralel": 2})


def test_serve_takes_a_folder_of_models_and_pins_from_the_toml_file_or_the_command_line(
        daemon: list[dict[str, Any]], tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("x", "y"):
        (folder / f"{name}.gguf").write_bytes(b"")
    config = tmp_path / "serve.toml"
    config.write_text(f'models_dir = "{folder}"\nmax_loaded = 1\n[[models]]\nname = "y"\npin = true\nn_ctx = 512\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(config), "--idle-unload", "60"])
    assert result.exit_code == 0, result.output
    (call,) = daemon
    x, y = sorted(call["models"], key=lambda s: s.name)
    assert (x.preload, x.pin, x.idle_unload_s, x.config.model) == (False, False, 60.0, str(folder / "x.gguf"))
    assert (y.pin, y.config.n_ctx, y.config.model) == (True, 512, str(folder / "y.gguf"))
    result = CliRunner().invoke(main, ["serve", "--models-dir", str(folder), "--pin", "x"],
                                env={"LLAMACTOR_MAX_LOADED": "2"})
    assert result.exit_code == 0, result.output
    assert [(s.name, s.pin) for s in daemon[1]["models"]] == [("x", True), ("y", False)]
    assert daemon[1]["max_loaded"] == 2
    help_text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    assert "--models-dir" in help_text and "LLAMACTOR_MODELS_DIR" in help_text and "--pin" in help_text


def test_lora_adapters_are_repeated_name_equals_path_options_or_a_toml_list(started: list[dict[str, Any]],
                                                                            tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["info", "--lora", "style=/a.gguf", "--lora", "legal=/b.gguf"])
    assert result.exit_code == 0, result.output
    assert started[-1] == {"loras": (("style", "/a.gguf"), ("legal", "/b.gguf"))}
    assert '"name": "legal"' in result.output  # info lists them, with their ids
    config = tmp_path / "llamactor.toml"
    config.write_text('loras = ["style=/a.gguf"]\n')
    assert CliRunner().invoke(main, ["info", "--config", str(config)]).exit_code == 0
    assert started[-1] == {"loras": (("style", "/a.gguf"),)}
    refused = CliRunner().invoke(main, ["info", "--lora", "no-path"])
    assert refused.exit_code == 2 and "NAME=PATH" in refused.output

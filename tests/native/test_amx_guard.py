"""The AMX guard (``native/amx_guard.py``): a llama.cpp build with ggml's AMX kernels is refused
where they crash or cannot run, naming the rebuild; the build ``make install`` makes passes."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

import llamactor
from llamactor.native import amx_guard

pytestmark = pytest.mark.pure

# llama_print_system_info of llama-cpp-python 0.3.36's ggml built with llama.cpp's default flags
# (-march=native) on this project's machines (README, "Installing without make"), and with AMX off
NATIVE = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
          "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | "
          "OPENMP = 1 | REPACK = 1 | ")
NO_AMX = NATIVE.replace("AMX_INT8 = 1 | ", "")
SAPPHIRE_RAPIDS = frozenset({"avx512f", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"})


def test_the_kernels_are_read_from_llama_cpps_feature_list() -> None:
    assert amx_guard.amx_kernels_built_in(NATIVE)
    assert not amx_guard.amx_kernels_built_in(NO_AMX)
    assert not amx_guard.amx_kernels_built_in(NATIVE.replace("AMX_INT8 = 1", "AMX_INT8 = 0"))


def test_cpu_flags_are_the_first_cpus() -> None:
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx512f amx_tile hypervisor\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert amx_guard.cpu_flags(cpuinfo) == {"fpu", "avx512f", "amx_tile", "hypervisor"}
    assert amx_guard.cpu_flags("") == frozenset()


@pytest.mark.parametrize("flags, granted, why", [
    (SAPPHIRE_RAPIDS | {"hypervisor"}, True, "virtualized"),
    (frozenset({"avx512f", "hypervisor"}), True, "no AMX"),
    (frozenset(), False, "no AMX"),
    (SAPPHIRE_RAPIDS, False, "tile data"),
])
def test_an_amx_build_is_refused_where_its_kernels_crash_or_cannot_run(
        flags: frozenset[str], granted: bool, why: str) -> None:
    refusal = amx_guard.amx_refusal(NATIVE, flags, granted, allowed=False)
    assert refusal is not None and why in refusal
    assert "make install" in refusal and "pip install --force-reinstall" in refusal and "llama-cpp-python" in refusal
    assert 'CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" CXXFLAGS="-mno-amx-tile' in refusal
    assert "'" not in refusal  # the supervisor reports its repr: one kind of quote stays unescaped


def test_an_amx_build_runs_on_bare_metal_amx_or_when_the_operator_allows_it() -> None:
    assert amx_guard.amx_refusal(NATIVE, SAPPHIRE_RAPIDS, True, allowed=False) is None
    assert amx_guard.amx_refusal(NATIVE, SAPPHIRE_RAPIDS | {"hypervisor"}, True, allowed=True) is None


@pytest.mark.parametrize("flags", [SAPPHIRE_RAPIDS | {"hypervisor"}, frozenset()])
def test_a_build_without_amx_kernels_always_runs(flags: frozenset[str]) -> None:
    assert amx_guard.amx_refusal(NO_AMX, flags, False, allowed=False) is None


def test_the_installed_build_passes_and_has_no_amx_kernels_on_x86() -> None:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    amx_guard.check(info)  # raises where the build in .venv would crash on this machine
    if platform.machine() == "x86_64":  # make install builds with AMX off on every x86 CPU
        assert "AVX" in info and not amx_guard.amx_kernels_built_in(info)


def test_start_refuses_an_amx_build_on_this_vm_before_the_model_loads(
        model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_cpp

    cpuinfo = Path("/proc/cpuinfo")
    flags = amx_guard.cpu_flags(cpuinfo.read_text()) if cpuinfo.exists() else frozenset()
    if amx_guard.AMX_CPU_FLAGS <= flags and "hypervisor" not in flags:
        pytest.skip("bare-metal AMX: an AMX build is allowed here")
    monkeypatch.delenv(amx_guard.ALLOW_ENV, raising=False)
    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: NATIVE.encode())
    with pytest.raises(llamactor.ModelLoadError, match="built with the AMX kernels of ggml.*make install"):
        llamactor.start(model_path)

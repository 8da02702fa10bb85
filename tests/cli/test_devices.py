"""What the REPL banner and the ``Device`` record say of a build's backend devices (no llama.cpp)."""

from __future__ import annotations

import dataclasses

import pytest

from llamactor.base.engine_info import Device, EngineInfo
from llamactor.cli.repl import devices_line

pytestmark = pytest.mark.pure

GIB = 1 << 30
CPU = Device("CPU", "AMD EPYC", "cpu", 20 * GIB, 24 * GIB)
GPU = Device("CUDA0", "NVIDIA H100 80GB HBM3", "gpu", 70 * GIB, 80 * GIB)


def info(**kw: object) -> EngineInfo:
    base = EngineInfo(model_path="m.gguf", description="a model", n_params=1, size_bytes=1, n_vocab=16, n_embd=8,
                      embedding_pooling="mean", n_ctx_train=64, n_ctx=64, n_ctx_seq=64, n_batch=8, n_ubatch=8,
                      n_seq_max=1, n_threads=1, kv_type="f16", chat_template="transcript", looks_like_base_model=True)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_engine_info_made_without_devices_still_works() -> None:
    plain = info()
    assert plain.devices == () and plain.gpu_offload is False and plain.n_gpu_layers == 0


def test_a_device_says_its_name_what_it_is_and_its_free_memory() -> None:
    assert GPU.summary() == "CUDA0 (NVIDIA H100 80GB HBM3): 70.0 of 80.0 GiB free"
    assert GPU.is_gpu and not CPU.is_gpu and Device("Vulkan0", "iGPU", "igpu", 1, 2).is_gpu
    with pytest.raises(dataclasses.FrozenInstanceError):
        GPU.memory_free = 0  # type: ignore[misc]


def test_the_banner_names_every_device_and_where_the_layers_went() -> None:
    assert devices_line(info(devices=(CPU,))) == \
        "Devices: CPU (AMD EPYC): 20.0 of 24.0 GiB free (a CPU build: no GPU offload)."
    gpu = info(devices=(GPU, CPU), gpu_offload=True, n_gpu_layers=-1)
    assert devices_line(gpu).startswith("Devices: CUDA0 (NVIDIA H100 80GB HBM3): 70.0 of 80.0 GiB free; CPU (")
    assert devices_line(gpu).endswith("(all layers offloaded to the GPU).")
    assert "(12 layers offloaded" in devices_line(dataclasses.replace(gpu, n_gpu_layers=12))
    assert "no layers offloaded" in devices_line(dataclasses.replace(gpu, n_gpu_layers=0))

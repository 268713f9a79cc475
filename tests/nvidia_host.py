"""The GPU host the nvidia, CUDA-runtime and nv-p2p tests share: one machine, the nvidia
module loaded, no HCA driver (modules=()), 64 MiB of RAM."""

from __future__ import annotations

from typing import Any

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.nvgpu import GpuConfig


def gpu_host(release: str | None = None, nr_gpus: int = 1, gpu: GpuConfig | None = None,
             iommu: str = "identity", **params: Any) -> Any:
    """An RDMA host with `nr_gpus` GPUs (config `gpu`) and the nvidia module loaded with
    `release` (the default one when None) and any other module `params`."""
    m = rdma_host(ram_size=64 << 20, nr_gpus=nr_gpus, modules=(), gpu=gpu, iommu=iommu)
    if release is not None:
        params["release"] = release
    m.load_module("nvidia", **params)
    return m


def nvdev(m: Any, i: int = 0) -> Any:
    """GPU i's NvDevice, as nvidia's probe made it."""
    return m.modules["nvidia"].state.devices[i]

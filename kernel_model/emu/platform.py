"""An RDMA host in one call: a Machine with ConnectX HCAs and the driver modules loaded.

Emulator-level (the "BIOS and modprobe" of a test or a demo):

    m = rdma_host()                        # 256 MiB, 4 KiB pages, one ConnectX-6 Dx
    m.hcas[0].fw.state                     # "initialized": mlx5_core probed it
    m = rdma_host(page_size=65536, nr_hcas=2, modules=())   # nothing loaded yet
    m = rdma_host(ofed="4.9")              # ib_core loaded first, as MLNX_OFED 4.9's
    m = rdma_host(devices=[PciDeviceSpec(0x1D0F, 0xF00D, bars=(BarSpec(2, 1 << 20),))])

Modules are loaded by name (machine.load_module), as modprobe does, so
kernel_model never imports a driver.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel_model.emu.machine import Machine
from kernel_model.hw.amdgpu import AmdGpu
from kernel_model.hw.cmb import CmbDevice
from kernel_model.hw.fabric import Fabric
from kernel_model.hw.mlx5 import ConnectX, Mlx5Config
from kernel_model.hw.nvgpu import GpuConfig, NvGpu
from kernel_model.hw.pci_device import BarSpec, PciDevice, PciDeviceSpec
from kernel_model.module import peer_client_modules

# Fabric: hosts on one switch; peer_client_modules: what `modprobe` could load
__all__ = ["DEFAULT_MODULES", "BarSpec", "Fabric", "GpuConfig", "PciDeviceSpec",
           "peer_client_modules", "rdma_host"]

DEFAULT_MODULES: tuple[str, ...] = ("mlx5_core",)


def rdma_host(ram_size: int = 256 << 20, page_size: int = 4096, backend: str | None = None,
              name: str | None = None, hca: Mlx5Config | None = None,
              modules: tuple[str, ...] = DEFAULT_MODULES, *, nr_hcas: int = 1,
              iommu: str = "identity", fabric: Fabric | None = None, nr_gpus: int = 0,
              gpu: GpuConfig | None = None, cmb_size: int = 0,
              nr_amd_gpus: int = 0, devices: Sequence[PciDeviceSpec] = (),
              ofed: str | None = None) -> Machine:
    """Build a Machine, plug `nr_hcas` ConnectX functions (config `hca`) and `nr_gpus`
    NVIDIA GPUs (config `gpu`; their driver is the `nvidia` module), `nr_amd_gpus`
    AMD Instinct boards (driver `amdgpu`) and, with
    `cmb_size`, a device with a memory BAR of that size (driver `uio_cmb`), and each of
    `devices` (your own PCI functions, kernel_model.hw.pci_device.PciDevice; their
    drivers are yours to load); load `modules`.  With `ofed` ("4.9", "5.1" ... "25.04"),
    ib_core is loaded first with that MLNX_OFED release's peer-memory core.

    The HCAs are reachable as machine.hcas (kernel_model.hw.mlx5.ConnectX);
    with `fabric` their ports are cabled to that switch, so QPs on other
    machines on the same fabric can reach them.
    """
    machine = Machine(ram_size=ram_size, page_size=page_size, backend=backend, name=name,
                      iommu=iommu)
    for _ in range(nr_hcas):
        cx = ConnectX(machine, hca)
        if fabric is not None:
            fabric.attach(cx)
            machine.shutdown_hooks.append(lambda m, cx=cx: fabric.detach(cx))
    for _ in range(nr_gpus):
        NvGpu(machine, gpu)
    for _ in range(nr_amd_gpus):
        AmdGpu(machine)
    if cmb_size:
        CmbDevice(machine, cmb_size)
    for spec in devices:
        PciDevice(machine, spec)
    if ofed is not None:
        machine.load_module("ib_core", ofed=ofed)
    for mod in modules:
        if mod not in machine.modules:  # a dependency may have loaded it already
            machine.load_module(mod)
    return machine

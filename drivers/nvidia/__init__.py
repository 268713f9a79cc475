"""The nvidia module (nvidia.ko): the GPU driver and its nv-p2p API.

module_init registers a PCI driver for every NVIDIA GPU on the machine; its
probe gives each GPU an NvDevice (rm.py) and a /dev/nvidiaN (nv.py).  The
third-party P2P API other modules import lives in nv_p2p.py.

Module parameters:
  release   the driver release, "580.65.06" by default.  Before 535.14 (and
            R525 before 525.105.17) a NULL free callback means "persistent"
            and there is no nvidia_p2p_get_pages_persistent; from R515 up to
            those fixes put_pages also has the free-callback race NVIDIA's
            GPUDirect RDMA guide describes ("Changes in CUDA 12.2").  Later
            releases refuse a NULL callback and export the persistent calls.
            See nv_p2p.py.
  p2p_latency_us
            the fixed latency of one nv-p2p call into RM on a real system (0 by
            default).  It is a parameter, not work: each get_pages, put_pages,
            dma_map_pages and dma_unmap_pages that reaches RM adds it to the
            device's `p2p_latency_us` account, which a
            benchmark adds to the time it measured; nothing waits or spins.

Lock order: see rm.py.
"""

from __future__ import annotations

from typing import Any

from drivers.nvidia.nv import nvidia_fops
from drivers.nvidia.rm import NvDevice
from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.fs import cdev, cdev_add, cdev_del
from kernel_model.pci import PCI_ANY_ID, pci_driver, pci_register_driver, pci_unregister_driver
from kernel_model.trace import traced
from kernel_model.uapi.nvidia import NV_DEVICE_PATH
from kernel_model.workqueue import alloc_workqueue, destroy_workqueue

PCI_VENDOR_ID_NVIDIA = 0x10DE
DEFAULT_RELEASE = "580.65.06"


class NvidiaState:
    """The module's globals: its devices, nv_queue, the release it behaves as."""

    def __init__(self, mod: Any, release: tuple[int, ...], p2p_latency_us: int = 0):
        self.mod = mod
        self.release = release
        self.p2p_latency_us = p2p_latency_us
        self.devices: list = []
        self.nv_queue = alloc_workqueue("nv_queue")
        self.driver = pci_driver("nvidia", [(PCI_VENDOR_ID_NVIDIA, PCI_ANY_ID)], self.probe,
                                 self.remove)

    @traced
    def probe(self, pdev: Any, ident: tuple[int, int]) -> None:
        """nv_pci_probe(): an NvDevice and its /dev/nvidiaN."""
        gpu = getattr(pdev, "model", None)
        if gpu is None:
            raise KernelError(EINVAL, f"nv_pci_probe: {pdev.name} is not a GPU this driver "
                              "knows")
        dev = NvDevice(gpu, len(self.devices), self.release, self.nv_queue)
        dev.latency_per_call_us = self.p2p_latency_us
        dev.cdev = cdev(nvidia_fops(self.mod), private=dev)
        cdev_add(dev.cdev, NV_DEVICE_PATH.format(minor=dev.minor))
        pdev.dev.driver_data = dev
        self.devices.append(dev)

    @traced
    def remove(self, pdev: Any) -> None:
        """nv_pci_remove(): every client gone, every page back, no P2P mapping left."""
        dev = pdev.dev.driver_data
        cdev_del(dev.cdev)
        self.devices.remove(dev)
        lost = dev.gpu.nr_pages - len(dev.free_pages)
        if dev.clients or lost or dev.p2p_infos:
            current().machine.report_bug(
                "nv_pci_remove", f"{dev!r}: {len(dev.clients)} clients, {lost} GPU pages "
                f"not freed, {len(dev.p2p_infos)} P2P mappings left")


def parse_release(release: str) -> tuple[int, int, int]:
    """"525.105.17" -> (525, 105, 17): branch, build, patch (0 when absent)."""
    parts = release.split(".")
    try:
        nums = [int(x) for x in parts[:3]]
    except ValueError:
        nums = []
    if len(nums) < 2:
        raise KernelError(EINVAL, f"nvidia: release {release!r} is not BRANCH.BUILD[.x]")
    return tuple((nums + [0])[:3])  # type: ignore[return-value]


def module_init(mod: Any, release: str = DEFAULT_RELEASE,
                p2p_latency_us: int = 0) -> NvidiaState:
    """nvidia_init_module(): the workqueue, then the PCI driver (probing every GPU)."""
    if p2p_latency_us < 0:
        raise KernelError(EINVAL, f"nvidia: p2p_latency_us {p2p_latency_us} < 0")
    state = NvidiaState(mod, parse_release(release), p2p_latency_us)
    pci_register_driver(current().machine, state.driver)
    return state


def module_exit(mod: Any) -> None:
    """nvidia_exit_module()."""
    pci_unregister_driver(current().machine, mod.state.driver)
    destroy_workqueue(mod.state.nv_queue)

"""Mirrors drivers/uio/uio.c (the physical-memory map of a UIO device) for a CMB device.

The smallest driver that lets a process map device memory: it binds to the
CMB function (kernel_model/hw/cmb.py), gives it /dev/uio0 with one memory
map (map 0 = the whole memory BAR), and mmap at offset 0 maps it with
io_remap_pfn_range - as uio_mmap_physical does - so the process can load
and store device memory while gup cannot pin it (VM_IO|VM_PFNMAP): the
case io_peer_mem exists for.

# EMU: one map per device, no interrupts, no sysfs maps/ directory; the
# binding is a PCI driver of its own instead of uio_pci_generic + a
# userspace BAR lookup.
"""

from __future__ import annotations

from typing import Any

from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.fs import cdev, cdev_add, cdev_del, file_operations
from kernel_model.memory import io_remap_pfn_range
from kernel_model.pci import (
    pci_driver,
    pci_register_driver,
    pci_resource_len,
    pci_resource_start,
    pci_unregister_driver,
)
from kernel_model.pgtable import pgprot_noncached
from kernel_model.trace import traced

PCI_IDS = [(0x1B36, 0x0010)]
CMB_BAR = 2


class uio_device:
    """Mirrors struct uio_device with its one uio_mem: the BAR's address and size."""

    def __init__(self, minor: int, addr: int, size: int, pdev: Any):
        self.minor, self.addr, self.size, self.pdev = minor, addr, size, pdev
        self.cdev: cdev | None = None

    def __repr__(self) -> str:
        return f"uio{self.minor} [{self.addr:#x}+{self.size:#x}]"


@traced
def uio_mmap(f: Any, vma: Any) -> None:
    """Mirrors uio_mmap() -> uio_mmap_physical(): map 0 only, within the BAR."""
    idev: uio_device = f.private_data
    m = current().machine
    if vma.vm_pgoff != 0:
        raise KernelError(EINVAL, f"uio_mmap: map {vma.vm_pgoff} does not exist")
    size = vma.vm_end - vma.vm_start
    if size > idev.size:
        raise KernelError(EINVAL, f"uio_mmap: {size:#x} bytes, the map has {idev.size:#x}")
    io_remap_pfn_range(vma, vma.vm_start, idev.addr >> m.page_shift, size,
                       pgprot_noncached(vma.vm_page_prot))


def uio_open(inode: Any, f: Any) -> None:
    """Mirrors uio_open()."""
    f.private_data = inode.i_cdev.private


class UioCmb:
    """The module: a PCI driver that gives each CMB function a /dev/uioN."""

    def __init__(self, mod: Any):
        self.mod = mod
        self.devices: list[uio_device] = []
        self.fops = file_operations(owner=mod, open=uio_open, mmap=uio_mmap)
        self.driver = pci_driver("uio_cmb", PCI_IDS, self.probe, self.remove)

    @traced
    def probe(self, pdev: Any, ident: tuple[int, int]) -> None:
        """__uio_register_device(): the map, then the device node."""
        idev = uio_device(len(self.devices), pci_resource_start(pdev, CMB_BAR),
                          pci_resource_len(pdev, CMB_BAR), pdev)
        idev.cdev = cdev(self.fops, private=idev)
        cdev_add(idev.cdev, f"/dev/uio{idev.minor}")
        pdev.dev.driver_data = idev
        self.devices.append(idev)

    @traced
    def remove(self, pdev: Any) -> None:
        """uio_unregister_device()."""
        idev = pdev.dev.driver_data
        cdev_del(idev.cdev)
        self.devices.remove(idev)


def module_init(mod: Any) -> UioCmb:
    state = UioCmb(mod)
    pci_register_driver(current().machine, state.driver)
    return state


def module_exit(mod: Any) -> None:
    pci_unregister_driver(current().machine, mod.state.driver)

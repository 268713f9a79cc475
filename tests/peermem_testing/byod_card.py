"""A user's own PCI card and its driver, as a new client's author writes them (used by
test_byod.py): the card is described with a PciDeviceSpec and put on the host by
rdma_host(devices=...); this driver - loaded by name, as
`tests.peermem_testing.byod_card` - binds to it through pci_register_driver, gives
each card /dev/mydevN whose mmap maps the memory BAR (VM_IO|VM_PFNMAP, so a peer
client must serve it), and counts the card's MSI-X interrupts.
"""

from __future__ import annotations

from typing import Any

from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.fs import cdev, cdev_add, cdev_del, file_operations
from kernel_model.hw.pci_device import BarSpec, PciDeviceSpec
from kernel_model.interrupt import IRQ_HANDLED, free_irq, request_irq
from kernel_model.memory import io_remap_pfn_range
from kernel_model.pci import (
    pci_driver,
    pci_msix_vec_count,
    pci_register_driver,
    pci_resource_len,
    pci_resource_start,
    pci_unregister_driver,
)
from kernel_model.pgtable import pgprot_noncached

VENDOR, DEVICE = 0x1D0F, 0xF00D
MEM_BAR = 2


class Doorbell:
    """BAR0 of the card: one 32-bit scratch register at offset 0."""

    def __init__(self) -> None:
        self.value = b"\0" * 4

    def read(self, off: int, n: int) -> bytes:
        return (self.value + b"\0" * 4096)[off:off + n]

    def write(self, off: int, data: bytes) -> None:
        if off == 0:
            self.value = bytes(data[:4]).ljust(4, b"\0")


def spec(mem_size: int = 4 << 20) -> PciDeviceSpec:
    """The card: BAR0 registers, BAR2 `mem_size` bytes of memory, 2 MSI-X vectors."""
    regs = Doorbell()
    return PciDeviceSpec(VENDOR, DEVICE, bars=(BarSpec(0, 4096, regs.read, regs.write),
                                               BarSpec(MEM_BAR, mem_size)),
                         msix_vectors=2)


class mydev:
    """One bound card: its memory BAR, device node and interrupt count."""

    def __init__(self, minor: int, pdev: Any):
        self.minor, self.pdev = minor, pdev
        self.addr = pci_resource_start(pdev, MEM_BAR)
        self.size = pci_resource_len(pdev, MEM_BAR)
        self.irqs = 0
        self.cdev: cdev | None = None


def mydev_irq(nr: int, dev: mydev) -> int:
    dev.irqs += 1
    return IRQ_HANDLED


def mydev_open(inode: Any, f: Any) -> None:
    f.private_data = inode.i_cdev.private


def mydev_mmap(f: Any, vma: Any) -> None:
    dev: mydev = f.private_data
    size = vma.vm_end - vma.vm_start
    if vma.vm_pgoff or size > dev.size:
        raise KernelError(EINVAL, f"mydev_mmap: {size:#x} bytes at page {vma.vm_pgoff}")
    io_remap_pfn_range(vma, vma.vm_start, dev.addr >> current().machine.page_shift, size,
                       pgprot_noncached(vma.vm_page_prot))


class MyDevDriver:
    def __init__(self, mod: Any):
        self.devices: list[mydev] = []
        self.fops = file_operations(owner=mod, open=mydev_open, mmap=mydev_mmap)
        self.driver = pci_driver("mydev", [(VENDOR, DEVICE)], self.probe, self.remove)

    def probe(self, pdev: Any, ident: tuple[int, int]) -> None:
        if pci_msix_vec_count(pdev) < 1:
            raise KernelError(EINVAL, "mydev_probe: no MSI-X")
        dev = mydev(len(self.devices), pdev)
        request_irq(pdev, 0, mydev_irq, "mydev", dev)
        dev.cdev = cdev(self.fops, private=dev)
        cdev_add(dev.cdev, f"/dev/mydev{dev.minor}")
        pdev.dev.driver_data = dev
        self.devices.append(dev)

    def remove(self, pdev: Any) -> None:
        dev = pdev.dev.driver_data
        cdev_del(dev.cdev)
        free_irq(pdev, 0, dev)
        self.devices.remove(dev)


def module_init(mod: Any) -> MyDevDriver:
    state = MyDevDriver(mod)
    pci_register_driver(current().machine, state.driver)
    return state


def module_exit(mod: Any) -> None:
    pci_unregister_driver(current().machine, mod.state.driver)

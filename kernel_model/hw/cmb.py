"""A PCI function with a memory BAR: a controller memory buffer (device model).

What an NVMe controller's CMB (or any device exposing memory on the bus)
looks like from the host: BAR2 reads and writes as memory - lazily
committed, `size` bytes - and any bus master (the CPU, an HCA) can reach it
at its physical address.  It is what io_peer_mem serves: a process maps the
BAR through its driver (drivers/uio_cmb.py), the mapping is VM_IO|VM_PFNMAP
so gup refuses it, and an RDMA NIC can still DMA to it peer to peer.

# EMU: only the memory BAR; no NVMe registers, queues or doorbells.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.pci import MemoryBar, pci_add_device, pci_dev

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

PCI_VENDOR_ID_REDHAT, PCI_DEVICE_ID_REDHAT_NVME = 0x1B36, 0x0010
CMB_BAR = 2


class CmbDevice:
    """One device with a memory BAR of `size` bytes (a power of two >= 1 MiB)."""

    def __init__(self, machine: Machine, size: int = 64 << 20):
        if size < 1 << 20 or size & (size - 1):
            raise ValueError("CmbDevice: size must be a power of two >= 1 MiB")
        self.machine = machine
        self.pdev = pci_dev(machine, PCI_VENDOR_ID_REDHAT, PCI_DEVICE_ID_REDHAT_NVME)
        self.pdev.model = self
        self.bar = MemoryBar(self.pdev, CMB_BAR, size)
        pci_add_device(machine, self.pdev)

    def __repr__(self) -> str:
        return f"CMB {self.pdev.name} BAR{CMB_BAR} [{self.bar.start:#x}+{self.bar.size:#x}]"

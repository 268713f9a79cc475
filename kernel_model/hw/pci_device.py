"""A PCI function the user describes (device model): bring your own device.

The built-in devices (ConnectX, the GPUs, the CMB device) are classes here
in kernel_model/hw; a device of your own is a `PciDeviceSpec` - vendor and
device IDs, its memory BARs with their sizes, the MSI-X vectors it can raise -
that `rdma_host(devices=[...])` (or `PciDevice(machine, spec)`) puts on the
machine's PCI bus before any driver loads, as firmware enumerates a card
before modprobe.  Your driver then finds it as a driver finds any card:
pci_register_driver() with its (vendor, device) pair probes it.

    spec = PciDeviceSpec(0x1D0F, 0xF00D, bars=(BarSpec(2, 4 << 20),), msix_vectors=4)
    m = rdma_host(devices=[spec])                 # the card is on the bus, no driver yet
    dev = pci_get_device(m, 0x1D0F, 0xF00D).model  # this module's PciDevice
    dev.memory(2)[:4] = b"fw!\\0"                  # the card's own view of BAR2's memory
    dev.raise_irq(1)                              # MSI-X vector 1: the driver's handler

A BAR is either memory (no callbacks: reads and writes land in a lazily
committed buffer, what a device's on-board memory behind a BAR looks like
to the host and to an RDMA NIC's peer-to-peer DMA) or registers (`read` and
`write` callbacks, called with the offset into the BAR).  Every BAR is a
64-bit memory BAR, so it takes two BAR registers: index `i + 1` stays empty.

# EMU: no config space, capabilities list or legacy INTx; the MSI-X table is a
# vector count (pci_msix_vec_count), and a raised vector runs the handler
# request_irq attached at once (kernel_model/interrupt.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from kernel_model.interrupt import msix_raise
from kernel_model.pci import (
    PCI_STD_NUM_BARS,
    MemoryBar,
    pci_add_device,
    pci_dev,
    pci_register_bar,
    pci_remove_device,
    resource,
)

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

PCI_MSIX_MAX_VECTORS = 2048     # PCI_MSIX_FLAGS_QSIZE + 1: the largest MSI-X table


@attrs.frozen
class BarSpec:
    """One 64-bit memory BAR: its register `index` (0-4), its `size` (a power of two, at
    least 4 KiB) and, for a register BAR, `read(offset, n) -> bytes` and
    `write(offset, data)`; without them the BAR is plain memory."""

    index: int
    size: int
    read: Callable[[int, int], bytes] | None = None
    write: Callable[[int, bytes], None] | None = None
    prefetch: bool = True

    @property
    def is_memory(self) -> bool:
        """A memory BAR (no callbacks), not registers."""
        return self.read is None and self.write is None


@attrs.frozen
class PciDeviceSpec:
    """A PCI function to put on a host: 16-bit `vendor` and `device` IDs, its `bars`,
    and `msix_vectors`, the size of its MSI-X table (0: no MSI-X)."""

    vendor: int
    device: int
    bars: tuple[BarSpec, ...] = attrs.field(default=(), converter=tuple)
    msix_vectors: int = 0


class PciDevice:
    """The device model built from a PciDeviceSpec, on `machine`'s bus from construction
    on.  `pdev` is its kernel_model.pci.pci_dev (whose `.model` is this object)."""

    def __init__(self, machine: Machine, spec: PciDeviceSpec):
        if not (0 <= spec.vendor <= 0xFFFE and 0 <= spec.device <= 0xFFFF):
            raise ValueError(f"PciDevice: vendor {spec.vendor:#x} / device {spec.device:#x} "
                             "are not 16-bit IDs (0xffff means 'no device')")
        if not 0 <= spec.msix_vectors <= PCI_MSIX_MAX_VECTORS:
            raise ValueError(f"PciDevice: msix_vectors {spec.msix_vectors} not in "
                             f"0..{PCI_MSIX_MAX_VECTORS}")
        for b in spec.bars:
            if not 0 <= b.index < PCI_STD_NUM_BARS - 1:
                raise ValueError(f"PciDevice: BAR index {b.index} not in 0..4 (a 64-bit BAR "
                                 "takes two registers)")
            if b.size < 4096 or b.size & (b.size - 1):
                raise ValueError(f"PciDevice: BAR{b.index} size {b.size:#x} is not a power "
                                 "of two >= 4 KiB")
            if (b.read is None) != (b.write is None):
                raise ValueError(f"PciDevice: BAR{b.index}: give both read and write "
                                 "(registers) or neither (memory)")
        self.machine = machine
        self.spec = spec
        self.pdev = pci_dev(machine, spec.vendor, spec.device)
        self.pdev.model = self
        self.pdev.msix_vec_count = spec.msix_vectors
        self.bars: dict[int, MemoryBar | resource] = {}
        for b in spec.bars:          # a clash (BAR i+1 of a 64-bit BAR i): EINVAL
            if b.is_memory:
                self.bars[b.index] = MemoryBar(self.pdev, b.index, b.size, b.prefetch)
            else:
                self.bars[b.index] = pci_register_bar(self.pdev, b.index, b.size, b.read,
                                                      b.write, b.prefetch)
        pci_add_device(machine, self.pdev)

    def __repr__(self) -> str:
        bars = " ".join(f"BAR{i} {self.bar_start(i):#x}+{self.bar_size(i):#x}"
                        for i in sorted(self.bars))
        return (f"PciDevice {self.pdev.name} [{self.spec.vendor:04x}:{self.spec.device:04x}]"
                f" {bars} msix {self.spec.msix_vectors}")

    def bar_start(self, index: int) -> int:
        """The physical address the BAR was placed at (pci_resource_start)."""
        bar = self.bars[index]
        return bar.start

    def bar_size(self, index: int) -> int:
        """The BAR's size in bytes."""
        bar = self.bars[index]
        return bar.size if isinstance(bar, MemoryBar) else bar.end - bar.start + 1

    def memory(self, index: int) -> memoryview:
        """The device's own view of a memory BAR's contents (its on-board memory): what
        the host and bus masters read and write at bar_start(index) onwards."""
        bar = self.bars[index]
        if not isinstance(bar, MemoryBar):
            raise ValueError(f"PciDevice: BAR{index} is registers, not memory")
        return bar.buf

    def raise_irq(self, vector: int) -> int:
        """The device raises MSI-X `vector`: the handler its driver attached with
        request_irq runs now; IRQ_HANDLED or its answer, IRQ_NONE (counted spurious)
        when none is attached."""
        if not 0 <= vector < self.spec.msix_vectors:
            raise ValueError(f"PciDevice: vector {vector} not in its MSI-X table of "
                             f"{self.spec.msix_vectors}")
        return msix_raise(self.pdev, vector)

    def remove(self) -> None:
        """Hot-unplug: the bound driver's remove() runs, the BARs stop decoding."""
        pci_remove_device(self.pdev)

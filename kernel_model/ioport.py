"""The physical address map's definitions: what decodes an address, and what a miss is.

Kin to include/linux/ioport.h (a `struct resource` claims a range of the physical
address space) with the device's decode callbacks attached, as a PCI function decodes
its BARs.  A definition module: the PCI core, the device models and the drivers use
these without reaching up into the Machine that holds the map.
"""

from __future__ import annotations

from collections.abc import Callable

PCI_MMIO_BASE = 0x40_0000_0000  # 256 GiB: 64-bit BARs live above RAM


class MachineCheck(Exception):
    """A CPU or device access to a physical address nothing decodes."""


class MmioRegion:
    """A physical address range decoded by a device: read/write callbacks."""

    def __init__(self, name: str, start: int, size: int,
                 read: Callable[[int, int], bytes], write: Callable[[int, bytes], None]):
        self.name, self.start, self.size = name, start, size
        self.read, self.write = read, write

    @property
    def end(self) -> int:
        return self.start + self.size

    def __repr__(self) -> str:
        return f"MMIO {self.name} [{self.start:#x}-{self.end - 1:#x}]"

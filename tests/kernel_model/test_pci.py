"""Tests for kernel_model/pci.py: BAR placement, MMIO decoding, the bus list."""

from __future__ import annotations

from itertools import pairwise

import pytest

from kernel_model.dma import DMA_BIT_MASK
from kernel_model.errno import EEXIST, EINVAL, KernelError
from kernel_model.ioport import PCI_MMIO_BASE, MachineCheck
from kernel_model.pci import (
    IORESOURCE_MEM,
    IORESOURCE_MEM_64,
    IORESOURCE_PREFETCH,
    MemoryBar,
    for_each_pci_dev,
    pci_add_device,
    pci_dev,
    pci_disable_device,
    pci_enable_device,
    pci_get_device,
    pci_get_drvdata,
    pci_register_bar,
    pci_remove_device,
    pci_resource_end,
    pci_resource_flags,
    pci_resource_len,
    pci_resource_start,
    pci_set_drvdata,
    pci_set_master,
)

MiB = 1 << 20


class RegisterFile:
    """A callback BAR that records writes and reads back a pattern."""

    def __init__(self):
        self.writes: list[tuple[int, bytes]] = []

    def read(self, off: int, n: int) -> bytes:
        return bytes((off + i) & 0xFF for i in range(n))

    def write(self, off: int, data: bytes) -> None:
        self.writes.append((off, data))


def test_bars_are_placed_above_ram_aligned_and_disjoint(machine):
    pdev = pci_dev(machine, 0x15B3, 0x1017)
    assert pdev.name == "0000:01:00.0"
    regs = RegisterFile()
    pci_register_bar(pdev, 0, 1 * MiB, regs.read, regs.write)
    bar2 = MemoryBar(pdev, 2, 32 * MiB)
    pci_add_device(machine, pdev)
    assert pci_resource_start(pdev, 0) == PCI_MMIO_BASE == 0x40_0000_0000
    assert pci_resource_len(pdev, 0) == MiB
    assert pci_resource_end(pdev, 0) == PCI_MMIO_BASE + MiB - 1
    assert pci_resource_start(pdev, 2) == bar2.start == 0x40_0200_0000
    assert pci_resource_len(pdev, 2) == 32 * MiB
    assert pci_resource_flags(pdev, 0) == IORESOURCE_MEM | IORESOURCE_MEM_64
    assert pci_resource_flags(pdev, 2) == IORESOURCE_MEM | IORESOURCE_MEM_64 | \
        IORESOURCE_PREFETCH
    assert pci_resource_len(pdev, 1) == 0 and pci_resource_len(pdev, 4) == 0
    other = pci_dev(machine, 0x10DE, 0x2330)
    MemoryBar(other, 0, 16 * MiB)
    pci_add_device(machine, other)
    assert other.name == "0000:02:00.0"
    assert pci_resource_start(other, 0) == 0x40_0400_0000
    starts = [(r.start, r.end) for r in machine.iomem]
    assert starts == sorted(starts)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(starts))
    assert all(s >= machine.ram_size for s, _ in starts)
    pci_remove_device(other)
    pci_remove_device(pdev)


def test_callback_bar_decodes_reads_and_writes(machine):
    pdev = pci_dev(machine, 0x15B3, 0x1017)
    regs = RegisterFile()
    res = pci_register_bar(pdev, 0, 1 * MiB, regs.read, regs.write)
    pci_add_device(machine, pdev)
    machine.phys_write(res.start + 0x800, b"\x01\x02")
    assert regs.writes == [(0x800, b"\x01\x02")]
    assert machine.phys_read(res.start + 0x10, 3) == b"\x10\x11\x12"
    pci_remove_device(pdev)


def test_memory_bar_reads_back_writes(machine):
    pdev = pci_dev(machine, 0x10DE, 0x2330)
    bar = MemoryBar(pdev, 1, 64 * MiB)
    pci_add_device(machine, pdev)
    machine.phys_write(bar.start + 0x1234, b"hello")
    assert machine.phys_read(bar.start + 0x1234, 5) == b"hello"
    assert bytes(bar.buf[0x1234:0x1239]) == b"hello"  # what the device itself sees
    bar.buf[0:4] = b"gpu!"
    assert machine.phys_read(bar.start, 4) == b"gpu!"
    assert machine.phys_read(bar.start + 64 * MiB - 4, 4) == b"\0\0\0\0"
    pci_remove_device(pdev)


def test_removal_stops_decoding(machine):
    pdev = pci_dev(machine, 0x10DE, 0x2330)
    bar = MemoryBar(pdev, 0, 1 * MiB)
    pci_add_device(machine, pdev)
    assert machine.find_mmio(bar.start).name == "0000:01:00.0 BAR0"
    pci_remove_device(pdev)
    assert machine.find_mmio(bar.start) is None
    assert list(for_each_pci_dev(machine)) == []
    with pytest.raises(MachineCheck):
        machine.phys_read(bar.start, 4)
    with pytest.raises(KernelError) as e:
        pci_remove_device(pdev)
    assert e.value.errno == EINVAL


def test_bar_registered_after_add_decodes_at_once(machine):
    pdev = pci_add_device(machine, pci_dev(machine, 0x1B36, 0x0010))
    bar = MemoryBar(pdev, 4, 1 * MiB)
    machine.phys_write(bar.start, b"cmb")
    assert bytes(bar.buf[:3]) == b"cmb"
    pci_remove_device(pdev)


def test_64bit_bars_take_two_slots(machine):
    pdev = pci_dev(machine, 0x10DE, 0x2330)
    MemoryBar(pdev, 1, 1 * MiB)
    for bar in (1, 2, 5):
        with pytest.raises(KernelError) as e:
            MemoryBar(pdev, bar, 1 * MiB)
        assert e.value.errno == EINVAL
    MemoryBar(pdev, 3, 1 * MiB)
    with pytest.raises(KernelError):
        pci_register_bar(pdev, 0, 4 * MiB, lambda o, n: b"", lambda o, d: None)  # 1 taken
    assert pci_resource_len(pdev, 0) == 0
    with pytest.raises(KernelError) as e:
        MemoryBar(pci_dev(machine, 0x10DE, 0x2330), 0, MiB + 1)
    assert "not a power of 2" in e.value.message


def test_bus_list_drvdata_and_enable(machine):
    pdev = pci_dev(machine, 0x15B3, 0x101B, bus=3)
    assert pdev.name == "0000:03:00.0"
    assert pdev.dev.name == pdev.name and pdev.dev.bus == "pci"
    assert pdev.dev.dma_mask == DMA_BIT_MASK(32)  # until the driver's dma_set_mask
    pci_add_device(machine, pdev)
    with pytest.raises(KernelError) as e:
        pci_add_device(machine, pci_dev(machine, 0x15B3, 0x101B, bus=3))
    assert e.value.errno == EEXIST
    assert list(for_each_pci_dev(machine)) == [pdev] and machine.pci_devices == [pdev]
    assert pci_get_device(machine, 0x15B3, 0x101B) is pdev
    assert pci_get_device(machine, 0x15B3, 0x1017) is None
    pci_set_drvdata(pdev, "mlx5")
    assert pci_get_drvdata(pdev) == "mlx5"
    assert pci_enable_device(pdev) == 0
    pci_set_master(pdev)
    assert pdev.enable_cnt == 1 and pdev.is_busmaster
    pci_disable_device(pdev)
    assert pdev.enable_cnt == 0 and not pdev.is_busmaster
    pci_disable_device(pdev)
    assert machine.bugs == ["WARNING: pci_disable_device: 0000:03:00.0: disabling disabled "
                            "device"]
    machine.bugs.clear()
    pci_remove_device(pdev)

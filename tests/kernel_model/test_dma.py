"""Tests for kernel_model/dma.py: the streaming DMA API over the direct mapping."""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model.dma import (
    DMA_BIDIRECTIONAL,
    DMA_BIT_MASK,
    DMA_FROM_DEVICE,
    DMA_MAPPING_ERROR,
    DMA_NONE,
    DMA_TO_DEVICE,
    device,
    dma_get_max_seg_size,
    dma_map_resource,
    dma_map_sgtable,
    dma_mapping_error,
    dma_set_mask,
    dma_set_mask_and_coherent,
    dma_set_max_seg_size,
    dma_unmap_resource,
    dma_unmap_sgtable,
)
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.emu.machine import Machine
from kernel_model.errno import EINVAL, EIO, ENOMEM, KernelError
from kernel_model.scatterlist import sg_alloc_table_from_pages_segment, sg_table

P = 4096
GiB = 1 << 30


def build(m: Machine, pfns: list[int], offset: int = 0) -> sg_table:
    arr = U64Array(len(pfns))
    for i, p in enumerate(pfns):
        arr[i] = p
    sgt = sg_table(m)
    sg_alloc_table_from_pages_segment(sgt, arr, len(pfns), offset, len(pfns) * P - offset,
                                      2 * GiB)
    return sgt


def test_device_defaults(machine):
    dev = device("dev0", machine)
    assert dev.dma_mask == DMA_BIT_MASK(64) == (1 << 64) - 1
    assert dev.coherent_dma_mask == DMA_BIT_MASK(64)
    assert dma_get_max_seg_size(dev) == 65536
    dma_set_max_seg_size(dev, 2 * GiB)
    assert dma_get_max_seg_size(dev) == 2 * GiB
    assert DMA_BIT_MASK(32) == 0xFFFFFFFF


def test_identity_dma_address_is_physical(machine):
    dev = device("dev0", machine)
    sgt = build(machine, [10, 11, 12, 20], offset=0x80)
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL, 0)
    assert sgt.nents == sgt.orig_nents == 2
    assert sgt.dma_entries() == [(10 * P + 0x80, 3 * P - 0x80), (20 * P, P)]
    assert dev.nr_dma_mappings == 1
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL, 0)
    assert dev.nr_dma_mappings == 0
    assert find_leaks(machine) == []


def test_32bit_mask_refuses_pages_above_4g(backend):
    m = Machine(ram_size=5 * GiB, backend=backend)
    dev = device("nic0", m)
    dma_set_mask_and_coherent(dev, DMA_BIT_MASK(32))
    below, above = (4 * GiB - P) // P, (4 * GiB) // P
    sgt = build(m, [1, 2, below, above + 5])  # (1,2 pages), (below,1), (above+5,1)
    with pytest.raises(KernelError) as e:
        dma_map_sgtable(dev, sgt, DMA_TO_DEVICE)
    assert e.value.errno == EIO
    assert "0x100005000" in e.value.message and "0xffffffff" in e.value.message
    assert dev.nr_dma_mappings == 0
    assert sgt.nents == sgt.orig_nents == 3
    assert find_leaks(m) == []
    ok = build(m, [below])
    dma_map_sgtable(dev, ok, DMA_TO_DEVICE)
    assert ok.dma_entries() == [(below * P, P)]
    dma_unmap_sgtable(dev, ok, DMA_TO_DEVICE)


def test_invalid_direction_and_empty_table(machine):
    dev = device("dev0", machine)
    with pytest.raises(KernelError) as e:
        dma_map_sgtable(dev, build(machine, [3]), DMA_NONE)
    assert e.value.errno == EINVAL
    with pytest.raises(KernelError) as e:
        dma_map_sgtable(dev, sg_table(machine), DMA_FROM_DEVICE)
    assert e.value.errno == EINVAL
    assert dev.nr_dma_mappings == 0


def test_dma_set_mask_below_zone_dma_is_eio(machine):
    dev = device("dev0", machine)
    with pytest.raises(KernelError) as e:
        dma_set_mask(dev, DMA_BIT_MASK(20))
    assert e.value.errno == EIO
    assert dev.dma_mask == DMA_BIT_MASK(64)
    assert dma_set_mask(dev, DMA_BIT_MASK(24)) == 0


def test_leak_check_reports_live_mapping(machine):
    dev = device("leaky0", machine)
    sgt = build(machine, [7])
    dma_map_sgtable(dev, sgt, DMA_FROM_DEVICE)
    assert find_leaks(machine) == [
        "dma: leaky0: 1 live DMA mapping(s): sg_table of 1 entries at dma 0x7000 "
        "DMA_FROM_DEVICE"]
    dma_unmap_sgtable(dev, sgt, DMA_FROM_DEVICE)
    assert find_leaks(machine) == []


def test_unmap_of_unmapped_table_is_a_reported_bug(machine):
    dev = device("dev0", machine)
    sgt = build(machine, [7])
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    assert len(machine.bugs) == 1
    assert "dma_unmap_sgtable: dev0: device driver tries to free DMA memory" in machine.bugs[0]
    machine.bugs.clear()


def test_unmap_with_other_direction_is_a_reported_bug(machine):
    dev = device("dev0", machine)
    sgt = build(machine, [7])
    dma_map_sgtable(dev, sgt, DMA_TO_DEVICE)
    dma_unmap_sgtable(dev, sgt, DMA_FROM_DEVICE)
    assert dev.nr_dma_mappings == 0
    assert machine.bugs == ["WARNING: dma_unmap_sgtable: dev0: DMA memory mapped "
                            "DMA_TO_DEVICE freed with DMA_FROM_DEVICE"]
    machine.bugs.clear()


def test_map_resource_identity(machine):
    dev = device("dev0", machine)
    bar = machine.alloc_mmio_window(1 << 20)
    addr = dma_map_resource(dev, bar + 0x40, 0x100, DMA_BIDIRECTIONAL, 0)
    assert addr == bar + 0x40 and dma_mapping_error(dev, addr) == 0
    assert machine.iommu.translate(dev, addr, 0x100) == [(bar + 0x40, 0x100)]
    dma_unmap_resource(dev, addr, 0x100, DMA_BIDIRECTIONAL, 0)
    assert dev.nr_dma_mappings == 0


def test_map_resource_beyond_mask_or_on_ram_fails(machine):
    dev = device("dev0", machine)
    dma_set_mask(dev, DMA_BIT_MASK(32))
    bar = machine.alloc_mmio_window(1 << 20)  # at 256 GiB: beyond a 32-bit mask
    addr = dma_map_resource(dev, bar, 0x1000, DMA_TO_DEVICE)
    assert addr == DMA_MAPPING_ERROR and dma_mapping_error(dev, addr) == -ENOMEM
    assert dma_map_resource(dev, 0x5000, 0x1000, DMA_TO_DEVICE) == DMA_MAPPING_ERROR
    assert machine.bugs == ["WARNING: dma_map_resource: dev0: 0x5000 is RAM, not MMIO"]
    machine.bugs.clear()
    assert dev.nr_dma_mappings == 0

"""Tests for kernel_model/iommu.py: IOVA allocation, merging, translation, faults."""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model.dma import (
    DMA_BIDIRECTIONAL,
    DMA_BIT_MASK,
    DMA_TO_DEVICE,
    device,
    dma_map_resource,
    dma_map_sgtable,
    dma_set_mask,
    dma_set_max_seg_size,
    dma_unmap_resource,
    dma_unmap_sgtable,
)
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.emu.machine import Machine
from kernel_model.errno import ENOMEM, KernelError
from kernel_model.iommu import IommuFault, dma_to_phys, iova_domain
from kernel_model.scatterlist import sg_alloc_table_from_pages_segment, sg_table

P = 4096
GiB = 1 << 30
TOP48 = 1 << 48


@pytest.fixture
def machine(backend):
    return Machine(ram_size=64 << 20, backend=backend, iommu="translating")


def build(m: Machine, pfns: list[int], offset: int = 0) -> sg_table:
    arr = U64Array(len(pfns))
    for i, p in enumerate(pfns):
        arr[i] = p
    sgt = sg_table(m)
    sg_alloc_table_from_pages_segment(sgt, arr, len(pfns), offset, len(pfns) * P - offset,
                                      2 * GiB)
    return sgt


def test_identity_translate_is_the_identity(backend):
    m = Machine(ram_size=64 << 20, backend=backend)
    dev = device("dev0", m)
    assert not m.iommu.translating
    assert dma_to_phys(dev, 0x1234, 0x20) == [(0x1234, 0x20)]


def test_contiguous_iova_merges_entries_into_one_segment(machine):
    dev = device("dev0", machine)
    dma_set_max_seg_size(dev, 2 * GiB)
    sgt = build(machine, [10, 11, 12, 20, 21, 5])
    assert sgt.orig_nents == 3
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    # 6 pages round up to an 8-page, 8-page-aligned IOVA at the top of the 48-bit aperture
    assert sgt.nents == 1
    assert sgt.dma_entries() == [(TOP48 - 8 * P, 6 * P)]
    assert machine.iommu.domain(dev).iovad.ranges() == [((TOP48 >> 12) - 8, TOP48 >> 12)]
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    assert machine.iommu.domain(dev).iovad.ranges() == []


def test_max_segment_size_limits_merging(machine):
    dev = device("dev0", machine)  # default max segment 64 KiB
    sgt = build(machine, list(range(100, 110)) + list(range(200, 210)))
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    base = TOP48 - 32 * P  # 20 pages round up to 32 (below the rcache limit)
    assert sgt.dma_entries() == [(base, 10 * P), (base + 10 * P, 10 * P)]
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)


def test_pci_device_uses_32bit_space_first(machine):
    dev = device("0000:01:00.0", machine, bus="pci")
    sgt = build(machine, [10, 11])
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    assert sgt.dma_entries() == [(0x1_0000_0000 - 2 * P, 2 * P)]
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)


def test_translate_returns_physical_pieces(machine):
    dev = device("dev0", machine)
    sgt = build(machine, [10, 11, 12, 20, 21, 5], offset=0x100)
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    (dma, length), = sgt.dma_entries()
    assert (dma, length) == (TOP48 - 8 * P + 0x100, 6 * P - 0x100)
    assert dma_to_phys(dev, dma, 0x10) == [(10 * P + 0x100, 0x10)]
    # from the middle of pfn 11 across the 12 -> 20 discontinuity into pfn 20
    assert dma_to_phys(dev, dma + 0x1000, 0x2800) == [(11 * P + 0x100, 0x1F00),
                                                      (20 * P, 0x900)]
    assert dma_to_phys(dev, dma, length) == [(10 * P + 0x100, 3 * P - 0x100),
                                             (20 * P, 2 * P), (5 * P, P)]
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    with pytest.raises(IommuFault, match=r"dev0: DMA to unmapped IOVA 0xffffffff8100"):
        dma_to_phys(dev, dma, 0x10)


def test_access_past_the_mapping_faults(machine):
    dev = device("dev0", machine)
    sgt = build(machine, [10])
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    dma = sgt.dma_addr[0]
    assert dma_to_phys(dev, dma + P - 8, 8) == [(10 * P + P - 8, 8)]
    with pytest.raises(IommuFault):
        dma_to_phys(dev, dma + P - 8, 16)
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)


def test_domains_are_per_device_and_directions_are_enforced(machine):
    a, b = device("devA", machine), device("devB", machine)
    sgt = build(machine, [30])
    dma_map_sgtable(a, sgt, DMA_TO_DEVICE)
    dma = sgt.dma_addr[0]
    assert dma_to_phys(a, dma, 8, write=False) == [(30 * P, 8)]
    with pytest.raises(IommuFault, match="devA: DMA write"):
        dma_to_phys(a, dma, 8, write=True)
    with pytest.raises(IommuFault, match="devB"):
        dma_to_phys(b, dma, 8)
    dma_unmap_sgtable(a, sgt, DMA_TO_DEVICE)


def test_iova_space_exhaustion_is_enomem(machine):
    dev = device("dev0", machine)
    dma_set_mask(dev, DMA_BIT_MASK(16))  # 16 granules; IOVA pfn 0 is never handed out
    first = build(machine, list(range(40, 48)))
    dma_map_sgtable(dev, first, DMA_BIDIRECTIONAL)
    assert first.dma_entries()[0][0] == 8 * P
    second = build(machine, list(range(60, 68)))
    with pytest.raises(KernelError) as e:
        dma_map_sgtable(dev, second, DMA_BIDIRECTIONAL)
    assert e.value.errno == ENOMEM
    assert dev.nr_dma_mappings == 1
    dma_unmap_sgtable(dev, first, DMA_BIDIRECTIONAL)
    dma_map_sgtable(dev, second, DMA_BIDIRECTIONAL)  # the space came back
    dma_unmap_sgtable(dev, second, DMA_BIDIRECTIONAL)


def test_map_resource_through_the_iommu(machine):
    dev = device("dev0", machine)
    bar = machine.alloc_mmio_window(1 << 20)
    addr = dma_map_resource(dev, bar + 0x10, 0x100, DMA_BIDIRECTIONAL)
    assert addr == TOP48 - P + 0x10
    assert dma_to_phys(dev, addr, 0x100) == [(bar + 0x10, 0x100)]
    dma_unmap_resource(dev, addr, 0x100, DMA_BIDIRECTIONAL)
    with pytest.raises(IommuFault):
        dma_to_phys(dev, addr, 1)


def test_leak_check_names_iova_ranges(machine):
    dev = device("dev0", machine)
    sgt = build(machine, [9])
    dma_map_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    assert find_leaks(machine) == [
        "dma: dev0: 1 live DMA mapping(s): sg_table of 1 entries at dma 0xfffffffff000 "
        "DMA_BIDIRECTIONAL | IOVA [0xfffffffff000-0xffffffffffff] sg"]
    dma_unmap_sgtable(dev, sgt, DMA_BIDIRECTIONAL)
    assert find_leaks(machine) == []


def test_iova_allocator_is_top_down_and_size_aligned():
    iovad = iova_domain(12)
    assert iovad.alloc_iova(4, 0xFF) == 0xFC
    assert iovad.alloc_iova(2, 0xFF) == 0xFA
    assert iovad.alloc_iova(4, 0xFF) == 0xF4  # 0xF8 would overlap 0xFA
    assert iovad.alloc_iova(1, 0xFF) == 0xF9
    assert iovad.free_iova(0xFC) == 4
    assert iovad.alloc_iova(4, 0xFF) == 0xFC
    assert iovad.alloc_iova(1, 0) == 0  # nothing fits at or below pfn 0
    assert iovad.free_iova(0x10) == 0

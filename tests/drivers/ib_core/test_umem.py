"""Tests for drivers/ib_core/umem.py: ib_umem_get/release, page-size choice, block walk.

Pinning tests run a user process on a real Machine and check what the kernel
would leave behind: page pincounts, mm->pinned_vm, the mm reference, DMA
mappings (the suite's leak check runs after each test).  The page-size and
block tests build an ib_umem around a hand-filled DMA table, as the vectors
of kernel_facts.md §13 are stated in DMA addresses.
"""

from __future__ import annotations

import random
import sys

import pytest

import c_ext
import drivers.ib_core.umem as umem_mod
from c_ext import U64Array
from drivers.ib_core.umem import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_MW_BIND,
    IB_ACCESS_ON_DEMAND,
    IB_ACCESS_RELAXED_ORDERING,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    ib_access_writable,
    ib_dma_max_seg_size,
    ib_umem,
    ib_umem_dma_offset,
    ib_umem_fill_dma_blocks,
    ib_umem_find_best_pgoff,
    ib_umem_find_best_pgsz,
    ib_umem_get,
    ib_umem_is_contiguous,
    ib_umem_num_dma_blocks,
    ib_umem_num_pages,
    ib_umem_offset,
    ib_umem_release,
    ib_umem_start_dma_addr,
    rdma_for_each_block,
    rdma_umem_for_each_dma_block,
)
from kernel_model.dma import DMA_ATTR_WEAK_ORDERING, device
from kernel_model.emu.machine import Machine
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import EFAULT, EINVAL, EIO, ENOMEM, EOPNOTSUPP, EPERM, KernelError
from kernel_model.fs import cdev, cdev_add, file_operations
from kernel_model.gup import FOLL_LONGTERM, FOLL_WRITE
from kernel_model.memory import remap_pfn_range
from kernel_model.mm import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE
from kernel_model.page_alloc import PG_dirty, page
from kernel_model.scatterlist import sg_table
from kernel_model.trace import Tracer

K4, M1, M2, G1 = 1 << 12, 1 << 20, 1 << 21, 1 << 30
VA = 0x7F00_0000_0000  # aligned to every page-table span
ANON = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED
PTE_ADDR_MASK = 0x000F_FFFF_FFFF_F000


class IbDev:
    """Stand-in for an ib_device: ib_umem only reads .dma_device (an mlx5 PCI function)."""

    def __init__(self, m: Machine, max_seg: int = 2 << 30):
        self.dma_device = device("mlx5_0", m, bus="pci")
        self.dma_device.dma_parms.max_segment_size = max_seg


def genmask(h: int, lo: int) -> int:
    return ((1 << (h + 1)) - 1) & ~((1 << lo) - 1)


def be64(v: int) -> int:
    """cpu_to_be64(v) as a native u64 reads it back."""
    return int.from_bytes(v.to_bytes(8, "big"), sys.byteorder)


def pfn_of(p, va: int) -> int:
    return (p.mm.pgtable.get(va) & PTE_ADDR_MASK) >> p.machine.page_shift


def pins(p, va: int, npages: int) -> list[int]:
    m = p.machine
    return [page(m.zone, pfn_of(p, va + i * m.page_size))._pincount for i in range(npages)]


def get(p, dev, addr: int, size: int, access: int = 0) -> ib_umem:
    with p.kernel():
        return ib_umem_get(dev, addr, size, access)


def release(p, umem) -> None:
    with p.kernel():
        ib_umem_release(umem)


def expected_blocks(p, addr: int, length: int, pgsz: int) -> list[int]:
    """The DMA address of every pgsz block (pgsz <= PAGE_SIZE), through the page tables."""
    ps = p.machine.page_size
    first, end = addr & ~(pgsz - 1), (addr + length + pgsz - 1) & ~(pgsz - 1)
    return [(pfn_of(p, va) * ps) + (va & (ps - 1)) for va in range(first, end, pgsz)]


# -- ib_umem_get: the good path -------------------------------------------------------
def test_get_pins_maps_and_release_undoes_it(machine):
    """§13: ib_umem_get(0x7F0000001040, 0x2000) -> 3 pages."""
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 4 * K4, flags=ANON)
    mm_count = p.mm.mm_count
    umem = get(p, dev, VA + 0x1040, 0x2000)
    assert ib_umem_num_pages(umem) == 3 and p.mm.pinned_vm == 3
    assert pins(p, VA + K4, 3) == [1, 1, 1] and pins(p, VA, 1) == [0]  # page 0 was never faulted
    assert p.mm.mm_count == mm_count + 1 and umem.owning_mm is p.mm
    assert (umem.address, umem.length, umem.iova) == (VA + 0x1040, 0x2000, VA + 0x1040)
    assert not umem.writable and not umem.is_odp and not umem.is_dmabuf
    sgt = umem.sgt_append.sgt
    assert sum(length for _, _, length in sgt.cpu_entries()) == 3 * K4
    assert sgt.nents >= 1 and umem.sgt_append.end_marked
    assert ib_umem_offset(umem) == 0x40
    assert ib_umem_start_dma_addr(umem) == pfn_of(p, VA + K4) * K4 + 0x40
    assert dev.dma_device.nr_dma_mappings == 1
    assert repr(umem).startswith(f"ib_umem {VA + 0x1040:#x}+0x2000 iova") and "\n" not in repr(umem)
    release(p, umem)
    assert pins(p, VA + K4, 3) == [0, 0, 0] and p.mm.pinned_vm == 0
    assert p.mm.mm_count == mm_count and dev.dma_device.nr_dma_mappings == 0


def test_release_of_none_does_nothing(m):
    ib_umem_release(None)


def test_umem_outlives_the_process(m):
    """The umem holds mm_count, not mm_users: exit unmaps, pins keep the pages."""
    p = m.spawn("app")
    dev = IbDev(m)
    p.mmap(VA, 2 * K4, flags=ANON)
    umem = get(p, dev, VA, 2 * K4, IB_ACCESS_LOCAL_WRITE)
    mm, pfns = p.mm, [pfn_of(p, VA), pfn_of(p, VA + K4)]
    p.exit()
    assert mm in m.mms and mm.pinned_vm == 2
    assert [page(m.zone, pfn)._pincount for pfn in pfns] == [1, 1]
    with m.kernel():  # e.g. the uverbs file released later by another task
        ib_umem_release(umem)
    assert mm not in m.mms and mm.pinned_vm == 0
    assert [page(m.zone, pfn)._refcount for pfn in pfns] == [0, 0]  # freed by the last unpin


def test_size_zero_on_an_unaligned_address_still_pins_a_page(m):
    """ib_umem_num_pages() of [addr, addr) is 1 when addr is not page aligned."""
    p = m.spawn("app")
    p.mmap(VA, K4, flags=ANON)
    umem = get(p, IbDev(m), VA + 8, 0)
    assert ib_umem_num_pages(umem) == 1 and pins(p, VA, 1) == [1]
    release(p, umem)


def test_traced_call_flow(m):
    p = m.spawn("app")
    dev = IbDev(m)
    p.mmap(VA, K4, flags=ANON)
    with Tracer() as t:
        umem = get(p, dev, VA, K4)
        with p.kernel():
            ib_umem_find_best_pgsz(umem, K4, VA)
        release(p, umem)
    assert_call_flow(t.trace, ["ib_umem_get", "pin_user_pages_fast",
                               "sg_alloc_append_table_from_pages", "dma_map_sgtable",
                               "ib_umem_find_best_pgsz", "ib_umem_release", "dma_unmap_sgtable",
                               "unpin_user_page_range_dirty_lock"])


# -- ib_umem_get: every errno ---------------------------------------------------------
@pytest.mark.parametrize("addr,size", [((1 << 64) - K4, K4), ((1 << 64) - K4, 100),
                                        (VA, 0), (-K4, K4), (VA, -1)])
def test_einval_for_a_wrapping_or_empty_range(m, addr, size):
    p = m.spawn("app")
    mm_count = p.mm.mm_count
    with pytest.raises(KernelError) as e:
        get(p, IbDev(m), addr, size)
    assert e.value.errno == EINVAL
    assert p.mm.mm_count == mm_count and p.mm.pinned_vm == 0


def test_eperm_without_memlock_rlimit(m):
    p = m.spawn("app", rlimit_memlock=0)
    p.mmap(VA, K4, flags=ANON)
    with pytest.raises(KernelError) as e:
        get(p, IbDev(m), VA, K4)
    assert e.value.errno == EPERM


def test_cap_ipc_lock_allows_a_zero_rlimit(m):
    p = m.spawn("app", rlimit_memlock=0, cap_ipc_lock=True)
    p.mmap(VA, K4, flags=ANON)
    umem = get(p, IbDev(m), VA, K4)
    assert p.mm.pinned_vm == 1
    release(p, umem)


def test_enomem_over_rlimit_memlock_and_cap_ipc_lock_passes():
    """§13: 65 KiB with RLIMIT_MEMLOCK 64 KiB -> ENOMEM (17 > 16 pages); CAP_IPC_LOCK OK."""
    m = Machine(ram_size=64 << 20)
    p = m.spawn("app", rlimit_memlock=64 << 10)
    dev = IbDev(m)
    p.mmap(VA, 32 * K4, flags=ANON)
    with pytest.raises(KernelError) as e:
        get(p, dev, VA, 65 << 10)
    assert e.value.errno == ENOMEM and p.mm.pinned_vm == 0 and pins(p, VA, 1) == [0]
    # the limit counts what is already pinned: 8 + 9 pages > 16
    first = get(p, dev, VA, 8 * K4)
    with pytest.raises(KernelError) as e:
        get(p, dev, VA + 8 * K4, 9 * K4)
    assert e.value.errno == ENOMEM and p.mm.pinned_vm == 8
    release(p, first)
    capped = m.spawn("admin", rlimit_memlock=64 << 10, cap_ipc_lock=True)
    capped.mmap(VA, 17 * K4, flags=ANON)
    umem = get(capped, dev, VA, 65 << 10)
    assert capped.mm.pinned_vm == 17 and pins(capped, VA, 17) == [1] * 17
    release(capped, umem)


def test_eopnotsupp_for_on_demand_paging(m):
    p = m.spawn("app")
    p.mmap(VA, K4, flags=ANON)
    with pytest.raises(KernelError) as e:
        get(p, IbDev(m), VA, K4, IB_ACCESS_ON_DEMAND | IB_ACCESS_LOCAL_WRITE)
    assert e.value.errno == EOPNOTSUPP


def test_efault_for_an_unmapped_range(machine):
    p = machine.spawn("app")
    with pytest.raises(KernelError) as e:
        get(p, IbDev(machine), VA, 4 * K4)
    assert e.value.errno == EFAULT and p.mm.pinned_vm == 0


def test_efault_half_way_unpins_what_was_pinned(machine):
    """gup pins the mapped head (a short pin), the loop goes round, the hole fails."""
    p = machine.spawn("app")
    mm_count = p.mm.mm_count
    p.mmap(VA, 3 * K4, flags=ANON)
    for i in range(3):
        p.store(VA + i * K4, b"data")
    with pytest.raises(KernelError) as e:
        get(p, IbDev(machine), VA, 5 * K4, IB_ACCESS_LOCAL_WRITE)
    assert e.value.errno == EFAULT
    assert pins(p, VA, 3) == [0, 0, 0] and p.mm.pinned_vm == 0 and p.mm.mm_count == mm_count
    assert not any(page(machine.zone, pfn_of(p, VA + i * K4)).flags & PG_dirty for i in range(3))


def test_efault_for_an_io_pfnmap_range(machine):
    m = machine
    bar = m.alloc_mmio_window(1 << 20)

    def bar_mmap(f, vma):
        remap_pfn_range(vma, vma.vm_start, bar >> m.page_shift, vma.vm_end - vma.vm_start,
                        vma.vm_page_prot)

    with m.kernel():
        cdev_add(cdev(file_operations(mmap=bar_mmap)), "/dev/bar")
    p = m.spawn("app")
    fd = p.open("/dev/bar")
    addr = p.mmap(0, 2 * K4, PROT_READ | PROT_WRITE, MAP_SHARED, fd)
    with pytest.raises(KernelError) as e:
        get(p, IbDev(m), addr, 2 * K4, IB_ACCESS_LOCAL_WRITE)
    assert e.value.errno == EFAULT and p.mm.pinned_vm == 0
    assert p.close(fd) == 0


def test_dma_map_failure_unwinds_without_dirtying(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    dev.dma_device.dma_mask = 0xFFF  # no RAM page is reachable
    p.mmap(VA, 2 * K4, flags=ANON)
    mm_count = p.mm.mm_count
    with pytest.raises(KernelError) as e:
        get(p, dev, VA, 2 * K4, IB_ACCESS_LOCAL_WRITE)
    assert e.value.errno == EIO
    assert pins(p, VA, 2) == [0, 0] and p.mm.pinned_vm == 0 and p.mm.mm_count == mm_count
    assert not any(page(machine.zone, pfn_of(p, VA + i * K4)).flags & PG_dirty for i in range(2))
    assert dev.dma_device.nr_dma_mappings == 0


def test_append_failure_unpins_the_batch(m):
    """A max segment below PAGE_SIZE makes sg_alloc_append_table_from_pages WARN and fail."""
    p = m.spawn("app")
    p.mmap(VA, 2 * K4, flags=ANON)
    with pytest.raises(KernelError) as e:
        get(p, IbDev(m, max_seg=100), VA, 2 * K4)
    assert e.value.errno == EINVAL
    assert pins(p, VA, 2) == [0, 0] and p.mm.pinned_vm == 0
    assert len(m.bugs) == 1 and "max_segment" in m.bugs[0]
    m.bugs.clear()


# -- gup flags, dirtying, DMA attributes ----------------------------------------------
class PinSpy:
    """Wraps umem's pin_user_pages_fast: records calls, optionally pins at most `cap` pages."""

    def __init__(self, monkeypatch, cap: int | None = None):
        self.calls: list[tuple[int, int, int]] = []
        real = umem_mod.pin_user_pages_fast

        def spy(start, nr_pages, gup_flags, pages, pages_off=0):
            self.calls.append((start, nr_pages, gup_flags))
            return real(start, min(nr_pages, cap or nr_pages), gup_flags, pages, pages_off)

        monkeypatch.setattr(umem_mod, "pin_user_pages_fast", spy)
        monkeypatch.setattr(umem_mod, "PIN_AT_ONCE", False)    # every batch, one call each


@pytest.mark.parametrize("access,writable", [
    (0, False), (IB_ACCESS_REMOTE_READ, False), (IB_ACCESS_LOCAL_WRITE, True),
    (IB_ACCESS_REMOTE_WRITE, True), (IB_ACCESS_REMOTE_ATOMIC, True), (IB_ACCESS_MW_BIND, True)])
def test_gup_flags_follow_writability(m, monkeypatch, access, writable):
    """§13: LOCAL_WRITE -> FOLL_LONGTERM|FOLL_WRITE; read access pins without FOLL_WRITE."""
    spy = PinSpy(monkeypatch)
    p = m.spawn("app")
    p.mmap(VA, K4, flags=ANON)
    umem = get(p, IbDev(m), VA, K4, access)
    assert umem.writable is writable is ib_access_writable(access)
    assert spy.calls == [(VA, 1, FOLL_LONGTERM | (FOLL_WRITE if writable else 0))]
    release(p, umem)


def test_read_only_mapping_pins_for_read_but_not_for_write(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, PROT_READ, ANON)
    umem = get(p, dev, VA, 2 * K4, IB_ACCESS_REMOTE_READ)
    assert pins(p, VA, 2) == [1, 1]
    release(p, umem)
    with pytest.raises(KernelError) as e:
        get(p, dev, VA, 2 * K4, IB_ACCESS_LOCAL_WRITE)
    assert e.value.errno == EFAULT and pins(p, VA, 2) == [0, 0] and p.mm.pinned_vm == 0


@pytest.mark.parametrize("access,dirty", [(IB_ACCESS_LOCAL_WRITE, True), (0, False)])
def test_release_dirties_only_writable_pages(machine, access, dirty):
    p = machine.spawn("app")
    p.mmap(VA, 2 * K4, flags=ANON)
    umem = get(p, IbDev(machine), VA, 2 * K4, access)
    pfns = [pfn_of(p, VA), pfn_of(p, VA + K4)]
    assert not any(page(machine.zone, pfn).flags & PG_dirty for pfn in pfns)
    release(p, umem)
    assert [bool(page(machine.zone, pfn).flags & PG_dirty) for pfn in pfns] == [dirty, dirty]


@pytest.mark.parametrize("access,attrs", [(0, 0), (IB_ACCESS_RELAXED_ORDERING,
                                                   DMA_ATTR_WEAK_ORDERING)])
def test_relaxed_ordering_maps_weakly_ordered(m, monkeypatch, access, attrs):
    seen = []
    real = umem_mod.dma_map_sgtable
    monkeypatch.setattr(umem_mod, "dma_map_sgtable",
                        lambda dev, sgt, dir, a=0: seen.append(a) or real(dev, sgt, dir, a))
    p = m.spawn("app")
    p.mmap(VA, K4, flags=ANON)
    release(p, get(p, IbDev(m), VA, K4, access))
    assert seen == [attrs]


def test_max_seg_size_is_the_dma_devices(m):
    assert ib_dma_max_seg_size(IbDev(m)) == 2 << 30
    assert ib_dma_max_seg_size(IbDev(m, max_seg=8192)) == 8192


# -- coalescing (§13) ---------------------------------------------------------------
def test_physical_runs_become_sg_entries(machine):
    """Like PFNs [10,11,12,20,21,5]: runs of 3, 2 and 1 pages, in VA order."""
    p = machine.spawn("app")
    p.mmap(VA, 7 * K4, flags=ANON)
    for i in (5, 0, 1, 2, 6, 3, 4):  # page 6 (outside the umem) splits 0-2 from 3-4
        p.store(VA + i * K4, b"x")
    first = pfn_of(p, VA)
    umem = get(p, IbDev(machine), VA, 6 * K4)
    assert umem.sgt_append.sgt.cpu_entries() == [
        (first, 0, 3 * K4), (first + 4, 0, 2 * K4), (first - 1, 0, K4)]
    assert umem.sgt_append.sgt.nents == 3
    release(p, umem)


@pytest.mark.parametrize("max_seg", [8192, 10000])
def test_max_segment_cuts_runs(m, max_seg):
    """§13: [1..5] with max_segment 8K -> 2+2+1 pages; 10000 rounds down to 8K."""
    p = m.spawn("app")
    p.mmap(VA, 5 * K4, flags=ANON)
    p.store(VA, bytes(5 * K4))  # faulted in VA order: one physical run
    first = pfn_of(p, VA)
    umem = get(p, IbDev(m, max_seg=max_seg), VA, 5 * K4)
    assert umem.sgt_append.sgt.cpu_entries() == [
        (first, 0, 2 * K4), (first + 2, 0, 2 * K4), (first + 4, 0, K4)]
    release(p, umem)


def test_batches_of_a_page_of_pointers_merge_into_one_entry(m, monkeypatch):
    """§13: 1000 consecutive PFNs pinned in 2 batches (512 + 488) -> 1 entry."""
    spy = PinSpy(monkeypatch)
    p = m.spawn("app")
    p.mmap(VA, 1000 * K4, flags=ANON)
    for va in range(VA, VA + 1000 * K4, 512 * K4):  # page tables first: data stays contiguous
        p.mm.pgtable.pte_slot(va, True)
    p.store(VA, bytes(1000 * K4))
    umem = get(p, IbDev(m), VA, 1000 * K4)
    assert [(s, n) for s, n, _ in spy.calls] == [(VA, 512), (VA + 512 * K4, 488)]
    assert umem.sgt_append.sgt.cpu_entries() == [(pfn_of(p, VA), 0, 1000 * K4)]
    assert ib_umem_is_contiguous(umem)
    release(p, umem)


def test_short_pins_continue_and_extend_the_last_entry(machine, monkeypatch):
    """§13: batches of 2 with max 12K -> (first, 3 pages), (first + 3, 2 pages)."""
    spy = PinSpy(monkeypatch, cap=2)
    p = machine.spawn("app")
    p.mmap(VA, 5 * K4, flags=ANON)
    p.store(VA, bytes(5 * K4))
    first = pfn_of(p, VA)
    umem = get(p, IbDev(machine, max_seg=12288), VA, 5 * K4)
    assert [(s, n) for s, n, _ in spy.calls] == [(VA, 5), (VA + 2 * K4, 3), (VA + 4 * K4, 1)]
    assert umem.sgt_append.sgt.cpu_entries() == [(first, 0, 3 * K4), (first + 3, 0, 2 * K4)]
    assert p.mm.pinned_vm == 5 and pins(p, VA, 5) == [1] * 5
    release(p, umem)
    assert pins(p, VA, 5) == [0] * 5 and p.mm.pinned_vm == 0


def test_blocks_of_a_scattered_umem_follow_the_page_tables(machine):
    p = machine.spawn("app")
    p.mmap(VA, 8 * K4, flags=ANON)
    for i in (3, 0, 7, 1, 6, 2, 5, 4):
        p.store(VA + i * K4, b"x")
    umem = get(p, IbDev(machine), VA + 0x123, 7 * K4)
    for pgsz in (K4, 1024, 64):
        want = expected_blocks(p, VA + 0x123, 7 * K4, pgsz)
        assert list(rdma_umem_for_each_dma_block(umem, pgsz)) == want
        out = U64Array(len(want))
        assert ib_umem_fill_dma_blocks(umem, pgsz, out) == len(want) and out.tolist() == want
    assert ib_umem_find_best_pgsz(umem, genmask(43, 12), VA + 0x123) == K4
    assert not ib_umem_is_contiguous(umem)
    release(p, umem)


# -- the batches in one C call (_pin_batches_at_once) --------------------------------------
def _pin_layout(backend: str, seed: int, at_once: bool, monkeypatch) -> tuple:
    """A registration over 1,300 pages faulted in a shuffled order with holes (pages
    the fast path cannot pin, left to the slow path), max_seg 40 pages: its table,
    pins, pin count and end mark, by batches one call each or at once."""
    monkeypatch.setattr(umem_mod, "PIN_AT_ONCE", at_once)
    took = []
    real = umem_mod._pin_batches_at_once
    monkeypatch.setattr(umem_mod, "_pin_batches_at_once",
                        lambda *a: took.append(real(*a)) or took[-1])
    rng = random.Random(seed)
    m = Machine(ram_size=64 << 20, backend=backend)
    p = m.spawn("app")
    n = 1300
    p.mmap(VA, n * K4, flags=ANON)
    order = list(range(n))
    rng.shuffle(order) if seed % 2 else None      # odd seeds: fragmented
    holes = set(rng.sample(range(n), rng.randrange(0, 12)))
    for i in order:
        if i not in holes:
            p.store(VA + i * K4, b"x")
    before = m.vmstat["nr_foll_pin_acquired"]
    umem = get(p, IbDev(m, max_seg=40 * K4), VA, n * K4, IB_ACCESS_LOCAL_WRITE)
    seen = (umem.sgt_append.sgt.cpu_entries(), pins(p, VA, n),
            m.vmstat["nr_foll_pin_acquired"] - before, umem.sgt_append.end_marked,
            len(holes))
    release(p, umem)
    assert pins(p, VA, n) == [0] * n
    assert (sum(took) >= n - 512 * len(holes)) if at_once else not any(took)
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_batches_at_once_build_what_batch_by_batch_builds(seed, monkeypatch):
    """The shortcut pins, appends and counts exactly as the kernel's loop, on the C
    loops and on their Python twins; a page the fast path cannot pin (a hole) makes
    it stop and that batch go the kernel's way, slow path included."""
    got = {(b, once): _pin_layout(b, seed, once, monkeypatch)
           for b in ("c", "python") for once in (True, False)}
    assert len({repr(v) for v in got.values()}) == 1
    entries, pinned, acquired, end, _ = got["c", True]
    assert pinned == [1] * 1300 and acquired == 1300 and end
    assert all(length <= 40 * K4 for _, _, length in entries)


@pytest.mark.parametrize("layout", ["contiguous", "shuffled"])
def test_the_table_grows_with_what_the_batches_need(layout, backend, monkeypatch):
    """At once, the table is sized for one batch's worst case (an entry per page) and
    grown as batches come: a range whose pages coalesce never holds room for an entry
    per page (one 4,000-page range: at most a few batches' room); one whose pages do
    not is grown once, to every page left, after its first batch."""
    m = Machine(ram_size=64 << 20, backend=backend)
    p = m.spawn("app", cap_ipc_lock=True)       # 4,000 pages: over the default 8 MiB
    n = 4000
    p.mmap(VA, n * K4, flags=ANON)
    order = list(range(n))
    if layout == "shuffled":
        random.Random(7).shuffle(order)
    for i in order:
        p.store(VA + i * K4, b"x")
    grown = []
    real = sg_table._alloc

    def spy(self, capacity, zero=False):
        grown.append(capacity)
        real(self, capacity, zero)
    monkeypatch.setattr(sg_table, "_alloc", spy)
    umem = get(p, IbDev(m), VA, n * K4, IB_ACCESS_LOCAL_WRITE)
    monkeypatch.undo()
    sgt = umem.sgt_append.sgt
    if layout == "contiguous":
        assert sgt.orig_nents < 10 and sgt.capacity <= 2 * 512
    else:
        assert sgt.orig_nents > n // 2
        assert [c for c in grown if c] == [512, n]   # a batch's room, then all of it
    release(p, umem)
    assert pins(p, VA, n) == [0] * n


def test_a_traced_registration_pins_batch_by_batch(m):
    """Tracing on: each batch's pin_user_pages_fast and append is in the trace, the
    shortcut not taken."""
    p = m.spawn("app")
    p.mmap(VA, 1000 * K4, flags=ANON)
    p.store(VA, bytes(1000 * K4))
    with Tracer() as t:
        umem = get(p, IbDev(m), VA, 1000 * K4)
    calls = [c.func for c in t.trace.calls() if c.func in (
        "pin_user_pages_fast", "sg_alloc_append_table_from_pages")]
    assert calls == ["pin_user_pages_fast", "sg_alloc_append_table_from_pages"] * 2
    release(p, umem)


def test_pin_append_refuses_columns_too_short(m):
    """ops.pin_append checks the table's count fits its columns before C runs, and
    pins no batch whose worst case (an entry per page) the columns lack room for:
    it returns for the caller to grow the table."""
    small = U64Array(3)
    with pytest.raises(ValueError, match="overflow"):
        m.ops.pin_append(m.mem, 0, VA, 4, 0, 0, U64Array(512), 1 << 30, small, small, small, 4)
    # 4 pages to pin, room for 3 entries: nothing pinned (pgd 0 is never walked)
    assert m.ops.pin_append(m.mem, 0, VA, 4, 0, 0, U64Array(512), 1 << 30, small, small,
                            small, 0) == (0, 0)
    assert m.ops.pin_append(m.mem, 0, VA, 4, 0, 0, U64Array(2), 1 << 30, small, small,
                            small, 2) == (0, 2)
    with pytest.raises(ValueError, match="max_seg"):
        m.ops.pin_append(m.mem, 0, VA, 1, 0, 0, U64Array(512), 100, small, small, small, 0)


# -- a 64 KiB-page machine -----------------------------------------------------------
def test_64k_pages(backend, monkeypatch):
    m = Machine(ram_size=64 << 20, page_size=1 << 16, backend=backend)
    spy = PinSpy(monkeypatch)
    p = m.spawn("app")
    ps = m.page_size
    p.mmap(VA, 4 * ps, flags=ANON)
    for i in (2, 0, 1):
        p.store(VA + i * ps, b"x")
    umem = get(p, IbDev(m), VA + 0x1040, 0x20000, IB_ACCESS_LOCAL_WRITE)
    assert ib_umem_num_pages(umem) == 3 and p.mm.pinned_vm == 3  # pinned_vm counts 64K pages
    assert spy.calls == [(VA, 3, FOLL_LONGTERM | FOLL_WRITE)]  # a batch would be 8192 pages
    assert ib_umem_offset(umem) == 0x1040
    want = expected_blocks(p, VA + 0x1040, 0x20000, K4)
    assert len(want) == ib_umem_num_dma_blocks(umem, K4) == 33
    assert list(rdma_umem_for_each_dma_block(umem, K4)) == want
    out = U64Array(33)
    assert ib_umem_fill_dma_blocks(umem, K4, out, 0x5, big_endian=True) == 33
    assert out.tolist() == [be64(b | 5) for b in want]
    # the VA is 64K aligned only at its page: no larger device page fits
    assert ib_umem_find_best_pgsz(umem, genmask(43, 12), VA + 0x1040) == ps
    release(p, umem)
    assert pins(p, VA, 3) == [0, 0, 0] and p.mm.pinned_vm == 0


# -- pure algorithms on hand-filled DMA tables (§13 vectors) ------------------------------
def umem_of(m: Machine, address: int, length: int, segs: list[tuple[int, int]]) -> ib_umem:
    """An ib_umem around a DMA table (no pins, no mm: never released)."""
    u = ib_umem(None, m)
    u.address, u.length, u.iova = address, length, address
    sgt = u.sgt_append.sgt
    sgt.ensure_capacity(len(segs))
    for i, (dma, n) in enumerate(segs):
        sgt.sg_pfn[i], sgt.sg_off[i], sgt.sg_len[i] = dma >> m.page_shift, 0, n
        sgt.dma_addr[i], sgt.dma_len[i] = dma, n
    sgt.orig_nents = sgt.nents = len(segs)
    return u


BITMAP = K4 | M2 | G1
VA2M = 0x7F00_0020_0000


@pytest.mark.parametrize("address,length,segs,bitmap,best", [
    (VA2M, M2, [(0x4000_0000, M2)], BITMAP, M2),                        # VA and DMA 2M aligned
    (VA2M + K4, M2, [(0x4000_0000, M2 + K4)], BITMAP, K4),              # VA only 4K aligned
    (VA2M, 2 * M2, [(0x4000_0000, M2), (0x8000_0000, M2)], BITMAP, M2),  # two 2M runs
    (VA2M, M2, [(0x4000_0000, M1), (0x4010_0000, M1)], BITMAP, M2),     # contiguous 1M entries
    (VA, 2 * K4, [(0x1000_0000, K4), (0x2000_0000, K4)], BITMAP, K4),   # two scattered pages
    (VA, 2 * K4, [(0x1000_0000, K4), (0x2000_0000, K4)], M2, 0),        # ... and 2M only
    (VA2M, 2 * M2, [(0x4000_0000, M2), (0x8000_0000, M2)], genmask(63, 0), M2),
    (VA, G1, [(0x4000_0000, G1)], BITMAP, G1),                          # 1G aligned both
    (VA2M, G1, [(0x4000_0000, G1)], BITMAP, M2),                        # VA 2M aligned only
])
def test_find_best_pgsz_vectors(m, address, length, segs, bitmap, best):
    u = umem_of(m, address, length, segs)
    assert ib_umem_find_best_pgsz(u, bitmap, address) == best
    assert u.iova == address


def test_find_best_pgsz_sets_iova_and_counts_blocks_from_it(m):
    u = umem_of(m, VA2M, M2, [(0x4000_0000, M2)])
    assert ib_umem_find_best_pgsz(u, BITMAP, 0) == M2  # a zero-based MR at the same alignment
    assert u.iova == 0 and ib_umem_num_dma_blocks(u, M2) == 1
    assert ib_umem_find_best_pgsz(u, BITMAP, K4) == K4 and u.iova == K4


def mlx5_quantized_pgoff(u: ib_umem, log_bits: int, off_bits: int, scale: int) -> tuple[int, int]:
    """The mlx5 caller (mem.c __mlx5_umem_find_best_quantized_pgoff), to check the §13 vectors."""
    bitmap = genmask(min((1 << log_bits) - 1 + 12, 63), 12)
    mask = (1 << off_bits) - 1
    page_size = ib_umem_find_best_pgoff(u, bitmap, genmask(31, (scale - 1).bit_length()))
    if not page_size:
        return 0, 0
    offset = ib_umem_dma_offset(u, page_size)
    while offset & ~(mask * (page_size // scale)):
        page_size //= 2
        offset = ib_umem_dma_offset(u, page_size)
    if not bitmap & page_size:
        return 0, 0
    return page_size, offset // (page_size // scale)


def test_quantized_pgoff_qp_buffer_vectors(m):
    """§13: qpc log_page_size (5 bits), page_offset (6 bits), quanta 64."""
    scattered = [(0x1000_0000, K4), (0x2000_0000, K4)]
    u = umem_of(m, VA + 0x40, 0x1000, scattered)
    assert mlx5_quantized_pgoff(u, 5, 6, 64) == (K4, 1)
    assert u.iova == 0x1000_0040 and ib_umem_num_dma_blocks(u, K4) == 2  # ncont, log 0
    assert list(rdma_umem_for_each_dma_block(u, K4)) == [0x1000_0000, 0x2000_0000]
    u = umem_of(m, VA + 0x10000, 0x10000, [(0x4000_0000, 0x10000)])
    assert mlx5_quantized_pgoff(u, 5, 6, 64) == (0x10000, 0)
    assert ib_umem_num_dma_blocks(u, 0x10000) == 1  # log_page_size 4
    u = umem_of(m, VA + 0x20, 0x1000, scattered)
    assert mlx5_quantized_pgoff(u, 5, 6, 64) == (0, 0)  # the caller returns EINVAL


def test_num_dma_blocks_vector(m):
    """§13: num_dma_blocks(iova 0x10000040, len 0x1000, 4K) = 2."""
    u = umem_of(m, VA + 0x40, 0x1000, [(0x1000_0000, 2 * K4)])
    u.iova = 0x1000_0040
    assert ib_umem_num_dma_blocks(u, K4) == 2 and ib_umem_num_pages(u) == 2


def test_is_contiguous(m):
    assert ib_umem_is_contiguous(umem_of(m, VA + 0x40, 3 * K4, [(0x1000_0000, 4 * K4)]))
    assert ib_umem_is_contiguous(umem_of(m, VA, 2 * K4,
                                         [(0x1000_0000, K4), (0x1000_1000, K4)]))
    assert not ib_umem_is_contiguous(umem_of(m, VA, 2 * K4,
                                             [(0x1000_0000, K4), (0x3000_0000, K4)]))


def test_release_refund_follows_iova_like_the_kernel(m):
    """ib_umem_release refunds ib_umem_num_pages(), which reads iova: a find_best_pgoff
    that drops the page offset (QP buffer at offset 0x20, then EINVAL) refunds one
    page less than was charged - the kernel's accounting, mirrored."""
    p = m.spawn("app")
    p.mmap(VA, 4 * K4, flags=ANON)
    umem = get(p, IbDev(m), VA + 0x1020, 0x2000)
    assert p.mm.pinned_vm == 3
    assert mlx5_quantized_pgoff(umem, 5, 6, 64) == (0, 0)
    assert umem.iova & (K4 - 1) == 0 and ib_umem_num_pages(umem) == 2
    release(p, umem)
    assert p.mm.pinned_vm == 1 and pins(p, VA + K4, 3) == [0, 0, 0]


def test_fill_refuses_a_short_table(m):
    u = umem_of(m, VA, 2 * K4, [(0x1000_0000, 2 * K4)])
    with pytest.raises(KernelError) as e:
        ib_umem_fill_dma_blocks(u, K4, U64Array(1))
    assert e.value.errno == EINVAL


def test_fill_or_flags_and_big_endian(machine):
    u = umem_of(machine, VA, 3 * K4, [(0x1000_0000, 2 * K4), (0x3000_0000, K4)])
    out = U64Array(3)
    assert ib_umem_fill_dma_blocks(u, K4, out, 0x3) == 3
    assert out.tolist() == [0x1000_0003, 0x1000_1003, 0x3000_0003]
    assert ib_umem_fill_dma_blocks(u, K4, out, 0x3, big_endian=True) == 3
    assert out.tolist() == [be64(v) for v in (0x1000_0003, 0x1000_1003, 0x3000_0003)]


def test_rdma_for_each_block_walks_every_segment(m):
    u = umem_of(m, VA, 3 * K4, [(0x1000_0800, 0x800), (0x2000_0000, 2 * K4)])
    assert list(rdma_for_each_block(u.sgt_append.sgt, 2, K4)) == [
        0x1000_0000, 0x2000_0000, 0x2000_1000]


def test_iterator_and_c_loop_agree_on_random_tables(machine):
    """The generator mirrors iter.c step by step; the C loop (or twin) must match it."""
    rng = random.Random(4)
    ps = machine.page_size
    for _ in range(300):
        nsegs = rng.randint(1, 6)
        base = rng.randrange(1, 1 << 20) * ps
        segs, dma = [], base
        for _ in range(nsegs):
            if rng.random() < 0.5:
                dma = rng.randrange(1, 1 << 20) * ps  # a discontinuity
            n = rng.randint(1, 8) * ps
            segs.append((dma, n))
            dma += n
        total = sum(n for _, n in segs)
        off = rng.randrange(ps)
        length = rng.randint(1, total - off)
        u = umem_of(machine, VA + off, length, segs)
        pgsz = rng.choice([64, 512, K4, ps, 2 * ps, 8 * ps])
        if rng.random() < 0.5:
            pgsz = ib_umem_find_best_pgsz(u, genmask(40, 6), VA + off) or K4
        want = list(rdma_umem_for_each_dma_block(u, pgsz))
        assert len(want) <= ib_umem_num_dma_blocks(u, pgsz)
        out = U64Array(ib_umem_num_dma_blocks(u, pgsz))
        assert ib_umem_fill_dma_blocks(u, pgsz, out, 1) == len(want)
        assert out[:len(want)] == [b | 1 for b in want]


@pytest.mark.parametrize("backend", ["c", "python"])
def test_release_counts_pages_per_entry_rounding_up(m, backend):
    """__ib_umem_release unpins DIV_ROUND_UP(length, PAGE_SIZE) pages per entry: the
    unpin takes the entries' byte lengths and rounds each up itself."""
    ops = c_ext.backend(backend)
    whole = umem_of(m, VA, 5 * K4, [(0x1000_0000, 2 * K4), (0x3000_0000, 3 * K4)])
    sgt = whole.sgt_append.sgt
    assert ops.count_pages(sgt.sg_len, sgt.orig_nents, sgt.page_shift) == 5
    ragged = umem_of(m, VA, 5 * K4, [(0x1000_0000, 0x800), (0x3000_0000, K4 + 1), (0, K4)])
    sgt = ragged.sgt_append.sgt
    assert ops.count_pages(sgt.sg_len, sgt.orig_nents, sgt.page_shift) == 1 + 2 + 1

"""Tests for drivers/ib_core/umem_odp.py and kernel_model/mmu_notifier.py: ODP umems.

An ODP umem pins nothing and charges nothing; pages are found (faulted in) on
demand by ib_umem_odp_map_dma_and_lock(); munmap and exit invalidate through
the mmu interval notifier before the pages go, so the next access faults again.
The suite's leak check (no pin, no DMA mapping, no page, mm dropped) runs after each.
"""

from __future__ import annotations

import pytest

from drivers.ib_core.ib_verbs import IB_ACCESS_HUGETLB
from drivers.ib_core.umem import IB_ACCESS_LOCAL_WRITE, IB_ACCESS_ON_DEMAND, ib_umem_release
from drivers.ib_core.umem_odp import (
    ODP_READ_ALLOWED_BIT,
    ODP_WRITE_ALLOWED_BIT,
    ib_umem_odp_alloc_child,
    ib_umem_odp_alloc_implicit,
    ib_umem_odp_get,
    ib_umem_odp_map_dma_and_lock,
    ib_umem_odp_unmap_dma_pages,
)
from kernel_model.dma import device
from kernel_model.errno import EFAULT, EINVAL, ENOMEM, EOVERFLOW, KernelError
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.mm import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, PROT_READ, VM_IO, VM_PFNMAP
from kernel_model.mmu_notifier import (
    mmu_interval_notifier,
    mmu_interval_notifier_insert,
    mmu_interval_notifier_ops,
    mmu_interval_notifier_remove,
    mmu_interval_read_begin,
    mmu_interval_read_retry,
    mmu_interval_set_seq,
)
from kernel_model.page_alloc import page

K4 = 1 << 12
VA = 0x7F00_0000_0000
ANON = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED
PTE_ADDR_MASK = 0x000F_FFFF_FFFF_F000
ODP = IB_ACCESS_ON_DEMAND | IB_ACCESS_LOCAL_WRITE


class IbDev:
    """Stand-in for an ib_device: the ODP umem reads .dma_device only."""

    def __init__(self, m):
        self.dma_device = device("mlx5_0", m, bus="pci")


class Mirror:
    """A driver's invalidate: what it was told, and it unmaps as mlx5 does."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []
        self.umem = None

    def invalidate(self, mni, rng, cur_seq) -> bool:
        self.calls.append((rng.start, rng.end))
        u = self.umem
        mutex_lock(u.umem_mutex)
        mmu_interval_set_seq(mni, cur_seq)
        ib_umem_odp_unmap_dma_pages(u, max(rng.start, mni.start), min(rng.end, mni.last + 1))
        mutex_unlock(u.umem_mutex)
        return True


def odp_get(p, dev, addr, size, access=ODP):
    mirror = Mirror()
    with p.kernel():
        u = ib_umem_odp_get(dev, addr, size, access,
                            mmu_interval_notifier_ops(invalidate=mirror.invalidate))
    mirror.umem = u
    return u, mirror


def fault(p, u, addr, n, write=True, do_fault=True) -> int:
    bits = ODP_READ_ALLOWED_BIT | (ODP_WRITE_ALLOWED_BIT if write else 0)
    with p.kernel():
        got = ib_umem_odp_map_dma_and_lock(u, addr, n, bits, do_fault)
        mutex_unlock(u.umem_mutex)
    return got


def release(p, u):
    with p.kernel():
        ib_umem_release(u)


def present(p, va) -> bool:
    return bool(p.mm.pgtable.get(va) & 1)


def test_get_pins_nothing_and_faults_on_first_touch(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 4 * K4, flags=ANON)
    count = p.mm.mm_count
    u, _ = odp_get(p, dev, VA + 0x10, 3 * K4)
    assert u.is_odp and u.npages == 4 and p.mm.pinned_vm == 0 and p.mm.mm_count == count + 1
    assert not any(present(p, VA + i * K4) for i in range(4))   # nothing touched
    assert dev.dma_device.nr_dma_mappings == 0
    assert fault(p, u, VA + K4, 2 * K4) == 2                    # first touch faults two in
    assert present(p, VA + K4) and present(p, VA + 2 * K4) and not present(p, VA)
    pfn = (p.mm.pgtable.get(VA + K4) & PTE_ADDR_MASK) >> machine.page_shift
    assert page(machine.zone, pfn)._pincount == 0               # mapped, never pinned
    assert u.dma_list.view[1] & 3 == 3 and u.dma_list.view[0] == 0
    assert dev.dma_device.nr_dma_mappings == 2 and u.npages_mapped == 2
    assert fault(p, u, VA + K4, K4) == 1 and dev.dma_device.nr_dma_mappings == 2  # kept
    release(p, u)
    assert dev.dma_device.nr_dma_mappings == 0 and p.mm.mm_count == count


def test_snapshot_maps_only_present_pages(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, flags=ANON)
    p.store(VA, b"x")
    u, _ = odp_get(p, dev, VA, 2 * K4)
    assert fault(p, u, VA, 2 * K4, do_fault=False) == 2 and not present(p, VA + K4)
    assert u.dma_list.view[0] and not u.dma_list.view[1] and u.npages_mapped == 1
    release(p, u)


def test_munmap_invalidates_then_the_next_access_faults_again(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 4 * K4, flags=ANON)
    u, mirror = odp_get(p, dev, VA, 4 * K4)
    assert fault(p, u, VA, 4 * K4) == 4
    seq = mmu_interval_read_begin(u.notifier)
    p.munmap(VA + K4, K4)
    assert mirror.calls == [(VA + K4, VA + 2 * K4)]
    assert mmu_interval_read_retry(u.notifier, seq)
    assert u.dma_list.view[1] == 0 and u.dma_list.view[0] and u.npages_mapped == 3
    assert dev.dma_device.nr_dma_mappings == 3
    with p.kernel(), pytest.raises(KernelError) as e:           # nothing mapped there now
        ib_umem_odp_map_dma_and_lock(u, VA + K4, K4, ODP_READ_ALLOWED_BIT, True)
    assert e.value.errno == EFAULT
    p.mmap(VA + K4, K4, flags=ANON)                             # mapped again: faults in
    assert fault(p, u, VA + K4, K4) == 1 and u.npages_mapped == 4
    release(p, u)


def test_exit_invalidates_the_whole_umem(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, flags=ANON)
    u, mirror = odp_get(p, dev, VA, 2 * K4)
    fault(p, u, VA, 2 * K4)
    p.exit()
    assert mirror.calls and u.npages_mapped == 0 and dev.dma_device.nr_dma_mappings == 0
    with machine.spawn("other").kernel(), pytest.raises(KernelError) as e:
        ib_umem_odp_map_dma_and_lock(u, VA, K4, ODP_READ_ALLOWED_BIT, True)
    assert e.value.errno == EINVAL                              # the mm is gone
    ib_umem_release(u)


def test_write_fault_on_a_read_only_mapping_is_efault(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, K4, prot=PROT_READ, flags=ANON)
    u, _ = odp_get(p, dev, VA, K4)
    with p.kernel(), pytest.raises(KernelError) as e:
        ib_umem_odp_map_dma_and_lock(u, VA, K4, ODP_READ_ALLOWED_BIT | ODP_WRITE_ALLOWED_BIT,
                                     True)
    assert e.value.errno == EFAULT
    assert fault(p, u, VA, K4, write=False) == 1 and u.dma_list.view[0] & 3 == 1
    release(p, u)


def test_range_outside_the_umem_is_efault(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, flags=ANON)
    u, _ = odp_get(p, dev, VA, K4)
    with p.kernel(), pytest.raises(KernelError) as e:
        ib_umem_odp_map_dma_and_lock(u, VA, 2 * K4, ODP_READ_ALLOWED_BIT, True)
    assert e.value.errno == EFAULT
    release(p, u)


@pytest.mark.parametrize("addr, size, access, want", [
    (VA, K4, IB_ACCESS_LOCAL_WRITE, EINVAL),          # not ON_DEMAND
    (VA, 0, ODP, EINVAL),
    ((1 << 64) - K4, 2 * K4, ODP, EOVERFLOW),
])
def test_get_errnos(machine, addr, size, access, want):
    p = machine.spawn("app")
    with p.kernel(), pytest.raises(KernelError) as e:
        ib_umem_odp_get(IbDev(machine), addr, size, access,
                        mmu_interval_notifier_ops(invalidate=lambda *a: True))
    assert e.value.errno == want and p.mm.mm_count == 1


def test_implicit_root_holds_the_mm_and_its_child_faults_like_an_odp_umem(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, flags=ANON)
    count = p.mm.mm_count
    with p.kernel():
        root = ib_umem_odp_alloc_implicit(dev, ODP)
    assert root.is_implicit_odp and root.is_odp and root.writable and root.npages == 0
    assert p.mm.mm_count == count + 1 and not p.mm.__dict__.get("notifier_subscriptions")
    mirror = Mirror()
    slice_ = VA & ~((1 << 30) - 1)
    # the child is made from another context (the driver's page-fault work): the root's mm
    with machine.spawn("worker").kernel():
        child = ib_umem_odp_alloc_child(root, slice_, 1 << 30,
                                        mmu_interval_notifier_ops(invalidate=mirror.invalidate))
    mirror.umem = child
    assert child.owning_mm is p.mm and child.npages == (1 << 30) // K4 and child.writable
    assert p.mm.mm_count == count + 2 and not child.is_implicit_odp
    assert fault(p, child, VA, 2 * K4) == 2 and child.npages_mapped == 2
    p.munmap(VA, K4)                                            # the child's notifier runs
    assert mirror.calls == [(VA, VA + K4)] and child.npages_mapped == 1
    release(p, child)
    release(p, root)
    assert p.mm.mm_count == count and dev.dma_device.nr_dma_mappings == 0


def test_implicit_errnos(machine):
    p = machine.spawn("app")
    dev = IbDev(machine)
    ops = mmu_interval_notifier_ops(invalidate=lambda *a: True)
    with p.kernel(), pytest.raises(KernelError) as e:
        ib_umem_odp_alloc_implicit(dev, ODP | IB_ACCESS_HUGETLB)
    assert e.value.errno == EINVAL and p.mm.mm_count == 1
    p.mmap(VA, K4, flags=ANON)
    u, _ = odp_get(p, dev, VA, K4)
    with p.kernel(), pytest.raises(KernelError) as e:           # the root is not implicit
        ib_umem_odp_alloc_child(u, 0, 1 << 30, ops)
    assert e.value.errno == EINVAL
    release(p, u)


def test_notifier_sees_only_overlapping_invalidations(machine):
    p = machine.spawn("app")
    p.mmap(VA, 4 * K4, flags=ANON)
    seen = []
    sub = mmu_interval_notifier()
    mmu_interval_notifier_insert(sub, p.mm, VA + 2 * K4, K4,
                                 mmu_interval_notifier_ops(
                                     invalidate=lambda s, r, q: seen.append(r.start) or True))
    p.munmap(VA, K4)
    assert seen == []
    p.munmap(VA + 2 * K4, 2 * K4)
    assert seen == [VA + 2 * K4]
    mmu_interval_notifier_remove(sub)
    mmu_interval_notifier_remove(sub)                           # a second remove: nothing
    with pytest.raises(KernelError) as e:
        mmu_interval_notifier_insert(sub, p.mm, VA, 0, sub.ops)
    assert e.value.errno == EINVAL


def test_madvise_dontneed_invalidates_and_the_next_access_faults_a_new_page(machine):
    from kernel_model.madvise import MADV_DONTNEED
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, flags=ANON)
    p.store(VA, b"old")
    u, mirror = odp_get(p, dev, VA, 2 * K4)
    assert fault(p, u, VA, 2 * K4) == 2
    old_pfn = u.pfn_list[0]
    assert p.madvise(VA, K4, MADV_DONTNEED) == 0
    assert mirror.calls == [(VA, VA + K4)] and u.dma_list.view[0] == 0 and u.dma_list.view[1]
    assert not present(p, VA)
    assert fault(p, u, VA, K4) == 1 and p.load(VA, 3) == bytes(3)   # a fresh zero page
    assert u.pfn_list[0] and old_pfn
    release(p, u)


def test_madvise_errnos(machine):
    from kernel_model.madvise import MADV_DONTNEED
    p = machine.spawn("app")
    p.mmap(VA, 2 * K4, flags=ANON)
    assert p.madvise(VA + 1, K4, MADV_DONTNEED) == -EINVAL            # unaligned
    assert p.madvise(VA, K4, 99) == -EINVAL                          # not modelled
    assert p.madvise(VA, 4 * K4, MADV_DONTNEED) == -ENOMEM           # runs past the VMA
    assert p.madvise(VA, 0, MADV_DONTNEED) == 0


def test_a_device_mapping_is_efault_to_fault_and_absent_to_a_snapshot(machine):
    """hmm_vma_walk_test: a VM_IO|VM_PFNMAP mapping has no struct page behind its PTEs,
    present or not, so an ODP umem never maps one (found by peermem fuzz: an ODP MR over
    a mapped UAR page faulted the device page in, and unmapping it at exit indexed a
    struct page beyond RAM)."""
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA, 2 * K4, flags=ANON)
    p.store(VA, b"x")                                           # the PTE is present
    vma = p.mm.vma_lookup(VA)
    vma.vm_flags |= VM_IO | VM_PFNMAP                           # as io_remap_pfn_range marks it
    u, _ = odp_get(p, dev, VA, 2 * K4)
    with pytest.raises(KernelError) as ei:
        fault(p, u, VA, K4)
    assert ei.value.errno == EFAULT and "VM_IO|VM_PFNMAP" in str(ei.value)
    assert fault(p, u, VA, 2 * K4, do_fault=False) == 2         # a snapshot: both absent
    assert u.dma_list.view[0] == u.dma_list.view[1] == 0 and u.npages_mapped == 0
    assert dev.dma_device.nr_dma_mappings == 0
    vma.vm_flags &= ~(VM_IO | VM_PFNMAP)
    release(p, u)


def test_a_snapshot_skips_the_holes_between_mappings_whole(machine):
    """walk_page_range's hole callback: a snapshot of a range mostly no VMA covers
    steps over each hole at once (found by peermem fuzz: an ODP MR of 4 GiB around a
    64 KiB mapping walked a million absent pages one by one, for seconds, at
    registration).  The pages around the holes still come out right."""
    p = machine.spawn("app")
    dev = IbDev(machine)
    p.mmap(VA + 4 * K4, K4, flags=ANON)
    p.mmap(VA + (1 << 30), K4, flags=ANON)
    p.store(VA + 4 * K4, b"x")
    p.store(VA + (1 << 30), b"y")
    u, _ = odp_get(p, dev, VA, 1 << 31)
    lookups = []
    real = p.mm.vma_lookup
    p.mm.vma_lookup = lambda va: lookups.append(va) or real(va)
    try:
        assert fault(p, u, VA, 1 << 31, do_fault=False) == (1 << 31) // K4
    finally:
        del p.mm.vma_lookup
    assert len(lookups) < 10                 # the holes stepped over, not 512K pages
    mapped = [i for i in range(u.npages) if u.dma_list.view[i]]
    assert mapped == [4, (1 << 30) // K4] and u.npages_mapped == 2
    release(p, u)

"""Mirrors drivers/infiniband/core/umem_odp.c and include/rdma/ib_umem_odp.h: on-demand
paging (ODP) umems.

An ODP umem pins nothing.  ib_umem_odp_get() only records the range and
subscribes an mmu_interval_notifier over it; pages are found (and faulted in,
hmm_range_fault-style) when the device needs them - on its page fault - by
ib_umem_odp_map_dma_and_lock(), which DMA-maps each page and keeps its address,
with the access bits, in dma_list.  When the kernel changes the mappings under
the range (munmap, exit), the notifier's invalidate runs first: the driver stops
the device's access (zaps its MTT) and calls ib_umem_odp_unmap_dma_pages(), so
the pages can then be freed; the next device access faults again.

Facts the callers rely on: no pinned_vm charge, no page reference held; the
sequence check (mmu_interval_read_retry under umem_mutex) makes a fault that
raced with an invalidation redo its collection rather than map stale pages.

Implicit ODP (the whole address space): ib_umem_odp_alloc_implicit() makes a
root umem with no range, no notifier and no pages; the driver hangs child umems
(ib_umem_odp_alloc_child: each an ordinary ODP umem over one slice, with its own
notifier) under it as the device touches the slices.

# EMU: ib_dma_map_page is a one-page scatterlist through dma_map_sgtable (the
# model's DMA API has no dma_map_page).

Lock order: umem_mutex, taken inside the notifier's invalidate (mmap_lock side)
and by the fault path after the pages were collected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from c_ext import U64Array
from drivers.ib_core.ib_umem import ib_umem
from drivers.ib_core.ib_verbs import IB_ACCESS_HUGETLB, IB_ACCESS_ON_DEMAND, ib_access_writable
from kernel_model.current import current
from kernel_model.dma import DMA_BIDIRECTIONAL, dma_map_sgtable, dma_unmap_sgtable
from kernel_model.errno import EFAULT, EINVAL, EOVERFLOW, KernelError
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.memory import FAULT_FLAG_WRITE, VM_FAULT_ERROR, handle_mm_fault
from kernel_model.mm import VM_IO, VM_PFNMAP, VM_READ, VM_WRITE, mmdrop, mmgrab
from kernel_model.mmu_notifier import (
    mmu_interval_notifier,
    mmu_interval_notifier_insert,
    mmu_interval_notifier_ops,
    mmu_interval_notifier_remove,
    mmu_interval_read_begin,
    mmu_interval_read_retry,
)
from kernel_model.page_alloc import PG_dirty, page
from kernel_model.pgtable import _PAGE_PRESENT, _PAGE_RW, pte_addr
from kernel_model.scatterlist import (
    sg_alloc_append_table_from_pages,
    sg_append_table,
    sg_free_append_table,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.ib_core.device import ib_device

ODP_READ_ALLOWED_BIT = 1 << 0
ODP_WRITE_ALLOWED_BIT = 1 << 1
ODP_DMA_ADDR_MASK = ~(ODP_READ_ALLOWED_BIT | ODP_WRITE_ALLOWED_BIT)
HMM_RANGE_RETRIES = 16   # EMU: hmm_range_fault retries until its timeout; the model counts


class ib_umem_odp(ib_umem):
    """Mirrors struct ib_umem_odp: the notifier, the per-page DMA list and umem_mutex."""

    def __init__(self, ibdev: ib_device, machine: object):
        super().__init__(ibdev, machine)
        self.notifier = mmu_interval_notifier(container=self)
        self.umem_mutex = mutex_init("umem_odp->umem_mutex")
        self.page_shift = machine.page_shift
        self.is_implicit_odp = False
        self.private: object = None
        self.npages = 0
        self.dma_list: U64Array | None = None    # dma address | ODP_*_ALLOWED_BIT, 0 = none
        self.pfn_list: list[int] = []
        self.map_sgt: list[sg_append_table | None] = []
        self.npages_mapped = 0


def ib_umem_start(umem_odp: ib_umem_odp) -> int:
    """Mirrors ib_umem_start(): the first byte of the umem's first page."""
    return umem_odp.notifier.start


def ib_umem_end(umem_odp: ib_umem_odp) -> int:
    """Mirrors ib_umem_end(): one past the umem's last page."""
    return umem_odp.notifier.last + 1


def to_ib_umem_odp(umem: ib_umem) -> ib_umem_odp:
    """Mirrors to_ib_umem_odp() (container_of)."""
    assert isinstance(umem, ib_umem_odp)
    return umem


@traced
def ib_umem_odp_get(device: ib_device, addr: int, size: int, access: int,
                    ops: mmu_interval_notifier_ops) -> ib_umem_odp:
    """Mirrors ib_umem_odp_get() (+ ib_init_umem_odp): an ODP umem over [addr, addr +
    size) of the current process - no page pinned, nothing charged to pinned_vm.

    EINVAL without IB_ACCESS_ON_DEMAND (a WARN in the kernel) or for size 0 (the
    notifier's check); EOVERFLOW for a range that wraps."""
    if not access & IB_ACCESS_ON_DEMAND:
        raise KernelError(EINVAL, "ib_umem_odp_get: access without IB_ACCESS_ON_DEMAND")
    mm = current().mm
    machine = mm.machine
    ps = machine.page_size
    if addr + size >= 1 << 64 or (addr + size + ps - 1) >> 64:
        raise KernelError(EOVERFLOW, "ib_init_umem_odp: address + length overflows")
    if size == 0:
        raise KernelError(EINVAL, "ib_umem_odp_get: length 0")
    umem_odp = ib_umem_odp(device, machine)
    umem = umem_odp
    umem.address, umem.length, umem.iova = addr, size, addr
    umem.writable = ib_access_writable(access)
    umem.is_odp = True
    umem.owning_mm = mm
    ib_init_umem_odp(umem_odp, ops)
    return umem_odp


@traced
def ib_umem_odp_alloc_implicit(device: ib_device, access: int) -> ib_umem_odp:
    """Mirrors ib_umem_odp_alloc_implicit(): the root umem of an implicit ODP MR - the
    whole address space of the current process, nothing mapped, no notifier (the
    children have theirs); it holds the mm (mmgrab) as any ODP umem.  EINVAL for
    IB_ACCESS_HUGETLB."""
    if access & IB_ACCESS_HUGETLB:
        raise KernelError(EINVAL, "ib_umem_odp_alloc_implicit: IB_ACCESS_HUGETLB")
    mm = current().mm
    umem_odp = ib_umem_odp(device, mm.machine)
    umem_odp.writable = ib_access_writable(access)
    umem_odp.is_odp = True
    umem_odp.owning_mm = mm
    umem_odp.is_implicit_odp = True
    mmgrab(mm)
    return umem_odp


@traced
def ib_umem_odp_alloc_child(root: ib_umem_odp, addr: int, size: int,
                            ops: mmu_interval_notifier_ops) -> ib_umem_odp:
    """Mirrors ib_umem_odp_alloc_child(): an ODP umem over [addr, addr + size) of the
    root's mm (not current's: the driver makes children from its page-fault work),
    writable as the root, with its own interval notifier.  EINVAL when root is not an
    implicit umem (a WARN upstream)."""
    if not root.is_implicit_odp:
        raise KernelError(EINVAL, "ib_umem_odp_alloc_child: root is not implicit")
    mm = root.owning_mm
    umem_odp = ib_umem_odp(root.ibdev, mm.machine)
    umem_odp.address, umem_odp.length, umem_odp.iova = addr, size, addr
    umem_odp.writable = root.writable
    umem_odp.is_odp = True
    umem_odp.owning_mm = mm
    ib_init_umem_odp(umem_odp, ops)
    return umem_odp


def ib_init_umem_odp(umem_odp: ib_umem_odp, ops: mmu_interval_notifier_ops) -> None:
    """Mirrors ib_init_umem_odp() (ib_umem_odp_get's and a child's): the per-page lists
    over its range, then mmgrab and the interval notifier on its owning mm (unwound
    on failure)."""
    mm = umem_odp.owning_mm
    ps = 1 << umem_odp.page_shift
    start = umem_odp.address & ~(ps - 1)
    end = -(-(umem_odp.address + umem_odp.length) // ps) * ps
    umem_odp.npages = (end - start) >> umem_odp.page_shift
    umem_odp.dma_list = U64Array(umem_odp.npages)
    umem_odp.pfn_list = [0] * umem_odp.npages
    umem_odp.map_sgt = [None] * umem_odp.npages
    mmgrab(mm)
    try:
        mmu_interval_notifier_insert(umem_odp.notifier, mm, start, end - start, ops)
    except BaseException:
        mmdrop(mm)
        raise


def _hmm_range_fault(umem_odp: ib_umem_odp, start: int, end: int, write: bool,
                     fault: bool) -> list[int]:
    """What hmm_range_fault() does for ODP: each page's PFN, faulting absent pages in
    (fault) or reporting them as 0 (snapshot).  EFAULT for an address no VMA covers or
    one the VMA does not allow (write to a read-only mapping), or a fault that fails.

    A VM_IO|VM_PFNMAP mapping (a device's registers, mapped with io_remap_pfn_range) has
    no struct page behind its PTEs: as hmm_vma_walk_test, it is EFAULT when the pages
    are needed and 0 in a snapshot, whether its PTEs are present or not."""
    mm = umem_odp.owning_mm
    ps = mm.machine.page_size
    need = _PAGE_PRESENT | (_PAGE_RW if write else 0)
    pfns: list[int] = []
    va = start - ps
    while va + ps < end:
        va += ps
        vma = mm.vma_lookup(va)
        if vma is None and not fault:
            # as walk_page_range's hmm_vma_walk_hole: a hole no VMA covers is skipped
            # whole in a snapshot (0 for each of its pages), not walked page by page
            nxt = mm.find_vma(va)
            hole_end = min(end, nxt.vm_start if nxt is not None else end)
            n = max(1, (hole_end - va) // ps)
            pfns.extend([0] * n)
            va += (n - 1) * ps
            continue
        if vma is not None and vma.vm_flags & (VM_IO | VM_PFNMAP):
            if fault:
                raise KernelError(EFAULT, f"hmm_range_fault: {va:#x} is in a "
                                  "VM_IO|VM_PFNMAP mapping")
            pfns.append(0)
            continue
        pte = mm.pgtable.get(va)
        if pte & need != need:
            if not fault:
                pfns.append(0)
                continue
            if vma is None or not vma.vm_flags & (VM_WRITE if write else VM_READ):
                raise KernelError(EFAULT, f"hmm_range_fault: {va:#x} not mapped "
                                  f"{'writable' if write else 'readable'}")
            if handle_mm_fault(vma, va, FAULT_FLAG_WRITE if write else 0) & VM_FAULT_ERROR:
                raise KernelError(EFAULT, f"hmm_range_fault: fault at {va:#x} failed")
            pte = mm.pgtable.get(va)
        pfns.append(pte_addr(pte) >> mm.machine.page_shift)
    return pfns


def _dma_map_page(umem_odp: ib_umem_odp, idx: int, pfn: int) -> int:
    """ib_dma_map_page() of one page (see the module's EMU note): its DMA address."""
    dev = umem_odp.ibdev.dma_device
    sgta = sg_append_table(dev.machine)
    pages = U64Array(1)
    pages.view[0] = pfn
    ps = dev.machine.page_size
    sg_alloc_append_table_from_pages(sgta, pages, 1, 0, ps, ps, 0)
    dma_map_sgtable(dev, sgta.sgt, DMA_BIDIRECTIONAL)
    umem_odp.map_sgt[idx] = sgta
    return int(sgta.sgt.dma_addr.view[0])


def _dma_unmap_page(umem_odp: ib_umem_odp, idx: int) -> None:
    sgta = umem_odp.map_sgt[idx]
    if sgta is None:
        return
    dma_unmap_sgtable(umem_odp.ibdev.dma_device, sgta.sgt, DMA_BIDIRECTIONAL)
    sg_free_append_table(sgta)
    umem_odp.map_sgt[idx] = None


@traced
def ib_umem_odp_map_dma_and_lock(umem_odp: ib_umem_odp, user_virt: int, bcnt: int,
                                 access_mask: int, fault: bool) -> int:
    """Mirrors ib_umem_odp_map_dma_and_lock(): find (fault, or only snapshot) the pages
    of [user_virt, user_virt + bcnt), DMA-map those not mapped yet; on success return
    the number of pages the range spans, with umem_mutex HELD (the caller updates its
    device's translation from dma_list - 0 for a page a snapshot found absent - then
    unlocks).

    EFAULT for a range outside the umem, or from the page walk; EINVAL when the
    process's address space is gone (mmget_not_zero failed)."""
    if user_virt < ib_umem_start(umem_odp) or user_virt + bcnt > ib_umem_end(umem_odp):
        raise KernelError(EFAULT, "ib_umem_odp_map_dma_and_lock: range outside the umem")
    mm = umem_odp.owning_mm
    if mm.mm_users == 0:
        raise KernelError(EINVAL, "ib_umem_odp_map_dma_and_lock: the mm is gone")
    shift = umem_odp.page_shift
    ps = 1 << shift
    start = user_virt & ~(ps - 1)
    end = -(-(user_virt + bcnt) // ps) * ps
    write = bool(access_mask & ODP_WRITE_ALLOWED_BIT) and umem_odp.writable
    bits = ODP_READ_ALLOWED_BIT | (ODP_WRITE_ALLOWED_BIT if write else 0)
    for _ in range(HMM_RANGE_RETRIES):
        seq = mmu_interval_read_begin(umem_odp.notifier)
        pfns = _hmm_range_fault(umem_odp, start, end, write, fault)
        mutex_lock(umem_odp.umem_mutex)
        if mmu_interval_read_retry(umem_odp.notifier, seq):
            mutex_unlock(umem_odp.umem_mutex)       # an invalidation raced: collect again
            continue
        break
    else:
        raise KernelError(EFAULT, "ib_umem_odp_map_dma_and_lock: invalidated "
                          f"{HMM_RANGE_RETRIES} times in a row")
    first = (start - ib_umem_start(umem_odp)) >> shift
    try:
        for i, pfn in enumerate(pfns):
            idx = first + i
            if not pfn:
                continue
            cur = umem_odp.dma_list.view[idx]
            if cur and umem_odp.pfn_list[idx] == pfn:
                umem_odp.dma_list.view[idx] = (cur & ODP_DMA_ADDR_MASK) | bits
            else:
                if cur:
                    _dma_unmap_page(umem_odp, idx)
                    umem_odp.npages_mapped -= 1
                dma = _dma_map_page(umem_odp, idx, pfn)
                umem_odp.dma_list.view[idx] = dma | bits
                umem_odp.pfn_list[idx] = pfn
                umem_odp.npages_mapped += 1
    except BaseException:
        mutex_unlock(umem_odp.umem_mutex)
        raise
    return len(pfns)


@traced
def ib_umem_odp_unmap_dma_pages(umem_odp: ib_umem_odp, virt: int, bound: int) -> None:
    """Mirrors ib_umem_odp_unmap_dma_pages() (umem_mutex held): DMA-unmap the mapped
    pages of [virt, bound), marking those the device could write dirty."""
    shift = umem_odp.page_shift
    start = ib_umem_start(umem_odp)
    lo = max(virt, start)
    hi = min(bound, ib_umem_end(umem_odp))
    if hi <= lo:
        return
    m = umem_odp.owning_mm.machine
    zone = m.zone
    dma_list = umem_odp.dma_list
    view = dma_list.view
    # the pages of [lo, hi): those not mapped (dma 0) are skipped, a C walk from one
    # mapped page to the next (machine.ops.next_set) instead of a visit of each
    idx, end = (lo - start) >> shift, (hi - start + (1 << shift) - 1) >> shift
    while (idx := m.ops.next_set(dma_list, idx, end)) < end:
        cur = view[idx]
        if cur & ODP_WRITE_ALLOWED_BIT:
            pg = page(zone, umem_odp.pfn_list[idx])
            pg.flags |= PG_dirty                    # set_page_dirty()
        _dma_unmap_page(umem_odp, idx)
        view[idx] = 0
        umem_odp.pfn_list[idx] = 0
        umem_odp.npages_mapped -= 1
        idx += 1


@traced
def ib_umem_odp_release(umem_odp: ib_umem_odp) -> None:
    """Mirrors ib_umem_odp_release(): unmap every page (under umem_mutex), remove the
    notifier (no invalidation runs after this), drop the mm."""
    if not umem_odp.is_implicit_odp:
        mutex_lock(umem_odp.umem_mutex)
        ib_umem_odp_unmap_dma_pages(umem_odp, ib_umem_start(umem_odp),
                                    ib_umem_end(umem_odp))
        mutex_unlock(umem_odp.umem_mutex)
        mmu_interval_notifier_remove(umem_odp.notifier)
    mmdrop(umem_odp.owning_mm)

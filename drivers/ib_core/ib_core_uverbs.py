"""Mirrors drivers/infiniband/core/ib_core_uverbs.c: driver helpers for user mmaps.

Two services a driver's ops.mmap uses:

  * rdma_user_mmap_io(): map device pages (a UAR, a BAR window) into the
    VMA the user's mmap() created, and record the mapping on the uverbs file
    (`ufile.umaps`), so that removing the device can zap it later
    (uverbs_user_mmap_disassociate).
  * mmap entries: a driver that hands out objects to be mmapped (mlx5's UAR
    objects, doorbell pages of other drivers) inserts an `rdma_user_mmap_entry`
    into the ucontext's page-offset space (`mmap_xa`: pgoff -> entry, an entry
    occupying `npages` consecutive slots), returns the offset to userspace,
    and looks the entry up again when userspace mmaps that offset.  Entries
    are reference counted: the driver's object holds one (dropped by
    rdma_user_mmap_entry_remove), each live VMA another (dropped by
    rdma_umap_close); the last put erases the slots and calls the driver's
    ops.mmap_free, so a UAR is given back only after the object is destroyed
    *and* every mapping of it is gone.

Insertion takes the lowest free range of slots at or above the minimum
offset (xas_find_marked over the free mark, then a check that the range is
empty).

Lock order: ufile.umap_lock -> ucontext mmap_xa lock (a spinlock: the
xarray's xa_lock).
"""

from __future__ import annotations

from typing import Any

from kernel_model.errno import EAGAIN, EINVAL, ENOMEM, KernelError
from kernel_model.locking import spinlock_t
from kernel_model.memory import io_remap_pfn_range, zap_vma_ptes
from kernel_model.mm import VM_SHARED, vm_area_struct
from kernel_model.refcount import kref, kref_get, kref_get_unless_zero, kref_init, kref_put
from kernel_model.trace import traced

U32_MAX = (1 << 32) - 1


class rdma_user_mmap_entry:
    """Mirrors struct rdma_user_mmap_entry (drivers embed it: subclass it)."""

    def __init__(self) -> None:
        self.ref = kref()
        self.ucontext: Any = None
        self.start_pgoff = 0
        self.npages = 0
        self.driver_removed = False

    def __repr__(self) -> str:
        removed = " removed" if self.driver_removed else ""
        return (f"mmap entry pgoff={self.start_pgoff:#x} npages={self.npages} "
                f"ref={self.ref.refcount.refs.counter}{removed}")


def _mmap_xa(ucontext: Any) -> dict[int, rdma_user_mmap_entry]:
    """ucontext->mmap_xa (xa_init_flags in ib_alloc_ucontext), made on first use.

    # EMU: ib_ucontext does not carry the xarray; it is attached here.
    """
    xa = getattr(ucontext, "mmap_xa", None)
    if xa is None:
        xa = ucontext.mmap_xa = {}
    return xa


def _xa_lock(ucontext: Any) -> spinlock_t:
    lock = getattr(ucontext, "mmap_xa_lock", None)
    if lock is None:
        lock = ucontext.mmap_xa_lock = spinlock_t("ib_ucontext.mmap_xa.xa_lock")
    return lock


def _page_size(ucontext: Any) -> int:
    return ucontext.device.machine.page_size


# -- mapping device pages -------------------------------------------------------------
@traced
def rdma_user_mmap_io(ucontext: Any, vma: vm_area_struct, pfn: int, size: int, prot: int,
                      entry: rdma_user_mmap_entry | None) -> None:
    """Mirrors rdma_user_mmap_io(): map `size` bytes of device pages at pfn into vma.

    The mapping must be shared (EINVAL) and exactly cover the VMA (EINVAL); a
    failing io_remap_pfn_range is EAGAIN.  On success the VMA and its entry
    (which gains a reference) are recorded on the uverbs file, so a device
    removal can zap the PTEs and rdma_umap_close can drop the entry.
    """
    ufile = ucontext.ufile
    if not vma.vm_flags & VM_SHARED:
        raise KernelError(EINVAL, "rdma_user_mmap_io: mapping is not MAP_SHARED")
    if vma.vm_end - vma.vm_start != size:
        raise KernelError(EINVAL, f"rdma_user_mmap_io: vma of {vma.vm_end - vma.vm_start:#x} "
                          f"bytes, mapping {size:#x}")
    if ufile is not None and (vma.vm_file is None or vma.vm_file.private_data is not ufile):
        ucontext.device.machine.report_bug("rdma_user_mmap_io",
                                           "not called from ib_uverbs_mmap")
        raise KernelError(EINVAL, "rdma_user_mmap_io: vma is not of this uverbs file")
    vma.vm_page_prot = prot
    try:
        io_remap_pfn_range(vma, vma.vm_start, pfn, size, prot)
    except KernelError as e:
        raise KernelError(EAGAIN, f"rdma_user_mmap_io: io_remap_pfn_range failed: "
                          f"{e.message}") from e
    rdma_umap_priv_init(ucontext, vma, entry)


def rdma_umap_priv_init(ucontext: Any, vma: vm_area_struct,
                        entry: rdma_user_mmap_entry | None) -> None:
    """Mirrors rdma_umap_priv_init(): the VMA holds a reference on its entry and
    is listed on ufile->umaps.

    # EMU: a ucontext without a uverbs file (a test calling the op directly)
    # records nothing: no rdma_umap_close will run for that VMA.
    """
    ufile = ucontext.ufile
    if ufile is None:
        return
    if entry is not None:
        kref_get(entry.ref)
    vma.vm_private_data = entry
    with ufile.umap_lock:
        ufile.umaps.append((vma, entry))


# -- mmap entries -----------------------------------------------------------------------
@traced
def rdma_user_mmap_entry_insert_range(ucontext: Any, entry: rdma_user_mmap_entry,
                                      length: int, min_pgoff: int, max_pgoff: int) -> None:
    """Mirrors rdma_user_mmap_entry_insert_range(): give entry the lowest free run of
    DIV_ROUND_UP(length, PAGE_SIZE) page offsets in [min_pgoff, max_pgoff].

    ENOMEM when no such run exists (or it would pass U32_MAX); EINVAL for no entry.
    The whole search and insert happen under umap_lock and the xarray lock,
    so two threads cannot pick the same range.
    """
    if entry is None:
        raise KernelError(EINVAL, "rdma_user_mmap_entry_insert_range: no entry")
    kref_init(entry.ref)
    entry.ucontext = ucontext
    xa = _mmap_xa(ucontext)
    ps = _page_size(ucontext)
    npages = -(-length // ps)
    entry.npages = npages
    ufile = ucontext.ufile
    umap_lock = ufile.umap_lock if ufile is not None else None
    if umap_lock is not None:
        umap_lock.__enter__()
    try:
        with _xa_lock(ucontext):
            first = _find_free_range(xa, npages, min_pgoff, max_pgoff)
            if first is None:
                raise KernelError(ENOMEM, f"rdma_user_mmap_entry_insert_range: no free run "
                                  f"of {npages} page(s) in [{min_pgoff:#x}, {max_pgoff:#x}]")
            for i in range(first, first + npages):
                xa[i] = entry
            entry.start_pgoff = first
    finally:
        if umap_lock is not None:
            umap_lock.__exit__(None, None, None)


def _find_free_range(xa: dict[int, Any], npages: int, min_pgoff: int,
                     max_pgoff: int) -> int | None:
    """The xas_find_marked(XA_FREE_MARK) / xas_next_entry() loop: the lowest index
    >= min_pgoff starting npages free slots, the first one <= max_pgoff."""
    first = min_pgoff
    while True:
        while first in xa:  # first free index
            first += 1
        if first > max_pgoff:
            return None
        last = first + npages  # check_add_overflow(u32)
        if last > U32_MAX + 1 or npages == 0:
            return None if npages else first
        busy = next((i for i in range(first, last) if i in xa), None)
        if busy is None:
            return first
        first = busy + 1


def rdma_user_mmap_entry_insert(ucontext: Any, entry: rdma_user_mmap_entry,
                                length: int) -> None:
    """Mirrors rdma_user_mmap_entry_insert(): anywhere in [0, U32_MAX]."""
    rdma_user_mmap_entry_insert_range(ucontext, entry, length, 0, U32_MAX)


@traced
def rdma_user_mmap_entry_get_pgoff(ucontext: Any, pgoff: int) -> rdma_user_mmap_entry | None:
    """Mirrors rdma_user_mmap_entry_get_pgoff(): the entry starting at pgoff, with a
    reference taken; None if there is none, pgoff is inside (not at the start
    of) an entry, the driver removed it, or its last reference is going."""
    if pgoff > U32_MAX:
        return None
    xa = _mmap_xa(ucontext)
    with _xa_lock(ucontext):
        entry = xa.get(pgoff)
        if entry is None or entry.start_pgoff != pgoff or entry.driver_removed or \
                not kref_get_unless_zero(entry.ref):
            return None
    return entry


def rdma_user_mmap_entry_get(ucontext: Any, vma: vm_area_struct) -> rdma_user_mmap_entry | None:
    """Mirrors rdma_user_mmap_entry_get(): the entry for a shared VMA of its exact size."""
    if not vma.vm_flags & VM_SHARED:
        return None
    entry = rdma_user_mmap_entry_get_pgoff(ucontext, vma.vm_pgoff)
    if entry is None:
        return None
    if entry.npages * _page_size(ucontext) != vma.vm_end - vma.vm_start:
        rdma_user_mmap_entry_put(entry)
        return None
    return entry


def rdma_user_mmap_get_offset(entry: rdma_user_mmap_entry) -> int:
    """Mirrors rdma_user_mmap_get_offset(): the byte offset userspace passes to mmap."""
    return entry.start_pgoff * _page_size(entry.ucontext)


def _rdma_user_mmap_entry_free(ref: kref, entry: rdma_user_mmap_entry) -> None:
    """Mirrors rdma_user_mmap_entry_free(): erase every slot, then ops.mmap_free.

    Deferred to the last reference so an offset is never reused while a VMA
    still maps the old object.
    """
    ucontext = entry.ucontext
    xa = _mmap_xa(ucontext)
    with _xa_lock(ucontext):
        for i in range(entry.start_pgoff, entry.start_pgoff + entry.npages):
            xa.pop(i, None)
    mmap_free = ucontext.device.ops.mmap_free
    if mmap_free is not None:
        mmap_free(entry)


@traced
def rdma_user_mmap_entry_put(entry: rdma_user_mmap_entry) -> None:
    """Mirrors rdma_user_mmap_entry_put(): drop a reference (the last frees it)."""
    kref_put(entry.ref, lambda ref: _rdma_user_mmap_entry_free(ref, entry))


@traced
def rdma_user_mmap_entry_remove(entry: rdma_user_mmap_entry | None) -> None:
    """Mirrors rdma_user_mmap_entry_remove(): the driver's object is going - no new
    mmaps of it; drop the driver's reference (VMAs keep theirs)."""
    if entry is None:
        return
    with _xa_lock(entry.ucontext):
        entry.driver_removed = True
    rdma_user_mmap_entry_put(entry)


def uverbs_user_mmap_disassociate(ufile: Any) -> None:
    """Mirrors uverbs_user_mmap_disassociate(): zap every user mapping of the
    device's pages, so nothing can reach the hardware after removal, and drop each
    mapping's reference on its mmap entry, so the driver's mmap_free runs (a dynamic
    UAR's DEALLOC_UAR) while the device is still there - before dealloc_ucontext,
    whose DESTROY_UCTX fails while a UAR of the context is allocated.

    The upstream commit that added rdma_user_mmap_disassociate() for drivers moved it
    from uverbs_main.c to ib_core_uverbs.c and exported it; here too it sits below both rdma_core,
    which calls it at device removal, and uverbs_main, which owns the umaps."""
    with ufile.umap_lock:
        for i, (vma, entry) in enumerate(ufile.umaps):
            zap_vma_ptes(vma, vma.vm_start, vma.vm_end - vma.vm_start)
            if entry is not None:
                ufile.umaps[i] = (vma, None)  # rdma_umap_close then has nothing to put
                rdma_user_mmap_entry_put(entry)

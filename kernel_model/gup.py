"""Mirrors mm/gup.c: pin_user_pages_fast() and unpinning.

The fast path (gup_fast, in C: c_ext pm_gup_fast) walks the page tables in
emulated RAM without taking mmap_lock and pins every page whose PTE allows
the access; it stops at the first page it cannot take.  The slow path here
(__get_user_pages) then does what the fast path may not: look up the VMA,
check its flags (check_vma_flags: VM_IO|VM_PFNMAP is refused, a write needs
VM_WRITE or FOLL_FORCE on a COW mapping), fault the page in with
handle_mm_fault(), and hand the rest of the range back to the fast loop.

EMU: the real slow path pins the whole remainder page by page under
mmap_lock; resuming the C loop after each fault pins the same pages in the
same order, faster.  FOLL_PIN pins are counted in struct page's own pincount
(the kernel folds small-page pins into _refcount with GUP_PIN_COUNTING_BIAS),
so the leak check can tell a pin from a reference.  There is no ZONE_MOVABLE,
so FOLL_LONGTERM never migrates.
"""

from __future__ import annotations

from c_ext import U64Array, UnpinUnderflow
from kernel_model import trace
from kernel_model.current import current
from kernel_model.errno import EFAULT, EINVAL, ENOMEM, EOVERFLOW, KernelError
from kernel_model.memory import (
    FAULT_FLAG_WRITE,
    VM_FAULT_ERROR,
    VM_FAULT_OOM,
    fault_anon_run,
    handle_mm_fault,
)
from kernel_model.mm import VM_IO, VM_MAYWRITE, VM_PFNMAP, VM_READ, VM_SHARED, VM_WRITE, mm_struct
from kernel_model.pgtable import _PAGE_DIRTY, _PAGE_PRESENT, _PAGE_RW, _PAGE_SPECIAL, _PAGE_USER
from kernel_model.trace import traced, tracepoint

trace_pages_pinned = tracepoint("pages_pinned", "start nr_pages pinned gup_flags")
trace_pages_unpinned = tracepoint("pages_unpinned", "nr_pages freed dirty")

FOLL_WRITE = 0x01
FOLL_GET = 0x04
FOLL_FORCE = 0x10
FOLL_NOWAIT = 0x20
FOLL_NOFAULT = 0x80
FOLL_HWPOISON = 0x100
FOLL_ANON = 0x200
FOLL_LONGTERM = 0x400
FOLL_SPLIT_PMD = 0x800
FOLL_PCI_P2PDMA = 0x1000
FOLL_INTERRUPTIBLE = 0x2000
FOLL_PIN = 0x40000  # internal: set by the pin_user_pages*() entry points
_FAST_ALLOWED = FOLL_WRITE | FOLL_LONGTERM | FOLL_FORCE | FOLL_PIN | FOLL_PCI_P2PDMA


def _is_cow_mapping(vm_flags: int) -> bool:
    return vm_flags & (VM_SHARED | VM_MAYWRITE) == VM_MAYWRITE


@traced
def check_vma_flags(vma, gup_flags: int) -> None:
    """Mirrors check_vma_flags(): may gup touch this VMA for this access?"""
    vm_flags = vma.vm_flags
    if vm_flags & (VM_IO | VM_PFNMAP):
        raise KernelError(EFAULT, f"check_vma_flags: {vma.vm_start:#x} is VM_IO|VM_PFNMAP")
    if gup_flags & FOLL_WRITE:
        if not vm_flags & VM_WRITE:
            if not gup_flags & FOLL_FORCE:
                raise KernelError(EFAULT, "check_vma_flags: write to a read-only vma")
            if not _is_cow_mapping(vm_flags):
                raise KernelError(EFAULT, "check_vma_flags: FOLL_FORCE write to a shared "
                                  "read-only vma")
    elif not vm_flags & VM_READ and not gup_flags & FOLL_FORCE:
        raise KernelError(EFAULT, "check_vma_flags: read of a PROT_NONE vma")


def _follow_need(vma, gup_flags: int) -> int:
    """PTE bits the pin needs: can_follow_write_pte() in bit form."""
    need = _PAGE_PRESENT | _PAGE_USER
    if gup_flags & FOLL_WRITE:
        # FOLL_FORCE into a read-only private mapping follows the dirty anon copy
        need |= _PAGE_RW if vma.vm_flags & VM_WRITE else _PAGE_DIRTY
    return need


@traced
def __get_user_pages(mm: mm_struct, start: int, nr_pages: int, gup_flags: int,
                     pages: U64Array, off: int) -> int:
    """Mirrors __get_user_pages(): per VMA, check flags, fault in, pin; count pinned.

    Raises KernelError only if nothing was pinned (the gup return contract).
    """
    m = mm.machine
    ps, shift = m.page_size, m.page_shift
    done = 0
    vma = None
    try:
        while done < nr_pages:
            addr = start + (done << shift)
            if vma is None or addr >= vma.vm_end:
                vma = mm.vma_lookup(addr)
                if vma is None:
                    raise KernelError(EFAULT, f"__get_user_pages: no vma at {addr:#x}")
                check_vma_flags(vma, gup_flags)
                need = _follow_need(vma, gup_flags)
            run = min(nr_pages - done, (vma.vm_end - addr) // ps)
            n = m.ops.gup_fast(m.mem, mm.pgd, addr, run, need, _PAGE_SPECIAL, pages, off + done)
            done += n
            if n:
                continue
            # follow_page_mask() found nothing it may pin: faultin_page()
            absent = not mm.pgtable.get(addr) & _PAGE_PRESENT
            ret = handle_mm_fault(vma, addr, FAULT_FLAG_WRITE if gup_flags & FOLL_WRITE else 0)
            if ret & VM_FAULT_OOM:
                raise KernelError(ENOMEM, f"faultin_page: out of memory at {addr:#x}")
            if ret & VM_FAULT_ERROR:
                raise KernelError(EFAULT, f"faultin_page: fault error {ret:#x} at {addr:#x}")
            if absent and run > 1:           # the next laps' faults, as they would come
                fault_anon_run(vma, addr, addr + (run << shift), bool(gup_flags & FOLL_WRITE))
            # the retry follows on past the faulted page while pages are present (the
            # next lap's follow_page_mask, without a lap for it)
            n = m.ops.gup_fast(m.mem, mm.pgd, addr, run, need, _PAGE_SPECIAL, pages, off + done)
            if n:
                done += n
                continue
            raise KernelError(EFAULT, f"__get_user_pages: page at {addr:#x} cannot be pinned")
    except KernelError:
        if done == 0:
            raise
    return done


@traced
def pin_user_pages_fast(start: int, nr_pages: int, gup_flags: int, pages: U64Array,
                        pages_off: int = 0) -> int:
    """Mirrors pin_user_pages_fast(): pin current->mm's pages, fast path first.

    `pages` receives the pinned PFNs (our struct page pointers) from
    `pages_off`.  Returns how many were pinned - possibly fewer than asked, as
    the kernel's does; raises KernelError when none could be pinned.
    """
    mm = current().mm
    if mm is None:
        raise KernelError(EFAULT, "pin_user_pages_fast: kernel thread has no mm")
    return _pin_pages(mm, start, nr_pages, gup_flags | FOLL_PIN, pages, pages_off)


@traced
def pin_user_pages(start: int, nr_pages: int, gup_flags: int, pages: U64Array,
                   pages_off: int = 0) -> int:
    """Mirrors pin_user_pages(): the slow path only (__gup_longterm_locked), under mmap_lock."""
    mm = current().mm
    if mm is None:
        raise KernelError(EFAULT, "pin_user_pages: kernel thread has no mm")
    if nr_pages <= 0:
        return 0
    if pages_off < 0 or pages_off + nr_pages > len(pages):
        raise KernelError(EINVAL, "pin_user_pages: pages array too small")
    nr = __get_user_pages(mm, start & ~(mm.machine.page_size - 1), nr_pages,
                          gup_flags | FOLL_PIN, pages, pages_off)
    mm.machine.vmstat["nr_foll_pin_acquired"] += nr
    return nr


@traced
def pin_user_pages_remote(mm: mm_struct, start: int, nr_pages: int, gup_flags: int,
                          pages: U64Array, pages_off: int = 0) -> int:
    """Mirrors pin_user_pages_remote(): the same, for another process's mm."""
    return _pin_pages(mm, start, nr_pages, gup_flags | FOLL_PIN, pages, pages_off)


def gup_fast_need(gup_flags: int) -> int:
    """The PTE bits gup_fast_pte_range requires for these flags (present, user, and
    writable for FOLL_WRITE); a PTE with _PAGE_SPECIAL is refused."""
    return _PAGE_PRESENT | _PAGE_USER | (_PAGE_RW if gup_flags & FOLL_WRITE else 0)


def _pin_pages(mm: mm_struct, start: int, nr_pages: int, gup_flags: int, pages: U64Array,
               off: int) -> int:
    """gup_fast_fallback(): validate, C fast path, then the slow path for the rest."""
    m = mm.machine
    if gup_flags & ~_FAST_ALLOWED:
        m.report_bug("gup_fast_fallback", f"unsupported gup_flags {gup_flags:#x}")
        raise KernelError(EINVAL, f"pin_user_pages_fast: unsupported gup_flags {gup_flags:#x}")
    if nr_pages <= 0:
        return 0
    start &= ~(m.page_size - 1)
    length = nr_pages << m.page_shift
    if start + length >= 1 << 64:
        raise KernelError(EOVERFLOW, "pin_user_pages_fast: start + length overflows")
    if start + length > mm.task_size:
        raise KernelError(EFAULT, "pin_user_pages_fast: range beyond TASK_SIZE")
    if off < 0 or off + nr_pages > len(pages):
        raise KernelError(EINVAL, "pin_user_pages_fast: pages array too small")
    nr = m.ops.gup_fast(m.mem, mm.pgd, start, nr_pages, gup_fast_need(gup_flags),
                        _PAGE_SPECIAL, pages, off)
    if nr < nr_pages:
        try:
            nr += __get_user_pages(mm, start + (nr << m.page_shift), nr_pages - nr, gup_flags,
                                   pages, off + nr)
        except KernelError:
            if nr == 0:
                raise
    m.vmstat["nr_foll_pin_acquired"] += nr
    if trace.enabled:
        trace_pages_pinned(start, nr_pages, nr, gup_flags)
    return nr


def _unpin(m, pfns: U64Array, counts: U64Array | None, n: int, dirty: bool,
           len_shift: int = -1) -> None:
    total = n if counts is None else sum(counts.view[:n]) if len_shift < 0 else \
        m.ops.count_pages(counts, n, len_shift)
    freed = getattr(m, "_unpin_scratch", None)  # reused: a 1 GiB unpin needs 2 MiB of it
    if freed is None or freed.n < total:
        freed = m._unpin_scratch = U64Array(total, zero=False)
    try:
        nfreed = m.ops.unpin(m.mem, pfns, counts, n, dirty, freed, len_shift)
    except UnpinUnderflow as e:
        # account for what was done before the bad page, then WARN and fail
        _free_unpinned(m, freed, e.nfreed, e.done)
        m.report_bug("unpin_user_page", f"pfn {e.pfn:#x} was not pinned")
        raise KernelError(EINVAL, f"unpin_user_pages: pfn {e.pfn:#x} was not pinned") from None
    _free_unpinned(m, freed, nfreed, total)
    if trace.enabled:
        trace_pages_unpinned(total, nfreed, dirty)


def _free_unpinned(m, freed: U64Array, nfreed: int, unpinned: int) -> None:
    for i in range(nfreed):
        m.zone.free(freed.view[i], 0)  # the unpin dropped the last reference
    m.vmstat["nr_foll_pin_released"] += unpinned


@traced
def unpin_user_pages(pages: U64Array, npages: int) -> None:
    """Mirrors unpin_user_pages(): drop one pin from each page."""
    _unpin(current().machine, pages, None, npages, False)


@traced
def unpin_user_pages_dirty_lock(pages: U64Array, npages: int, make_dirty: bool) -> None:
    """Mirrors unpin_user_pages_dirty_lock(): mark dirty (the device wrote), then unpin."""
    _unpin(current().machine, pages, None, npages, make_dirty)


@traced
def unpin_user_page_range_dirty_lock(pfns: U64Array, counts: U64Array, n: int,
                                     make_dirty: bool, len_shift: int = -1) -> None:
    """Mirrors unpin_user_page_range_dirty_lock(), for n ranges at once.

    ib_umem_release() calls it once per scatterlist entry with
    DIV_ROUND_UP(sg->length, PAGE_SIZE) pages; taking the entries' arrays lets the
    whole release be one C loop.  With len_shift (PAGE_SHIFT) the counts are the
    entries' byte lengths and the loop does the division: no array of counts.
    """
    _unpin(current().machine, pfns, counts, n, make_dirty, len_shift)

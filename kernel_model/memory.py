"""Mirrors mm/memory.c: page faults, zapping, remap_pfn_range, user access.

handle_mm_fault() is the only way a user page comes to exist: first touch of
anonymous memory allocates a zeroed page and maps it (do_anonymous_page);
a driver VMA with a ->fault handler is asked; a VM_PFNMAP VMA without one
gets SIGBUS.  zap_pte_range() is the reverse: clear the PTE, drop the
mapping and the reference - a page that is still pinned survives the unmap
until its last unpin, which is the behaviour peer memory and ib_umem rely on.

EMU: read faults on anonymous memory allocate a private zeroed page instead
of mapping the shared zero page, so pins of untouched memory are ordinary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kernel_model import trace
from kernel_model.errno import EBUSY, EINVAL, KernelError
from kernel_model.mm_types import (
    VM_DONTDUMP,
    VM_DONTEXPAND,
    VM_IO,
    VM_PFNMAP,
    VM_READ,
    VM_WRITE,
    vm_area_struct,
)
from kernel_model.page_alloc import (
    __GFP_ZERO,
    GFP_HIGHUSER_MOVABLE,
    PAGE_FLAGS,
    PAGE_MAPCOUNT,
    PG_anon,
    PG_dirty,
)
from kernel_model.pgtable import (
    _PAGE_DIRTY,
    _PAGE_PRESENT,
    _PAGE_RW,
    _PAGE_SPECIAL,
    pte_addr,
)
from kernel_model.sched import SCHED
from kernel_model.slab import counter_add
from kernel_model.trace import traced, tracepoint

if TYPE_CHECKING:
    from kernel_model.mm_types import mm_struct

# what page_at needs of a PTE; its arguments are 64-bit unsigned in C
_NEED_READ, _NEED_WRITE = _PAGE_PRESENT, _PAGE_PRESENT | _PAGE_RW
_U64 = 1 << 64

# vm_fault_t (include/linux/mm_types.h)
VM_FAULT_OOM = 0x000001
VM_FAULT_SIGBUS = 0x000002
VM_FAULT_SIGSEGV = 0x000040
VM_FAULT_ERROR = VM_FAULT_OOM | VM_FAULT_SIGBUS | VM_FAULT_SIGSEGV
# fault flags
FAULT_FLAG_WRITE = 0x01
FAULT_FLAG_REMOTE = 0x80

# arch/x86/include/asm/trace/exceptions.h (error_code: bit 0 present, 1 write, 2 user)
trace_page_fault_user = tracepoint("page_fault_user", "address error_code")


class vm_fault:
    """Mirrors struct vm_fault: what a ->fault handler is told."""

    __slots__ = ("vma", "address", "flags", "pgoff")

    def __init__(self, vma: vm_area_struct, address: int, flags: int):
        self.vma, self.address, self.flags = vma, address, flags
        ps = vma.vm_mm.machine.page_shift
        self.pgoff = vma.vm_pgoff + ((address - vma.vm_start) >> ps)


@traced
def handle_mm_fault(vma: vm_area_struct, address: int, flags: int) -> int:
    """Mirrors handle_mm_fault(): make the page at address present; 0 or VM_FAULT_*.

    The caller has already checked that the access is allowed (access_error()
    for the CPU, check_vma_flags() for gup).
    """
    mm = vma.vm_mm
    ps = mm.machine.page_size
    address &= ~(ps - 1)
    try:
        slot = mm.pgtable.pte_slot(address, True)
    except KernelError:
        return VM_FAULT_OOM  # __handle_mm_fault: a pud/pmd/pte_alloc failed
    pte = mm.pgtable.ram_q[slot >> 3]
    if pte & _PAGE_PRESENT:
        if flags & FAULT_FLAG_WRITE and not pte & _PAGE_RW:
            # do_wp_page() -> wp_page_reuse(): pte_mkdirty(), and maybe_mkwrite() adds
            # RW only in a VM_WRITE vma, so a FOLL_FORCE write to a present page of a
            # read-only private mapping leaves it dirty, which gup then follows.
            # EMU: no COW; the (exclusive, anonymous) page is reused in place.
            rw = _PAGE_RW if vma.vm_flags & VM_WRITE else 0
            mm.pgtable.set(slot, pte | rw | _PAGE_DIRTY)
        return 0
    if vma.vm_ops is not None and vma.vm_ops.fault is not None:
        return vma.vm_ops.fault(vm_fault(vma, address, flags))
    if vma.vm_flags & VM_PFNMAP:
        return VM_FAULT_SIGBUS
    return do_anonymous_page(vma, address, slot, flags)


@traced
def do_anonymous_page(vma: vm_area_struct, address: int, slot: int, flags: int) -> int:
    """Mirrors do_anonymous_page(): a zeroed page, mapped with the VMA's prot."""
    mm = vma.vm_mm
    try:
        pg = mm.machine.zone.alloc(GFP_HIGHUSER_MOVABLE | __GFP_ZERO, 0,
                                   f"anon pid {mm.owner_pid}")
    except KernelError:
        return VM_FAULT_OOM
    pg.flags |= PG_anon
    pg._mapcount = 1
    pte = (pg.pfn << mm.machine.page_shift) | vma.vm_page_prot
    if flags & FAULT_FLAG_WRITE:
        pte |= _PAGE_DIRTY  # a FOLL_FORCE write to a read-only VMA: dirty, not RW
    mm.pgtable.set(slot, pte)
    counter_add(mm, "rss", 1)
    return 0


def fault_anon_run(vma: vm_area_struct, va: int, end: int, write: bool) -> None:
    """After handle_mm_fault mapped a page at va where there was none: the first-touch
    faults of the pages after it up to end (the end of the access), while they lie
    in the VMA and in the same PTE table and have no PTE, when the VMA is anonymous.
    Each gets what do_anonymous_page gives a page - a zeroed page, anonymous, mapped
    once, the VMA's prot (dirty for a write), one rss - in the order its own fault
    would have taken it, recorded as va's page is.

    # EMU: one loop instead of a fault per page (access_vm, __get_user_pages), taken
    # only when nothing could tell the two apart: no tracer (each fault is a trace
    # event) and no partial-order recording (each is a step's footprint); no
    # scheduling point lies between the faults of one access.
    """
    if trace.enabled or SCHED.fp_step is not None or vma.vm_ops is not None or \
            vma.vm_flags & VM_PFNMAP:
        return
    mm = vma.vm_mm
    m = mm.machine
    pt = mm.pgtable
    ps, shift = m.page_size, m.page_shift
    span = ps << pt.bits
    va &= ~(ps - 1)
    end = min(end, vma.vm_end, (va // span + 1) * span)   # the VMA's, this PTE table's
    slot = pt.pte_slot(va, False)
    if slot is None or end <= va + ps:
        return
    ram_q = pt.ram_q
    first = slot >> 3
    n = 0                                           # pages after va's without a PTE
    while va + (n + 1) * ps < end and not ram_q[first + n + 1]:
        n += 1
    if not n:
        return
    zone = m.zone
    pfns = zone.alloc_zeroed_run(n, zone.allocated[pte_addr(ram_q[first]) >> shift])
    words = zone.pages
    prot = vma.vm_page_prot | (_PAGE_DIRTY if write else 0)
    for i, pfn in enumerate(pfns, 1):
        words[pfn * 4 + PAGE_FLAGS] |= PG_anon
        words[pfn * 4 + PAGE_MAPCOUNT] = 1
        ram_q[first + i] = (pfn << shift) | prot
    counter_add(mm, "rss", len(pfns))


@traced
def unmap_vmas(vma: vm_area_struct, start: int, end: int) -> None:
    """Mirrors unmap_vmas()/zap_pte_range(): clear PTEs, drop maps and references.

    Whole missing page-table pages are skipped, so zapping sparse ranges is cheap.
    """
    mm = vma.vm_mm
    m = mm.machine
    pt = mm.pgtable
    ram_q = pt.ram_q
    ps = m.page_size
    span = ps << pt.bits  # bytes one PTE table covers
    zone = m.zone
    words = zone.pages      # the struct pages' mem_map words: page_mapcount, flags
    special = vma.vm_flags & VM_PFNMAP
    addr = start
    rss = 0
    try:
        while addr < end:
            slot = pt.pte_slot(addr, False)
            if slot is None:
                addr = (addr // span + 1) * span
                continue
            table_end = min(end, (addr // span + 1) * span)
            while addr < table_end:
                pte = ram_q[slot >> 3]
                if pte & _PAGE_PRESENT:
                    ram_q[slot >> 3] = 0
                    pfn = pte_addr(pte) >> m.page_shift
                    if not (pte & _PAGE_SPECIAL or special) and pfn < m.nr_pages:
                        words[pfn * 4 + PAGE_MAPCOUNT] -= 1
                        if pte & _PAGE_DIRTY:
                            words[pfn * 4 + PAGE_FLAGS] |= PG_dirty  # set_page_dirty
                        rss -= 1
                        zone.put_pfn(pfn)
                slot += 8
                addr += ps
    finally:
        if rss:         # one add for the zap (as the kernel batches its rss counters)
            counter_add(mm, "rss", rss)


@traced
def zap_vma_ptes(vma: vm_area_struct, address: int, size: int) -> None:
    """Mirrors zap_vma_ptes(): drivers remove PFN mappings they installed."""
    if address < vma.vm_start or address + size > vma.vm_end or not vma.vm_flags & VM_PFNMAP:
        raise KernelError(EINVAL, "zap_vma_ptes: range outside a VM_PFNMAP vma")
    unmap_vmas(vma, address, address + size)


@traced
def remap_pfn_range(vma: vm_area_struct, addr: int, pfn: int, size: int, prot: int) -> None:
    """Mirrors remap_pfn_range(): map raw PFNs (device pages) as special PTEs.

    Marks the VMA VM_IO|VM_PFNMAP|VM_DONTEXPAND|VM_DONTDUMP, which is what makes
    gup refuse it.  A PTE already present is a driver bug (the kernel BUG()s);
    here it fails with EBUSY after undoing what this call mapped.
    """
    mm = vma.vm_mm
    ps = mm.machine.page_size
    if addr % ps or size % ps or size == 0:
        raise KernelError(EINVAL, "remap_pfn_range: addr or size not page aligned")
    if addr < vma.vm_start or addr + size > vma.vm_end:
        raise KernelError(EINVAL, "remap_pfn_range: range outside the vma")
    vma.vm_flags |= VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP
    pt = mm.pgtable
    for i in range(size // ps):
        va = addr + i * ps
        slot = pt.pte_slot(va, True)
        if pt.ram_q[slot >> 3] & _PAGE_PRESENT:
            mm.machine.report_bug("remap_pte_range", f"PTE at {va:#x} already present")
            unmap_vmas(vma, addr, va)
            raise KernelError(EBUSY, f"remap_pfn_range: PTE at {va:#x} already present")
        pt.set(slot, ((pfn + i) << mm.machine.page_shift) | prot | _PAGE_SPECIAL)


io_remap_pfn_range = remap_pfn_range  # x86: no I/O address translation


def follow_pte(mm: mm_struct, address: int) -> int:
    """Mirrors follow_pte(): the PTE mapping address (0 if none)."""
    return mm.pgtable.get(address)


def follow_pfn(vma: vm_area_struct, address: int) -> int:
    """Mirrors follow_pfn() (mm/memory.c, before 6.10): the PFN a VM_IO|VM_PFNMAP vma
    maps at address.  EINVAL for any other vma, or when nothing is mapped there."""
    if not vma.vm_flags & (VM_IO | VM_PFNMAP):
        raise KernelError(EINVAL, f"follow_pfn: {address:#x}: not a PFN mapping")
    pte = follow_pte(vma.vm_mm, address)
    if not pte & _PAGE_PRESENT:
        raise KernelError(EINVAL, f"follow_pfn: {address:#x}: no PTE")
    return pte_addr(pte) >> vma.vm_mm.machine.page_shift


def page_at(mm: mm_struct, addr: int, length: int, write: bool) -> int:
    """The physical address of [addr, addr + length) when it lies within one page
    whose PTE already grants the access (RAM, or a device's MMIO), else -1.

    This is access_vm's walk when it has nothing to fault in and no error to
    report - most of what a program's loads and stores and the kernel's small
    copy_*_user calls touch - so they take it first and run the whole walk only on
    -1 (the TLB hit before the page walk).  The PTE is read as it is now; nothing
    is cached across calls.  The walk and the checks are one C call
    (ops.page_at_fn, pm_page_at).
    """
    if not (0 <= addr < _U64 and 0 < length < _U64):
        return -1
    return mm.machine.page_at_fn(mm.pgtable.pgd, addr, length,
                                 _NEED_WRITE if write else _NEED_READ, mm.task_size)


def access_vm(mm: mm_struct, addr: int, length: int, write: bool,
              chunk: Callable[[int, int, int], None], force: bool = False) -> int:
    """Walk [addr, addr+len) page by page, faulting pages in as the CPU would.

    For each piece calls chunk(phys, offset_in_request, n).  Returns the
    number of bytes done before the first access that could not be satisfied
    (no VMA, no permission, or a fault error) - the contract copy_*_user and
    access_process_vm share.  `force` is FOLL_FORCE (ptrace-style access).
    """
    m = mm.machine
    ps = m.page_size
    done = 0
    need = _PAGE_PRESENT | (_PAGE_RW if write else 0)
    while done < length:
        va = addr + done
        n = min(ps - (va % ps), length - done)
        pte = mm.pgtable.get(va)
        if pte & need != need:
            vma = mm.vma_lookup(va)
            if vma is None or (write and not vma.vm_flags & VM_WRITE and not force) or (
                    not write and not vma.vm_flags & VM_READ and not force):
                break
            if trace.enabled:
                trace_page_fault_user(va, (pte & _PAGE_PRESENT) | (2 if write else 0) | 4)
            absent = not pte & _PAGE_PRESENT
            if handle_mm_fault(vma, va, FAULT_FLAG_WRITE if write else 0) & VM_FAULT_ERROR:
                break
            pte = mm.pgtable.get(va)
            if not pte & _PAGE_PRESENT or (write and not (pte & _PAGE_RW or force)):
                break
            if absent and addr + length - va > n:
                fault_anon_run(vma, va, addr + length, write)
        chunk(pte_addr(pte) + va % ps, done, n)
        done += n
    return done

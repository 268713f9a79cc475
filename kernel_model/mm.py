"""Mirrors mm/mmap.c (and kernel/fork.c's mm lifetime): mmap/munmap, VMA splits, mmput.

An mm is an address space: a sorted list of VMAs (the kernel keeps a maple
tree; a sorted list with bisect answers the same find_vma() question), page
tables in emulated RAM (kernel_model.pgtable), and the counters gup and
ib_umem charge (`pinned_vm`, `locked_vm`).  Lifetime follows the kernel's two
counts: mm_users (address space in use: mmget/mmput; the last mmput tears the
mappings down) and mm_count (struct alive: mmgrab/mmdrop; ib_umem holds this
one, so the counters outlive the process).  The structs and flags themselves are
in kernel_model.mm_types (include/linux/mm_types.h), re-exported here.

Lock order: mmap_lock is implied (EMU: taken as a real rwsem once the
scheduler issue lands; nothing here yields).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from kernel_model.errno import (
    EACCES,
    EBADF,
    EINVAL,
    ENODEV,
    ENOMEM,
    EOVERFLOW,
    KernelBug,
    KernelError,
)
from kernel_model.fs import FMODE_WRITE, fput, get_file
from kernel_model.memory import unmap_vmas
from kernel_model.mm_types import (  # noqa: F401 - re-exported: callers name them as mm's
    DEFAULT_MAX_MAP_COUNT,
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_POPULATE,
    MAP_PRIVATE,
    MAP_SHARED,
    MMAP_BASE,
    PROT_EXEC,
    PROT_NONE,
    PROT_READ,
    PROT_WRITE,
    TASK_SIZE,
    VM_ACCOUNT,
    VM_DONTCOPY,
    VM_DONTDUMP,
    VM_DONTEXPAND,
    VM_EXEC,
    VM_IO,
    VM_LOCKED,
    VM_MAYEXEC,
    VM_MAYREAD,
    VM_MAYSHARE,
    VM_MAYWRITE,
    VM_MIXEDMAP,
    VM_NORESERVE,
    VM_PFNMAP,
    VM_READ,
    VM_SHARED,
    VM_WRITE,
    mm_struct,
    vm_area_struct,
    vm_operations_struct,
)
from kernel_model.mmu_notifier import (
    MMU_NOTIFY_RELEASE,
    MMU_NOTIFY_UNMAP,
    mmu_notifier_invalidate_range_start,
    mmu_notifier_range,
)
from kernel_model.pgtable import _PAGE_ACCESSED, _PAGE_NX, _PAGE_PRESENT, _PAGE_RW, _PAGE_USER
from kernel_model.trace import traced
from kernel_model.userfaultfd_k import userfaultfd_unmap_prep

if TYPE_CHECKING:
    from kernel_model.fs import file


# -- lifetime (kernel/fork.c) ------------------------------------------------
def mmget(mm: mm_struct) -> None:
    """Mirrors mmget(): pin the address space."""
    mm.mm_users += 1


@traced
def mmput(mm: mm_struct) -> None:
    """Mirrors mmput(): the last user tears down every mapping (exit_mmap)."""
    mm.mm_users -= 1
    if mm.mm_users == 0:
        try:
            exit_mmap(mm)
        finally:
            mmdrop(mm)


def mmgrab(mm: mm_struct) -> None:
    """Mirrors mmgrab(): keep the struct (not the mappings) alive."""
    mm.mm_count += 1


def mmdrop(mm: mm_struct) -> None:
    """Mirrors mmdrop(): free the struct when the last reference goes."""
    if mm.mm_count <= 0:
        mm.machine.report_bug("mmdrop", f"mm_count underflow on {mm}")
        return
    mm.mm_count -= 1
    if mm.mm_count == 0:
        mm.machine.mms.discard(mm)


@traced
def exit_mmap(mm: mm_struct) -> None:
    """Mirrors exit_mmap(): unmap every VMA, then free the page tables.

    Every VMA goes even if a debug check (KernelBug) fires in one of them;
    the first such oops is raised again at the end.
    """
    oops: list[KernelBug] = []
    if mm.vmas:  # mmu_notifier_release(): mirrors of the address space let go first
        mmu_notifier_invalidate_range_start(mmu_notifier_range(mm, 0, mm.task_size,
                                                               MMU_NOTIFY_RELEASE))
    for vma in list(mm.vmas):
        try:
            unmap_vmas(vma, vma.vm_start, vma.vm_end)
            remove_vma(vma)
        except KernelBug as e:
            oops.append(e)
            if vma in mm.vmas:
                mm.unlink(vma)
    mm.pgtable.free_all()
    if oops:
        raise oops[0]


def remove_vma(vma: vm_area_struct) -> None:
    """Mirrors remove_vma(): ->close, drop the file reference, unlink.

    ->close returns void in the kernel: nothing it does can stop the VMA from
    going, so munmap and exit never fail because of a driver.  A close that
    raises anyway is a driver bug, recorded as a WARN; the VMA still goes.
    """
    if vma.vm_ops is not None and vma.vm_ops.close is not None:
        try:
            vma.vm_ops.close(vma)
        except KernelBug:
            raise
        except Exception as e:  # noqa: BLE001 - a void callback failed: WARN, go on
            vma.vm_mm.machine.report_bug("remove_vma", f"vm_ops->close of {vma!r} "
                                         f"failed: {e}")
    if vma.vm_file is not None:
        fput(vma.vm_file)
        vma.vm_file = None
    vma.vm_mm.unlink(vma)


# -- mmap / munmap (mm/mmap.c, mm/vma.c) -------------------------------------
@traced
def get_unmapped_area(mm: mm_struct, length: int) -> int:
    """Mirrors the top-down allocator: highest gap below mmap_base that fits.

    EMU: a non-MAP_FIXED hint address is ignored (the kernel uses it when free).
    EMU: the walk from the top resumes where the last one found its gap when the
    request is bigger than every gap it passed (mm.gap_cache: the pre-3.8 kernel's
    free_area_cache and cached_hole_size; today's kernel searches a maple tree by
    gap size).  The address is the one the walk from the top finds; only the walk
    over the packed VMAs above is skipped.
    """
    base = mm.mmap_base
    vmas = mm.vmas                      # (the walk reads the whole list)
    end, hole, i = base, 0, len(vmas)
    cache = object.__getattribute__(mm, "gap_cache")
    if cache is not None and cache[0] == base and length > cache[2]:
        _, end, hole = cache            # every gap above `end` is at most `hole` bytes
        i = bisect_left(object.__getattribute__(mm, "_starts"), end)
    while i:
        i -= 1
        vma = vmas[i]
        if vma.vm_start >= end:
            continue
        if vma.vm_end + length <= end:
            object.__setattr__(mm, "gap_cache", (base, end, hole))
            return end - length
        if vma.vm_end < end:            # a gap too small for this request
            hole = max(hole, end - vma.vm_end)
        end = vma.vm_start
    if end - length >= mm.machine.page_size * 16:
        object.__setattr__(mm, "gap_cache", (base, end, hole))
        return end - length
    raise KernelError(ENOMEM, "get_unmapped_area: address space exhausted")


def vm_get_page_prot(vm_flags: int) -> int:
    """Mirrors vm_get_page_prot() (mm/mmap.c before 6.0, now per arch): the PTE bits a
    VMA's flags give its pages."""
    prot = _PAGE_PRESENT | _PAGE_USER | _PAGE_ACCESSED
    # EMU: no fork, so a private writable mapping never needs COW write-protect
    if vm_flags & VM_WRITE:
        prot |= _PAGE_RW
    if not vm_flags & VM_EXEC:
        prot |= _PAGE_NX
    return prot


def calc_vm_flags(prot: int, flags: int) -> int:
    vm = (VM_READ if prot & PROT_READ else 0) | (VM_WRITE if prot & PROT_WRITE else 0)
    vm |= (VM_EXEC if prot & PROT_EXEC else 0) | VM_MAYREAD | VM_MAYWRITE | VM_MAYEXEC
    if flags & MAP_SHARED:
        vm |= VM_SHARED | VM_MAYSHARE
    return vm


@traced
def do_mmap(mm: mm_struct, f: file | None, addr: int, length: int, prot: int, flags: int,
            pgoff: int) -> int:
    """Mirrors do_mmap() + mmap_region(): validate, place, create the VMA, call ->mmap.

    A failing ->mmap unwinds: PTEs it installed are zapped, the file reference
    is dropped and the VMA never becomes visible (mmap_region's unmap_and_free_vma).
    """
    ps = mm.machine.page_size
    if length == 0:
        raise KernelError(EINVAL, "do_mmap: length is 0")
    if flags & (MAP_SHARED | MAP_PRIVATE) not in (MAP_SHARED, MAP_PRIVATE):
        raise KernelError(EINVAL, "do_mmap: exactly one of MAP_SHARED / MAP_PRIVATE")
    if f is None and not flags & MAP_ANONYMOUS:
        raise KernelError(EBADF, "ksys_mmap_pgoff: not anonymous and no file")
    length = -(-length // ps) * ps
    if length > mm.task_size:
        raise KernelError(ENOMEM, "do_mmap: length beyond TASK_SIZE")
    if pgoff + (length >> mm.machine.page_shift) >= 1 << 64:
        raise KernelError(EOVERFLOW, "do_mmap: pgoff + length overflows")
    if len(mm.vmas) >= DEFAULT_MAX_MAP_COUNT:
        raise KernelError(ENOMEM, "do_mmap: max_map_count reached")
    vm_flags = calc_vm_flags(prot, flags)
    if f is not None:
        if f.f_op.mmap is None:
            raise KernelError(ENODEV, "do_mmap: file has no mmap operation")
        if flags & MAP_SHARED and prot & PROT_WRITE and not f.f_mode & FMODE_WRITE:
            raise KernelError(EACCES, "do_mmap: shared writable map of a read-only file")
    old: list[vm_area_struct] = []
    if flags & MAP_FIXED:
        # __get_unmapped_area(): the range check comes first and is ENOMEM
        if addr < 0 or addr > mm.task_size - length:
            raise KernelError(ENOMEM, "__get_unmapped_area: MAP_FIXED range beyond TASK_SIZE")
        if addr % ps:
            raise KernelError(EINVAL, "__get_unmapped_area: MAP_FIXED address not page aligned")
        # mmap_region(): every VMA to be replaced is checked before anything changes
        old = vms_gather_munmap_vmas(mm, addr, addr + length)
    else:
        addr = get_unmapped_area(mm, length)
    if old:
        # mmap_region() since 6.12: the old VMAs' PTEs are cleared and their ->close
        # runs before the new file's ->mmap (vms_clean_up_area), so a failing ->mmap
        # leaves a hole (vms_abort_munmap_vmas cannot re-open them); an anonymous
        # MAP_FIXED cannot fail past this point.
        vms_complete_munmap_vmas(mm, addr, addr + length, old)
    vma = vm_area_struct(mm, addr, addr + length, vm_flags, vm_get_page_prot(vm_flags), pgoff)
    if f is not None:
        vma.vm_file = get_file(f)
        try:
            f.f_op.mmap(f, vma)
        except KernelError:
            unmap_vmas(vma, vma.vm_start, vma.vm_end)  # unmap_and_free_vma:
            fput(f)
            raise
    mm.link(vma)
    return addr


@traced
def split_vma(vma: vm_area_struct, addr: int) -> vm_area_struct:
    """Mirrors __split_vma(): cut at addr; return the upper part (linked)."""
    mm = vma.vm_mm
    if vma.vm_ops is not None and vma.vm_ops.may_split is not None:
        vma.vm_ops.may_split(vma, addr)
    new = vm_area_struct(mm, addr, vma.vm_end, vma.vm_flags, vma.vm_page_prot,
                         vma.vm_pgoff + ((addr - vma.vm_start) >> mm.machine.page_shift),
                         vma.vm_file, vma.vm_ops, vma.vm_private_data)
    new.vm_userfaultfd_ctx = vma.vm_userfaultfd_ctx
    if new.vm_file is not None:
        get_file(new.vm_file)
    if new.vm_ops is not None and new.vm_ops.open is not None:
        new.vm_ops.open(new)
    mm.unlink(vma)
    vma.vm_end = addr
    mm.link(vma)
    mm.link(new)
    return new


@traced
def vms_gather_munmap_vmas(mm: mm_struct, start: int, end: int) -> list[vm_area_struct]:
    """Mirrors vms_gather_munmap_vmas()'s checks: the VMAs [start, end) touches.

    Only the edge VMAs are split, so only they are asked (vm_ops->may_split)
    and only a split that adds a VMA checks max_map_count (ENOMEM).  Every
    check runs before anything changes: a refused split fails the whole call
    with every mapping as it was.
    """
    vmas = mm.overlapping(start, end)
    if not vmas:
        return vmas
    first, last = vmas[0], vmas[-1]
    if first.vm_start < start:
        if end < first.vm_end and len(mm.vmas) >= DEFAULT_MAX_MAP_COUNT:
            raise KernelError(ENOMEM, "vms_gather_munmap_vmas: max_map_count reached")
        _may_split(first, start)
    if last.vm_end > end:
        _may_split(last, end)
    return vmas


def _may_split(vma: vm_area_struct, addr: int) -> None:
    """The driver's veto of a split at addr (__split_vma's first check)."""
    if vma.vm_ops is not None and vma.vm_ops.may_split is not None:
        vma.vm_ops.may_split(vma, addr)


@traced
def vms_complete_munmap_vmas(mm: mm_struct, start: int, end: int,
                             vmas: list[vm_area_struct]) -> None:
    """Mirrors vms_complete_munmap_vmas(): split the edges, queue the
    userfaultfd unmap events, zap and remove.  Nothing here fails: vms_gather_munmap_vmas
    asked every question first.

    EMU: the kernel splits the edge VMAs while gathering and undoes them on a later
    failure; here the splits wait until every check has passed."""
    first, last = vmas[0], vmas[-1]
    if first.vm_start < start:
        upper = split_vma(first, start)
        if last is first:
            last = upper
        vmas = [upper, *vmas[1:]]
    if last.vm_end > end:
        split_vma(last, end)
    userfaultfd_unmap_prep(mm, start, end)
    # unmap_vmas(): mirrors of the range (ODP, hmm) are invalidated before the zap
    mmu_notifier_invalidate_range_start(mmu_notifier_range(mm, vmas[0].vm_start,
                                                           vmas[-1].vm_end, MMU_NOTIFY_UNMAP))
    for vma in vmas:
        unmap_vmas(vma, vma.vm_start, vma.vm_end)
        remove_vma(vma)


@traced
def do_munmap(mm: mm_struct, start: int, length: int) -> None:
    """Mirrors do_vmi_munmap(): all or nothing - vms_gather_munmap_vmas() checks every
    split first, then vms_complete_munmap_vmas() splits, zaps and removes."""
    ps = mm.machine.page_size
    if start % ps or start > mm.task_size or length > mm.task_size - start:
        raise KernelError(EINVAL, "do_munmap: start unaligned or range out of TASK_SIZE")
    length = -(-length // ps) * ps
    if length == 0:
        raise KernelError(EINVAL, "do_munmap: length is 0")
    end = start + length
    vmas = vms_gather_munmap_vmas(mm, start, end)
    if vmas:
        vms_complete_munmap_vmas(mm, start, end, vmas)

"""Mirrors mm/madvise.c: madvise(2) - here MADV_DONTNEED only.

MADV_DONTNEED drops the pages of a private anonymous range: the mirrors of the
range (mmu interval notifiers: ODP MRs) are invalidated first, then the PTEs are
zapped (a page still pinned survives until its unpin); the next touch faults in
a fresh zeroed page.

# EMU: the other advices are not modelled (EINVAL, as an unknown advice is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.errno import EINVAL, ENOMEM, KernelError
from kernel_model.memory import unmap_vmas
from kernel_model.mm_types import VM_LOCKED, VM_PFNMAP
from kernel_model.mmu_notifier import (
    MMU_NOTIFY_CLEAR,
    mmu_notifier_invalidate_range_start,
    mmu_notifier_range,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.mm_types import mm_struct

MADV_NORMAL, MADV_DONTNEED = 0, 4


@traced
def do_madvise(mm: mm_struct, start: int, len_in: int, behavior: int) -> None:
    """Mirrors do_madvise() for MADV_DONTNEED: madvise_dontneed_free() over each VMA of
    the range (zap_page_range_single, notifiers first).

    EINVAL for an unaligned start, a range that wraps, an advice not modelled, or a
    VM_LOCKED / VM_PFNMAP VMA in the range; ENOMEM when part of the range is not
    mapped (the mapped parts are still done, as the kernel does)."""
    ps = mm.machine.page_size
    if behavior not in (MADV_NORMAL, MADV_DONTNEED):
        raise KernelError(EINVAL, f"do_madvise: advice {behavior} not modelled")
    if start % ps:
        raise KernelError(EINVAL, "do_madvise: start not page aligned")
    length = -(-len_in // ps) * ps
    end = start + length
    if end < start or (len_in and not length):
        raise KernelError(EINVAL, "do_madvise: range wraps")
    if end == start or behavior == MADV_NORMAL:
        return
    vmas = mm.overlapping(start, end)
    for vma in vmas:
        if vma.vm_flags & (VM_LOCKED | VM_PFNMAP):
            raise KernelError(EINVAL, "madvise_dontneed_free_valid_vma: locked or PFN map")
    unmapped = False
    at = start
    for vma in vmas:
        lo, hi = max(start, vma.vm_start), min(end, vma.vm_end)
        unmapped = unmapped or lo > at
        mmu_notifier_invalidate_range_start(mmu_notifier_range(mm, lo, hi, MMU_NOTIFY_CLEAR))
        unmap_vmas(vma, lo, hi)
        at = hi
    if unmapped or at < end:
        raise KernelError(ENOMEM, "do_madvise: part of the range is not mapped")

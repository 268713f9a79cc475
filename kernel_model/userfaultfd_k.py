"""Mirrors include/linux/userfaultfd_k.h: the hooks mm calls into userfaultfd.

munmap (kernel_model.mm) must tell a monitoring userfaultfd that a registered range
went away, yet userfaultfd (kernel_model.userfaultfd, fs/userfaultfd.c) sits above mm:
it splits VMAs and copies to user memory.  This header is the floor between them:
mm includes it, and the event it queues needs only the context a VMA points at
(vma.vm_userfaultfd_ctx, a userfaultfd_ctx) and its wait queue.

# EMU: the kernel only declares userfaultfd_unmap_prep()/userfaultfd_unmap_complete()
# here and defines them in fs/userfaultfd.c; the definition lives in the header so mm
# does not import the file-system side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernel_model.locking import wake_up
from kernel_model.uapi.userfaultfd import UFFD_EVENT_UNMAP, UFFD_FEATURE_EVENT_UNMAP

if TYPE_CHECKING:
    from kernel_model.mm_types import mm_struct


def userfaultfd_unmap_prep(mm: mm_struct, start: int, end: int) -> None:
    """Mirrors userfaultfd_unmap_prep() + userfaultfd_unmap_complete(): a munmap of
    [start, end) queues one UFFD_EVENT_UNMAP for each userfaultfd with VMAs in it
    that asked for unmap events."""
    told: list[Any] = []
    for vma in mm.overlapping(start, end):
        ctx = vma.vm_userfaultfd_ctx
        if ctx is None or ctx in told or ctx.released or \
                not ctx.features & UFFD_FEATURE_EVENT_UNMAP:
            continue
        told.append(ctx)
        ctx.events.append((UFFD_EVENT_UNMAP, start, end))
        wake_up(ctx.wqh)

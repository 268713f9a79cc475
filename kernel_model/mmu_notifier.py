"""Mirrors mm/mmu_notifier.c and include/linux/mmu_notifier.h: interval notifiers.

A driver that mirrors part of an address space without pinning it (ODP: the
HCA's MTT, hmm) inserts an mmu_interval_notifier over [start, start + length);
whenever the kernel is about to change the mappings of an overlapping range -
munmap, exit, madvise(MADV_DONTNEED) - the notifier's ops.invalidate is called
*before* the page-table entries are cleared and the pages freed, so the driver
can stop its device's access and drop its DMA mappings first.

The sequence protocol is the kernel's: mmu_interval_read_begin() returns the
current sequence; the driver collects pages; under its own lock it checks
mmu_interval_read_retry() - if an invalidation ran meanwhile (its invalidate
called mmu_interval_set_seq() under that same lock), the collection is stale
and is redone.

# EMU: the subscriptions are a plain list on the mm (the kernel keeps an
# interval tree in mm->notifier_subscriptions); invalidations are not
# deferred while one is in progress (nothing here yields between the
# invalidate_range_start and the zap), so the odd "invalidating" sequence
# number of the kernel is modelled by a counter bumped per invalidation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.mm_types import mm_struct

# enum mmu_notifier_event
MMU_NOTIFY_UNMAP = 0
MMU_NOTIFY_CLEAR = 1
MMU_NOTIFY_PROTECTION_VMA = 2
MMU_NOTIFY_RELEASE = 5


@attrs.define(eq=False)
class mmu_notifier_range:
    """Mirrors struct mmu_notifier_range: the range whose mappings change, and why."""

    mm: mm_struct
    start: int
    end: int
    event: int = MMU_NOTIFY_UNMAP


@attrs.define(eq=False)
class mmu_interval_notifier_ops:
    """Mirrors struct mmu_interval_notifier_ops: invalidate(mni, range, cur_seq) -> bool."""

    invalidate: Callable[..., bool]


@attrs.define(eq=False)
class mmu_interval_notifier:
    """Mirrors struct mmu_interval_notifier: one subscribed range of an mm."""

    ops: mmu_interval_notifier_ops | None = None
    mm: mm_struct | None = None
    start: int = 0
    last: int = 0               # the last byte covered (inclusive), as the kernel keeps it
    invalidate_seq: int = 0
    container: Any = None       # EMU: what embeds it (the kernel's container_of)


def _subscriptions(mm: mm_struct) -> list[mmu_interval_notifier]:
    subs = getattr(mm, "notifier_subscriptions", None)
    if subs is None:
        subs = mm.notifier_subscriptions = []
    return subs


@traced
def mmu_interval_notifier_insert(interval_sub: mmu_interval_notifier, mm: mm_struct,
                                 start: int, length: int,
                                 ops: mmu_interval_notifier_ops) -> None:
    """Mirrors mmu_interval_notifier_insert(): subscribe [start, start + length) of mm.

    EINVAL for a zero length or a range that wraps (the kernel's overflow check).
    # EMU: the kernel's notifier takes its own mm_count (mmgrab); here the caller's
    # reference covers it (ib_umem_odp holds one for the umem's life), so that this
    # header-level module needs nothing from kernel_model.mm (which calls into it)."""
    if length == 0 or start + length - 1 >= 1 << 64:
        raise KernelError(EINVAL, "mmu_interval_notifier_insert: empty or wrapping range")
    interval_sub.ops, interval_sub.mm = ops, mm
    interval_sub.start, interval_sub.last = start, start + length - 1
    interval_sub.invalidate_seq = getattr(mm, "notifier_seq", 1)
    _subscriptions(mm).append(interval_sub)


@traced
def mmu_interval_notifier_remove(interval_sub: mmu_interval_notifier) -> None:
    """Mirrors mmu_interval_notifier_remove(): unsubscribe; once it returns no invalidate
    of this notifier runs any more (none is in flight here, see the module's EMU note)."""
    mm = interval_sub.mm
    if mm is None:
        return
    subs = _subscriptions(mm)
    if interval_sub in subs:
        subs.remove(interval_sub)
    interval_sub.mm = None


def mmu_interval_read_begin(interval_sub: mmu_interval_notifier) -> int:
    """Mirrors mmu_interval_read_begin(): the sequence a later read_retry compares with."""
    return interval_sub.invalidate_seq


def mmu_interval_read_retry(interval_sub: mmu_interval_notifier, seq: int) -> bool:
    """Mirrors mmu_interval_read_retry(): True if an invalidation ran since read_begin."""
    return interval_sub.invalidate_seq != seq


def mmu_interval_set_seq(interval_sub: mmu_interval_notifier, cur_seq: int) -> None:
    """Mirrors mmu_interval_set_seq(): called by invalidate under the driver's lock."""
    interval_sub.invalidate_seq = cur_seq


def mm_has_notifiers(mm: mm_struct) -> bool:
    """Mirrors mm_has_notifiers(): does anything mirror this address space?"""
    return bool(getattr(mm, "notifier_subscriptions", None))


def mmu_notifier_invalidate_range_start(rng: mmu_notifier_range) -> None:
    """Mirrors mmu_notifier_invalidate_range_start(): nothing unless the mm has notifiers."""
    if mm_has_notifiers(rng.mm):
        __mmu_notifier_invalidate_range_start(rng)


@traced
def __mmu_notifier_invalidate_range_start(rng: mmu_notifier_range) -> None:
    """Mirrors __mmu_notifier_invalidate_range_start() for the interval notifiers: every
    subscription overlapping [start, end) is told, before the mappings change.

    An invalidate that returns False (it could not block) is a caller bug here:
    every caller in the model may block.  # EMU: the kernel retries non-blocking
    callers; none exist in the model."""
    mm = rng.mm
    subs = mm.notifier_subscriptions
    seq = getattr(mm, "notifier_seq", 1) + 2
    mm.notifier_seq = seq
    for sub in list(subs):
        if sub.start < rng.end and sub.last >= rng.start:
            if not sub.ops.invalidate(sub, rng, seq):
                mm.machine.report_bug("mmu_notifier_invalidate_range_start",
                                      f"invalidate of {sub.start:#x} refused to block")

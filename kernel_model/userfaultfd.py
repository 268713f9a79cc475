"""Mirrors fs/userfaultfd.c, reduced to what a registration cache's unmap monitor uses:
userfaultfd(2), UFFDIO_API, UFFDIO_REGISTER / UFFDIO_UNREGISTER, read() of
struct uffd_msg, and the UFFD_EVENT_UNMAP a munmap of a registered range queues.

    fd = userfaultfd(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)
    ioctl(fd, UFFDIO_API, {api: UFFD_API, features: UFFD_FEATURE_EVENT_UNMAP | ...})
    ioctl(fd, UFFDIO_REGISTER, {range: {start, len}, mode: MISSING})
    ... munmap(start, len) anywhere in the process ...
    read(fd, msg, 32)  ->  {event: UFFD_EVENT_UNMAP, arg.remove: {start, end}}

Errors: EPERM for an unprivileged caller without UFFD_USER_MODE_ONLY
(vm.unprivileged_userfaultfd=0, the default since 5.11); EINVAL for unknown
flags, a wrong api, unsupported features, UFFDIO_API twice, any other ioctl
before it, an unaligned or empty range, a range with a hole, or memory that
cannot be registered (a PFN/IO mapping); EBUSY for a range another userfaultfd
registered; EAGAIN on a non-blocking read with nothing queued.

# EMU: the kernel makes the unmapping thread wait until the monitor has read the
# UNMAP event (userfaultfd_event_wait_completion); here munmap queues it and goes
# on, and the monitor reads the queue before it trusts its registrations.
# REMOVE (madvise) and REMAP (mremap) are accepted as features but never queued:
# the model has neither call.  Missing-page and write-protect faults are not
# delivered.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

from kernel_model.current import current
from kernel_model.errno import EAGAIN, EBUSY, EFAULT, EINVAL, EPERM, KernelError
from kernel_model.fs import O_CLOEXEC, O_NONBLOCK, O_RDWR, cdev, file, file_operations, inode
from kernel_model.locking import init_waitqueue_head, wait_event
from kernel_model.mm import VM_IO, VM_PFNMAP, split_vma
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user, copy_to_user
from kernel_model.uapi.userfaultfd import (
    UFFD_API,
    UFFD_API_IOCTLS,
    UFFD_FEATURE_EVENT_FORK,
    UFFD_FEATURE_EVENT_REMAP,
    UFFD_FEATURE_EVENT_REMOVE,
    UFFD_FEATURE_EVENT_UNMAP,
    UFFD_MSG_FMT,
    UFFD_MSG_SIZE,
    UFFD_USER_MODE_ONLY,
    UFFDIO_API,
    UFFDIO_API_FMT,
    UFFDIO_RANGE_FMT,
    UFFDIO_REGISTER,
    UFFDIO_REGISTER_FMT,
    UFFDIO_REGISTER_MODE_MISSING,
    UFFDIO_REGISTER_MODE_WP,
    UFFDIO_UNREGISTER,
)
from kernel_model.userfaultfd_k import userfaultfd_unmap_prep  # noqa: F401 - re-exported

UFFD_SUPPORTED = (UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMAP |
                  UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP)


class userfaultfd_ctx:
    """Mirrors struct userfaultfd_ctx: the mm it watches, the features, the queue."""

    def __init__(self, mm: Any, flags: int):
        self.mm = mm
        self.flags = flags
        self.features = 0
        self.api_done = False
        self.events: deque[tuple[int, int, int]] = deque()
        self.wqh = init_waitqueue_head("userfaultfd")
        self.released = False

    def __repr__(self) -> str:
        return f"userfaultfd_ctx features={self.features:#x} {len(self.events)} queued"


def _copy_in(arg: int, fmt: str) -> tuple:
    buf = bytearray(struct.calcsize(fmt))
    if copy_from_user(buf, arg, len(buf)):
        raise KernelError(EFAULT, "userfaultfd_ioctl: bad user address")      # EFAULT
    return struct.unpack(fmt, buf)


def _copy_out(arg: int, fmt: str, *vals: int) -> None:
    data = struct.pack(fmt, *vals)
    if copy_to_user(arg, data, len(data)):
        raise KernelError(EFAULT, "userfaultfd_ioctl: bad user address")


def _range(ctx: userfaultfd_ctx, start: int, length: int, what: str) -> int:
    ps = ctx.mm.machine.page_size
    if start % ps or length % ps or length == 0 or start + length > ctx.mm.task_size:
        raise KernelError(EINVAL, f"{what}: range [{start:#x}, +{length:#x}) unaligned, "
                          "empty or beyond TASK_SIZE")
    return start + length


@traced
def userfaultfd_register(ctx: userfaultfd_ctx, start: int, length: int, mode: int) -> None:
    """Mirrors userfaultfd_register(): every VMA of the range (no holes) joins ctx."""
    if not ctx.api_done:
        raise KernelError(EINVAL, "userfaultfd_register: UFFDIO_API first")
    if not mode or mode & ~(UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP):
        raise KernelError(EINVAL, f"userfaultfd_register: mode {mode:#x}")
    end = _range(ctx, start, length, "userfaultfd_register")
    mm = ctx.mm
    vmas = mm.overlapping(start, end)
    cur = start
    for vma in vmas:
        if vma.vm_start > cur:
            break
        cur = vma.vm_end
    if not vmas or cur < end:
        raise KernelError(EINVAL, f"userfaultfd_register: [{start:#x}, {end:#x}) has a hole")
    for vma in vmas:
        if vma.vm_flags & (VM_IO | VM_PFNMAP):
            raise KernelError(EINVAL, f"userfaultfd_register: {vma} cannot be registered")
        if vma.vm_userfaultfd_ctx not in (None, ctx):
            raise KernelError(EBUSY, f"userfaultfd_register: {vma} is another "
                              "userfaultfd's")
    for vma in vmas:
        if vma.vm_start < start:
            vma = split_vma(vma, start)
        if vma.vm_end > end:
            split_vma(vma, end)
        vma.vm_userfaultfd_ctx = ctx


@traced
def userfaultfd_unregister(ctx: userfaultfd_ctx, start: int, length: int) -> None:
    """Mirrors userfaultfd_unregister(): the range's VMAs leave ctx."""
    if not ctx.api_done:
        raise KernelError(EINVAL, "userfaultfd_unregister: UFFDIO_API first")
    end = _range(ctx, start, length, "userfaultfd_unregister")
    for vma in ctx.mm.overlapping(start, end):
        if vma.vm_userfaultfd_ctx is not ctx:
            continue
        if vma.vm_start < start:          # only the range leaves: split at its edges
            vma = split_vma(vma, start)
        if vma.vm_end > end:
            split_vma(vma, end)
        vma.vm_userfaultfd_ctx = None


def userfaultfd_ioctl(f: file, cmd: int, arg: int) -> int:
    """Mirrors userfaultfd_ioctl(): UFFDIO_API, UFFDIO_REGISTER, UFFDIO_UNREGISTER."""
    ctx = f.private_data
    if cmd == UFFDIO_API:
        api, features, _ = _copy_in(arg, UFFDIO_API_FMT)
        if ctx.api_done or api != UFFD_API or features & ~UFFD_SUPPORTED:
            _copy_out(arg, UFFDIO_API_FMT, 0, 0, 0)
            raise KernelError(EINVAL, f"userfaultfd_api: api {api:#x} features "
                              f"{features:#x}{' (twice)' if ctx.api_done else ''}")
        ctx.features, ctx.api_done = features, True
        _copy_out(arg, UFFDIO_API_FMT, UFFD_API, UFFD_SUPPORTED, UFFD_API_IOCTLS)
        return 0
    if cmd == UFFDIO_REGISTER:
        start, length, mode, _ = _copy_in(arg, UFFDIO_REGISTER_FMT)
        userfaultfd_register(ctx, start, length, mode)
        _copy_out(arg, UFFDIO_REGISTER_FMT, start, length, mode, UFFD_API_IOCTLS)
        return 0
    if cmd == UFFDIO_UNREGISTER:
        start, length = _copy_in(arg, UFFDIO_RANGE_FMT)
        userfaultfd_unregister(ctx, start, length)
        return 0
    raise KernelError(EINVAL, f"userfaultfd_ioctl: cmd {cmd:#x}")


def userfaultfd_read(f: file, buf: int, count: int) -> int:
    """Mirrors userfaultfd_read(): one struct uffd_msg; EAGAIN when non-blocking and
    nothing is queued, else it waits for an event."""
    ctx = f.private_data
    if not ctx.api_done or count < UFFD_MSG_SIZE:
        raise KernelError(EINVAL, "userfaultfd_read: UFFDIO_API first, and room for a msg")
    if not ctx.events:
        if f.f_flags & O_NONBLOCK:
            raise KernelError(EAGAIN, "userfaultfd_read: nothing queued")
        wait_event(ctx.wqh, lambda: ctx.events)
    event, start, end = ctx.events.popleft()
    if copy_to_user(buf, struct.pack(UFFD_MSG_FMT, event, 0, 0, 0, start, end, 0),
                    UFFD_MSG_SIZE):
        raise KernelError(EFAULT, "userfaultfd_read: bad user address")
    return UFFD_MSG_SIZE


def userfaultfd_release(inode_: Any, f: file) -> int:
    """Mirrors userfaultfd_release(): every VMA registered with it is let go."""
    ctx = f.private_data
    ctx.released = True
    mm = ctx.mm
    if mm is not None:
        for vma in mm.vmas:
            if vma.vm_userfaultfd_ctx is ctx:
                vma.vm_userfaultfd_ctx = None
    ctx.events.clear()
    return 0


USERFAULTFD_FOPS = file_operations(read=userfaultfd_read, unlocked_ioctl=userfaultfd_ioctl,
                                   release=userfaultfd_release)


@traced
def new_userfaultfd(flags: int) -> int:
    """Mirrors new_userfaultfd() (the userfaultfd(2) system call): an fd."""
    t = current()
    if flags & ~(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY):
        raise KernelError(EINVAL, f"userfaultfd: flags {flags:#x}")
    if not flags & UFFD_USER_MODE_ONLY and t.cred.uid != 0:
        raise KernelError(EPERM, "userfaultfd: unprivileged without UFFD_USER_MODE_ONLY "
                          "(vm.unprivileged_userfaultfd=0)")
    ctx = userfaultfd_ctx(t.mm, flags)
    fd = t.files.alloc_fd()
    t.files.fd_install(fd, file(USERFAULTFD_FOPS, "anon_inode:[userfaultfd]",
                                inode(cdev(USERFAULTFD_FOPS)), O_RDWR | (flags & O_NONBLOCK),
                                3, ctx))
    return fd

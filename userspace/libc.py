"""The C library pieces the userspace libraries need: memory and errno.

Libraries in userspace/ run inside an emulated Process and reach the kernel
only through its system calls.  `posix_memalign` here is an anonymous mmap
(rdma-core's buffers are page aligned anyway); `SysError` is what a failed
system call becomes when a library reports it.

EMU: one mmap per allocation (glibc would carve small ones from its heap).
"""

from __future__ import annotations

import os
import struct

PROT_NONE, PROT_READ, PROT_WRITE = 0x0, 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
O_RDONLY, O_RDWR, O_CLOEXEC = 0, 2, 0o2000000
O_NONBLOCK = 0o4000


class SysError(OSError):
    """A failed system call: errno and the call that failed."""

    def __init__(self, errno_: int, what: str):
        super().__init__(errno_, f"{what}: {os.strerror(errno_)}")


def check(ret: int, what: str) -> int:
    """Raise SysError for a -errno return, else pass the value through."""
    if isinstance(ret, int) and ret < 0:
        raise SysError(-ret, what)
    return ret


def posix_memalign(proc, align: int, size: int) -> int:
    """Page-aligned zeroed memory of at least `size` bytes (an anonymous mmap)."""
    ps = proc.machine.page_size
    length = -(-max(size, 1) // ps) * ps
    return check(proc.mmap(0, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS),
                 "mmap")


def free(proc, addr: int, size: int) -> None:
    """Release memory from posix_memalign."""
    ps = proc.machine.page_size
    check(proc.munmap(addr, -(-max(size, 1) // ps) * ps), "munmap")


def read_sysfs(proc, path: str) -> str | None:
    """Read a sysfs attribute (open, read, close); None if it does not exist."""
    fd = proc.open(path, O_RDONLY)
    if fd < 0:
        return None
    try:
        buf = posix_memalign(proc, 0, 256)
        try:
            n = check(proc.read(fd, buf, 256), f"read {path}")
            return proc.load(buf, n).decode()
        finally:
            free(proc, buf, 256)
    finally:
        proc.close(fd)


def ioctl_struct(proc, fd: int, cmd: int, fmt: str, fields: list[int], error: type,
                 what: str) -> tuple:
    """An ioctl whose argument is a struct (`fmt`, struct module notation) in and out:
    packed into a bounce buffer, the call, unpacked; `error`(errno, what) on failure
    (how the GPU runtimes call their drivers)."""
    n = struct.calcsize(fmt)
    buf = posix_memalign(proc, 0, n)
    try:
        proc.store(buf, struct.pack(fmt, *fields))
        ret = proc.ioctl(fd, cmd, buf)
        if ret < 0:
            raise error(-ret, what)
        return struct.unpack(fmt, proc.load(buf, n))
    finally:
        free(proc, buf, n)


def reserve_aligned(proc, length: int, align: int, what: str) -> int:
    """An `align`-aligned range of `length` bytes reserved for the caller (PROT_NONE):
    reserve one `align` more, give back the misaligned head and tail.  The caller maps
    over it with MAP_FIXED (which replaces the reservation), or munmaps it; while it is
    held no other mmap of the process can land there - how the GPU runtimes place an
    allocation before they map it."""
    hole = check(proc.mmap(0, length + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS),
                 f"{what}: reserve")
    va = -(-hole // align) * align
    if va > hole:
        check(proc.munmap(hole, va - hole), f"{what}: trim head")
    end, hole_end = va + length, hole + length + align
    if hole_end > end:
        check(proc.munmap(end, hole_end - end), f"{what}: trim tail")
    return va

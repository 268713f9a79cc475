"""The C library pieces the userspace libraries need: memory and errno.

Libraries in userspace/ run inside an emulated Process and reach the kernel
only through its system calls.  `posix_memalign` here is an anonymous mmap
(rdma-core's buffers are page aligned anyway); `SysError` is what a failed
system call becomes when a library reports it.

EMU: one mmap per allocation (glibc would carve small ones from its heap).
"""

from __future__ import annotations

import os

PROT_READ, PROT_WRITE = 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS = 0x01, 0x02, 0x20
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

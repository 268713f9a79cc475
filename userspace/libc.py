"""The C library pieces the userspace libraries need: memory and errno.

Libraries in userspace/ run inside an emulated Process and reach the kernel
only through its system calls.  `posix_memalign` hands out small blocks (at most
HEAP_MAX bytes, alignment at most 16: the bounce buffers and stack arrays of
rdma-core and the runtimes) from a per-process heap, as glibc's malloc does,
and everything else as an anonymous mmap of its own (rdma-core's queue and
data buffers are page aligned anyway); `SysError` is what a failed system call
becomes when a library reports it.

EMU: the heap is anonymous mappings of HEAP_ARENA bytes (glibc grows its main
arena with brk), carved into power-of-two size classes with a free list each;
a block is zeroed when handed out.  Larger or more aligned allocations take one
mmap each, where glibc would serve the smaller of them from the heap too.
"""

from __future__ import annotations

import errno
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


HEAP_MAX = 2048              # bytes: the largest block the heap serves
HEAP_ARENA = 64 << 10        # bytes of address space the heap maps at a time
_HEAP_MIN = 16               # the smallest size class (and the heap's alignment)


class _Heap:
    """One process's small-block heap: arenas carved from the top of the last one,
    freed blocks kept per size class (last freed, first reused)."""

    def __init__(self) -> None:
        self.arenas: list[int] = []               # where each arena was mapped
        self.next = self.end = 0                  # the free part of the newest arena
        self.free: dict[int, list[int]] = {}      # size class -> freed blocks
        self.live: dict[int, int] = {}            # block -> its size class


def _size_class(size: int) -> int:
    return max(_HEAP_MIN, 1 << (max(size, 1) - 1).bit_length())


def _heap_alloc(proc, size: int) -> int:
    heap = proc.__dict__.get("libc_heap")
    if heap is None:
        heap = proc.__dict__["libc_heap"] = _Heap()
    cls = _size_class(size)
    freed = heap.free.get(cls)
    if freed:
        addr = freed.pop()
    else:
        if heap.next + cls > heap.end:
            arena = check(proc.mmap(0, HEAP_ARENA, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS), "mmap")
            heap.arenas.append(arena)
            heap.next, heap.end = arena, arena + HEAP_ARENA
        addr = heap.next
        heap.next += cls
    proc.store(addr, bytes(cls))
    heap.live[addr] = cls
    return addr


def heap_arenas(proc) -> list[int]:
    """The addresses of the process's heap arenas (HEAP_ARENA bytes each), oldest first."""
    heap = proc.__dict__.get("libc_heap")
    return list(heap.arenas) if heap is not None else []


def posix_memalign(proc, align: int, size: int) -> int:
    """Zeroed memory of at least `size` bytes aligned to `align`: a block of the
    process's heap when small (see the module docstring), else page-aligned pages
    of an anonymous mmap of its own."""
    if size <= HEAP_MAX and align <= _HEAP_MIN:
        return _heap_alloc(proc, size)
    ps = proc.machine.page_size
    length = -(-max(size, 1) // ps) * ps
    return check(proc.mmap(0, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS),
                 "mmap")


def free(proc, addr: int, size: int) -> None:
    """Release memory from posix_memalign: a heap block goes back to its size class's
    free list, a mapping is unmapped."""
    heap = proc.__dict__.get("libc_heap")
    if heap is not None:
        cls = heap.live.pop(addr, None)
        if cls is not None:
            heap.free.setdefault(cls, []).append(addr)
            return
        if any(a <= addr < a + HEAP_ARENA for a in heap.arenas):
            # glibc aborts ("free(): double free detected"); unmapping a page of
            # the arena would pull it from under the live blocks
            raise SysError(errno.EINVAL, f"free({addr:#x}): not an allocated block "
                                         "(double free?)")
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

"""pyverbs.mem_alloc: memory of the (emulated) process, as pyverbs' libc wrappers.

Every address here is a virtual address of the implicit host's process, the one the
verbs run in: malloc/posix_memalign map anonymous zeroed pages there (libc's
allocator is an mmap per block in this model), read/write load and store through
that process's page tables, so data a test writes is what the HCA reads.
"""

from __future__ import annotations

from userspace import libc
from userspace.pyverbs.host import current_process
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError

MAP_SHARED_, MAP_PRIVATE_, MAP_FIXED_, MAP_ANONYMOUS_ = 1, 2, 16, 32
MAP_GROWSDOWN_, MAP_LOCKED_, MAP_NORESERVE_, MAP_POPULATE_ = 256, 8192, 16384, 32768
MAP_STACK_, MAP_HUGETLB_ = 131072, 262144
PROT_NONE_, PROT_READ_, PROT_WRITE_, PROT_EXEC_ = 0, 1, 2, 4

_blocks: dict[int, int] = {}  # address -> size, for free()


def posix_memalign(size: int, alignment: int = 8) -> int:
    """Zeroed memory of `size` bytes aligned to `alignment` (a page or more here)."""
    addr = libc.posix_memalign(current_process(), alignment, size)
    _blocks[addr] = size
    return addr


def malloc(size: int) -> int:
    """`size` bytes of memory (0 if the process's address space is full)."""
    try:
        return posix_memalign(size)
    except OSError:
        return 0


def free(ptr: int) -> None:
    """Free a block from malloc/posix_memalign."""
    size = _blocks.pop(ptr, None)
    if size is None:
        raise PyverbsUserError(f"free: {ptr:#x} was not allocated by malloc/posix_memalign")
    libc.free(current_process(), ptr, size)


def mmap(addr: int = 0, length: int = 0, prot: int = PROT_READ_ | PROT_WRITE_,
         flags: int = MAP_PRIVATE_ | MAP_ANONYMOUS_, fd: int = -1, offset: int = 0) -> int:
    """mmap(2) in the process; the address, or -errno."""
    return current_process().mmap(addr, length, prot, flags, fd, offset)


def munmap(addr: int, length: int) -> int:
    return current_process().munmap(addr, length)


MADV_DONTNEED_ = 4


def madvise(addr: int, length: int, flags: int = MADV_DONTNEED_) -> None:
    """madvise(2) in the process (rdma-core 50+ pyverbs; its ODP tests drop a buffer's
    pages so the next access faults); PyverbsRDMAError with the errno on failure."""
    ret = current_process().madvise(addr, length, flags)
    if ret < 0:
        raise PyverbsRDMAError("Failed to madvise memory", -ret)


def read(addr: int, length: int, offset: int = 0) -> bytes:
    return current_process().load(addr + offset, length)


def write(addr: int, data: str | bytes, length: int, offset: int = 0) -> None:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    current_process().store(addr + offset, raw[:length])


def read32(addr: int, offset: int = 0) -> int:
    return int.from_bytes(read(addr + 4 * offset, 4), "little")


def read64(addr: int, offset: int = 0) -> int:
    return int.from_bytes(read(addr + 8 * offset, 8), "little")


def writebe32(addr: int, val: int, offset: int = 0) -> None:
    current_process().store(addr + 4 * offset, val.to_bytes(4, "big"))


def writebe64(addr: int, val: int, offset: int = 0) -> None:
    current_process().store(addr + 8 * offset, val.to_bytes(8, "big"))

"""A HIP-like runtime: what libamdhip64/ROCr do over /dev/kfd, reduced to memory.

    hip = hiprt(proc)                 # the process's runtime (opens /dev/kfd)
    d = hip.hipMalloc(1 << 20)        # VRAM at a 64 KiB-aligned virtual address
    hip.hipFree(d)                    # third parties' free callbacks run first

hipMalloc reserves a 64 KiB-aligned VA (an anonymous PROT_NONE mapping,
trimmed to the aligned range and held), asks KFD for a VRAM buffer there
(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU) and maps it over the reservation with an mmap
of /dev/kfd at the returned offset.  The CPU cannot use that mapping and gup cannot pin it.

Failures raise HipError carrying the errno KFD returned.
"""

from __future__ import annotations

from kernel_model.trace import traced
from kernel_model.uapi import kfd as uapi
from userspace.libc import (
    MAP_FIXED,
    MAP_SHARED,
    O_RDWR,
    PROT_READ,
    PROT_WRITE,
    SysError,
    check,
    ioctl_struct,
    reserve_aligned,
)

GPU_PAGE_SIZE = 1 << 16
FIRST_GPU_ID = 0x1000


class HipError(SysError):
    """A failed HIP call: KFD's errno and the call."""


class HipRuntime:
    """One process's HIP runtime on one GPU (the first unless told)."""

    def __init__(self, proc, gpu_id: int = FIRST_GPU_ID):
        self.proc = proc
        self.gpu_id = gpu_id
        self.fd = proc.open(uapi.KFD_DEVICE_PATH, O_RDWR)
        if self.fd < 0:
            raise HipError(-self.fd, "hipInit: open /dev/kfd")
        self.allocations: dict[int, tuple[int, int]] = {}     # va -> (size, handle)

    def __repr__(self) -> str:
        return f"HipRuntime pid {self.proc.pid} gpu {self.gpu_id:#x}, " \
               f"{len(self.allocations)} allocations"

    def _ioctl(self, cmd: int, fmt: str, fields: list[int], what: str) -> tuple:
        return ioctl_struct(self.proc, self.fd, cmd, fmt, fields, HipError, what)

    @traced
    def hipMalloc(self, size: int) -> int:
        """VRAM of `size` bytes (whole 64 KiB pages); its virtual address."""
        length = -(-size // GPU_PAGE_SIZE) * GPU_PAGE_SIZE
        p = self.proc
        va = reserve_aligned(p, length, GPU_PAGE_SIZE, "hipMalloc")
        try:
            out = self._ioctl(uapi.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, uapi.KFD_ALLOC_FMT,
                              [va, length, 0, 0, self.gpu_id,
                               uapi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM], "hipMalloc")
        except HipError:
            p.munmap(va, length)                     # the reservation
            raise
        handle, offset = out[2], out[3]
        ret = p.mmap(va, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.fd, offset)
        if ret < 0:
            self._ioctl(uapi.AMDKFD_IOC_FREE_MEMORY_OF_GPU, uapi.KFD_FREE_FMT, [handle],
                        "hipMalloc: undo")
            p.munmap(va, length)
            raise HipError(-ret, "hipMalloc: map")
        self.allocations[va] = (length, handle)
        return va

    @traced
    def hipFree(self, va: int) -> None:
        """Free VRAM (third parties holding it get their free callback first)."""
        if va not in self.allocations:
            raise HipError(22, f"hipFree: {va:#x} was not returned by hipMalloc")
        length, handle = self.allocations.pop(va)
        self._ioctl(uapi.AMDKFD_IOC_FREE_MEMORY_OF_GPU, uapi.KFD_FREE_FMT, [handle], "hipFree")
        check(self.proc.munmap(va, length), "hipFree: unmap")


def hiprt(proc, gpu_id: int = FIRST_GPU_ID) -> HipRuntime:
    """The process's runtime, created on first use."""
    rts = proc.__dict__.setdefault("_hiprt", {})
    rt = rts.get(gpu_id)
    if rt is None or rt.fd < 0:
        rt = rts[gpu_id] = HipRuntime(proc, gpu_id)
    return rt

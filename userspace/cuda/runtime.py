"""A CUDA-like runtime: what libcudart/libcuda do over /dev/nvidiaN, reduced.

    cuda = cudart(proc)                       # the process's runtime (cuInit + a context)
    d = cuda.cudaMalloc(1 << 20)              # device memory at a unified virtual address
    cuda.cudaMemcpy(d, host, n, cudaMemcpyHostToDevice)
    cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, d)
    cuda.cudaFree(d)                          # third parties' free callbacks run first

cudaMalloc asks the driver for the memory (ALLOC_MEMORY) and then binds its
address with an mmap of the GPU file over a 64 KiB-aligned range it reserved
first (an anonymous PROT_NONE mapping, trimmed to the aligned range and held
until the mmap replaces it), the way the real library places its allocations.
The CPU cannot touch that address (a load or store faults) and gup cannot pin it.

Failures raise CudaError carrying the errno the driver returned (the real
API returns cudaError_t codes; cudaErrorInvalidValue is EINVAL here,
cudaErrorMemoryAllocation ENOMEM).
"""

from __future__ import annotations

from kernel_model.trace import traced
from kernel_model.uapi import nvidia as uapi
from kernel_model.uapi.nvidia import (  # noqa: F401 - re-exported for programs
    CU_MEMORYTYPE_DEVICE,
    CU_POINTER_ATTRIBUTE_BUFFER_ID,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    CU_POINTER_ATTRIBUTE_P2P_TOKENS,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
    cudaMemcpyDeviceToHost,
    cudaMemcpyHostToDevice,
)
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


CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1   # CUmemRangeHandleType (cuda.h)


class CudaError(SysError):
    """A failed CUDA call: the driver's errno and the call."""


class CudaRuntime:
    """One process's CUDA runtime on one GPU (device 0 unless told)."""

    def __init__(self, proc, device: int = 0):
        self.proc = proc
        self.device = device
        self.fd = proc.open(uapi.NV_DEVICE_PATH.format(minor=device), O_RDWR)
        if self.fd < 0:
            raise CudaError(-self.fd, f"cuInit: open /dev/nvidia{device}")
        self.allocations: dict[int, int] = {}     # va -> mapped size

    def __repr__(self) -> str:
        return f"CudaRuntime pid {self.proc.pid} nvidia{self.device}, " \
               f"{len(self.allocations)} allocations"

    def _escape(self, cmd: int, fmt: str, fields: list[int], what: str) -> tuple:
        return ioctl_struct(self.proc, self.fd, cmd, fmt, fields, CudaError, what)

    # -- memory --------------------------------------------------------------------
    @traced
    def cudaMalloc(self, size: int) -> int:
        """Device memory of `size` bytes; its unified virtual address (64 KiB aligned)."""
        _size, handle = self._escape(uapi.NV_ESC_ALLOC_MEMORY, uapi.NV_ALLOC_FMT, [size, 0],
                                     "cudaMalloc")
        length = -(-size // GPU_PAGE_SIZE) * GPU_PAGE_SIZE
        p = self.proc
        va = reserve_aligned(p, length, GPU_PAGE_SIZE, "cudaMalloc")
        ret = p.mmap(va, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.fd, handle)
        if ret < 0:
            p.munmap(va, length)                     # the reservation
            raise CudaError(-ret, "cudaMalloc: map")
        self.allocations[va] = length
        return va

    @traced
    def cudaFree(self, va: int) -> None:
        """Free device memory (third parties holding it get their free callback first)."""
        if va not in self.allocations:
            raise CudaError(22, f"cudaFree: {va:#x} was not returned by cudaMalloc")
        self._escape(uapi.NV_ESC_FREE_MEMORY, uapi.NV_FREE_FMT, [va], "cudaFree")
        check(self.proc.munmap(va, self.allocations.pop(va)), "cudaFree: unmap")

    @traced
    def cudaMemcpy(self, dst: int, src: int, count: int, kind: int) -> None:
        """Copy host <-> device (cudaMemcpyHostToDevice / DeviceToHost)."""
        self._escape(uapi.NV_ESC_MEMCPY, uapi.NV_MEMCPY_FMT, [dst, src, count, kind, 0],
                     "cudaMemcpy")

    @traced
    def cuMemGetAddressRange(self, va: int) -> tuple[int, int]:
        """(base, size) of the allocation holding va."""
        return (self.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va),
                self.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_SIZE, va))

    # -- pointer attributes --------------------------------------------------------
    @traced
    def cuPointerGetAttribute(self, attribute: int, va: int):
        """MEMORY_TYPE, BUFFER_ID, SYNC_MEMOPS, RANGE_START_ADDR, RANGE_SIZE: an int;
        P2P_TOKENS: (p2pToken, vaSpaceToken)."""
        out = self._escape(uapi.NV_ESC_GET_POINTER_ATTR, uapi.NV_ATTR_FMT,
                           [va, attribute, 0, 0, 0], "cuPointerGetAttribute")
        if attribute == CU_POINTER_ATTRIBUTE_P2P_TOKENS:
            return out[3], out[4]
        return out[3]

    @traced
    def cuMemGetHandleForAddressRange(self, va: int, size: int, handle_type: int,
                                      flags: int = 0) -> int:
        """A dma-buf fd for [va, va + size) of device memory (handle_type
        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD; CUDA 11.7+, driver R515+)."""
        if handle_type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD or flags:
            raise CudaError(22, "cuMemGetHandleForAddressRange: handle type or flags")
        out = self._escape(uapi.NV_ESC_EXPORT_DMABUF, uapi.NV_EXPORT_DMABUF_FMT,
                           [va, size, -1], "cuMemGetHandleForAddressRange")
        return out[2]

    @traced
    def cuPointerSetAttribute(self, value: int, attribute: int, va: int) -> None:
        """Only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS can be set."""
        self._escape(uapi.NV_ESC_SET_POINTER_ATTR, uapi.NV_ATTR_FMT,
                     [va, attribute, value, 0, 0], "cuPointerSetAttribute")

    def close(self) -> None:
        """Tear the context down: close the GPU file (the driver frees what is left)."""
        if self.fd >= 0:
            for va, length in list(self.allocations.items()):
                self.proc.munmap(va, length)
            self.allocations.clear()
            self.proc.close(self.fd)
            self.fd = -1


def cudart(proc, device: int = 0) -> CudaRuntime:
    """The process's runtime for `device`, created on first use (as cuInit is)."""
    rts = proc.__dict__.setdefault("_cudart", {})
    rt = rts.get(device)
    if rt is None or rt.fd < 0:
        rt = rts[device] = CudaRuntime(proc, device)
    return rt

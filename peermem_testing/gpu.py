"""GPU memory as a test reads and writes it: through a host bounce buffer and cudaMemcpy,
as a CUDA program would (a CPU load or store to a cudaMalloc'd VA faults); AMD VRAM
straight from the board (the HIP runtime here has no hipMemcpy)."""

from __future__ import annotations

from typing import Any

from userspace.cuda.runtime import cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice, cudart
from userspace.libc import free, posix_memalign


def gpu_load(proc: Any, addr: int, n: int) -> bytes:
    """The n bytes of device memory at addr (cudaMemcpy DeviceToHost)."""
    host = posix_memalign(proc, 0, n)
    try:
        cudart(proc).cudaMemcpy(host, addr, n, cudaMemcpyDeviceToHost)
        return proc.load(host, n)
    finally:
        free(proc, host, n)


def gpu_store(proc: Any, addr: int, data: bytes) -> None:
    """Write data into device memory at addr (cudaMemcpy HostToDevice)."""
    host = posix_memalign(proc, 0, len(data))
    try:
        proc.store(host, data)
        cudart(proc).cudaMemcpy(addr, host, len(data), cudaMemcpyHostToDevice)
    finally:
        free(proc, host, len(data))


def amd_load(proc: Any, addr: int, n: int) -> bytes:
    """The n bytes of VRAM at addr, a hipMalloc'd address of proc (# EMU: read from the
    board's memory by the buffer's pages, as a debugger would, not through a copy)."""
    from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
    kfd = proc.machine.modules["amdgpu"].state
    (kp,) = [q for q in kfd.processes if q.mm is proc.mm]
    bo = kp.find_bo_from_interval(addr, addr + n - 1)
    out = bytearray()
    while len(out) < n:
        off = addr + len(out) - bo.va
        page, inner = bo.pages[off >> GPU_PAGE_SHIFT], off & (GPU_PAGE_SIZE - 1)
        k = min(n - len(out), GPU_PAGE_SIZE - inner)
        start = (page << GPU_PAGE_SHIFT) + inner
        out += bo.dev.gpu.vidmem[start:start + k]
    return bytes(out)

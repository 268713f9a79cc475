"""GPU memory as a test reads and writes it: through a host bounce buffer and cudaMemcpy,
as a CUDA program would (a CPU load or store to a cudaMalloc'd VA faults)."""

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

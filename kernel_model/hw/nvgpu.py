"""An NVIDIA GPU on the PCI bus: device memory and the BAR1 aperture (device model).

This is the silicon side of drivers/nvidia (the kernel driver, its resource
manager and nv-p2p).  What the model has:

  * device memory ("vidmem"), `GpuConfig.mem_size` bytes (16 GiB by default),
    committed lazily like the machine's RAM, addressed by GPU physical
    address and managed by the driver in 64 KiB GPU pages;
  * BAR1, the aperture through which anything on the PCI bus (the CPU, an
    HCA) reaches vidmem.  It is cut into 64 KiB windows; the driver maps a
    window onto one GPU page by writing the BAR1 page table (`bar1_map`) -
    which nv-p2p does only while a third party has the pages pinned - and
    unmaps it when the pin goes;
  * copy engines: the driver moves bytes between vidmem and host memory for
    cudaMemcpy (`vidmem_read` / `vidmem_write`).

An access to a BAR1 window that maps nothing is a fault the model reports,
never a silent read: it is recorded in `bar1_faults` and WARNed on the
machine (so the leak check names it), a read raises MachineCheck (the
requester sees an error completion) and a write is dropped (a posted write
has nobody to fail to).  That is the check that catches device DMA into GPU
memory whose owner freed it or whose pin was revoked.

# EMU: BAR0 (registers) and BAR3 are not modelled: the driver reaches the GPU
# through the calls above, not through register writes; there is no GMMU for
# the GPU's own virtual addresses (the driver keeps VA -> page tables itself),
# no MIG, no vGPU, no large-page (2 MiB) BAR1 mappings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from c_ext import U64Array, anon_map
from kernel_model.ioport import MachineCheck
from kernel_model.pci import pci_add_device, pci_dev, pci_register_bar
from kernel_model.sched import touch

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

GPU_PAGE_SHIFT = 16
GPU_PAGE_SIZE = 1 << GPU_PAGE_SHIFT
GiB, MiB = 1 << 30, 1 << 20


@attrs.frozen
class GpuConfig:
    """What kind of GPU to build (defaults: an A100-class board with a 256 MiB BAR1)."""

    vendor: int = 0x10DE
    device: int = 0x20B0
    name: str = "NVIDIA A100-SXM4-40GB"
    mem_size: int = attrs.field(default=16 * GiB)
    bar1_size: int = attrs.field(default=256 * MiB)

    @mem_size.validator
    def _mem(self, attribute: object, value: int) -> None:
        if value < GPU_PAGE_SIZE or value % GPU_PAGE_SIZE:
            raise ValueError("GpuConfig: mem_size must be a multiple of 64 KiB")

    @bar1_size.validator
    def _bar1(self, attribute: object, value: int) -> None:
        if value < 64 * MiB or value & (value - 1):
            raise ValueError("GpuConfig: bar1_size must be a power of two >= 64 MiB")


class NvGpu:
    """One GPU.  See the module docstring."""

    APERTURE_BAR = 1          # the BAR that reaches vidmem (BAR1 on NVIDIA boards)

    def __init__(self, machine: Machine, config: GpuConfig | None = None):
        self.machine = machine
        self.config = cfg = config or GpuConfig()
        self.pdev = pci_dev(machine, cfg.vendor, cfg.device)
        self.pdev.model = self
        self.nr_pages = cfg.mem_size >> GPU_PAGE_SHIFT
        self.bar1_windows = cfg.bar1_size >> GPU_PAGE_SHIFT
        # the BAR1 page table: window -> GPU page + 1 (0: maps nothing); an array the
        # driver's C loop (c_ext bar1_map) writes
        self.bar1_pte = U64Array(self.bar1_windows, lazy=True)
        self.bar1_faults: list[tuple[str, int, int]] = []   # (read/write, BAR1 offset, bytes)
        # GPU UUID: stable per machine and slot, as the board's would be
        self.uuid = bytes(((machine.serial * 131 + self.pdev.bus * 7 + i) * 37) & 0xFF
                          for i in range(16))
        self._vidmem: memoryview | None = None
        self.bar1 = pci_register_bar(self.pdev, self.APERTURE_BAR, cfg.bar1_size, self.bar1_read,
                                     self.bar1_write, prefetch=True)
        pci_add_device(machine, self.pdev)
        gpus = getattr(machine, "gpus", None)
        if gpus is None:
            gpus = machine.gpus = []
            machine.leak_checks.append(_leak_check)
        gpus.append(self)

    def __repr__(self) -> str:
        return (f"GPU {self.pdev.name} {self.config.name} {self.config.mem_size >> 30} GiB "
                f"BAR1 {self.config.bar1_size >> 20} MiB, {self.windows_mapped()} windows mapped")

    def windows_mapped(self) -> int:
        """How many BAR1 windows map a page now."""
        return self.bar1_windows - self.bar1_pte.view.tolist().count(0)

    @property
    def name(self) -> str:
        return self.pdev.name

    # -- device memory -------------------------------------------------------------
    @property
    def vidmem(self) -> memoryview:
        if self._vidmem is None:
            self._vidmem = memoryview(anon_map(self.config.mem_size))
        return self._vidmem

    def vidmem_read(self, gpu_addr: int, n: int) -> bytes:
        """A copy engine reading vidmem at a GPU physical address."""
        self._check(gpu_addr, n)
        return bytes(self.vidmem[gpu_addr:gpu_addr + n])

    def vidmem_write(self, gpu_addr: int, data: bytes) -> None:
        """A copy engine writing vidmem at a GPU physical address."""
        self._check(gpu_addr, len(data))
        self.vidmem[gpu_addr:gpu_addr + len(data)] = data

    def _check(self, gpu_addr: int, n: int) -> None:
        if gpu_addr < 0 or n < 0 or gpu_addr + n > self.config.mem_size:
            raise ValueError(f"{self.name}: vidmem [{gpu_addr:#x}, +{n:#x}) out of range")

    # -- BAR1 ------------------------------------------------------------------------
    @property
    def bar1_ptes(self) -> dict[int, int]:
        """The mapped windows as {window: GPU page} (a copy, for tools and tests)."""
        return {w: p - 1 for w, p in enumerate(self.bar1_pte.view.tolist()) if p}

    def bar1_map(self, window: int, gpu_page: int) -> None:
        """Point a BAR1 window at a GPU page (the driver writes the BAR1 page table)."""
        if not 0 <= window < self.bar1_windows or not 0 <= gpu_page < self.nr_pages:
            raise ValueError(f"{self.name}: BAR1 map {window} -> {gpu_page} out of range")
        touch(self.bar1)          # the aperture's translation: what a BAR1 access reads
        self.bar1_pte.view[window] = gpu_page + 1

    def bar1_unmap(self, window: int) -> None:
        """Clear a BAR1 window: later accesses through it fault."""
        touch(self.bar1)
        if not self.bar1_pte.view[window]:
            raise KeyError(window)
        self.bar1_pte.view[window] = 0

    def bar1_bus_address(self, window: int) -> int:
        """The physical (bus) address of a BAR1 window."""
        return self.bar1.start + (window << GPU_PAGE_SHIFT)

    def _windows(self, off: int, n: int, write: bool):
        """(window offset in vidmem, bytes) pieces of a BAR1 access, or a fault."""
        pieces = []
        while n:
            w, o = off >> GPU_PAGE_SHIFT, off & (GPU_PAGE_SIZE - 1)
            k = min(n, GPU_PAGE_SIZE - o)
            page = self.bar1_pte.view[w] - 1 if w < self.bar1_windows else -1
            if page < 0:
                what = "write" if write else "read"
                self.bar1_faults.append((what, off, k))
                self.machine.report_bug(
                    "nvgpu", f"{self.name}: BAR1 {what} of {k} bytes at +{off:#x}: window "
                    f"{w} maps no GPU page (unpinned, revoked or freed)")
                return None
            pieces.append(((page << GPU_PAGE_SHIFT) + o, k))
            off, n = off + k, n - k
        return pieces

    def bar1_read(self, off: int, n: int) -> bytes:
        pieces = self._windows(off, n, False)
        if pieces is None:
            raise MachineCheck(f"{self.name}: BAR1 read at +{off:#x} through an unmapped window")
        return b"".join(bytes(self.vidmem[a:a + k]) for a, k in pieces)

    def bar1_write(self, off: int, data: bytes) -> None:
        pieces = self._windows(off, len(data), True)
        if pieces is None:
            return                      # a posted write to nothing is dropped
        done = 0
        for a, k in pieces:
            self.vidmem[a:a + k] = data[done:done + k]
            done += k


def _leak_check(machine: Machine) -> list[str]:
    """After shutdown no BAR1 window may still map a GPU page: a pin nobody put."""
    return [f"{gpu.name}: {gpu.windows_mapped()} BAR1 window(s) still mapped (a third-party "
            "pin never put)" for gpu in machine.gpus if gpu.windows_mapped()]

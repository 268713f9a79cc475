"""An AMD Instinct GPU on the PCI bus: VRAM and the BAR that exposes it (device model).

The silicon side of drivers/amdgpu (amdgpu + amdkfd).  It is the same device
model as the NVIDIA board (kernel_model/hw/nvgpu.py): device memory managed
in 64 KiB pages, and an aperture of 64 KiB windows the driver points at
them.  On AMD the aperture is BAR0 and, with resizable BAR ("large BAR",
which GPUDirect-style peer access needs), it is as large as VRAM, so every
page is reachable.

# EMU: on a real large-BAR board the whole of VRAM is always mapped and a
# device writing to VRAM that was freed corrupts whatever the allocator gave
# it to next.  The driver model maps a buffer's windows while the buffer is
# allocated and unmaps them when it is freed, so such a write is reported
# (the board's fault check) instead of going silently astray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.hw.nvgpu import GpuConfig, NvGpu

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

MiB = 1 << 20
PCI_VENDOR_ID_ATI = 0x1002

#: an MI210 with a 256 MiB VRAM slice modelled; BAR0 covers all of it
AMD_MI210 = GpuConfig(vendor=PCI_VENDOR_ID_ATI, device=0x740F, name="AMD Instinct MI210",
                      mem_size=256 * MiB, bar1_size=256 * MiB)


class AmdGpu(NvGpu):
    """One AMD GPU: the shared GPU device model with VRAM behind BAR0."""

    APERTURE_BAR = 0

    def __init__(self, machine: Machine, config: GpuConfig | None = None):
        super().__init__(machine, config or AMD_MI210)

    def __repr__(self) -> str:
        return (f"GPU {self.pdev.name} {self.config.name} {self.config.mem_size >> 20} MiB "
                f"VRAM, {self.windows_mapped()} BAR0 windows mapped")

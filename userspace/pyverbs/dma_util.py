"""pyverbs.dma_util: the barriers and MMIO stores of util/udma_barrier.h and mmio.h.

The emulated CPU and HCA see every store in program order (the scheduler switches
tasks only between whole operations), so the barriers order nothing more; the MMIO
writes are stores of the process into its mapped device page, big-endian as the
device expects.
"""

from __future__ import annotations

from userspace.pyverbs.host import current_process


def udma_to_dev_barrier() -> None:
    """Stores before it reach the device before stores after it (a no-op here)."""


def udma_from_dev_barrier() -> None:
    """Loads after it see what the device wrote before it (a no-op here)."""


def mmio_write32_as_be(addr: int, val: int) -> None:
    current_process().store(addr, val.to_bytes(4, "big"))


def mmio_write64_as_be(addr: int, val: int) -> None:
    current_process().store(addr, val.to_bytes(8, "big"))

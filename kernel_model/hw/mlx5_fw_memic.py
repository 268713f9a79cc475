"""The ConnectX firmware's on-chip memory (MEMIC) commands (device model, not kernel code).

MEMIC is device memory the host reaches through BAR0: the last memic_bar_size
bytes of the BAR, from memic_bar_start_addr (device_mem_cap, QUERY_HCA_CAP op_mod
MLX5_CAP_DEV_MEM).  ALLOC_MEMIC hands out a piece of it: the driver names a window
[range_start_addr, + range_size) it is ready to take it from, the size
(memic_size, a multiple of 1 << log_min_memic_alloc_size bytes) and the address
alignment (64 << log_memic_addr_alignment bytes); the answer is the lowest free,
aligned address in the window (BAR-relative).  DEALLOC_MEMIC names an allocation
by that address and its size.

Errors: BAD_PARAM for a zero or unaligned size, an alignment beyond
log_max_memic_addr_alignment, a window outside the MEMIC part of the BAR or
smaller than the size, and for a DEALLOC_MEMIC of something never allocated
(or with another size); NO_RES when no free aligned place is left in the window
(mlx5_core turns that into EAGAIN, and mlx5_ib tries the next page); RES_BUSY
for a DEALLOC_MEMIC while an mkey (access mode MEMIC) still maps the piece.

The bytes themselves live in Firmware.memic_data; the BAR decode
(kernel_model/hw/mlx5.py) stores and loads them for the CPU, the engine
(mlx5_engine.py) for DMA through a MEMIC mkey.  Allocations are firmware objects
(kind MEMIC): one still allocated when the function is torn down, or at the
machine's leak check, is reported like any other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.hw.mlx5_fw_cmd import FwError, FwObject, fw_command
from kernel_model.hw.mlx5_ifc import (
    MLX5_CAP_DEV_MEM,
    MLX5_CMD_OP_ALLOC_MEMIC,
    MLX5_CMD_OP_DEALLOC_MEMIC,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_NO_RES_ERR,
    MLX5_GET,
    MLX5_SET64,
    IfcStruct,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware

MEMIC_BASE_ALIGN = 6  # the PRM's alignment unit: 64 << log_memic_addr_alignment


class Mlx5Memic(FwObject):
    """One ALLOC_MEMIC allocation: num is its BAR-relative start address."""

    kind = "MEMIC"

    def __init__(self, num: int, size: int):
        super().__init__(num, 0)
        self.size = size

    def __repr__(self) -> str:
        return super().__repr__() + f" size={self.size:#x}"


def memic_window(fw: Firmware) -> tuple[int, int]:
    """The MEMIC part of BAR0: (start offset, size); (0, 0) without MEMIC."""
    if not fw.cap("memic", MLX5_CAP_DEV_MEM):
        return 0, 0
    return fw.cap("memic_bar_start_addr", MLX5_CAP_DEV_MEM), fw.cap("memic_bar_size",
                                                                   MLX5_CAP_DEV_MEM)


def memic_covers(fw: Firmware, addr: int, length: int) -> Mlx5Memic | None:
    """The allocation holding [addr, addr + length) (BAR-relative), if one does: the
    one `addr` lies in, so that an empty range at the first byte of one allocation is
    that allocation's, not the one before it, which ends there (found by peermem fuzz:
    a zero-length DM MR over a second DM took a reference on the first)."""
    for m in fw.memics.values():
        if m.num <= addr < m.num + m.size and addr + length <= m.num + m.size:
            return m
    return None


@fw_command(MLX5_CMD_OP_ALLOC_MEMIC, "alloc_memic")
def alloc_memic(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    start, size = memic_window(fw)
    length = MLX5_GET("alloc_memic_in", in_, "memic_size")
    log_align = MLX5_GET("alloc_memic_in", in_, "log_memic_addr_alignment")
    lo = MLX5_GET("alloc_memic_in", in_, "range_start_addr")
    hi = lo + MLX5_GET("alloc_memic_in", in_, "range_size")
    unit = 1 << fw.cap("log_min_memic_alloc_size", MLX5_CAP_DEV_MEM)
    if not size:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "alloc_memic_no_memic")
    if not length or length % unit:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "alloc_memic_size")
    if log_align > fw.cap("log_max_memic_addr_alignment", MLX5_CAP_DEV_MEM):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "alloc_memic_alignment")
    if lo < start or hi > start + size or hi - lo < length:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "alloc_memic_range")
    align = 1 << (MEMIC_BASE_ALIGN + log_align)
    addr = -(-lo // align) * align
    taken = sorted((m.num, m.num + m.size) for m in fw.memics.values())
    while addr + length <= hi:
        clash = next((e for s, e in taken if s < addr + length and addr < e), None)
        if clash is None:
            fw.memics[addr] = Mlx5Memic(addr, length)
            MLX5_SET64("alloc_memic_out", out, "memic_start_addr", addr)
            return
        addr = -(-clash // align) * align
    raise FwError(MLX5_CMD_STAT_NO_RES_ERR, "alloc_memic_range_full")


@fw_command(MLX5_CMD_OP_DEALLOC_MEMIC, "dealloc_memic")
def dealloc_memic(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    addr = MLX5_GET("dealloc_memic_in", in_, "memic_start_addr")
    memic = fw.memics.get(addr)
    if memic is None or memic.size != MLX5_GET("dealloc_memic_in", in_, "memic_size"):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "dealloc_memic_not_allocated")
    fw.release(memic, "memic")
    del fw.memics[addr]

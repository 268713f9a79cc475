"""Mirrors the clock parts of rdma-core providers/mlx5 (mlx5.c, mlx5dv.h): the HCA's
free-running clock and the kernel's clock-info page.

At context creation (mlx5_set_context):

  * CORE_CLOCK_OFFSET in the alloc_ucontext response: mlx5_map_internal_clock()
    maps the init-segment page with internal_timer_h/l (MLX5_IB_MMAP_CORE_CLOCK,
    PROT_READ, MAP_SHARED) - a failure only warns; hca_core_clock is then unset;
  * clock_info_versions has V1: mlx5_map_clock_info() maps the clock-info page
    (MLX5_IB_MMAP_CLOCK_INFO, index V1); a failure leaves clock_info_page unset.

Then:

  * mlx5_query_rt_values() (ibv_query_rt_values_ex): the raw clock, read
    high/low/high until the high word holds still (at most twice); EOPNOTSUPP
    without the mapped clock, EINVAL for a comp_mask beyond RAW_CLOCK;
  * _mlx5dv_get_clock_info(): a consistent copy of the page (the sign's
    KERNEL_UPDATING bit and sequence); EINVAL without the page, EBUSY when the
    kernel stays in an update for ten tries;
  * mlx5dv_ts_to_ns(): a device timestamp to nanoseconds with such a copy.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CLOCK_INFO_KERNEL_UPDATING,
    MLX5_IB_CLOCK_INFO_V1,
    MLX5_IB_MMAP_CLOCK_INFO,
    MLX5_IB_MMAP_CORE_CLOCK,
    mlx5_ib_clock_info,
)
from userspace.libc import MAP_SHARED, PROT_READ
from userspace.libibverbs.verbs_types import IBV_VALUES_MASK_RAW_CLOCK, ibv_values_ex
from userspace.providers.mlx5.uar import set_command, set_index

U64_MAX = 0xFFFFFFFFFFFFFFFF


@attrs.define
class mlx5dv_clock_info:
    """Mirrors struct mlx5dv_clock_info."""

    nsec: int = 0
    last_cycles: int = 0
    frac: int = 0
    mult: int = 0
    shift: int = 0
    mask: int = 0


@traced
def mlx5_map_internal_clock(ctx: Any) -> int:
    """Mirrors mlx5_map_internal_clock(): 0, or -1 when the mmap fails.

    # EMU: libmlx5's warning then ("Timestamp available, but failed to mmap() hca
    # core clock page", mlx5_err to the debug file) is not printed."""
    offset = set_command(MLX5_IB_MMAP_CORE_CLOCK)
    addr = ctx.proc.mmap(0, ctx.page_size, PROT_READ, MAP_SHARED, ctx.cmd_fd,
                         ctx.page_size * offset)
    if addr < 0:
        return -1
    ctx.hca_core_clock = addr + (ctx.core_clock_offset & (ctx.page_size - 1))
    return 0


@traced
def mlx5_map_clock_info(ctx: Any) -> None:
    """Mirrors mlx5_map_clock_info(): the page, or nothing."""
    offset = set_index(MLX5_IB_CLOCK_INFO_V1, set_command(MLX5_IB_MMAP_CLOCK_INFO))
    addr = ctx.proc.mmap(0, ctx.page_size, PROT_READ, MAP_SHARED, ctx.cmd_fd,
                         offset * ctx.page_size)
    if addr >= 0:
        ctx.clock_info_page = addr


def mlx5_unmap_clocks(ctx: Any) -> None:
    """The clock part of mlx5_free_context(): unmap both pages."""
    if ctx.hca_core_clock:
        ctx.proc.munmap(ctx.hca_core_clock - (ctx.core_clock_offset & (ctx.page_size - 1)),
                        ctx.page_size)
        ctx.hca_core_clock = 0
    if ctx.clock_info_page:
        ctx.proc.munmap(ctx.clock_info_page, ctx.page_size)
        ctx.clock_info_page = 0


def _mmio_read32_be(ctx: Any, addr: int) -> int:
    return struct.unpack(">I", ctx.proc.load(addr, 4))[0]


@traced
def mlx5_read_clock(ctx: Any) -> tuple[int, int]:
    """Mirrors mlx5_read_clock(): (0, cycles), or (EOPNOTSUPP, 0) without the mapped
    core clock.  The high word is read before and after the low one; when it moved,
    the low word wrapped in between and the pair is read again (twice at most)."""
    if not ctx.hca_core_clock:
        return errno.EOPNOTSUPP, 0
    clockhi = clocklo = 0
    for _ in range(2):
        clockhi = _mmio_read32_be(ctx, ctx.hca_core_clock)
        clocklo = _mmio_read32_be(ctx, ctx.hca_core_clock + 4)
        clockhi1 = _mmio_read32_be(ctx, ctx.hca_core_clock)
        if clockhi == clockhi1:
            break
    return 0, clockhi << 32 | clocklo


@traced
def mlx5_query_rt_values(ctx: Any, values: ibv_values_ex) -> int:
    """Mirrors mlx5_query_rt_values(): 0 or an errno; values.comp_mask becomes what
    was read (the raw clock as tv_sec 0, tv_nsec = cycles)."""
    if values.comp_mask & ~IBV_VALUES_MASK_RAW_CLOCK:
        return errno.EINVAL
    comp_mask = err = 0
    if values.comp_mask & IBV_VALUES_MASK_RAW_CLOCK:
        err, cycles = mlx5_read_clock(ctx)
        if not err:
            values.raw_clock = (0, cycles)
            comp_mask |= IBV_VALUES_MASK_RAW_CLOCK
    values.comp_mask = comp_mask
    return err


@traced
def _mlx5dv_get_clock_info(ctx: Any, clock_info: mlx5dv_clock_info) -> int:
    """Mirrors _mlx5dv_get_clock_info() (of an mlx5 context; dv.py's
    mlx5dv_get_clock_info checks that): 0, EINVAL without the clock-info page, or
    EBUSY when ten reads in a row find the kernel updating it.  A copy whose sign
    changed while it was read is taken again."""
    ci = ctx.clock_info_page
    if not ci:
        return errno.EINVAL
    proc = ctx.proc
    while True:
        for _ in range(10):
            tmp_sig = struct.unpack("<I", proc.load(ci, 4))[0]
            if not tmp_sig & MLX5_IB_CLOCK_INFO_KERNEL_UPDATING:
                break
        else:
            return errno.EBUSY
        page = mlx5_ib_clock_info.unpack(proc.load(ci, mlx5_ib_clock_info.SIZE))
        clock_info.nsec, clock_info.last_cycles = page.nsec, page.cycles
        clock_info.frac, clock_info.mult = page.frac, page.mult
        clock_info.shift, clock_info.mask = page.shift, page.mask
        if tmp_sig == struct.unpack("<I", proc.load(ci, 4))[0]:
            return 0


def mlx5dv_ts_to_ns(clock_info: mlx5dv_clock_info, device_timestamp: int) -> int:
    """Mirrors mlx5dv_ts_to_ns() (mlx5dv.h): the timestamp's distance from
    last_cycles (within half the mask: later, else earlier) scaled by mult >> shift
    around nsec."""
    mask = clock_info.mask
    delta = (device_timestamp - clock_info.last_cycles) & mask
    nsec = clock_info.nsec
    if delta > mask // 2:
        delta = (clock_info.last_cycles - device_timestamp) & mask
        nsec -= ((delta * clock_info.mult - clock_info.frac) & U64_MAX) >> clock_info.shift
    else:
        nsec += ((delta * clock_info.mult + clock_info.frac) & U64_MAX) >> clock_info.shift
    return nsec & U64_MAX

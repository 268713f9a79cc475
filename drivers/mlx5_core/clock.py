"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/lib/clock.c: the free-running
device clock as a timecounter, and the clock-info page user space maps.

mlx5_init_clock():

  * mlx5_timecounter_init(): a cyclecounter over internal_timer_h:l (the init
    segment, read with the high/low/high wrap check) masked to 41 bits, with
    shift = mlx5_ptp_shift_constant(device_frequency_khz) and
    mult = clocksource_khz2mult(freq, shift); the timecounter starts at the
    current real time (ktime_get_real);
  * mlx5_init_clock_info(): one zeroed kernel page, struct mlx5_ib_clock_info
    (nsec, cycles, frac, mult, shift, mask, overflow_period);
  * mlx5_init_overflow_period(): the period (in jiffies) after which the
    overflow work re-reads the timecounter so it never misses a wrap; the work
    (mlx5_timestamp_overflow) then rewrites the page under the
    KERNEL_UPDATING bit of its sign.

libmlx5 (mlx5dv_get_clock_info, mlx5dv_ts_to_ns) converts a CQE's device
timestamp with the page's values: nsec + ((ts - cycles) & mask) * mult + frac
>> shift.

# EMU: the model has no PTP clock and no delayed work: mlx5_ib's "clock" probe
# stage calls mlx5_init_clock / mlx5_cleanup_clock (mlx5_load does on Linux),
# and the scheduler's clock-jump hook queues the overflow work on system_wq
# once overflow_period jiffies have passed (virtual time moves only in jumps).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from drivers.mlx5_core.driver import MLX5_CAP_GEN, mlx5_core_dev, mlx5_core_warn
from drivers.mlx5_core.ifc import MLX5_ISEG_INTERNAL_TIMER_H, MLX5_ISEG_INTERNAL_TIMER_L
from kernel_model.current import current, current_or_none
from kernel_model.errno import KernelError
from kernel_model.page_alloc import __GFP_ZERO, GFP_KERNEL, __free_pages, alloc_pages, page
from kernel_model.pci import ioread32be
from kernel_model.sched import HZ, SCHED
from kernel_model.timekeeping import NSEC_PER_MSEC, NSEC_PER_SEC, ktime_get_real_ns
from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import MLX5_IB_CLOCK_INFO_KERNEL_UPDATING, mlx5_ib_clock_info
from kernel_model.workqueue import INIT_WORK, cancel_work_sync, queue_work, system_wq, work_struct

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


def CLOCKSOURCE_MASK(bits: int) -> int:
    """Mirrors CLOCKSOURCE_MASK()."""
    return (1 << bits) - 1


def ilog2(n: int) -> int:
    """Mirrors ilog2() for n > 0."""
    return n.bit_length() - 1


def clocksource_khz2mult(khz: int, shift_constant: int) -> int:
    """Mirrors clocksource_khz2mult(): the mult that turns khz-clock cycles into
    nanoseconds with `shift_constant`, rounded."""
    return ((1000000 << shift_constant) + khz // 2) // khz & U32_MAX


class cyclecounter:
    """Mirrors struct cyclecounter."""

    def __init__(self, read: Callable[[cyclecounter], int], mask: int, mult: int,
                 shift: int) -> None:
        self.read, self.mask, self.mult, self.shift = read, mask, mult, shift


class timecounter:
    """Mirrors struct timecounter."""

    def __init__(self) -> None:
        self.cc: cyclecounter | None = None
        self.cycle_last = 0
        self.nsec = 0
        self.mask = 0
        self.frac = 0


def cyclecounter_cyc2ns(cc: cyclecounter, cycles: int, mask: int,
                        frac: list[int]) -> int:
    """Mirrors cyclecounter_cyc2ns(): (cycles * mult + *frac) >> shift, keeping the
    fractional part in frac[0] (a one-element list stands for the pointer)."""
    ns = (cycles * cc.mult + frac[0]) & U64_MAX
    frac[0] = ns & mask
    return ns >> cc.shift


def timecounter_init(tc: timecounter, cc: cyclecounter, start_tstamp: int) -> None:
    """Mirrors timecounter_init()."""
    tc.cc = cc
    tc.cycle_last = cc.read(cc)
    tc.nsec = start_tstamp
    tc.mask = (1 << cc.shift) - 1
    tc.frac = 0


def timecounter_read(tc: timecounter) -> int:
    """Mirrors timecounter_read(): advance nsec by the cycles since the last read."""
    cc = tc.cc
    assert cc is not None
    now = cc.read(cc)
    delta = (now - tc.cycle_last) & cc.mask
    frac = [tc.frac]
    tc.nsec = (tc.nsec + cyclecounter_cyc2ns(cc, delta, tc.mask, frac)) & U64_MAX
    tc.frac = frac[0]
    tc.cycle_last = now
    return tc.nsec


class mlx5_timer:
    """Mirrors struct mlx5_timer."""

    def __init__(self) -> None:
        self.cycles: cyclecounter | None = None
        self.tc = timecounter()
        self.nominal_c_mult = 0
        self.overflow_period = 0      # jiffies
        self.next_overflow = 0        # EMU: when the "delayed work" is due (jiffies)


class mlx5_clock:
    """Mirrors struct mlx5_clock (the free-running timer part)."""

    def __init__(self, mdev: mlx5_core_dev) -> None:
        self.mdev = mdev
        self.timer = mlx5_timer()
        self.overflow_work: work_struct | None = None
        self.hook: Callable[[int], None] | None = None  # EMU: the overflow work's timer


def mlx5_read_time(mdev: mlx5_core_dev) -> int:
    """Mirrors mlx5_read_time(): internal_timer_h, _l, then _h again; a changed high
    word means the low one wrapped in between: read the low word again."""
    timer_h = ioread32be(mdev.iseg + MLX5_ISEG_INTERNAL_TIMER_H)
    timer_l = ioread32be(mdev.iseg + MLX5_ISEG_INTERNAL_TIMER_L)
    timer_h1 = ioread32be(mdev.iseg + MLX5_ISEG_INTERNAL_TIMER_H)
    if timer_h != timer_h1:
        timer_l = ioread32be(mdev.iseg + MLX5_ISEG_INTERNAL_TIMER_L)
    return timer_h1 << 32 | timer_l


def mlx5_ptp_shift_constant(dev_freq_khz: int) -> int:
    """Mirrors mlx5_ptp_shift_constant(): the largest shift that keeps a 1 ppb
    correction expressible and mult within 32 bits."""
    return min(ilog2(dev_freq_khz) + 16,
               ilog2(((U32_MAX // NSEC_PER_MSEC) * dev_freq_khz) & U32_MAX))


@traced
def mlx5_timecounter_init(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_timecounter_init()."""
    clock: mlx5_clock = mdev.clock
    timer = clock.timer
    dev_freq = MLX5_CAP_GEN(mdev, "device_frequency_khz")
    shift = mlx5_ptp_shift_constant(dev_freq)
    mask = CLOCKSOURCE_MASK(41)
    timer.cycles = cyclecounter(lambda cc: mlx5_read_time(mdev) & cc.mask, mask,
                                clocksource_khz2mult(dev_freq, shift), shift)
    timer.nominal_c_mult = timer.cycles.mult
    timecounter_init(timer.tc, timer.cycles, ktime_get_real_ns())


def _store_clock_info(pg: page, info: mlx5_ib_clock_info) -> None:
    zone = pg.zone
    base = pg.pfn << zone.page_shift
    zone.ram[base:base + mlx5_ib_clock_info.SIZE] = info.pack()


def clock_info_read(pg: page) -> mlx5_ib_clock_info:
    """The clock-info page's struct mlx5_ib_clock_info, as a reader of the page sees it."""
    zone = pg.zone
    base = pg.pfn << zone.page_shift
    return mlx5_ib_clock_info.unpack(bytes(zone.ram[base:base + mlx5_ib_clock_info.SIZE]))


@traced
def mlx5_init_clock_info(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_init_clock_info(): the zeroed page user space maps, filled from the
    timecounter (a failed allocation leaves mdev.clock_info None: no page to map)."""
    try:
        mdev.clock_info = alloc_pages(GFP_KERNEL | __GFP_ZERO, 0, owner="mlx5 clock_info")
    except KernelError:
        mlx5_core_warn(mdev, "Failed to allocate IB clock info page")
        mdev.clock_info = None
        return
    timer = mdev.clock.timer
    _store_clock_info(mdev.clock_info, mlx5_ib_clock_info(
        nsec=timer.tc.nsec, cycles=timer.tc.cycle_last, mask=timer.cycles.mask,
        mult=timer.nominal_c_mult, shift=timer.cycles.shift, frac=timer.tc.frac,
        overflow_period=timer.overflow_period))


def mlx5_update_clock_info_page(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_update_clock_info_page(): set KERNEL_UPDATING in sign, rewrite
    cycles, mult, nsec and frac, then clear it by adding 2 * KERNEL_UPDATING (the
    sequence number readers compare)."""
    pg = mdev.clock_info
    if pg is None:
        return
    timer = mdev.clock.timer
    info = clock_info_read(pg)
    sign = info.sign
    info.sign = sign | MLX5_IB_CLOCK_INFO_KERNEL_UPDATING
    _store_clock_info(pg, info)
    info.cycles, info.mult = timer.tc.cycle_last, timer.cycles.mult
    info.nsec, info.frac = timer.tc.nsec, timer.tc.frac
    info.sign = (sign + MLX5_IB_CLOCK_INFO_KERNEL_UPDATING * 2) & U32_MAX
    _store_clock_info(pg, info)


@traced
def mlx5_timestamp_overflow(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_timestamp_overflow(): read the timecounter (so no wrap of the 41
    bits goes unseen), refresh the clock-info page, and come back overflow_period
    jiffies later."""
    timer = mdev.clock.timer
    timecounter_read(timer.tc)
    mlx5_update_clock_info_page(mdev)
    timer.next_overflow = SCHED.jiffies + timer.overflow_period


@traced
def mlx5_init_overflow_period(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_init_overflow_period(): the overflow watchdog's period - a third
    of a wrap at most, and no more cycles than mult can scale within 63 bits - in
    jiffies, also published in the clock-info page; then start the work.

    # EMU: no delayed work: a scheduler clock hook queues the work item on the
    # machine's system_wq once overflow_period jiffies have passed, and the first
    # run (delay 0) happens inline here."""
    clock = mdev.clock
    timer = clock.timer
    cycles = timer.cycles
    overflow_cycles = min((U64_MAX >> 1) // cycles.mult, cycles.mask // 3)
    ns = cyclecounter_cyc2ns(cycles, overflow_cycles, 0, [0])
    timer.overflow_period = ns // (NSEC_PER_SEC // HZ)
    if timer.overflow_period:
        machine = weakref.ref(current().machine)
        clock.overflow_work = INIT_WORK(lambda _work: mlx5_timestamp_overflow(mdev))

        def hook(_delta: int) -> None:
            m = machine()
            if m is None or SCHED.jiffies < timer.next_overflow:
                return
            # a machine with no live task (torn down without a shutdown) runs nothing
            cur = current_or_none()
            if (cur is not None and cur.machine is m) or \
                    any(t.machine is m for t in SCHED.alive.values()):
                queue_work(system_wq(m), clock.overflow_work)

        clock.hook = hook
        SCHED.on_clock.append(hook)
        mlx5_timestamp_overflow(mdev)
    else:
        mlx5_core_warn(mdev, "invalid overflow period, overflow_work is not scheduled")
    if mdev.clock_info is not None:
        info = clock_info_read(mdev.clock_info)
        info.overflow_period = timer.overflow_period
        _store_clock_info(mdev.clock_info, info)


@traced
def mlx5_init_clock(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_init_clock() / mlx5_init_timer_clock() for a free-running clock:
    nothing without device_frequency_khz (a warning; no clock-info page)."""
    mdev.clock = mlx5_clock(mdev)
    mdev.clock_info = None
    if not MLX5_CAP_GEN(mdev, "device_frequency_khz"):
        mlx5_core_warn(mdev, "invalid device_frequency_khz, aborting HW clock init")
        return
    mlx5_timecounter_init(mdev)
    mlx5_init_clock_info(mdev)
    mlx5_init_overflow_period(mdev)


@traced
def mlx5_cleanup_clock(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_cleanup_clock(): stop the overflow work, free the clock-info page."""
    clock: Any = getattr(mdev, "clock", None)
    if clock is None:
        return
    if clock.hook is not None:
        SCHED.on_clock.remove(clock.hook)
        clock.hook = None
        cancel_work_sync(clock.overflow_work)
    if mdev.clock_info is not None:
        __free_pages(mdev.clock_info, 0)
        mdev.clock_info = None


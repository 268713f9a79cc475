"""Tests for drivers/mlx5_core/clock.py: the timecounter over the device's free-running
timer, the clock-info page, its overflow work, and cleanup.

Numbers for device_frequency_khz 156250: shift = min(ilog2(156250) + 16,
ilog2(4294 * 156250)) = min(33, 29) = 29; mult = round(10^6 * 2^29 / 156250) =
3435973837; the overflow period: min((2^63 - 1) // mult, (2^41 - 1) // 3) cycles =
2684354560 cycles, 17179869183 ns, 17179 jiffies.
"""

from __future__ import annotations

import pytest

from drivers.mlx5_core.clock import (
    clock_info_read,
    clocksource_khz2mult,
    mlx5_cleanup_clock,
    mlx5_init_clock,
    mlx5_ptp_shift_constant,
    mlx5_read_time,
)
from kernel_model.hw.mlx5_ifc import MLX5_CAP_GENERAL, MLX5_SET
from kernel_model.locking import schedule_timeout
from kernel_model.timekeeping import BOOT_REALTIME_NS
from kernel_model.uapi.mlx5_abi import MLX5_IB_CLOCK_INFO_KERNEL_UPDATING
from kernel_model.workqueue import flush_workqueue, system_wq
from tests.drivers.mlx5_ib.ladder import host, ib_dev

FREQ = 156250
MULT = 3435973837


@pytest.fixture
def m():
    machine = host()
    yield machine
    machine.shutdown()


def advance(m, n: int) -> None:
    """Sleep n jiffies in a task: nothing else runs, so the scheduler jumps the virtual
    clock (its hooks queue the overflow work when due), then let the work run."""
    p = m.spawn("sleeper")
    with p.kernel():
        schedule_timeout(n)
        flush_workqueue(system_wq(m))
    p.exit(0)


def test_shift_and_mult_for_the_cx_frequency():
    assert mlx5_ptp_shift_constant(FREQ) == 29
    assert clocksource_khz2mult(FREQ, 29) == MULT
    assert mlx5_ptp_shift_constant(1 << 20) == 27        # 4294 * 2^20 wraps in u32, as in C


def test_probe_fills_the_clock_info_page(m):
    mdev = ib_dev(m).mdev
    info = clock_info_read(mdev.clock_info)
    assert ib_dev(m).clock_info == mdev.clock_info
    assert (info.mult, info.shift, info.mask) == (MULT, 29, (1 << 41) - 1)
    assert info.overflow_period == mdev.clock.timer.overflow_period == 17179
    assert info.sign == 2 * MLX5_IB_CLOCK_INFO_KERNEL_UPDATING   # one update, finished
    # the timecounter started at the real time of the probe, the timer's value then
    assert info.nsec == BOOT_REALTIME_NS + info.cycles // FREQ * 1_000_000
    assert info.cycles == mdev.clock.timer.tc.cycle_last


def test_read_time_is_the_device_timer(m):
    mdev = ib_dev(m).mdev
    with m.spawn("t").kernel():
        assert mlx5_read_time(mdev) == m.hcas[0].internal_timer() == m.sched.jiffies * FREQ


def test_read_time_rereads_the_low_word_when_the_high_one_moved(m, monkeypatch):
    mdev = ib_dev(m).mdev
    hca = type(m.hcas[0])
    values = iter([0x1_FFFF_FFFF, 0x1_FFFF_FFFF, 0x2_0000_0003, 0x2_0000_0004])
    monkeypatch.setattr(hca, "internal_timer", lambda self: next(values))
    # high 1, low 0xffffffff, high 2: the low word is read again (4)
    with m.spawn("t").kernel():
        assert mlx5_read_time(mdev) == 0x2_0000_0004


def test_the_overflow_work_refreshes_the_page(m):
    mdev = ib_dev(m).mdev
    timer = mdev.clock.timer
    before = clock_info_read(mdev.clock_info)
    advance(m, timer.overflow_period - 1)               # not due yet
    assert clock_info_read(mdev.clock_info) == before
    advance(m, 1)
    after = clock_info_read(mdev.clock_info)
    assert after.sign == before.sign + 2 * MLX5_IB_CLOCK_INFO_KERNEL_UPDATING
    assert after.cycles == (m.sched.jiffies * FREQ) & ((1 << 41) - 1)
    elapsed = (after.cycles - before.cycles) * MULT + before.frac
    assert after.nsec == before.nsec + (elapsed >> 29) and after.frac == elapsed & (2**29 - 1)
    # 1 ms per jiffy: the nanoseconds follow the virtual clock (to the ns rounding)
    assert abs(after.nsec - before.nsec - timer.overflow_period * 1_000_000) <= 1


def test_cleanup_stops_the_work_and_frees_the_page(m):
    mdev = ib_dev(m).mdev
    hooks = len(m.sched.on_clock)
    with m.spawn("probe").kernel():
        mlx5_cleanup_clock(mdev)
        assert mdev.clock_info is None and len(m.sched.on_clock) == hooks - 1
        mlx5_cleanup_clock(mdev)                          # twice: nothing left to do
        mlx5_init_clock(mdev)                             # back, for the remove path
    ib_dev(m).clock_info = mdev.clock_info
    assert len(m.sched.on_clock) == hooks


def test_no_device_frequency_no_clock_info(m):
    mdev = ib_dev(m).mdev
    general = mdev.caps[MLX5_CAP_GENERAL].cur
    with m.spawn("probe").kernel():
        mlx5_cleanup_clock(mdev)
        MLX5_SET("cmd_hca_cap", general, "device_frequency_khz", 0)
        mlx5_init_clock(mdev)
        assert mdev.clock_info is None and mdev.clock.hook is None
        assert "invalid device_frequency_khz" in mdev.log[-1]
        MLX5_SET("cmd_hca_cap", general, "device_frequency_khz", FREQ)
        mlx5_init_clock(mdev)
    ib_dev(m).clock_info = mdev.clock_info

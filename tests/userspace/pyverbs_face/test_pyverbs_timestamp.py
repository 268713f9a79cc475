"""The HCA clock through the pyverbs face: Context.query_rt_values_ex (libmlx5 reading
the mapped internal timer), Mlx5Context.device_timestamp_to_ns (the clock-info page
and mlx5dv_ts_to_ns), CQE timestamps the HCA writes (free-running, and converted for a
wall-clock CQ), and each errno on the way."""

from __future__ import annotations

import errno
import struct

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
import userspace.pyverbs.providers.mlx5.mlx5_enums as dve
from drivers.mlx5_core.clock import clock_info_read
from kernel_model.auxiliary import auxiliary_bus
from kernel_model.locking import schedule_timeout
from kernel_model.timekeeping import BOOT_REALTIME_NS
from kernel_model.uapi.mlx5_abi import MLX5_IB_CLOCK_INFO_KERNEL_UPDATING, mlx5_ib_clock_info
from kernel_model.workqueue import flush_workqueue, system_wq
from tests.userspace.pyverbs_face.test_pyverbs_cqex import rc_pair, send_imm, start
from userspace.libibverbs.verbs_types import ibv_values_ex
from userspace.providers.mlx5 import clock as mclock
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQEX, CqInitAttrEx, PollCqAttr
from userspace.pyverbs.pd import PD
from userspace.pyverbs.providers.mlx5.mlx5dv import Mlx5Context, Mlx5DVContextAttr
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError

FREQ = 156250          # device_frequency_khz: cycles per virtual millisecond (jiffy)


def machine():
    return host.host().machine


def ib_dev():
    return auxiliary_bus(machine()).devices[0].drvdata


def sleep(ms: int) -> None:
    """Another task sleeps: the scheduler jumps the virtual clock (and runs what
    became due, as the clock's overflow work)."""
    m = machine()
    p = m.spawn("sleeper")
    with p.kernel():
        schedule_timeout(ms)
        flush_workqueue(system_wq(m))
    p.exit(0)


def test_query_rt_values_reads_the_device_clock():
    with d.Context(name="mlx5_0") as ctx:
        assert ctx.query_rt_values_ex() == (0, machine().sched.jiffies * FREQ)
        before = ctx.query_rt_values_ex()[1]
        sleep(7)
        assert ctx.query_rt_values_ex()[1] - before == 7 * FREQ
        assert ctx.query_rt_values_ex(0) == (0, 0)          # nothing asked, nothing read
        with pytest.raises(PyverbsRDMAError, match="Failed to query real time values") as ei:
            ctx.query_rt_values_ex(e.IBV_VALUES_MASK_RESERVED)
        assert ei.value.error_code == errno.EINVAL


def test_read_clock_without_the_core_clock_page():
    with d.Context(name="mlx5_0") as ctx:
        mctx = ctx.ctx
        assert mctx.hca_core_clock and mctx.clock_info_page
        mapped, mctx.hca_core_clock = mctx.hca_core_clock, 0   # as if its mmap had failed
        try:
            values = ibv_values_ex(comp_mask=e.IBV_VALUES_MASK_RAW_CLOCK)
            assert mclock.mlx5_query_rt_values(mctx, values) == errno.EOPNOTSUPP
            assert values.comp_mask == 0
        finally:
            mctx.hca_core_clock = mapped


def test_read_clock_takes_the_pair_again_when_the_high_word_moved(monkeypatch):
    with d.Context(name="mlx5_0") as ctx:
        words = iter([1, 0xFFFFFFFF, 2, 2, 5, 2])
        monkeypatch.setattr(mclock, "_mmio_read32_be", lambda _ctx, _addr: next(words))
        assert mclock.mlx5_read_clock(ctx.ctx) == (0, 2 << 32 | 5)


def test_device_timestamp_to_ns_uses_the_clock_info_page():
    with d.Context(name="mlx5_0") as ctx:
        info = clock_info_read(ib_dev().clock_info)
        cycles = ctx.query_rt_values_ex()[1]
        now = Mlx5Context.device_timestamp_to_ns(ctx, cycles)
        assert now == BOOT_REALTIME_NS + machine().sched.jiffies * 1_000_000
        assert now == info.nsec + ((cycles - info.cycles) * info.mult + info.frac >> info.shift)
        # a timestamp before the page's cycles: counted back from nsec
        assert Mlx5Context.device_timestamp_to_ns(ctx, info.cycles - 3 * FREQ) == \
            info.nsec - 3_000_000
        sleep(25)
        later = Mlx5Context.device_timestamp_to_ns(ctx, ctx.query_rt_values_ex()[1])
        assert later - now == 25_000_000


def test_the_overflow_work_keeps_the_conversion_going():
    with d.Context(name="mlx5_0") as ctx:
        mdev = ib_dev().mdev
        first = clock_info_read(mdev.clock_info)
        start_ns = Mlx5Context.device_timestamp_to_ns(ctx, ctx.query_rt_values_ex()[1])
        sleep(mdev.clock.timer.overflow_period + 5)
        page = clock_info_read(mdev.clock_info)
        assert page.sign == first.sign + 2 and page.cycles > first.cycles   # rewritten
        end_ns = Mlx5Context.device_timestamp_to_ns(ctx, ctx.query_rt_values_ex()[1])
        assert abs(end_ns - start_ns - (mdev.clock.timer.overflow_period + 5) * 10**6) <= 1


def test_clock_info_while_the_kernel_updates_it_is_ebusy():
    with d.Context(name="mlx5_0") as ctx:
        pg = ib_dev().clock_info
        at = pg.pfn << pg.zone.page_shift
        ram = pg.zone.ram
        sign = struct.unpack_from("<I", ram, at)[0]
        struct.pack_into("<I", ram, at, sign | MLX5_IB_CLOCK_INFO_KERNEL_UPDATING)
        try:
            with pytest.raises(PyverbsRDMAError, match="Failed to get the clock info") as ei:
                Mlx5Context.device_timestamp_to_ns(ctx, 0)
            assert ei.value.error_code == errno.EBUSY
        finally:
            struct.pack_into("<I", ram, at, sign)


def test_without_the_clock_info_page():
    """A kernel without the page (mlx5_core has no clock info): no clock_info_versions,
    nothing mapped - the conversion is EINVAL and a wall-clock CQ EOPNOTSUPP."""
    dev = ib_dev()
    page, dev.clock_info = dev.clock_info, None
    try:
        with d.Context(name="mlx5_0") as ctx:
            assert ctx.ctx.clock_info_page == 0 and ctx.ctx.hca_core_clock
            with pytest.raises(PyverbsRDMAError, match="Failed to get the clock info") as ei:
                Mlx5Context.device_timestamp_to_ns(ctx, 0)
            assert ei.value.error_code == errno.EINVAL
            with pytest.raises(PyverbsRDMAError) as ei:
                CQEX(ctx, CqInitAttrEx(
                    cqe=4, wc_flags=e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK))
            assert ei.value.error_code == errno.EOPNOTSUPP
    finally:
        dev.clock_info = page


def test_mlx5dv_query_device_reports_both_clocks():
    with Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0") as c:
        mask = dve.MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE | dve.MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK
        attr = c.query_mlx5_device(mask)
        assert attr.comp_mask == mask
        assert attr.max_clock_info_update_nsec == ib_dev().mdev.clock.timer.overflow_period
        assert attr.dv.hca_core_clock == c.ctx.hca_core_clock


def test_closing_the_context_unmaps_the_clock_pages():
    ctx = d.Context(name="mlx5_0")
    mctx = ctx.ctx
    proc = mctx.proc
    core, info = mctx.hca_core_clock, mctx.clock_info_page
    assert proc.load(info, mlx5_ib_clock_info.SIZE) == \
        clock_info_read(ib_dev().clock_info).pack()
    ctx.close()
    assert mctx.hca_core_clock == mctx.clock_info_page == 0
    for addr in (core, info):
        assert proc.mm.vma_lookup(addr) is None


@pytest.mark.parametrize("wallclock", [False, True])
def test_cqes_carry_the_device_time(wallclock):
    flag = e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK if wallclock else \
        e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQEX(ctx, CqInitAttrEx(cqe=16, wc_flags=e.IBV_WC_STANDARD_FLAGS | flag))
        a, b = rc_pair(ctx, pd, cq)
        stamps = []
        for i in range(2):
            sleep(3)
            expected = ctx.query_rt_values_ex()[1]
            send_imm(pd, a, b, i, wr_id=10 * i)
            assert start(cq) == 0
            for _ in range(2):
                assert cq.status == e.IBV_WC_SUCCESS
                if wallclock:
                    ns = cq.read_completion_wallclock_ns()
                    assert ns == Mlx5Context.device_timestamp_to_ns(ctx, expected)
                    stamps.append(ns)
                else:
                    ts = cq.read_timestamp()
                    assert ts == expected        # the timer when the HCA wrote the CQE
                    stamps.append(ts)
                ret = errno.ENOENT
                for _ in range(10_000):
                    ret = cq.poll_next()
                    if ret != errno.ENOENT:
                        break
                if ret:
                    break
            cq.end_poll()
        assert len(stamps) == 4 and stamps == sorted(stamps)
        step = 3_000_000 if wallclock else 3 * FREQ
        assert stamps[2] - stamps[0] == step
        assert cq.start_poll(PollCqAttr()) == errno.ENOENT

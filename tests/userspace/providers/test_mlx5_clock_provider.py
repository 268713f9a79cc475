"""userspace/providers/mlx5/clock.py on hosts the pyverbs face does not build: a 64 KiB
page host (the kernel offers no core clock there), and mmaps that fail."""

from __future__ import annotations

import errno

import attrs

from tests.drivers.mlx5_ib.ladder import host, open_ctx
from userspace.libibverbs import verbs as v
from userspace.libibverbs.verbs_types import IBV_VALUES_MASK_RAW_CLOCK, ibv_values_ex
from userspace.providers.mlx5 import clock as mclock


def test_no_core_clock_on_a_64k_page_host():
    m = host(page_size=65536)
    p = m.spawn("app")
    ctx = open_ctx(p)
    # alloc_ucontext leaves CORE_CLOCK_OFFSET out (the page would expose more of BAR0)
    assert not ctx.resp.comp_mask & 1 and ctx.hca_core_clock == 0
    assert ctx.clock_info_page                          # the clock-info page is still there
    values = ibv_values_ex(comp_mask=IBV_VALUES_MASK_RAW_CLOCK)
    assert v.ibv_query_rt_values_ex(ctx, values) == errno.EOPNOTSUPP
    assert values.comp_mask == 0
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)
    m.shutdown()


def test_failed_clock_mmaps_leave_nothing_mapped():
    m = host()
    p = m.spawn("app")
    ctx = open_ctx(p)
    bad = attrs.evolve(ctx, cmd_fd=-1, hca_core_clock=0, clock_info_page=0)
    assert mclock.mlx5_map_internal_clock(bad) == -1 and bad.hca_core_clock == 0
    mclock.mlx5_map_clock_info(bad)
    assert bad.clock_info_page == 0
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)
    m.shutdown()

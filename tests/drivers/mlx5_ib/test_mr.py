"""Tests for drivers/mlx5_ib/mr.py: reg_user_mr's mkey and MTT, each errno, dereg."""

from __future__ import annotations

import errno

import pytest

from drivers.mlx5_ib.mr import get_octo_len
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.hw.mlx5_ifc import MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_LIM_ERR
from kernel_model.trace import Tracer
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    errno_of,
    fw,
    hole,
    last_error,
    open_ctx,
    ucontext,
    user_pages,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v

LW, RW, RR, RA = (v.IBV_ACCESS_LOCAL_WRITE, v.IBV_ACCESS_REMOTE_WRITE,
                  v.IBV_ACCESS_REMOTE_READ, v.IBV_ACCESS_REMOTE_ATOMIC)


@pytest.fixture
def app(app):
    """The conftest rung plus a PD: (p, ctx, pd)."""
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx)


def mkey_of(m, key):
    return fw(m).mkeys[key >> 8]


@pytest.mark.parametrize("addr,length,shift,octo", [
    (0, 3 * 4096, 12, 2), (0x800, 4096, 12, 1), (0, 4096, 12, 1), (0, 4 * 4096, 12, 2),
    (0x1000, 1 << 21, 21, 1)])
def test_get_octo_len(addr, length, shift, octo):
    assert get_octo_len(addr, length, shift) == octo


@pytest.mark.parametrize("access,bits", [
    (LW, (0, 0, 0)), (LW | RW, (1, 0, 0)), (LW | RR, (0, 1, 0)), (LW | RA | RW, (1, 0, 1))])
def test_mkey_context_of_a_user_mr(m, app, access, bits):
    p, ctx, pd = app
    addr = user_pages(p, 4)
    mr = v.ibv_reg_mr(pd, addr, 4 * 4096, access)
    mk = mkey_of(m, mr.lkey)
    mkc = mk.mkc
    assert mr.lkey == mr.rkey == mk.mkey
    assert (mkc["rw"], mkc["rr"], mkc["a"]) == bits and (mkc["lw"], mkc["lr"]) == (1, 1)
    assert (mkc["start_addr"], mkc["len"], mkc["pd"]) == (addr, 4 * 4096, pd.pdn)
    assert mkc["access_mode_1_0"] == 1 and mkc["free"] == 0  # MTT
    ps = 1 << mkc["log_page_size"]
    assert ps >= 4096 and len(mk.pas) >= 4 * 4096 // ps
    assert mk.uid == ucontext(p, ctx).devx_uid


def test_mkey_variants_roll_and_pins_follow_the_mrs(m, app):
    p, ctx, pd = app
    addr = user_pages(p, 3)
    before = p.mm.pinned_vm
    a = v.ibv_reg_mr(pd, addr, 4096, LW)
    b = v.ibv_reg_mr(pd, addr + 4096, 2 * 4096, LW)
    assert (b.lkey & 0xFF) == ((a.lkey & 0xFF) + 1) & 0xFF
    assert p.mm.pinned_vm == before + 3
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        assert v.ibv_dereg_mr(a) == 0
    # the HCA loses the key before the pages are unpinned
    assert_call_flow(t.trace, ["mlx5_ib_dereg_mr", "mlx5_core_destroy_mkey",
                               "ib_umem_release"])
    assert cmds(m, n) == ["DESTROY_MKEY"] and a.lkey >> 8 not in fw(m).mkeys
    assert p.mm.pinned_vm == before + 2
    assert v.ibv_dereg_mr(b) == 0 and p.mm.pinned_vm == before


def test_iova_other_than_the_address_is_the_mkey_start(m, app):
    p, ctx, pd = app
    addr = user_pages(p)
    iova = 0x10_0000_0000 + (addr & 0xFFF)
    resp = c.ibv_cmd_reg_mr(ctx, pd.handle, addr, 4096, iova, LW)
    assert mkey_of(m, resp.lkey).mkc["start_addr"] == iova


def test_reg_mr_call_flow(m, app):
    p, ctx, pd = app
    addr = user_pages(p)
    with Tracer() as t:
        p.run(v.ibv_reg_mr, pd, addr, 4096, LW)
    assert_call_flow(t.trace, ["mlx5_ib_reg_user_mr", "ib_umem_get_peer", "create_real_mr",
                               "reg_create", "mlx5_ib_populate_pas", "mlx5_ib_create_mkey"])


def test_on_demand_paging_pins_nothing(m, app):
    """An ODP MR (the rest of ODP: tests/drivers/mlx5_ib/test_odp.py) takes no pin."""
    p, ctx, pd = app
    addr = user_pages(p)
    mr = p.run(v.ibv_reg_mr, pd, addr, 4096, LW | v.IBV_ACCESS_ON_DEMAND)
    assert p.mm.pinned_vm == 0 and len(fw(m).mkeys) == 1
    assert p.run(v.ibv_dereg_mr, mr) == 0 and fw(m).mkeys == {}


def test_unmapped_range_is_efault_and_pins_nothing(m, app):
    p, ctx, pd = app
    before = p.mm.pinned_vm
    assert errno_of(v.ibv_reg_mr, pd, hole(p), 4096, LW) == errno.EFAULT
    assert p.mm.pinned_vm == before and fw(m).mkeys == {}


def test_memlock_limit(m):
    p = m.spawn("app", rlimit_memlock=16 * 4096)
    ctx = open_ctx(p)
    pd = v.ibv_alloc_pd(ctx)
    base = p.mm.pinned_vm  # the context's own pins count too
    room = 16 - base
    addr = user_pages(p, room + 1)
    assert errno_of(v.ibv_reg_mr, pd, addr, (room + 1) * 4096, LW) == errno.ENOMEM
    assert p.mm.pinned_vm == base and fw(m).mkeys == {}
    mr = v.ibv_reg_mr(pd, addr, room * 4096, LW)
    assert p.mm.pinned_vm == 16
    v.ibv_dereg_mr(mr)
    p.exit(0)


def test_zero_memlock_without_cap_is_eperm(m):
    p = m.spawn("app", rlimit_memlock=0)
    ctx = open_ctx(p)
    pd = v.ibv_alloc_pd(ctx)
    assert errno_of(v.ibv_reg_mr, pd, user_pages(p), 4096, LW) == errno.EPERM
    assert fw(m).mkeys == {}
    p.exit(0)


def test_firmware_failure_unpins(m, app):
    p, ctx, pd = app
    addr = user_pages(p, 2)
    before = p.mm.pinned_vm
    fw(m).inject(MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_LIM_ERR)
    assert errno_of(v.ibv_reg_mr, pd, addr, 8192, LW) == errno.ENOMEM
    assert "CREATE_MKEY" in last_error(p)
    assert p.mm.pinned_vm == before and fw(m).mkeys == {}

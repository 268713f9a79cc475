"""Tests for memory windows in the kernel: ib_uverbs_alloc_mw / dealloc_mw
(drivers/ib_core/uverbs_cmd.py) and mlx5_ib_alloc_mw / dealloc_mw (drivers/mlx5_ib/mr.py) -
the window's mkey, each errno, and what a window holds (its PD) until it goes."""

from __future__ import annotations

import errno

import pytest

from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import mlx5_ib_alloc_mw
from tests.drivers.mlx5_ib.ladder import cmds, fw, last_error, ucontext
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError


@pytest.fixture
def app(app):
    """The conftest rung plus a PD: (p, ctx, pd)."""
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx)


def alloc_raw(ctx, pd_handle: int, mw_type: int, drv: bytes = b"") -> int:
    """ALLOC_MW with this PD handle, type and driver request; 0 or the errno."""
    try:
        c.execute_write(ctx, uv.IB_USER_VERBS_CMD_ALLOC_MW,
                        uv.ib_uverbs_alloc_mw(pd_handle=pd_handle, mw_type=mw_type),
                        uv.ib_uverbs_alloc_mw_resp, what="alloc_mw", drv_req=drv_struct(drv))
    except VerbsError as e:
        return e.errno
    return 0


class drv_struct:
    """Raw driver request bytes in the shape execute_write packs."""

    def __init__(self, raw: bytes):
        self.raw = raw

    def pack(self) -> bytes:
        return self.raw


@pytest.mark.parametrize("mw_type,rinval", [(v.IBV_MW_TYPE_1, 0), (v.IBV_MW_TYPE_2, 1)])
def test_a_window_is_a_free_klm_mkey_umr_may_bind(m, app, mw_type, rinval):
    p, ctx, pd = app
    n = len(fw(m).cmd_log)
    mw = v.ibv_alloc_mw(pd, mw_type)
    assert cmds(m, n) == ["CREATE_MKEY"]
    mk = fw(m).mkeys[mw.rkey >> 8]
    mkc = mk.mkc
    assert mk.mkey == mw.rkey and mw.type == mw_type
    assert (mkc["free"], mkc["umr_en"], mkc["access_mode_1_0"], mkc["lr"]) == (1, 1, 2, 1)
    assert (mkc["rw"], mkc["rr"], mkc["a"], mkc["lw"]) == (0, 0, 0, 0)
    assert (mkc["en_rinval"], mkc["qpn"], mkc["pd"]) == (rinval, 0xFFFFFF, pd.pdn)
    assert mkc["translations_octword_size"] == 4 and mk.uid == ucontext(p, ctx).devx_uid
    # the window holds its PD
    assert v.ibv_dealloc_pd(pd) == errno.EBUSY
    assert v.ibv_dealloc_mw(mw) == 0 and mw.rkey >> 8 not in fw(m).mkeys
    assert v.ibv_dealloc_pd(pd) == 0


def test_a_type_other_than_1_or_2_is_einval(m, app):
    p, ctx, pd = app
    with pytest.raises(VerbsError) as ei:
        v.ibv_alloc_mw(pd, 3)
    assert ei.value.errno == errno.EINVAL and "memory window type 3" in last_error(p)
    assert not fw(m).mkeys


def test_a_bad_pd_handle_is_einval(m, app):
    p, ctx, pd = app
    assert alloc_raw(ctx, 77, v.IBV_MW_TYPE_1) == errno.EINVAL
    assert "PD handle 77" in last_error(p) and not fw(m).mkeys


@pytest.mark.parametrize("drv,err,octowords", [
    (mlx5_ib_alloc_mw(comp_mask=1).pack(), errno.EOPNOTSUPP, 0),
    (mlx5_ib_alloc_mw(reserved1=1).pack(), errno.EOPNOTSUPP, 0),
    (mlx5_ib_alloc_mw().pack() + b"\x00" * 8, 0, 4),
    (mlx5_ib_alloc_mw().pack() + b"\x01" + b"\x00" * 7, errno.EOPNOTSUPP, 0),
    (mlx5_ib_alloc_mw(num_klms=9).pack(), 0, 12),            # num_klms rounded up to 4
])
def test_the_driver_request(m, app, drv, err, octowords):
    p, ctx, pd = app
    assert alloc_raw(ctx, pd.handle, v.IBV_MW_TYPE_2, drv) == err
    if err:
        assert not fw(m).mkeys
    else:
        (mk,) = fw(m).mkeys.values()
        assert mk.mkc["translations_octword_size"] == octowords


def test_closing_the_file_deallocates_windows(m):
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    pd = v.ibv_alloc_pd(ctx)
    v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_1)
    v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_2)
    assert len(fw(m).mkeys) == 2
    p.exit(0)
    assert not fw(m).mkeys and not fw(m).pds


def test_a_device_without_alloc_mw_answers_eopnotsupp(m, app):
    """ALLOC_MW needs the driver's alloc_mw (upstream: UAPI_DEF_METHOD_NEEDS_FN)."""
    from tests.drivers.mlx5_ib.ladder import ib_dev
    p, ctx, pd = app
    ops = ib_dev(m).ops
    saved, ops.alloc_mw = ops.alloc_mw, None
    try:
        assert alloc_raw(ctx, pd.handle, v.IBV_MW_TYPE_1) == errno.EOPNOTSUPP
    finally:
        ops.alloc_mw = saved
    assert not fw(m).mkeys

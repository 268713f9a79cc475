"""Tests for ib_uverbs_rereg_mr (drivers/ib_core/uverbs_cmd.py) and rdma_assign_uobject:
the command's checks and errnos, what a failed rereg leaves, and how a driver's new MR
takes over the old one's handle (the old MR deregistered, its pins released)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.trace import Tracer
from kernel_model.uapi import ib_user_verbs as uv
from tests.drivers.mlx5_ib.ladder import fw, host, last_error, user_pages
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError

LW, RW = v.IBV_ACCESS_LOCAL_WRITE, v.IBV_ACCESS_REMOTE_WRITE
TRANS, PD, ACCESS = (v.IBV_REREG_MR_CHANGE_TRANSLATION, v.IBV_REREG_MR_CHANGE_PD,
                     v.IBV_REREG_MR_CHANGE_ACCESS)


@pytest.fixture
def env():
    """(m, p, ctx, pd, mr): a one-page LOCAL_WRITE MR."""
    m = host()
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    pd = v.ibv_alloc_pd(ctx)
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    yield m, p, ctx, pd, mr
    p.exit(0)


def rereg_raw(ctx, **fields) -> int:
    """REREG_MR with exactly these fields; 0 or the errno."""
    try:
        c.execute_write(ctx, uv.IB_USER_VERBS_CMD_REREG_MR, uv.ib_uverbs_rereg_mr(**fields),
                        uv.ib_uverbs_rereg_mr_resp, what="rereg")
    except VerbsError as e:
        return e.errno
    return 0


def handles(p, ctx) -> dict:
    """The uverbs file's handle table: handle -> type name."""
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    return {h: u.type.name for h, u in ufile.idr.items() if u is not None}


@pytest.mark.parametrize("fields,err,msg", [
    (dict(flags=0), errno.EINVAL, "no flags"),
    (dict(flags=8), errno.EOPNOTSUPP, "unknown flags"),
    (dict(flags=ACCESS | 8), errno.EOPNOTSUPP, "unknown flags"),
    (dict(flags=TRANS, start=0x1000, hca_va=0x2800, length=4096), errno.EINVAL,
     "page offsets differ"),
    (dict(flags=ACCESS, access_flags=RW), errno.EINVAL, "without local write"),
    (dict(flags=ACCESS, access_flags=1 << 30), errno.EINVAL, "unknown access flags"),
    (dict(flags=ACCESS, access_flags=LW | v.IBV_ACCESS_ON_DEMAND), errno.EOPNOTSUPP,
     "on-demand"),
    (dict(flags=PD, pd_handle=77), errno.EINVAL, "PD handle 77"),
])
def test_bad_requests_change_nothing(env, fields, err, msg):
    m, p, ctx, pd, mr = env
    key, n, table = mr.lkey, len(fw(m).cmd_log), handles(p, ctx)
    fields.setdefault("mr_handle", mr.handle)
    assert rereg_raw(ctx, **fields) == err
    assert msg in last_error(p)
    assert len(fw(m).cmd_log) == n and handles(p, ctx) == table
    assert fw(m).mkeys[key >> 8].mkc["free"] == 0
    assert v.ibv_dereg_mr(mr) == 0


def test_the_mr_handle_must_be_an_mr(env):
    m, p, ctx, pd, mr = env
    assert rereg_raw(ctx, mr_handle=99, flags=ACCESS, access_flags=LW) == errno.ENOENT
    assert rereg_raw(ctx, mr_handle=pd.handle, flags=ACCESS, access_flags=LW) == errno.EINVAL
    assert "is a PD, not a MR" in last_error(p)
    assert v.ibv_dereg_mr(mr) == 0


def test_a_new_mr_takes_over_the_handle_and_the_old_one_is_gone(env):
    m, p, ctx, pd, mr = env
    old_key, handle, pins = mr.lkey, mr.handle, p.mm.pinned_vm
    table = handles(p, ctx)
    b = user_pages(p, 2)
    with Tracer() as t:
        assert v.ibv_rereg_mr(mr, TRANS, None, b, 8192, 0) == (0, 0)
    assert_call_flow(t.trace, ["ib_uverbs_rereg_mr", "rdma_alloc_begin_uobject",
                               "mlx5_ib_rereg_user_mr", "rdma_assign_uobject",
                               "mlx5_ib_dereg_mr", "rdma_alloc_commit_uobject"])
    assert mr.handle == handle and handles(p, ctx) == table       # same handle, no extra one
    assert old_key >> 8 not in fw(m).mkeys and mr.lkey >> 8 in fw(m).mkeys
    assert p.mm.pinned_vm == pins + 1
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    kmr = ufile.idr[handle].object
    assert (kmr.iova, kmr.length, kmr.pd.uobject.id) == (b, 8192, pd.handle)
    assert v.ibv_dereg_mr(mr) == 0 and p.mm.pinned_vm == pins - 1
    assert v.ibv_dealloc_pd(pd) == 0


def test_a_failed_driver_rereg_releases_the_new_handle(env):
    m, p, ctx, pd, mr = env
    table, key = handles(p, ctx), mr.lkey
    ret = v.ibv_rereg_mr(mr, TRANS, None, user_pages(p) + 0x10_0000_0000, 4096, 0)
    assert ret == (v.IBV_REREG_MR_ERR_CMD, errno.EFAULT)
    assert handles(p, ctx) == table and mr.lkey == key
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    assert ufile.idr[mr.handle].usecnt == 0                        # the write lock dropped
    assert v.ibv_dereg_mr(mr) == 0


def test_a_pd_moved_in_place_moves_the_core_count(env):
    m, p, ctx, pd, mr = env
    pd2 = v.ibv_alloc_pd(ctx)
    assert v.ibv_rereg_mr(mr, PD, pd2, 0, 0, 0) == (0, 0)
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    kmr = ufile.idr[mr.handle].object
    assert kmr.pd is ufile.idr[pd2.handle].object
    assert v.ibv_dealloc_pd(pd) == 0
    assert v.ibv_dealloc_pd(pd2) == errno.EBUSY
    assert v.ibv_dereg_mr(mr) == 0 and v.ibv_dealloc_pd(pd2) == 0


def test_libibverbs_input_checks_stay_in_userspace(env):
    m, p, ctx, pd, mr = env
    n = len(fw(m).cmd_log)
    bad = [(8, None, 0, 0, 0), (TRANS, None, 0, 4096, 0), (TRANS, None, 0x1000, 0, 0),
           (PD, pd, 0, 0, LW)]
    for args in bad:
        assert v.ibv_rereg_mr(mr, *args) == (v.IBV_REREG_MR_ERR_INPUT, errno.EINVAL)
    assert len(fw(m).cmd_log) == n
    assert v.ibv_dereg_mr(mr) == 0

"""Tests for mlx5_ib_rereg_user_mr (drivers/mlx5_ib/mr.py): which path each rereg takes -
a UMR on the live mkey (same key), a new mkey over the kept umem, or new pages and a new
mkey - what happens to the old mkey and the pins, and each errno."""

from __future__ import annotations

import errno

import pytest

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import MLX5_ADDR_OF, MLX5_SET, IfcStruct
from drivers.mlx5_ib.mr import mlx5_ib_rereg_user_mr
from kernel_model.dma_buf import dma_buf_fd, dma_buf_move_notify
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_CREATE_MKEY,
    MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS,
    MLX5_CMD_STAT_LIM_ERR,
)
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.trace import Tracer
from tests.drivers.ib_core.fake_peer import K64, PeerEnv
from tests.drivers.ib_core.test_umem_dmabuf import MovingBuffer
from tests.drivers.mlx5_ib.ladder import cmds, fw, ib_dev, last_error, user_pages
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v

LW, RW, RR, RA = (v.IBV_ACCESS_LOCAL_WRITE, v.IBV_ACCESS_REMOTE_WRITE,
                  v.IBV_ACCESS_REMOTE_READ, v.IBV_ACCESS_REMOTE_ATOMIC)
TRANS, PD, ACCESS = (v.IBV_REREG_MR_CHANGE_TRANSLATION, v.IBV_REREG_MR_CHANGE_PD,
                     v.IBV_REREG_MR_CHANGE_ACCESS)
ERR_CMD = v.IBV_REREG_MR_ERR_CMD


@pytest.fixture
def app(app):
    """The conftest rung plus a PD: (p, ctx, pd)."""
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx)


def mkey_of(m, key):
    return fw(m).mkeys.get(key >> 8)


def test_an_access_change_is_a_umr_on_the_live_mkey(m, app):
    p, ctx, pd = app
    addr = user_pages(p, 2)
    mr = v.ibv_reg_mr(pd, addr, 2 * 4096, LW)
    key, pins, n = mr.lkey, p.mm.pinned_vm, len(fw(m).cmd_log)
    with Tracer() as t:
        assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | RW | RR | RA) == (0, 0)
    assert_call_flow(t.trace, ["ib_uverbs_rereg_mr", "mlx5_ib_rereg_user_mr",
                               "mlx5r_umr_rereg_pd_access"])
    assert cmds(m, n) == ["EMU_UMR_REREG_PD_ACCESS"]       # no new mkey, nothing destroyed
    assert mr.lkey == mr.rkey == key and p.mm.pinned_vm == pins
    mkc = mkey_of(m, key).mkc
    assert (mkc["rw"], mkc["rr"], mkc["a"], mkc["lw"], mkc["free"]) == (1, 1, 1, 1, 0)
    assert (mkc["start_addr"], mkc["len"]) == (addr, 2 * 4096)
    assert v.ibv_dereg_mr(mr) == 0 and mkey_of(m, key) is None


def test_a_pd_change_moves_the_mkey_and_the_pd_references(m, app):
    p, ctx, pd = app
    pd2 = v.ibv_alloc_pd(ctx)
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    key = mr.lkey
    assert v.ibv_rereg_mr(mr, PD, pd2, 0, 0, 0) == (0, 0)
    assert mr.lkey == key and mr.pd is pd2
    assert mkey_of(m, key).mkc["pd"] == pd2.pdn
    # the old PD is free, the new one is held by the MR (core usecnt and firmware refs)
    assert v.ibv_dealloc_pd(pd2) == errno.EBUSY
    assert v.ibv_dealloc_pd(pd) == 0
    assert v.ibv_dereg_mr(mr) == 0 and v.ibv_dealloc_pd(pd2) == 0


def test_an_access_change_a_umr_cannot_make_gets_a_new_mkey_over_the_same_pages(m, app):
    p, ctx, pd = app
    mr = v.ibv_reg_mr(pd, user_pages(p, 2), 2 * 4096, LW)
    old, pins, n = mr.lkey, p.mm.pinned_vm, len(fw(m).cmd_log)
    handle = mr.handle
    with Tracer() as t:
        assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | v.IBV_ACCESS_MW_BIND) == (0, 0)
    # revoke the old mkey, build the new one over the kept umem, then the core
    # deregisters the old MR (its umem already moved: nothing unpinned)
    assert_call_flow(t.trace, ["mlx5_ib_rereg_user_mr", "mlx5r_umr_revoke_mr",
                               "create_real_mr", "rdma_assign_uobject", "mlx5_ib_dereg_mr"])
    assert cmds(m, n) == ["EMU_UMR_REVOKE_MKEY", "CREATE_MKEY", "DESTROY_MKEY"]
    assert mr.lkey != old and mkey_of(m, old) is None and mkey_of(m, mr.lkey) is not None
    assert p.mm.pinned_vm == pins and mr.handle == handle
    assert v.ibv_dereg_mr(mr) == 0 and not fw(m).mkeys


def test_a_translation_change_pins_the_new_pages_and_unpins_the_old(m, app):
    p, ctx, pd = app
    a, b = user_pages(p, 1), user_pages(p, 3)
    mr = v.ibv_reg_mr(pd, a, 4096, LW | RW)
    old, pins = mr.lkey, p.mm.pinned_vm
    assert v.ibv_rereg_mr(mr, TRANS, None, b, 3 * 4096, 0) == (0, 0)
    assert (mr.addr, mr.length) == (b, 3 * 4096)
    assert p.mm.pinned_vm == pins + 2                      # 3 new pages in, 1 old out
    assert mkey_of(m, old) is None
    mkc = mkey_of(m, mr.lkey).mkc
    assert (mkc["start_addr"], mkc["len"], mkc["rw"]) == (b, 3 * 4096, 1)
    assert v.ibv_dereg_mr(mr) == 0 and p.mm.pinned_vm == pins - 1


def test_translation_pd_and_access_at_once(m, app):
    p, ctx, pd = app
    pd2 = v.ibv_alloc_pd(ctx)
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    b = user_pages(p, 2)
    assert v.ibv_rereg_mr(mr, TRANS | PD | ACCESS, pd2, b, 8192, LW | RR) == (0, 0)
    mkc = mkey_of(m, mr.lkey).mkc
    assert (mkc["pd"], mkc["rr"], mkc["rw"], mkc["start_addr"]) == (pd2.pdn, 1, 0, b)
    assert v.ibv_dealloc_pd(pd) == 0 and v.ibv_dealloc_pd(pd2) == errno.EBUSY
    assert v.ibv_dereg_mr(mr) == 0


def test_writable_access_over_a_read_only_pinning_is_eacces(m, app):
    p, ctx, pd = app
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, 0)          # pinned without FOLL_WRITE
    key = mr.lkey
    assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW) == (ERR_CMD, errno.EACCES)
    assert "read-only pinning" in last_error(p)
    assert mr.lkey == key and mkey_of(m, key).mkc["lw"] == 0
    # with new pages (TRANS) the pinning is redone writable: fine
    assert v.ibv_rereg_mr(mr, TRANS | ACCESS, None, user_pages(p), 4096, LW) == (0, 0)
    assert mkey_of(m, mr.lkey).mkc["lw"] == 1
    assert v.ibv_dereg_mr(mr) == 0


def test_a_failed_umr_is_efault_and_changes_nothing(m, app):
    p, ctx, pd = app
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    key = mr.lkey
    fw(m).inject(MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS, MLX5_CMD_STAT_LIM_ERR)
    assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | RW) == (ERR_CMD, errno.EFAULT)
    assert "reg umr failed" in last_error(p)
    assert mr.lkey == key and mkey_of(m, key).mkc["rw"] == 0
    assert v.ibv_dereg_mr(mr) == 0


def test_a_failed_new_mkey_leaves_the_old_mr_revoked_and_unpinned(m, app):
    p, ctx, pd = app
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    key, pins = mr.lkey, p.mm.pinned_vm
    fw(m).inject(MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_LIM_ERR)
    assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | v.IBV_ACCESS_MW_BIND) == \
        (ERR_CMD, errno.ENOMEM)
    # upstream's unwind: the umem is released, the old mkey stays revoked behind the handle
    assert p.mm.pinned_vm == pins - 1 and mkey_of(m, key).mkc["free"] == 1
    assert mr.lkey == key
    assert v.ibv_dereg_mr(mr) == 0 and not fw(m).mkeys


def test_a_failed_translation_change_keeps_the_old_mr(m, app):
    p, ctx, pd = app
    a = user_pages(p)
    mr = v.ibv_reg_mr(pd, a, 4096, LW)
    key, pins = mr.lkey, p.mm.pinned_vm
    fw(m).inject(MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_LIM_ERR)
    assert v.ibv_rereg_mr(mr, TRANS, None, user_pages(p), 4096, 0) == (ERR_CMD, errno.ENOMEM)
    assert p.mm.pinned_vm == pins and mkey_of(m, key).mkc["free"] == 0
    assert (mr.addr, mr.lkey) == (a, key)
    assert v.ibv_dereg_mr(mr) == 0


def test_dma_buf_mrs(m):
    """A dma-buf MR: libibverbs refuses it (not a plain MR); the kernel, reached by the
    raw command, takes a PD/access change by UMR, refuses one that needs a new mkey over
    the umem (EOPNOTSUPP), and after the exporter moved the buffer (the MTT zapped, the
    mkey still on, as upstream) the UMR still changes the access."""
    p = m.spawn("app")

    def go():
        ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
        pd = v.ibv_alloc_pd(ctx)
        buf = MovingBuffer(m, 2)
        fd = dma_buf_fd(buf.dmabuf, 0)
        mr = v.ibv_reg_dmabuf_mr(pd, 0, 2 * 4096, 0x100000, fd, LW)
        assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | RW) == \
            (v.IBV_REREG_MR_ERR_INPUT, errno.EINVAL)
        key = mr.lkey
        c.ibv_cmd_rereg_mr(mr, ACCESS, 0, 0, 0, LW | RW, None)
        assert mr.lkey == key and mkey_of(m, key).mkc["rw"] == 1
        with pytest.raises(OSError) as ei:
            c.ibv_cmd_rereg_mr(mr, ACCESS, 0, 0, 0, LW | v.IBV_ACCESS_MW_BIND, None)
        assert ei.value.errno == errno.EOPNOTSUPP
        mutex_lock(buf.dmabuf.resv)
        dma_buf_move_notify(buf.dmabuf)
        mutex_unlock(buf.dmabuf.resv)
        c.ibv_cmd_rereg_mr(mr, ACCESS, 0, 0, 0, LW, None)
        assert mkey_of(m, key).mkc["rw"] == 0 and mkey_of(m, key).pf_absent
        assert v.ibv_dereg_mr(mr) == 0
        p.close(fd)
        v.ibv_dealloc_pd(pd)
        v.ibv_close_device(ctx)
    p.run(go)
    p.exit(0)


def test_a_peer_memory_mr_cannot_be_reregistered():
    env = PeerEnv()
    try:
        fp = env.peer()
        va = env.gpu(K64, fp)
        mr = env.reg_mr(va, K64)
        key = mr.lkey
        assert env.p.run(v.ibv_rereg_mr, mr.mr, ACCESS, None, 0, 0, LW) == \
            (ERR_CMD, errno.EOPNOTSUPP)
        assert "peer-memory MR" in str(env.p.task.last_error)
        assert mr.lkey == key and env.hca.fw.mkeys[key >> 8].mkc["free"] == 0
        env.dereg(mr)
    finally:
        env.close()


def test_relaxed_ordering_is_accepted_and_changed_by_umr(m, app):
    """IBV_ACCESS_RELAXED_ORDERING (an optional access flag) registers, and adding or
    dropping it is a change a UMR may make (the model's HCA reports no relaxed-ordering
    capability that would forbid it): the same key."""
    p, ctx, pd = app
    ro = v.IBV_ACCESS_RELAXED_ORDERING
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW | ro)
    key = mr.lkey
    assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | RW) == (0, 0)
    assert v.ibv_rereg_mr(mr, ACCESS, None, 0, 0, LW | RW | ro) == (0, 0)
    assert mr.lkey == key and mkey_of(m, key).mkc["rw"] == 1
    assert v.ibv_dereg_mr(mr) == 0


def test_the_umr_stand_in_refuses_an_unknown_pd_and_moves_nothing(m, app):
    """EMU_UMR_REREG_PD_ACCESS with a PD the device does not have: BAD_PARAM (EINVAL
    from the command; the driver would report the failed UMR as EFAULT) - the mkey's
    PD, access bits and PD references stay."""
    p, ctx, pd = app
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    mk = mkey_of(m, mr.lkey)
    before = ({f: mk.mkc[f] for f in ("pd", "rw", "rr", "lw", "a")}, list(mk.refs),
              fw(m).pds[pd.pdn].users)
    in_ = IfcStruct("emu_umr_rereg_pd_access_in")
    MLX5_SET("emu_umr_rereg_pd_access_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS)
    MLX5_SET("emu_umr_rereg_pd_access_in", in_, "mkey_index", mr.lkey >> 8)
    mkc = MLX5_ADDR_OF("emu_umr_rereg_pd_access_in", in_, "memory_key_mkey_entry")
    MLX5_SET("mkc", mkc, "pd", 0x7777)
    MLX5_SET("mkc", mkc, "rw", 1)
    with p.kernel(), pytest.raises(KernelError) as ei:
        mlx5_cmd_exec(ib_dev(m).mdev, in_, IfcStruct("emu_umr_rereg_pd_access_out"))
    assert ei.value.errno == errno.EINVAL
    assert ({f: mk.mkc[f] for f in ("pd", "rw", "rr", "lw", "a")}, list(mk.refs),
            fw(m).pds[pd.pdn].users) == before
    assert v.ibv_dereg_mr(mr) == 0


def test_the_driver_refuses_flags_it_does_not_know(m, app):
    """mlx5_ib_rereg_user_mr's own flag check (the core filters first, so only a direct
    caller reaches it): EOPNOTSUPP, the MR untouched."""
    p, ctx, pd = app
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, LW)
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    kmr = ufile.idr[mr.handle].object
    with p.kernel(), pytest.raises(KernelError) as ei:
        mlx5_ib_rereg_user_mr(kmr, 8, 0, 0, 0, 0, kmr.pd, None)
    assert ei.value.errno == errno.EOPNOTSUPP
    assert mkey_of(m, mr.lkey).mkc["free"] == 0
    assert v.ibv_dereg_mr(mr) == 0

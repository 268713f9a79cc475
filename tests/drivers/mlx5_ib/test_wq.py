"""Tests for receive work queues and RSS indirection tables: libibverbs' wq.py and libmlx5's,
the extended uverbs commands (drivers/ib_core/uverbs_cmd_wq.py) and mlx5_ib's WQ ops
(drivers/mlx5_ib/wq.py) down to the firmware's RQ and RQT."""

from __future__ import annotations

import errno

import pytest

from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_CREATE_RQ,
    MLX5_CMD_OP_CREATE_RQT,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
)
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_wq, mlx5_ib_create_wq_resp
from tests.drivers.mlx5_ib.ladder import errno_of, fw, host, last_error, open_ctx, state
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs import wq as w

RST, RDY, ERR = 0, 1, 3


@pytest.fixture
def res(app):
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)


def _init(pd, cq, **kw) -> w.ibv_wq_init_attr:
    fields = dict(wq_type=w.IBV_WQT_RQ, max_wr=8, max_sge=2, pd=pd, cq=cq)
    fields.update(kw)
    return w.ibv_wq_init_attr(**fields)


def _wq(ctx, pd, cq, **kw) -> w.ibv_wq:
    return w.ibv_create_wq(ctx, _init(pd, cq, **kw))


def _rdy(wq) -> int:
    return w.ibv_modify_wq(wq, w.ibv_wq_attr(attr_mask=w.IBV_WQ_ATTR_STATE,
                                             wq_state=w.IBV_WQS_RDY))


def _rq(p, wq):
    return fw(p.machine).rqs[wq.wq_num]


# -- the happy path ---------------------------------------------------------------------------
def test_a_wq_is_an_rq_of_the_nic(res):
    p, ctx, pd, cq = res
    before = state(p, ctx)
    attr = _init(pd, cq)
    wq = w.ibv_create_wq(ctx, attr)
    rq = _rq(p, wq)
    assert (attr.max_wr, attr.max_sge) == (8, 2)
    assert rq.state == RST and rq.rqc["cqn"] == cq.cqn and rq.wq["pd"] == pd.pdn
    assert 1 << rq.wq["log_wq_sz"] == wq.rq.wqe_cnt == 8
    assert 1 << rq.wq["log_wq_stride"] == 32 and wq.rq.max_gs == 2   # two 16-byte SGEs
    assert rq.rqc["vsd"] == 1 and rq.rqc["user_index"] == wq.rsn
    assert _rdy(wq) == 0 and wq.state == w.IBV_WQS_RDY and rq.state == RDY
    err = w.ibv_wq_attr(attr_mask=w.IBV_WQ_ATTR_STATE, wq_state=w.IBV_WQS_ERR)
    assert w.ibv_modify_wq(wq, err) == 0 and rq.state == ERR
    reset = w.ibv_wq_attr(attr_mask=w.IBV_WQ_ATTR_STATE, wq_state=w.IBV_WQS_RESET)
    assert w.ibv_modify_wq(wq, reset) == 0 and rq.state == RST
    assert w.ibv_destroy_wq(wq) == 0
    assert state(p, ctx) == before


def test_an_indirection_table_holds_its_wqs(res):
    p, ctx, pd, cq = res
    before = state(p, ctx)
    wqs = [_wq(ctx, pd, cq) for _ in range(4)]
    tbl = w.ibv_create_rwq_ind_table(ctx, w.ibv_rwq_ind_table_init_attr(2, wqs))
    rqt = fw(p.machine).rqts[tbl.ind_tbl_num]
    assert [int(rqt.pas[i]) for i in range(4)] == [wq.wq_num for wq in wqs]
    assert w.ibv_destroy_wq(wqs[0]) == errno.EBUSY               # named by the table
    assert w.ibv_destroy_rwq_ind_table(tbl) == 0
    assert all(w.ibv_destroy_wq(wq) == 0 for wq in wqs)
    assert state(p, ctx) == before


def test_create_flags_reach_the_rq(res):
    p, ctx, pd, cq = res
    flags = w.IBV_WQ_FLAGS_CVLAN_STRIPPING | w.IBV_WQ_FLAGS_SCATTER_FCS | \
        w.IBV_WQ_FLAGS_PCI_WRITE_END_PADDING
    wq = _wq(ctx, pd, cq, comp_mask=w.IBV_WQ_INIT_ATTR_FLAGS, create_flags=flags)
    rq = _rq(p, wq)
    assert rq.rqc["vsd"] == 0 and rq.rqc["scatter_fcs"] == 1
    assert rq.wq["end_padding_mode"] == 1
    # VLAN stripping switched off again by MODIFY_RQ's VSD bit
    attr = w.ibv_wq_attr(attr_mask=w.IBV_WQ_ATTR_FLAGS, flags=0,
                         flags_mask=w.IBV_WQ_FLAGS_CVLAN_STRIPPING)
    assert w.ibv_modify_wq(wq, attr) == 0 and rq.rqc["vsd"] == 1 and rq.state == RST


def test_a_process_exit_frees_tables_and_wqs(m):
    p = m.spawn("leaver")
    ctx = open_ctx(p)
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
    wqs = [_wq(ctx, pd, cq) for _ in range(2)]
    w.ibv_create_rwq_ind_table(ctx, w.ibv_rwq_ind_table_init_attr(1, wqs))
    p.exit(0)
    assert not fw(m).rqs and not fw(m).rqts


# -- create's errno paths ---------------------------------------------------------------------
def _create_raw(ctx, pd, cq, drv: mlx5_ib_create_wq | None = None, **kw) -> int:
    """CREATE_WQ with a hand-made request; 0 or the errno."""
    fields = dict(wq_type=0, pd_handle=pd.handle, cq_handle=cq.handle, max_wr=8, max_sge=1)
    fields.update(kw)
    try:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_WQ,
                           uv.ib_uverbs_ex_create_wq(**fields),
                           uv.ib_uverbs_ex_create_wq_resp.SIZE, "create_wq", drv,
                           mlx5_ib_create_wq_resp.SIZE)
    except c.VerbsError as e:
        return e.errno
    return 0


def _drv(p, **kw) -> mlx5_ib_create_wq:
    from tests.drivers.mlx5_ib.ladder import user_pages
    fields = dict(buf_addr=user_pages(p), db_addr=user_pages(p), rq_wqe_count=8,
                  rq_wqe_shift=4, user_index=9)
    fields.update(kw)
    return mlx5_ib_create_wq(**fields)


@pytest.mark.parametrize("kw,drv_kw,want,msg", [
    (dict(comp_mask=1), {}, errno.EOPNOTSUPP, "comp_mask"),
    (dict(pd_handle=77), {}, errno.EINVAL, "PD handle 77"),
    (dict(cq_handle=77), {}, errno.EINVAL, "CQ handle 77"),
    (dict(wq_type=1), {}, errno.EINVAL, "unsupported wq type"),
    (dict(max_wr=1 << 18), {}, errno.EINVAL, "max_wr"),
    ({}, dict(rq_wqe_count=0), errno.EINVAL, "no rq_wqe_count"),
    ({}, dict(buf_addr=0), errno.EINVAL, "no buffer"),
    ({}, dict(comp_mask=1), errno.EOPNOTSUPP, "striding"),
    ({}, dict(comp_mask=2), errno.EOPNOTSUPP, "invalid comp mask"),
    (dict(create_flags=w.IBV_WQ_FLAGS_DELAY_DROP), {}, errno.EOPNOTSUPP, "delay drop"),
])
def test_create_wq_errors_leave_nothing_behind(res, kw, drv_kw, want, msg):
    p, ctx, pd, cq = res
    drv = _drv(p, **drv_kw)
    before = state(p, ctx)
    assert _create_raw(ctx, pd, cq, drv, **kw) == want
    assert msg in last_error(p)
    assert state(p, ctx) == before


def test_a_short_driver_request_is_einval(res):
    p, ctx, pd, cq = res
    assert _create_raw(ctx, pd, cq, None) == errno.EINVAL
    assert "invalid inlen" in last_error(p)


def test_a_refused_create_rq_unpins_the_buffer(res):
    p, ctx, pd, cq = res
    before = state(p, ctx)
    fw(p.machine).inject(MLX5_CMD_OP_CREATE_RQ, MLX5_CMD_STAT_BAD_PARAM_ERR)
    assert errno_of(_wq, ctx, pd, cq) == errno.EINVAL
    assert state(p, ctx) == before and not ctx.uidx_table


def test_libibverbs_and_libmlx5_refusals(res):
    p, ctx, pd, cq = res
    def refused(**kw) -> int:
        return errno_of(w.ibv_create_wq, ctx, _init(pd, cq, **kw))

    assert refused(wq_type=1) == errno.EOPNOTSUPP                      # libmlx5
    assert refused(max_wr=0) == errno.EINVAL                           # mlx5_calc_rwq_size
    assert refused(comp_mask=2) == errno.EINVAL                        # ibv_cmd_create_wq
    assert refused(comp_mask=1, create_flags=1 << 4) == errno.EOPNOTSUPP
    no_cq = _init(pd, cq)
    no_cq.cq = None
    assert errno_of(w.ibv_create_wq, ctx, no_cq) == errno.EINVAL       # EMU: no NULL deref
    assert not fw(p.machine).rqs


# -- modify and destroy -----------------------------------------------------------------------
def _modify_raw(ctx, wq, **kw) -> int:
    from kernel_model.uapi.mlx5_abi import mlx5_ib_modify_wq
    fields = dict(wq_handle=wq.handle, attr_mask=w.IBV_WQ_ATTR_STATE, wq_state=1)
    fields.update(kw)
    try:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_MODIFY_WQ,
                           uv.ib_uverbs_ex_modify_wq(**fields), 0, "modify_wq",
                           mlx5_ib_modify_wq(), 0)
    except c.VerbsError as e:
        return e.errno
    return 0


@pytest.mark.parametrize("kw,want", [
    (dict(attr_mask=0), errno.EINVAL), (dict(attr_mask=8), errno.EINVAL),
    (dict(wq_handle=77), errno.EINVAL), (dict(wq_state=3), errno.EINVAL),
    (dict(attr_mask=3, curr_wq_state=3), errno.EINVAL),
    (dict(attr_mask=3, curr_wq_state=1, wq_state=2), errno.EINVAL),   # BAD_RES_STATE
])
def test_modify_wq_errors_leave_the_state(res, kw, want):
    p, ctx, pd, cq = res
    wq = _wq(ctx, pd, cq)
    assert _modify_raw(ctx, wq, **kw) == want
    assert _rq(p, wq).state == RST and wq.state == w.IBV_WQS_RESET


def test_modify_wq_flag_refusals(res):
    p, ctx, pd, cq = res
    wq = _wq(ctx, pd, cq)
    pad = w.ibv_wq_attr(attr_mask=w.IBV_WQ_ATTR_FLAGS,
                        flags_mask=w.IBV_WQ_FLAGS_PCI_WRITE_END_PADDING)
    assert w.ibv_modify_wq(wq, pad) == errno.EOPNOTSUPP
    assert w.ibv_modify_wq(wq, w.ibv_wq_attr(attr_mask=8)) == errno.EINVAL   # libibverbs
    # libmlx5: to RDY from a current state that is not the WQ's (returned negative)
    cur = w.ibv_wq_attr(attr_mask=w.IBV_WQ_ATTR_STATE | w.IBV_WQ_ATTR_CURR_STATE,
                        wq_state=w.IBV_WQS_RDY, curr_wq_state=w.IBV_WQS_ERR)
    assert w.ibv_modify_wq(wq, cur) == -errno.EINVAL
    assert _rq(p, wq).state == RST


def test_destroy_wq_with_a_comp_mask_is_einval(res):
    p, ctx, pd, cq = res
    wq = _wq(ctx, pd, cq)
    with pytest.raises(c.VerbsError) as ei:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_DESTROY_WQ,
                           uv.ib_uverbs_ex_destroy_wq(comp_mask=1, wq_handle=wq.handle),
                           uv.ib_uverbs_ex_destroy_wq_resp.SIZE)
    assert ei.value.errno == errno.EINVAL and wq.wq_num in fw(p.machine).rqs


# -- the indirection table's errno paths -------------------------------------------------------
def _tbl_raw(ctx, log: int, handles: list[int], comp_mask: int = 0) -> int:
    req = w._ind_table_req(len(handles))(
        comp_mask=comp_mask, log_ind_tbl_size=log,
        wq_handles=b"".join(h.to_bytes(4, "little") for h in handles).ljust(
            w._ind_table_req(len(handles)).SIZE - 8, b"\0"))
    try:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL, req,
                           uv.ib_uverbs_ex_create_rwq_ind_table_resp.SIZE)
    except c.VerbsError as e:
        return e.errno
    return 0


@pytest.mark.parametrize("log,n,bad,comp_mask,want", [
    (1, 2, False, 1, errno.EOPNOTSUPP),
    (14, 2, False, 0, errno.EINVAL),      # past IB_USER_VERBS_MAX_LOG_IND_TBL_SIZE
    (2, 2, False, 0, errno.EINVAL),       # four handles do not fit
    (1, 2, True, 0, errno.EINVAL),        # a handle that is no WQ
])
def test_create_rwq_ind_table_errors_let_the_wqs_go(res, log, n, bad, comp_mask, want):
    p, ctx, pd, cq = res
    wqs = [_wq(ctx, pd, cq) for _ in range(2)]
    handles = [wq.handle for wq in wqs][:n]
    if bad:
        handles[-1] = 77
    assert _tbl_raw(ctx, log, handles, comp_mask) == want
    assert not fw(p.machine).rqts
    assert all(w.ibv_destroy_wq(wq) == 0 for wq in wqs)     # usecnt back to 0


def test_a_refused_rqt_lets_the_wqs_go(res):
    p, ctx, pd, cq = res
    wqs = [_wq(ctx, pd, cq) for _ in range(2)]
    fw(p.machine).inject(MLX5_CMD_OP_CREATE_RQT, MLX5_CMD_STAT_BAD_PARAM_ERR)
    assert errno_of(w.ibv_create_rwq_ind_table, ctx,
                    w.ibv_rwq_ind_table_init_attr(1, wqs)) == errno.EINVAL
    assert all(w.ibv_destroy_wq(wq) == 0 for wq in wqs)


def test_a_table_past_log_max_rqt_size_is_einval():
    m = host(hca=Mlx5Config(caps={"log_max_rqt_size": 0}))
    p = m.spawn("small")
    ctx = open_ctx(p)
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
    wqs = [_wq(ctx, pd, cq) for _ in range(2)]
    assert errno_of(w.ibv_create_rwq_ind_table, ctx,
                    w.ibv_rwq_ind_table_init_attr(1, wqs)) == errno.EINVAL
    assert "bigger than supported" in last_error(p)
    assert errno_of(w.ibv_create_rwq_ind_table, ctx,
                    w.ibv_rwq_ind_table_init_attr(0, wqs, comp_mask=1)) == errno.EINVAL
    p.exit(0)


def test_destroy_rwq_ind_table_with_a_comp_mask_is_eopnotsupp(res):
    p, ctx, pd, cq = res
    wqs = [_wq(ctx, pd, cq) for _ in range(2)]
    tbl = w.ibv_create_rwq_ind_table(ctx, w.ibv_rwq_ind_table_init_attr(1, wqs))
    with pytest.raises(c.VerbsError) as ei:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_DESTROY_RWQ_IND_TBL,
                           uv.ib_uverbs_ex_destroy_rwq_ind_table(
                               comp_mask=1, ind_tbl_handle=tbl.ind_tbl_handle), 0)
    assert ei.value.errno == errno.EOPNOTSUPP and tbl.ind_tbl_num in fw(p.machine).rqts
    assert w.ibv_destroy_rwq_ind_table(tbl) == 0


def test_driver_requests_mlx5_ib_checks(res):
    """mlx5_ib_modify_wq: no driver request is EINVAL; mlx5_ib_create_rwq_ind_table: a
    driver request that is not all zero is EOPNOTSUPP."""
    p, ctx, pd, cq = res
    wqs = [_wq(ctx, pd, cq) for _ in range(2)]
    with pytest.raises(c.VerbsError) as ei:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_MODIFY_WQ,
                           uv.ib_uverbs_ex_modify_wq(wq_handle=wqs[0].handle, attr_mask=1,
                                                     wq_state=1), 0)
    assert ei.value.errno == errno.EINVAL and "invalid inlen" in last_error(p)
    cls = w._ind_table_req(2)
    req = cls(log_ind_tbl_size=1, wq_handles=b"".join(
        wq.handle.to_bytes(4, "little") for wq in wqs))
    with pytest.raises(c.VerbsError) as ei:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL, req,
                           uv.ib_uverbs_ex_create_rwq_ind_table_resp.SIZE, "tbl",
                           mlx5_ib_create_wq_resp(response_length=1), 8)
    assert ei.value.errno == errno.EOPNOTSUPP and not fw(p.machine).rqts
    assert all(w.ibv_destroy_wq(wq) == 0 for wq in wqs)

"""Tests for the SRQ path: ib_uverbs_create_srq / create_xsrq / modify / query / destroy
(drivers/ib_core/uverbs_cmd.py), mlx5_ib_create_srq and friends (drivers/mlx5_ib/srq.py),
the firmware's CREATE_SRQ / ARM_RQ / DESTROY_SRQ (kernel_model/hw/mlx5_fw_srq.py), QPs
created on an SRQ, and libmlx5's SRQ verbs.  Every errno is checked to leave the
context as it found it (`state`: pins, doorbell pages, firmware objects)."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.ib_verbs import IB_SRQT_XRC, ib_srq_attr, ib_srq_init_attr, ib_udata
from drivers.mlx5_ib.srq import mlx5_ib_create_srq, mlx5_ib_srq
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_ARM_RQ,
    MLX5_CMD_OP_CREATE_SRQ,
    MLX5_CMD_OP_DESTROY_SRQ,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi import mlx5_abi as abi
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    errno_of,
    fw,
    hole,
    ib_dev,
    raw_pd,
    state,
    user_pages,
    write_raw,
)
from userspace.libibverbs import verbs as v

RESP_AT = 2048   # the response area in the command page (past the request)


def srq_ucmd(p, max_wr: int = 15, stride: int = 32, **kw: int) -> abi.mlx5_ib_create_srq:
    """A create_srq request as libmlx5 makes one: the ring and a doorbell record."""
    if "buf_addr" not in kw:
        kw["buf_addr"] = user_pages(p, max(1, -(-((max_wr + 1) * stride) // 4096)))
    if "db_addr" not in kw:
        kw["db_addr"] = user_pages(p) + 64
    return abi.mlx5_ib_create_srq(**kw)


def create_srq_raw(ctx, pd, ucmd, max_wr: int = 15, max_sge: int = 1, srq_limit: int = 0,
                   command: int = uv.IB_USER_VERBS_CMD_CREATE_SRQ, extra: bytes = b"",
                   **xsrq: int) -> tuple[int, uv.ib_uverbs_create_srq_resp | None, int]:
    """CREATE_SRQ (or CREATE_XSRQ) by hand: (errno, core response, srqn)."""
    if command == uv.IB_USER_VERBS_CMD_CREATE_SRQ:
        req = uv.ib_uverbs_create_srq(pd_handle=pd.handle, max_wr=max_wr, max_sge=max_sge,
                                      srq_limit=srq_limit)
    else:
        req = uv.ib_uverbs_create_xsrq(pd_handle=pd.handle, max_wr=max_wr, max_sge=max_sge,
                                       srq_limit=srq_limit, **xsrq)
    resp_size = uv.ib_uverbs_create_srq_resp.SIZE
    err = write_raw(ctx, command, req, resp_size, ucmd.pack() + extra,
                    abi.mlx5_ib_create_srq_resp.SIZE, ctx.cmd_buf + RESP_AT)
    if err:
        return err, None, 0
    raw = ctx.proc.load(ctx.cmd_buf + RESP_AT, resp_size + 8)
    drv = abi.mlx5_ib_create_srq_resp.unpack(raw[resp_size:])
    return 0, uv.ib_uverbs_create_srq_resp.unpack(raw[:resp_size]), drv.srqn


def cmd(ctx, command: int, req, resp_size: int = 0) -> int:
    return write_raw(ctx, command, req, resp_size, b"", 0, ctx.cmd_buf + RESP_AT)


@pytest.fixture
def res(app):
    p, ctx = app
    return p, ctx, raw_pd(ctx)


def test_create_srq_sizes_the_ring_and_the_firmware_keeps_it(res):
    p, ctx, pd = res
    err, resp, srqn = create_srq_raw(ctx, pd, srq_ucmd(p), max_wr=15, max_sge=1, srq_limit=3)
    assert err == 0
    assert (resp.max_wr, resp.max_sge, resp.srqn) == (15, 1, 0)   # srqn: XRC SRQs only
    srqc = fw(p.machine).srqs[srqn].srqc
    assert (srqc["log_srq_size"], srqc["log_rq_stride"], srqc["lwm"]) == (4, 1, 3)
    assert srqc["pd"] == pd.pdn and srqc["xrcd"] == 0 and srqc["cqn"] == 0
    assert "CREATE_SRQ" in cmds(p.machine)
    q = uv.ib_uverbs_query_srq(srq_handle=resp.srq_handle)
    assert cmd(ctx, uv.IB_USER_VERBS_CMD_QUERY_SRQ, q, uv.ib_uverbs_query_srq_resp.SIZE) == 0
    qr = uv.ib_uverbs_query_srq_resp.unpack(
        p.load(ctx.cmd_buf + RESP_AT, uv.ib_uverbs_query_srq_resp.SIZE))
    assert (qr.max_wr, qr.max_sge, qr.srq_limit) == (15, 1, 3)
    assert cmd(ctx, uv.IB_USER_VERBS_CMD_DESTROY_SRQ,
               uv.ib_uverbs_destroy_srq(srq_handle=resp.srq_handle),
               uv.ib_uverbs_destroy_srq_resp.SIZE) == 0
    assert not fw(p.machine).srqs


@pytest.mark.parametrize("case,err", [
    ("max_wr_at_cap", errno.EINVAL),       # mlx5_ib_create_srq: max_wr >= 1 << log_max_srq_sz
    ("max_sge", errno.EINVAL),             # a WQE beyond max_wqe_sz_rq
    ("reserved0", errno.EINVAL),           # create_srq_user
    ("reserved1", errno.EINVAL),
    ("trailing", errno.EINVAL),            # non-zero bytes past the request
    ("buf_hole", errno.EFAULT),            # ib_umem_get of an unmapped ring
    ("db_hole", errno.EFAULT),             # mlx5_ib_db_map_user
    ("bad_pd", errno.EINVAL),              # __uverbs_create_xsrq: no such PD
    ("fw_busy", errno.EBUSY),              # CREATE_SRQ refused: unwound
])
def test_create_srq_errors_leave_nothing_behind(res, case, err):
    p, ctx, pd = res
    before = state(p, ctx)
    kw: dict = {}
    extra = b""
    ucmd = srq_ucmd(p)
    if case == "max_wr_at_cap":
        kw["max_wr"] = 1 << fw(p.machine).cap("log_max_srq_sz")
    elif case == "max_sge":
        kw["max_sge"] = 1000
    elif case in ("reserved0", "reserved1"):
        setattr(ucmd, case, 1)
    elif case == "trailing":
        extra = b"\x01" + bytes(7)
    elif case == "buf_hole":
        ucmd.buf_addr = hole(p)
    elif case == "db_hole":
        ucmd.db_addr = hole(p)
    elif case == "bad_pd":
        pd = type(pd)(ctx, pd.handle + 100)
    elif case == "fw_busy":
        fw(p.machine).inject(MLX5_CMD_OP_CREATE_SRQ, MLX5_CMD_STAT_RES_BUSY)
    before = state(p, ctx)
    assert create_srq_raw(ctx, pd, ucmd, extra=extra, **kw)[0] == err
    assert state(p, ctx) == before


@pytest.mark.parametrize("srq_type,err", [(IB_SRQT_XRC, errno.EINVAL),   # XRCD handle 0
                                          (2, errno.EOPNOTSUPP),     # tag matching
                                          (7, errno.EINVAL)])
def test_create_xsrq_checks_the_type(res, srq_type, err):
    p, ctx, pd = res
    before = state(p, ctx)
    assert create_srq_raw(ctx, pd, srq_ucmd(p), command=uv.IB_USER_VERBS_CMD_CREATE_XSRQ,
                          srq_type=srq_type)[0] == err
    assert state(p, ctx) == before
    assert create_srq_raw(ctx, pd, srq_ucmd(p), command=uv.IB_USER_VERBS_CMD_CREATE_XSRQ,
                          srq_type=0)[0] == 0


def test_the_driver_refuses_kernel_and_other_typed_srqs(m):
    dev = ib_dev(m)
    srq = mlx5_ib_srq(dev)
    with pytest.raises(KernelError) as ei:
        mlx5_ib_create_srq(srq, ib_srq_init_attr(attr=ib_srq_attr(4, 1)), None)
    assert ei.value.errno == errno.EOPNOTSUPP
    with pytest.raises(KernelError) as ei:        # tag matching
        mlx5_ib_create_srq(srq, ib_srq_init_attr(attr=ib_srq_attr(4, 1), srq_type=2),
                           ib_udata(0, 0, 0, 0))
    assert ei.value.errno == errno.EOPNOTSUPP


@pytest.mark.parametrize("mask,max_wr,limit,err", [
    (uv.IB_SRQ_LIMIT, 0, 5, 0),
    (uv.IB_SRQ_MAX_WR, 64, 0, errno.EINVAL),        # no resizing
    (uv.IB_SRQ_LIMIT, 0, 16, errno.EINVAL),         # at the ring's size
    (1 << 2, 0, 0, errno.EINVAL),                   # past IB_SRQ_LIMIT
])
def test_modify_srq(res, mask, max_wr, limit, err):
    p, ctx, pd = res
    _, resp, srqn = create_srq_raw(ctx, pd, srq_ucmd(p))
    req = uv.ib_uverbs_modify_srq(srq_handle=resp.srq_handle, attr_mask=mask, max_wr=max_wr,
                                  srq_limit=limit)
    assert cmd(ctx, uv.IB_USER_VERBS_CMD_MODIFY_SRQ, req) == err
    assert fw(p.machine).srqs[srqn].srqc["lwm"] == (limit if not err else 0)


@pytest.mark.parametrize("command,req", [
    (uv.IB_USER_VERBS_CMD_MODIFY_SRQ,
     uv.ib_uverbs_modify_srq(srq_handle=99, attr_mask=uv.IB_SRQ_LIMIT)),
    (uv.IB_USER_VERBS_CMD_QUERY_SRQ, uv.ib_uverbs_query_srq(srq_handle=99)),
    (uv.IB_USER_VERBS_CMD_DESTROY_SRQ, uv.ib_uverbs_destroy_srq(srq_handle=99)),
])
def test_a_handle_that_names_no_srq(res, command, req):
    p, ctx, pd = res
    size = {uv.IB_USER_VERBS_CMD_QUERY_SRQ: uv.ib_uverbs_query_srq_resp.SIZE,
            uv.IB_USER_VERBS_CMD_DESTROY_SRQ: uv.ib_uverbs_destroy_srq_resp.SIZE}.get(command, 0)
    assert cmd(ctx, command, req, size) in (errno.EINVAL, errno.ENOENT)


def test_query_srq_without_the_driver_op_is_eopnotsupp(res, monkeypatch):
    p, ctx, pd = res
    _, resp, _srqn = create_srq_raw(ctx, pd, srq_ucmd(p))
    monkeypatch.setattr(ib_dev(p.machine).ops, "query_srq", None)
    assert cmd(ctx, uv.IB_USER_VERBS_CMD_QUERY_SRQ,
               uv.ib_uverbs_query_srq(srq_handle=resp.srq_handle),
               uv.ib_uverbs_query_srq_resp.SIZE) == errno.EOPNOTSUPP


def test_create_srq_without_the_driver_op_is_eopnotsupp(res, monkeypatch):
    p, ctx, pd = res
    monkeypatch.setattr(ib_dev(p.machine).ops, "create_srq", None)
    before = state(p, ctx)
    assert create_srq_raw(ctx, pd, srq_ucmd(p))[0] == errno.EOPNOTSUPP
    assert state(p, ctx) == before


# -- QPs on an SRQ ----------------------------------------------------------------------
def _qp_on(ctx, pd, cq, srq):
    return v.ibv_create_qp(pd, v.ibv_qp_init_attr(cq, cq, srq, v.ibv_qp_cap(4, 0, 1, 0),
                                                  v.IBV_QPT_RC))


def test_a_qp_on_an_srq_names_it_and_keeps_it_busy(res):
    p, ctx, _pd = res
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    srq = v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(8, 1)))
    qp = _qp_on(ctx, pd, cq, srq)
    qpc = fw(p.machine).qps[qp.qp_num].qpc
    assert (qpc["rq_type"], qpc["srqn_rmpn_xrqn"], qpc["log_rq_size"]) == (1, srq.srqn, 0)
    assert fw(p.machine).srqs[srq.srqn].users == 1
    assert v.ibv_destroy_srq(srq) == errno.EBUSY and srq.srqn in fw(p.machine).srqs
    _attr, init = v.ibv_query_qp(qp, v.IBV_QP_STATE)
    assert init.srq is srq
    assert v.ibv_destroy_qp(qp) == 0
    assert v.ibv_destroy_srq(srq) == 0 and not fw(p.machine).srqs


def test_a_bad_srq_handle_in_create_qp_is_einval(res):
    p, ctx, pd = res
    mpd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    fake = v.ibv_srq(ctx, mpd, handle=77)
    before = fw(p.machine).qps.copy()
    assert errno_of(_qp_on, ctx, mpd, cq, fake) == errno.EINVAL
    assert fw(p.machine).qps == before


def test_a_process_exit_destroys_its_qps_before_their_srq(m):
    p = m.spawn("quitter")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    srq = v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(8, 1)))
    _qp_on(ctx, pd, cq, srq)
    _qp_on(ctx, pd, cq, srq)
    p.exit(0)
    assert not fw(m).srqs and not fw(m).qps


# -- libmlx5 ------------------------------------------------------------------------------
def test_libmlx5_links_the_ring_and_posts_along_it(res):
    p, ctx, _pd = res
    pd = v.ibv_alloc_pd(ctx)
    attr = v.ibv_srq_init_attr(attr=v.ibv_srq_attr(6, 2))
    srq = v.ibv_create_srq(pd, attr)
    assert (srq.max, srq.max_gs, srq.wqe_shift) == (8, 3, 6)   # 16 + 2 * 16 -> 64 bytes
    assert (attr.attr.max_wr, attr.attr.max_sge) == (6, 3)
    nexts = [int.from_bytes(p.load(srq.buf + (i << 6) + 2, 2), "big") for i in range(8)]
    assert nexts == [1, 2, 3, 4, 5, 6, 7, 0]
    sge = v.ibv_sge(0x1000, 64, 0x55)
    wrs = None
    for i in reversed(range(8)):
        wrs = v.ibv_recv_wr(i, wrs, [sge])
    bad: list = []
    assert v.ibv_post_srq_recv(srq, wrs, bad) == errno.ENOMEM    # 7 fit: head reaches tail
    assert bad[0].wr_id == 7 and srq.counter == 7
    assert int.from_bytes(p.load(srq.db, 4), "big") == 7
    seg = p.load(srq.buf + 16, 48)
    assert seg[:16] == (64).to_bytes(4, "big") + (0x55).to_bytes(4, "big") + \
        (0x1000).to_bytes(8, "big")
    assert seg[16:24] == bytes(4) + (0x100).to_bytes(4, "big")  # the invalid-lkey end
    too_many = v.ibv_recv_wr(9, None, [sge] * 4)
    assert v.ibv_post_srq_recv(srq, too_many, []) == errno.EINVAL
    assert v.ibv_get_srq_num(srq) == srq.srqn
    assert v.ibv_modify_srq(srq, v.ibv_srq_attr(srq_limit=2), v.IBV_SRQ_LIMIT) == 0
    assert v.ibv_query_srq(srq).srq_limit == 2
    assert v.ibv_destroy_srq(srq) == 0


def test_ibv_create_srq_ex_routes_basic_srqs_and_refuses_the_rest(res):
    p, ctx, _pd = res
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    basic = v.ibv_srq_init_attr_ex(attr=v.ibv_srq_attr(4, 1), pd=pd,
                                   comp_mask=v.IBV_SRQ_INIT_ATTR_PD)
    srq = v.ibv_create_srq_ex(ctx, basic)
    assert srq.srqn in fw(p.machine).srqs
    typed = v.ibv_srq_init_attr_ex(attr=v.ibv_srq_attr(4, 1), pd=pd, srq_type=v.IBV_SRQT_BASIC,
                                   cq=cq, comp_mask=v.IBV_SRQ_INIT_ATTR_PD
                                   | v.IBV_SRQ_INIT_ATTR_TYPE | v.IBV_SRQ_INIT_ATTR_CQ)
    assert v.ibv_create_srq_ex(ctx, typed).srqn in fw(p.machine).srqs   # the provider's op
    tm = v.ibv_srq_init_attr_ex(attr=v.ibv_srq_attr(4, 1), pd=pd, srq_type=v.IBV_SRQT_TM,
                                cq=cq, comp_mask=v.IBV_SRQ_INIT_ATTR_PD
                                | v.IBV_SRQ_INIT_ATTR_TYPE | v.IBV_SRQ_INIT_ATTR_CQ)
    assert errno_of(v.ibv_create_srq_ex, ctx, tm) == errno.EOPNOTSUPP


@pytest.mark.parametrize("value,err", [("HUGE", errno.ENOMEM), ("contig", errno.ENOSYS),
                                       ("PREFER_HUGE", 0), ("ALL", 0), ("bogus", 0)])
def test_the_srq_alloc_type_environment(res, value, err):
    p, ctx, _pd = res
    pd = v.ibv_alloc_pd(ctx)
    p.environ["MLX_SRQ_ALLOC_TYPE"] = value
    attr = v.ibv_srq_init_attr(attr=v.ibv_srq_attr(4, 1))
    assert errno_of(v.ibv_create_srq, pd, attr) == err


# -- firmware -------------------------------------------------------------------------------
def _fw_create(m, mpd, **fields: int) -> int:
    """CREATE_SRQ straight to the firmware with the PD's uid: the status."""
    f = fw(m)
    in_ = IfcStruct("create_srq_in", pas=4)
    MLX5_SET("create_srq_in", in_, "opcode", MLX5_CMD_OP_CREATE_SRQ)
    MLX5_SET("create_srq_in", in_, "uid", f.pds[mpd.pdn].uid)
    srqc = MLX5_ADDR_OF("create_srq_in", in_, "srq_context_entry")
    MLX5_SET64("srqc", srqc, "dbr_addr", fields.pop("dbr_addr", 0x1000))
    for k, val in {"log_srq_size": 4, "log_rq_stride": 1, "pd": mpd.pdn, **fields}.items():
        MLX5_SET("srqc", srqc, k, val)
    return f.execute(in_, IfcStruct("create_srq_out"))


@pytest.mark.parametrize("field,value", [("log_srq_size", -1), ("log_rq_stride", 7),
                                         ("lwm", 16), ("dbr_addr", 0x1002), ("xrcd", 1),
                                         ("pd", 0xFFFF), ("cqn", 0x7777),
                                         ("log_srq_size", 10)])     # PAS too short
def test_firmware_create_srq_checks(res, field, value):
    p, _ctx, pd = res
    if value == -1:                               # beyond the current log_max_srq_sz
        MLX5_SET("cmd_hca_cap", fw(p.machine).caps_cur[0], "log_max_srq_sz", 3)
        value = 4
    assert _fw_create(p.machine, pd, **{field: value}) != 0 and not fw(p.machine).srqs


def test_firmware_arm_and_destroy_busy(res):
    p, _ctx, pd = res
    assert _fw_create(p.machine, pd) == 0
    f = fw(p.machine)
    srqn = next(iter(f.srqs))
    uid = f.srqs[srqn].uid
    arm = IfcStruct("arm_rq_in")
    MLX5_SET("arm_rq_in", arm, "opcode", MLX5_CMD_OP_ARM_RQ)
    MLX5_SET("arm_rq_in", arm, "srq_number", srqn)
    MLX5_SET("arm_rq_in", arm, "lwm", 4)
    MLX5_SET("arm_rq_in", arm, "uid", uid)
    assert f.execute(arm, IfcStruct("arm_rq_out")) == MLX5_CMD_STAT_BAD_PARAM_ERR   # op_mod 0
    MLX5_SET("arm_rq_in", arm, "op_mod", 1)
    assert f.execute(arm, IfcStruct("arm_rq_out")) == 0 and f.srqs[srqn].srqc["lwm"] == 4
    MLX5_SET("arm_rq_in", arm, "lwm", 16)
    assert f.execute(arm, IfcStruct("arm_rq_out")) == MLX5_CMD_STAT_BAD_PARAM_ERR
    f.srqs[srqn].users += 1                          # as a QP naming it
    d = IfcStruct("destroy_srq_in")
    MLX5_SET("destroy_srq_in", d, "opcode", MLX5_CMD_OP_DESTROY_SRQ)
    MLX5_SET("destroy_srq_in", d, "srqn", srqn)
    MLX5_SET("destroy_srq_in", d, "uid", uid)
    assert f.execute(d, IfcStruct("destroy_srq_out")) == MLX5_CMD_STAT_RES_BUSY
    f.srqs[srqn].users -= 1
    assert f.execute(d, IfcStruct("destroy_srq_out")) == 0 and not f.srqs


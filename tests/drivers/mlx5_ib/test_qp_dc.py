"""Tests for the kernel and firmware side of Dynamically Connected QPs: mlx5_ib_create_qp
with IB_QPT_DRIVER (drivers/mlx5_ib/qp.py: process_vendor_flags' DC subtype, check_qp_attr,
create_dct), mlx5_ib_modify_dct / mlx5_ib_destroy_dct (drivers/mlx5_ib/qp_dc.py), the
extended MODIFY_QP that carries the DCT's number back (ib_uverbs_ex_modify_qp), and the
firmware's CREATE_DCT / DRAIN_DCT / DESTROY_DCT / QUERY_DCT (kernel_model/hw/mlx5_fw_dct.py).
The requests libmlx5 never sends are built by hand; every failure leaves the context as
it found it (`state`)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_CREATE_DCT,
    MLX5_CMD_OP_DRAIN_DCT,
    MLX5_CMD_STAT_BAD_OP_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_STATE_ERR,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import (
    MLX5_QP_FLAG_TYPE_DCI,
    MLX5_QP_FLAG_TYPE_DCT,
    mlx5_ib_create_qp,
    mlx5_ib_create_qp_resp,
)
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    errno_of,
    fw,
    host,
    ib_dev,
    last_error,
    open_ctx,
    qp_ucmd,
    state,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.verbs_types import IBV_QP_CREATE_PCI_WRITE_END_PADDING
from userspace.providers.mlx5 import dc, dv

KEY = 0x1234_5678_9ABC
DRIVER = 0xFF


def dc_res(ctx):
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    srq = v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(max_wr=4, max_sge=1)))
    return pd, cq, srq


def init_attr(pd, cq, srq, **kw) -> v.ibv_qp_init_attr_ex:
    return v.ibv_qp_init_attr_ex(qp_type=DRIVER, send_cq=cq, recv_cq=cq, srq=srq,
                                 cap=v.ibv_qp_cap(4, 0, 1, 0), comp_mask=v.IBV_QP_INIT_ATTR_PD,
                                 pd=pd, **kw)


def dv_attr(dc_type: int = dc.MLX5DV_DCTYPE_DCT) -> dc.mlx5dv_qp_init_attr:
    return dc.mlx5dv_qp_init_attr(comp_mask=dc.MLX5DV_QP_INIT_ATTR_MASK_DC,
                                  dc_init_attr=dc.mlx5dv_dc_init_attr(dc_type, KEY))


def gid(ctx) -> bytes:
    return v.ibv_query_gid(ctx, 1, 0)


def to_init(qp) -> None:
    attr = v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, port_num=1,
                         qp_access_flags=v.IBV_ACCESS_REMOTE_WRITE)
    assert v.ibv_modify_qp(qp, attr, v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT
                           | v.IBV_QP_ACCESS_FLAGS) == 0


def rtr_attr(ctx) -> v.ibv_qp_attr:
    return v.ibv_qp_attr(qp_state=v.IBV_QPS_RTR, path_mtu=3, min_rnr_timer=12,
                         ah_attr=v.ibv_ah_attr(grh=v.ibv_global_route(dgid=gid(ctx)),
                                               is_global=1, port_num=1))


RTR_MASK = v.IBV_QP_STATE | v.IBV_QP_AV | v.IBV_QP_PATH_MTU | v.IBV_QP_MIN_RNR_TIMER


@pytest.fixture
def dct_app(app):
    p, ctx = app
    pd, cq, srq = dc_res(ctx)
    return p, ctx, pd, cq, srq


def test_a_dct_lives_in_the_firmware_from_rtr_to_destroy(dct_app):
    p, ctx, pd, cq, srq = dct_app
    m = p.machine
    qp = dv.mlx5dv_create_qp(ctx, init_attr(pd, cq, srq), dv_attr())
    assert qp.qp_num == 0 and not fw(m).dcts
    to_init(qp)
    assert not fw(m).dcts                                   # still a mailbox only
    since = len(fw(m).cmd_log)
    assert v.ibv_modify_qp(qp, rtr_attr(ctx), RTR_MASK) == 0
    assert cmds(m, since) == ["CREATE_DCT"]
    dct = fw(m).dcts[qp.qp_num]
    assert (dct.dctc["dc_access_key"], dct.dctc["rwe"], dct.dctc["rre"], dct.dctc["cqn"],
            dct.dctc["user_index"]) == (KEY, 1, 0, cq.cqn, qp.uidx)
    # the PD is the SRQ's and the DCT's, the SRQ the DCT's
    assert (fw(m).pds[dct.dctc["pd"]].users, fw(m).srqs[dct.dctc["srqn_xrqn"]].users) == (2, 1)
    since = len(fw(m).cmd_log)
    assert v.ibv_destroy_qp(qp) == 0
    assert cmds(m, since) == ["DRAIN_DCT", "DESTROY_DCT"] and not fw(m).dcts


def test_a_dct_destroyed_before_rtr_never_reaches_the_firmware(dct_app):
    p, ctx, pd, cq, srq = dct_app
    qp = dv.mlx5dv_create_qp(ctx, init_attr(pd, cq, srq), dv_attr())
    to_init(qp)
    since = len(fw(p.machine).cmd_log)
    assert v.ibv_destroy_qp(qp) == 0
    assert cmds(p.machine, since) == []


def test_without_the_dct_cap_a_driver_qp_is_eopnotsupp():
    m = host(Mlx5Config(caps={"dct": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd, cq, srq = dc_res(ctx)
    before = state(p, ctx)
    assert errno_of(dv.mlx5dv_create_qp, ctx, init_attr(pd, cq, srq), dv_attr()) == \
        errno.EOPNOTSUPP
    assert "no DC support" in last_error(p) and state(p, ctx) == before
    p.exit(0)


def test_a_driver_qp_without_a_dc_subtype_is_einval(dct_app):
    p, ctx, pd, cq, _srq = dct_app
    before = state(p, ctx)
    req = uv.ib_uverbs_create_qp(pd_handle=pd.handle, send_cq_handle=cq.handle,
                                 recv_cq_handle=cq.handle, max_send_wr=4, max_send_sge=1,
                                 qp_type=DRIVER)
    with pytest.raises(c.VerbsError) as info:
        c.ibv_cmd_create_qp_ex(ctx, req, qp_ucmd(p, rq=0, uidx=1), mlx5_ib_create_qp_resp)
    assert info.value.errno == errno.EINVAL
    assert "without a DC subtype" in last_error(p) and state(p, ctx) == before


def test_a_dct_takes_no_create_flags(dct_app):
    p, ctx, pd, cq, srq = dct_app
    before = state(p, ctx)
    req = uv.ib_uverbs_create_qp(pd_handle=pd.handle, send_cq_handle=cq.handle,
                                 recv_cq_handle=cq.handle, srq_handle=srq.handle, is_srq=1,
                                 qp_type=DRIVER)
    attr = v.ibv_qp_init_attr_ex(comp_mask=v.IBV_QP_INIT_ATTR_CREATE_FLAGS,
                                 create_flags=IBV_QP_CREATE_PCI_WRITE_END_PADDING)
    with pytest.raises(c.VerbsError) as info:
        c.ibv_cmd_create_qp_ex2(ctx, attr, req, mlx5_ib_create_qp(
            flags=MLX5_QP_FLAG_TYPE_DCT, uidx=1, buf_addr=KEY), mlx5_ib_create_qp_resp)
    assert info.value.errno == errno.EINVAL
    assert "a DCT takes no create flags" in last_error(p) and state(p, ctx) == before


def test_both_dc_subtypes_at_once_are_einval(dct_app):
    p, ctx, pd, cq, srq = dct_app
    req = uv.ib_uverbs_create_qp(pd_handle=pd.handle, send_cq_handle=cq.handle,
                                 recv_cq_handle=cq.handle, srq_handle=srq.handle, is_srq=1,
                                 max_send_wr=4, max_send_sge=1, qp_type=DRIVER)
    with pytest.raises(c.VerbsError) as info:
        c.ibv_cmd_create_qp_ex(ctx, req, qp_ucmd(p, rq=0, uidx=1, flags=MLX5_QP_FLAG_TYPE_DCT
                                                 | MLX5_QP_FLAG_TYPE_DCI),
                               mlx5_ib_create_qp_resp)
    assert info.value.errno == errno.EINVAL


def test_the_legacy_modify_has_no_room_for_the_dctn(dct_app):
    p, ctx, pd, cq, srq = dct_app
    qp = dv.mlx5dv_create_qp(ctx, init_attr(pd, cq, srq), dv_attr())
    to_init(qp)
    assert errno_of(c.ibv_cmd_modify_qp, qp, rtr_attr(ctx), RTR_MASK) == errno.EINVAL
    assert "no room for the dctn" in last_error(p) and not fw(p.machine).dcts


def test_a_failed_create_dct_leaves_the_dct_in_init(dct_app):
    p, ctx, pd, cq, srq = dct_app
    qp = dv.mlx5dv_create_qp(ctx, init_attr(pd, cq, srq), dv_attr())
    to_init(qp)
    fw(p.machine).inject(MLX5_CMD_OP_CREATE_DCT, MLX5_CMD_STAT_BAD_PARAM_ERR)
    assert v.ibv_modify_qp(qp, rtr_attr(ctx), RTR_MASK) == errno.EINVAL
    assert not fw(p.machine).dcts and qp.qp_num == 0
    assert v.ibv_modify_qp(qp, rtr_attr(ctx), RTR_MASK) == 0     # then it works
    assert qp.qp_num in fw(p.machine).dcts


def test_a_dct_whose_drain_fails_stays_until_it_can_go(dct_app):
    p, ctx, pd, cq, srq = dct_app
    qp = dv.mlx5dv_create_qp(ctx, init_attr(pd, cq, srq), dv_attr())
    to_init(qp)
    assert v.ibv_modify_qp(qp, rtr_attr(ctx), RTR_MASK) == 0
    fw(p.machine).inject(MLX5_CMD_OP_DRAIN_DCT, MLX5_CMD_STAT_BAD_RES_STATE_ERR)
    assert v.ibv_destroy_qp(qp) == errno.EINVAL
    assert qp.qp_num in fw(p.machine).dcts
    assert any("failed to destroy DCT" in line for line in ib_dev(p.machine).mdev.log)
    assert v.ibv_destroy_qp(qp) == 0 and not fw(p.machine).dcts


def test_the_srq_of_a_dct_is_busy_in_the_firmware(dct_app):
    p, ctx, pd, cq, srq = dct_app
    qp = dv.mlx5dv_create_qp(ctx, init_attr(pd, cq, srq), dv_attr())
    to_init(qp)
    assert v.ibv_modify_qp(qp, rtr_attr(ctx), RTR_MASK) == 0
    f = fw(p.machine)
    in_ = IfcStruct("destroy_srq_in")
    MLX5_SET("destroy_srq_in", in_, "opcode", 0x701)
    MLX5_SET("destroy_srq_in", in_, "srqn", srq.srqn)
    MLX5_SET("destroy_srq_in", in_, "uid", f.srqs[srq.srqn].uid)
    assert f.execute(in_, IfcStruct("destroy_srq_out")) == MLX5_CMD_STAT_RES_BUSY
    assert v.ibv_destroy_qp(qp) == 0


# -- the firmware's own checks ----------------------------------------------------------------
def _create_dct(f, dctc_fields: dict, uid: int) -> tuple[int, IfcStruct]:
    in_, out = IfcStruct("create_dct_in"), IfcStruct("create_dct_out")
    MLX5_SET("create_dct_in", in_, "opcode", MLX5_CMD_OP_CREATE_DCT)
    MLX5_SET("create_dct_in", in_, "uid", uid)
    dctc = MLX5_ADDR_OF("create_dct_in", in_, "dct_context_entry")
    for k, val in dctc_fields.items():
        MLX5_SET("dctc", dctc, k, val)
    return f.execute(in_, out), out


def test_create_dct_checks_its_context(dct_app):
    p, ctx, pd, cq, srq = dct_app
    f = fw(p.machine)
    good = {"pd": pd.pdn, "cqn": cq.cqn, "srqn_xrqn": srq.srqn, "port": 1, "mtu": 3}
    uid = f.pds[pd.pdn].uid
    for bad in ({"srqn_xrqn": 0xFFFF}, {"pd": 0xFFFF}, {"cqn": 0xFFFF}, {"port": 2},
                {"mtu": 0}, {"my_addr_index": 200}):
        status, _out = _create_dct(f, {**good, **bad}, uid)
        assert status == MLX5_CMD_STAT_BAD_PARAM_ERR, bad
    assert not f.dcts
    status, out = _create_dct(f, good, uid)
    dctn = MLX5_GET("create_dct_out", out, "dctn")
    assert status == 0 and dctn in f.dcts and dctn not in f.qps
    drain = IfcStruct("drain_dct_in")
    MLX5_SET("drain_dct_in", drain, "opcode", MLX5_CMD_OP_DRAIN_DCT)
    MLX5_SET("drain_dct_in", drain, "dctn", dctn)
    MLX5_SET("drain_dct_in", drain, "uid", uid)
    assert f.execute(drain, IfcStruct("drain_dct_out")) == 0
    assert f.execute(drain, IfcStruct("drain_dct_out")) == MLX5_CMD_STAT_BAD_RES_STATE_ERR
    destroy = IfcStruct("destroy_dct_in")
    MLX5_SET("destroy_dct_in", destroy, "opcode", 0x711)
    MLX5_SET("destroy_dct_in", destroy, "dctn", dctn)
    MLX5_SET("destroy_dct_in", destroy, "uid", uid)
    assert f.execute(destroy, IfcStruct("destroy_dct_out")) == 0 and not f.dcts


def test_create_dct_needs_the_dct_cap():
    m = host(Mlx5Config(caps={"dct": 0}))
    status, _out = _create_dct(fw(m), {"port": 1, "mtu": 3}, 0)
    assert status == MLX5_CMD_STAT_BAD_OP_ERR

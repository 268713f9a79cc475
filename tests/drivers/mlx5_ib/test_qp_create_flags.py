"""Tests for QP create flags: the extended CREATE_QP write command (ib_uverbs_ex_create_qp
-> create_qp), libibverbs' ibv_cmd_create_qp_ex2 and mlx5_ib's process_create_flags,
with the QPC bits the flags set (block_lb_mc, end_padding_mode)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.hw.mlx5_ifc import MLX5_GET
from kernel_model.task import cred
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_qp, mlx5_ib_create_qp_resp
from tests.drivers.mlx5_ib.ladder import errno_of, fw, state
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_types as vt

CAP_NET_RAW = 13


@pytest.fixture
def res(app):
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)


def _attr(pd, cq, qp_type: int, flags: int) -> v.ibv_qp_init_attr_ex:
    return v.ibv_qp_init_attr_ex(
        qp_type=qp_type, send_cq=cq, recv_cq=cq, cap=v.ibv_qp_cap(4, 4, 1, 1, 0), pd=pd,
        comp_mask=v.IBV_QP_INIT_ATTR_PD | v.IBV_QP_INIT_ATTR_CREATE_FLAGS, create_flags=flags)


def _set_caps(p, caps: int) -> None:
    """A cred of the process's own with these effective capabilities."""
    p.task.cred = cred(p.task.cred.uid, caps)


def _fw_qpc(m, qpn: int):
    return fw(m).qps[qpn].qpc


@pytest.mark.parametrize("flag,field", [(vt.IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, "block_lb_mc"),
                                        (vt.IBV_QP_CREATE_PCI_WRITE_END_PADDING,
                                         "end_padding_mode")])
def test_a_supported_flag_reaches_the_qpc_through_the_extended_command(res, flag, field):
    p, ctx, pd, cq = res
    calls = []
    orig = c.execute_write_ex

    def spy(ctx_, command, *a, **kw):
        raw = orig(ctx_, command, *a, **kw)
        calls.append((command, raw))
        return raw

    c.execute_write_ex = spy
    try:
        qp = v.ibv_create_qp_ex(ctx, _attr(pd, cq, v.IBV_QPT_UD, flag))
    finally:
        c.execute_write_ex = orig
    [(command, raw)] = calls
    R = uv.ib_uverbs_ex_create_qp_resp
    resp = R.unpack(raw[:R.SIZE])
    assert command == uv.IB_USER_VERBS_EX_CMD_CREATE_QP
    assert resp.response_length == R.SIZE and resp.base.qpn == qp.qp_num
    assert MLX5_GET("qpc", _fw_qpc(p.machine, qp.qp_num), field) == 1
    assert v.ibv_destroy_qp(qp) == 0
    assert qp.qp_num not in fw(p.machine).qps


def test_without_flags_the_qpc_bits_stay_clear(res):
    p, ctx, pd, cq = res
    qp = v.ibv_create_qp_ex(ctx, _attr(pd, cq, v.IBV_QPT_UD, 0))
    qpc = _fw_qpc(p.machine, qp.qp_num)
    assert MLX5_GET("qpc", qpc, "block_lb_mc") == 0
    assert MLX5_GET("qpc", qpc, "end_padding_mode") == 0
    assert v.ibv_destroy_qp(qp) == 0


@pytest.mark.parametrize("qp_type,flag", [(v.IBV_QPT_RC, vt.IBV_QP_CREATE_SCATTER_FCS),
                                          (v.IBV_QPT_UD, vt.IBV_QP_CREATE_CVLAN_STRIPPING)])
def test_a_flag_the_qp_type_cannot_carry_is_eopnotsupp(res, qp_type, flag):
    """process_create_flags: SCATTER_FCS / CVLAN_STRIPPING are RAW_PACKET flags."""
    p, ctx, pd, cq = res
    before = state(p, ctx)
    assert errno_of(v.ibv_create_qp_ex, ctx, _attr(pd, cq, qp_type, flag)) == errno.EOPNOTSUPP
    assert state(p, ctx) == before


def test_source_qpn_on_an_ethernet_port_is_eopnotsupp(res):
    """SOURCE_QPN is a UD flag of IB ports only (the model's port is Ethernet)."""
    p, ctx, pd, cq = res
    attr = _attr(pd, cq, v.IBV_QPT_UD, vt.IBV_QP_CREATE_SOURCE_QPN)
    attr.source_qpn = 0x1234
    _set_caps(p, p.task.cred.cap_effective | 1 << CAP_NET_RAW)
    assert errno_of(v.ibv_create_qp_ex, ctx, attr) == errno.EOPNOTSUPP


def test_source_qpn_needs_cap_net_raw(res):
    p, ctx, pd, cq = res
    _set_caps(p, p.task.cred.cap_effective & ~(1 << CAP_NET_RAW))
    attr = _attr(pd, cq, v.IBV_QPT_UD, vt.IBV_QP_CREATE_SOURCE_QPN)
    assert errno_of(v.ibv_create_qp_ex, ctx, attr) == errno.EPERM


def test_libibverbs_refuses_a_flag_the_extended_command_cannot_carry(res):
    """ibv_cmd_create_qp_ex2: CREATE_QP_EX2_SUP_CREATE_FLAGS (bit 3 is kernel-only)."""
    p, ctx, pd, cq = res
    before = state(p, ctx)
    assert errno_of(v.ibv_create_qp_ex, ctx, _attr(pd, cq, v.IBV_QPT_UD, 1 << 3)) == errno.EINVAL
    assert state(p, ctx) == before


def _ex_req(pd, cq, **kw) -> uv.ib_uverbs_ex_create_qp:
    fields = dict(pd_handle=pd.handle, send_cq_handle=cq.handle, recv_cq_handle=cq.handle,
                  max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1,
                  qp_type=v.IBV_QPT_UD)
    fields.update(kw)
    return uv.ib_uverbs_ex_create_qp(**fields)


@pytest.mark.parametrize("kw,err", [
    ({"create_flags": 1 << 0}, errno.EINVAL),          # IPOIB_UD_LSO: kernel-only
    ({"create_flags": 1 << 12}, errno.EINVAL),         # unknown
    ({"comp_mask": 1 << 1}, errno.EINVAL),             # beyond IND_TABLE
    ({"reserved": 1}, errno.EINVAL),
    ({"comp_mask": uv.IB_UVERBS_CREATE_QP_MASK_IND_TABLE}, errno.EOPNOTSUPP),
])
def test_the_kernel_checks_the_extended_request(res, kw, err):
    p, ctx, pd, cq = res
    before = state(p, ctx)
    with pytest.raises(c.VerbsError) as e:
        c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_QP, _ex_req(pd, cq, **kw),
                           uv.ib_uverbs_ex_create_qp_resp.SIZE, "test", mlx5_ib_create_qp(),
                           mlx5_ib_create_qp_resp.SIZE)
    assert e.value.errno == err
    assert state(p, ctx) == before

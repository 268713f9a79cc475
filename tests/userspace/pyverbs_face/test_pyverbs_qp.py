"""userspace/pyverbs QP: QPInitAttr's cap properties, creation through
ibv_create_qp_ex (QPInitAttrEx on a Context or a PD) with libmlx5's comp_mask
checks, the capability RAW packet QPs need, and query_data_in_order."""

from __future__ import annotations

import errno
import os

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from kernel_model.hw.mlx5_ifc import MLX5_GET
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr, QPInitAttrEx

CAP_NET_RAW = 13


def fw_qps() -> int:
    return len(host.host().machine.hcas[0].fw.qps)


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 100)
    yield ctx, pd, cq
    ctx.close()


def test_qp_init_attr_max_properties_read_and_write_the_cap():
    qia = QPInitAttr(cap=QPCap(4, 8, 1, 2, 0))
    assert (qia.max_send_wr, qia.max_recv_wr, qia.max_send_sge, qia.max_recv_sge) == (4, 8, 1, 2)
    qia.max_send_wr, qia.max_recv_sge, qia.max_inline_data = 7, 3, 64
    assert (qia.cap.max_send_wr, qia.cap.max_recv_sge, qia.cap.max_inline_data) == (7, 3, 64)


@pytest.mark.parametrize("field,value", [("max_send_wr", 0xFFFFFFFF), ("max_recv_wr", 0xFFFFFFFF),
                                         ("max_send_sge", 0xFFFF), ("max_recv_sge", 0xFFFF)])
def test_a_cap_above_the_device_limits_set_on_the_init_attr_is_einval(res, field, value):
    ctx, pd, cq = res
    qia = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq)
    setattr(qia, field, value)
    before = fw_qps()
    with pytest.raises(PyverbsRDMAError) as ei:
        QP(pd, qia, QPAttr())
    assert ei.value.error_code == errno.EINVAL
    assert fw_qps() == before


@pytest.mark.parametrize("qpt,state", [(e.IBV_QPT_RC, e.IBV_QPS_INIT),
                                       (e.IBV_QPT_UC, e.IBV_QPS_INIT),
                                       (e.IBV_QPT_UD, e.IBV_QPS_RTS)])
def test_a_qp_on_a_context_with_an_extended_attr_is_created_and_moved(res, qpt, state):
    ctx, pd, cq = res
    cap = QPCap(5, 6, 1, 1)
    qia = QPInitAttrEx(qp_type=qpt, scq=cq, rcq=cq, cap=cap, pd=pd,
                       comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_CREATE_FLAGS)
    qp = QP(ctx, qia)
    assert qp.qp_state == e.IBV_QPS_RESET and qp.qp_num in host.host().machine.hcas[0].fw.qps
    attr, init = qp.query(e.IBV_QP_STATE | e.IBV_QP_CAP)
    assert attr.qp_state == e.IBV_QPS_RESET
    assert init.cap.max_send_wr >= 5 and init.cap.max_recv_wr >= 6
    qp2 = QP(ctx, QPInitAttrEx(qp_type=qpt, scq=cq, rcq=cq, pd=pd,
                               comp_mask=e.IBV_QP_INIT_ATTR_PD), QPAttr())
    assert qp2.qp_state == state
    pd.close()  # the PD closes the QPs made on the Context with it
    assert fw_qps() == 0


def test_a_pd_creator_with_an_extended_attr_names_the_pd(res):
    ctx, pd, cq = res
    qia = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq)
    qp = QP(pd, qia)
    assert qia.pd is pd and qia.comp_mask & e.IBV_QP_INIT_ATTR_PD
    assert qp.qp_state == e.IBV_QPS_RESET


@pytest.mark.parametrize("comp_mask,flags,err", [
    (1 << 7, 0, errno.EINVAL),                                   # unknown to libmlx5
    (e.IBV_QP_INIT_ATTR_CREATE_FLAGS, 0, errno.EINVAL),          # no PD
    (e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_RX_HASH, 0, errno.EOPNOTSUPP),  # RSS
    (e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_CREATE_FLAGS,
     e.IBV_QP_CREATE_SCATTER_FCS, errno.EOPNOTSUPP),    # mlx5_ib: a RAW_PACKET flag
    (e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_MAX_TSO_HEADER, 0, errno.EINVAL),  # not RAW
])
def test_create_qp_ex_refuses_what_libmlx5_or_the_model_cannot_do(res, comp_mask, flags, err):
    ctx, pd, cq = res
    qia = QPInitAttrEx(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, comp_mask=comp_mask,
                       create_flags=flags, max_tso_header=64)
    qia.pd = pd if comp_mask & e.IBV_QP_INIT_ATTR_PD else None
    with pytest.raises(PyverbsRDMAError, match="Failed to create QP") as ei:
        QP(ctx, qia)
    assert ei.value.error_code == err
    assert fw_qps() == 0


def test_create_flags_travel_in_the_extended_command(res):
    """BLOCK_SELF_MCAST_LB on a UD QP: ibv_cmd_create_qp_ex2, the QPC's block_lb_mc."""
    ctx, pd, cq = res
    qia = QPInitAttrEx(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, pd=pd,
                       comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_CREATE_FLAGS,
                       create_flags=e.IBV_QP_CREATE_BLOCK_SELF_MCAST_LB)
    qp = QP(ctx, qia)
    fw_qp = host.host().machine.hcas[0].fw.qps[qp.qp_num]
    assert MLX5_GET("qpc", fw_qp.qpc, "block_lb_mc") == 1
    qp.close()
    assert fw_qps() == 0


def test_a_qp_on_a_context_needs_an_extended_attr(res):
    ctx, _pd, cq = res
    with pytest.raises(PyverbsUserError):
        QP(ctx, QPInitAttr(scq=cq, rcq=cq))


def test_query_data_in_order_is_not_guaranteed_without_the_provider_op(res):
    ctx, pd, cq = res
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq), QPAttr())
    assert qp.query_data_in_order(e.IBV_WR_SEND) == 0
    qp.close()
    with pytest.raises(PyverbsUserError):
        qp.query_data_in_order(e.IBV_WR_SEND)


@pytest.mark.parametrize("euid", [0, 1000])
def test_root_holds_cap_net_raw_which_a_raw_packet_qp_needs(monkeypatch, euid):
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    ctx = d.Context(name="mlx5_0")
    caps = host.current_process().task.cred.cap_effective
    assert bool(caps >> CAP_NET_RAW & 1) == (euid == 0)
    pd, cq = PD(ctx), CQ(ctx, 8)
    attr = QPInitAttr(qp_type=e.IBV_QPT_RAW_PACKET, scq=cq, rcq=cq)
    if euid == 0:       # with the capability mlx5_ib makes it (see test_pyverbs_raw_qp.py)
        assert QP(pd, attr).qp_type == e.IBV_QPT_RAW_PACKET
    else:               # without it the core refuses
        with pytest.raises(PyverbsRDMAError) as ei:
            QP(pd, attr)
        assert ei.value.error_code == errno.EPERM
    ctx.close()

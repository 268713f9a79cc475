"""userspace/pyverbs RAW_PACKET QPs: QPInitAttr / QPInitAttrEx with IBV_QPT_RAW_PACKET on
a PD or a Context, with and without a QPAttr (RESET, or moved to RTS), query, the flow
steering that receiving would need (Flow: EOPNOTSUPP), and the WQs and indirection
table of an RSS QP (which is not emulated)."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.flow import Flow, FlowAttr
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from userspace.pyverbs.wq import (
    WQ,
    RwqIndTable,
    RwqIndTableInitAttr,
    RxHashConf,
    WQAttr,
    WQInitAttr,
)


def fw():
    return host.host().machine.hcas[0].fw


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 100)
    yield ctx, pd, cq
    ctx.close()


def _init_attr(cq, ex: bool, pd=None):
    cap = QPCap(8, 8, 1, 1, 0)
    if ex:
        return QPInitAttrEx(qp_type=e.IBV_QPT_RAW_PACKET, scq=cq, rcq=cq, cap=cap, pd=pd,
                            comp_mask=e.IBV_QP_INIT_ATTR_PD)
    return QPInitAttr(qp_type=e.IBV_QPT_RAW_PACKET, scq=cq, rcq=cq, cap=cap)


@pytest.mark.parametrize("ex", [False, True])
@pytest.mark.parametrize("with_attr,state", [(False, e.IBV_QPS_RESET), (True, e.IBV_QPS_RTS)])
def test_a_raw_packet_qp_is_created_and_moved(res, ex, with_attr, state):
    """As rdma-core's test_create_raw_qp_*: RESET without a QPAttr, RTS with one."""
    ctx, pd, cq = res
    creator = ctx if ex else pd
    qp = QP(creator, _init_attr(cq, ex, pd), QPAttr(port_num=1) if with_attr else None)
    assert qp.qp_type == e.IBV_QPT_RAW_PACKET and qp.qp_state == state
    f = fw()
    assert qp.qp_num in f.sqs and qp.qp_num not in f.qps
    sq = f.sqs[qp.qp_num]
    [rq] = f.rqs.values()
    assert (sq.state, rq.state) == ((1, 1) if with_attr else (0, 0))
    attr, init_attr = qp.query(e.IBV_QP_STATE | e.IBV_QP_CAP)
    assert attr.qp_state == state and init_attr.cap.max_send_wr >= 8
    assert init_attr.cap.max_recv_wr >= 8
    qp.close()
    assert not (f.sqs or f.rqs or f.tises or f.tirs)


def test_an_error_state_is_both_queues_in_error(res):
    ctx, pd, cq = res
    qp = QP(pd, _init_attr(cq, False), QPAttr(port_num=1))
    qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
    f = fw()
    assert f.sqs[qp.qp_num].state == 3 and next(iter(f.rqs.values())).state == 3
    assert qp.query(e.IBV_QP_STATE)[0].qp_state == e.IBV_QPS_ERR


def test_flow_steering_is_not_emulated(res):
    """Receiving on a raw packet QP needs a flow rule (ibv_create_flow): EOPNOTSUPP, which
    rdma-core's traffic tests report as a skip ('Flow creation is not supported')."""
    ctx, pd, cq = res
    qp = QP(pd, _init_attr(cq, False), QPAttr(port_num=1))
    attr = FlowAttr(num_of_specs=0, port=1)
    attr.specs.append(object())
    assert attr.type == 0 and len(attr.specs) == 1
    with pytest.raises(PyverbsRDMAError) as ei:
        Flow(qp, attr)
    assert ei.value.error_code == errno.EOPNOTSUPP


def test_wqs_and_an_indirection_table_then_rss_is_not_emulated(res):
    """As rdma-core's test_rss_traffic: four WQs made ready, a table of them; the RSS QP
    on it is refused (EOPNOTSUPP: the suite skips 'Create QPEx type 8')."""
    ctx, pd, cq = res
    wqs = []
    for _ in range(4):
        wq = WQ(ctx, WQInitAttr(wq_pd=pd, wq_cq=cq, wq_type=e.IBV_WQT_RQ, max_wr=8,
                                max_sge=1))
        wq.modify(WQAttr(attr_mask=e.IBV_WQ_ATTR_STATE, wq_state=e.IBV_WQS_RDY))
        wqs.append(wq)
    f = fw()
    assert all(f.rqs[wq.wqn].state == 1 for wq in wqs)
    tbl = RwqIndTable(ctx, RwqIndTableInitAttr(2, wqs))
    assert tbl.wqs == wqs and len(f.rqts) == 1
    mask = e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_RX_HASH | e.IBV_QP_INIT_ATTR_IND_TABLE
    with pytest.raises(PyverbsRDMAError) as ei:
        QPEx(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RAW_PACKET, comp_mask=mask, pd=pd,
                               hash_conf=RxHashConf(), ind_table=tbl))
    assert ei.value.error_code == errno.EOPNOTSUPP
    with pytest.raises(PyverbsRDMAError) as ei:
        wqs[0].post_recv(None)
    assert ei.value.error_code == errno.EOPNOTSUPP
    wqs[1].close()                   # closes the table naming it first
    assert not f.rqts and wqs[1].wqn not in f.rqs
    ctx.close()                      # and the rest
    assert not f.rqs

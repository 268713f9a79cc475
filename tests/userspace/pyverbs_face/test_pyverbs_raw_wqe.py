"""userspace/pyverbs Mlx5QP.wr_raw_wqe: an RC QP created with MLX5DV_QP_EX_WITH_RAW_WQE
posts a WQE the caller built (WqeCtrlSeg, WqeDataSeg) as it is - libmlx5's
mlx5_wr_raw_wqe only gives it the queue's WQE index - and its completion reads as
IBV_WC_DRIVER2 (cq.c / cq_ext.c), on the old and the extended poll."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.enums as e
import userspace.pyverbs.providers.mlx5.mlx5_enums as dve
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ, CQEX, CqInitAttrEx, PollCqAttr
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.providers.mlx5.mlx5dv import (
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5DVQPInitAttr,
    Mlx5QP,
    Wqe,
    WqeCtrlSeg,
    WqeDataSeg,
)
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QPAttr, QPCap, QPInitAttrEx
from userspace.pyverbs.wr import SGE, RecvWR

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


def rc(ctx, pd, cq, dv_ops: int = dve.MLX5DV_QP_EX_WITH_RAW_WQE) -> Mlx5QP:
    attr = QPInitAttrEx(qp_type=e.IBV_QPT_RC, pd=pd, scq=cq, rcq=cq, cap=QPCap(2, 4, 2, 2),
                        send_ops_flags=e.IBV_QP_EX_WITH_SEND,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
    mask = dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS if dv_ops else 0
    return Mlx5QP(ctx, attr, Mlx5DVQPInitAttr(comp_mask=mask, send_ops_flags=dv_ops))


def connect(qp, peer, gid) -> None:
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = peer.qp_num, 0, 0
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 12
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1)
    qp.to_rts(attr)


@pytest.fixture
def pair():
    ctx = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
    pd = PD(ctx)
    cqa = CQEX(ctx, CqInitAttrEx(cqe=16))
    cqb = CQ(ctx, 16)
    mr = MR(pd, 4096, ACCESS)
    a, b = rc(ctx, pd, cqa), rc(ctx, pd, cqb, 0)
    gid = ctx.query_gid(1, 0)
    connect(a, b, gid)
    connect(b, a, gid)
    yield ctx, a, b, cqa, cqb, mr
    ctx.close()


def raw_send(qp, mr, offset: int, length: int) -> Wqe:
    ctrl = WqeCtrlSeg()
    ctrl.fm_ce_se = dve.MLX5_WQE_CTRL_CQ_UPDATE
    ctrl.opmod_idx_opcode = dve.MLX5_OPCODE_SEND
    ctrl.qpn_ds = 2 | qp.qp_num << 8
    return Wqe([ctrl, WqeDataSeg(length, mr.lkey, mr.buf + offset)])


def ex_poll(cq) -> tuple[int, int]:
    for _ in range(10000):
        if cq.start_poll(PollCqAttr()) == errno.ENOENT:
            continue
        got = (cq.wr_id, cq.status)
        cq.end_poll()
        return got
    raise AssertionError("no completion")


def test_a_raw_send_wqe_is_sent_as_built_and_completes_as_driver2(pair):
    _ctx, a, b, cqa, cqb, mr = pair
    mr.write(b"raw!", 4)
    b.post_recv(RecvWR(wr_id=9, sg=[SGE(mr.buf + 2048, 64, mr.lkey)], num_sge=1))
    wqe = raw_send(a, mr, 0, 4)
    for _ in range(3):                    # the 2-WQE queue wraps: the index is the queue's
        a.wr_start()
        a.wr_id = 0x51
        a.wr_raw_wqe(wqe)
        a.wr_complete()
        assert ex_poll(cqa) == (0x51, e.IBV_WC_SUCCESS)
        assert cqa.read_opcode() == e.IBV_WC_DRIVER2       # after end_poll, as in C
        wc = cqb.poll(1)[1]
        while not wc:
            wc = cqb.poll(1)[1]
        assert (wc[0].opcode, wc[0].byte_len) == (e.IBV_WC_RECV, 4)
        b.post_recv(RecvWR(wr_id=9, sg=[SGE(mr.buf + 2048, 64, mr.lkey)], num_sge=1))
    assert mr.read(4, 2048) == b"raw!"
    a.wr_start()                           # a regular WQE in between reads as a SEND
    a.wr_flags = e.IBV_SEND_SIGNALED
    a.wr_send()
    a.wr_set_sge(SGE(mr.buf, 4, mr.lkey))
    a.wr_complete()
    ex_poll(cqa)
    assert cqa.read_opcode() == e.IBV_WC_SEND


def test_a_full_queue_fails_the_batch_with_enomem(pair):
    _ctx, a, _b, _cqa, _cqb, mr = pair
    a.wr_start()
    for _ in range(3):
        a.wr_raw_wqe(raw_send(a, mr, 0, 4))
    with pytest.raises(PyverbsRDMAError) as info:
        a.wr_complete()
    assert info.value.error_code == errno.ENOMEM


def test_raw_wqes_need_the_dv_send_op(pair):
    ctx, _a, b, _cqa, _cqb, mr = pair
    b.wr_start()
    with pytest.raises(PyverbsRDMAError) as info:
        b.wr_raw_wqe(raw_send(b, mr, 0, 4))
    assert info.value.error_code == errno.EOPNOTSUPP
    b.wr_abort()
    with pytest.raises(PyverbsRDMAError) as info:   # a dv op libmlx5 does not know
        rc(ctx, b.pd, CQ(ctx, 4), 1 << 9)
    assert info.value.error_code == errno.EOPNOTSUPP

"""userspace/pyverbs SRQ: SrqAttr / SrqInitAttr / SrqInitAttrEx, creation on a PD or a
Context, sends arriving through the SRQ to two QPs, the limit, query, modify errors,
and the order closing keeps (the QPs before their SRQ)."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr, SrqInitAttrEx
from userspace.pyverbs.wr import SGE, RecvWR, SendWR


def fw():
    return host.host().machine.hcas[0].fw


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 64, None, None, 0)
    yield ctx, pd, cq
    ctx.close()


def _connect(ctx: d.Context, a: QP, b: QP) -> None:
    gid = ctx.query_gid(1, 0)
    for me, peer in ((a, b), (b, a)):
        attr = QPAttr()
        attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
        me.to_rts(attr)


def _poll(cq: CQ, n: int) -> list:
    wcs: list = []
    for _ in range(20_000):
        wcs += cq.poll(n - len(wcs))[1]
        if len(wcs) == n:
            break
    return wcs


def test_attrs_carry_pyverbs_defaults_and_fields():
    a = SrqAttr()
    assert (a.max_wr, a.max_sge, a.srq_limit) == (100, 1, 0)
    init = SrqInitAttr(SrqAttr(max_wr=8, max_sge=2, srq_limit=3))
    assert (init.max_wr, init.max_sge, init.srq_limit) == (8, 2, 3)
    assert (SrqInitAttr().max_wr, SrqInitAttr().max_sge) == (0, 0)
    ex = SrqInitAttrEx(max_wr=16)
    ex.srq_type, ex.comp_mask = e.IBV_SRQT_BASIC, e.IBV_SRQ_INIT_ATTR_TYPE
    assert (ex.max_wr, ex.max_sge, ex.srq_type, ex.pd, ex.cq) == (16, 1, 0, None, None)


def test_an_srq_is_created_sized_and_queried(res):
    ctx, pd, cq = res
    init = SrqInitAttr(SrqAttr(max_wr=100, max_sge=2))
    srq = SRQ(pd, init)
    # libmlx5: 128 WQEs (one is the free list's tail), the answer less the wrap WQE
    assert init.max_wr == 126 and init.max_sge == 3
    srqn = srq.get_srq_num()
    assert srqn in fw().srqs and fw().srqs[srqn].srqc["log_srq_size"] == 7
    q = srq.query()
    assert (q.max_wr, q.max_sge, q.srq_limit) == (127, 3, 0)
    srq.modify(SrqAttr(srq_limit=10), e.IBV_SRQ_LIMIT)
    assert srq.query().srq_limit == 10
    srq.close()
    assert srqn not in fw().srqs


def test_an_srq_on_a_context_takes_the_extended_attr(res):
    ctx, pd, cq = res
    ex = SrqInitAttrEx(max_wr=10)
    ex.pd, ex.comp_mask = pd, e.IBV_SRQ_INIT_ATTR_PD | e.IBV_SRQ_INIT_ATTR_TYPE
    srq = SRQ(ctx, ex)
    assert srq.get_srq_num() in fw().srqs
    pd.close()                                 # the PD closes the SRQ made on the Context
    assert not fw().srqs


@pytest.mark.parametrize("mask,attr,err", [
    (e.IBV_SRQ_MAX_WR, SrqAttr(max_wr=200), errno.EINVAL),      # mlx5: no resizing
    (e.IBV_SRQ_LIMIT, SrqAttr(srq_limit=16), errno.EINVAL),     # at the ring's size
    (1 << 2, SrqAttr(), errno.EINVAL),                          # beyond IB_SRQ_LIMIT
])
def test_modify_refuses_what_mlx5_cannot_do(res, mask, attr, err):
    ctx, pd, cq = res
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8)))
    with pytest.raises(PyverbsRDMAError, match="Failed to modify SRQ") as ei:
        srq.modify(attr, mask)
    assert ei.value.error_code == err


@pytest.mark.parametrize("attr,err", [
    (SrqAttr(max_wr=1 << 20), errno.EINVAL),             # beyond max_srq_recv_wr
    (SrqAttr(max_sge=1000), errno.EINVAL),               # beyond a receive WQE
])
def test_create_refuses_sizes_beyond_the_device(res, attr, err):
    ctx, pd, cq = res
    with pytest.raises(PyverbsRDMAError, match="Failed to create SRQ") as ei:
        SRQ(pd, SrqInitAttr(attr))
    assert ei.value.error_code == err and not fw().srqs


def test_a_tag_matching_srq_is_not_emulated(res):
    ctx, pd, cq = res
    ex = SrqInitAttrEx(max_wr=10)
    ex.pd, ex.cq, ex.srq_type = pd, cq, e.IBV_SRQT_TM
    ex.comp_mask = e.IBV_SRQ_INIT_ATTR_PD | e.IBV_SRQ_INIT_ATTR_TYPE | e.IBV_SRQ_INIT_ATTR_CQ
    with pytest.raises(PyverbsRDMAError) as ei:
        SRQ(ctx, ex)
    assert ei.value.error_code == errno.EOPNOTSUPP


def test_sends_to_two_qps_arrive_through_one_srq(res):
    ctx, pd, cq = res
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=QPCap(4, 0))
    recv = [QP(pd, init, QPAttr()) for _ in range(2)]
    send = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 1)),
               QPAttr()) for _ in range(2)]
    for s, r in zip(send, recv, strict=True):
        _connect(ctx, s, r)
    assert fw().qps[recv[0].qp_num].qpc["rq_type"] == 1          # MLX5_SRQ_RQ
    dst = MR(pd, 4 * 64, e.IBV_ACCESS_LOCAL_WRITE)
    src = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    for i in range(4):
        srq.post_recv(RecvWR(wr_id=100 + i, num_sge=1, sg=[SGE(dst.buf + 64 * i, 64, dst.lkey)]))
    got = {}
    for n, text in enumerate((b"to the first QP", b"to the second QP", b"first again")):
        src.write(text, len(text))
        send[n % 2].post_send(SendWR(wr_id=n, num_sge=1, sg=[SGE(src.buf, len(text), src.lkey)]))
        wcs = _poll(cq, 2)
        assert all(w.status == e.IBV_WC_SUCCESS for w in wcs), wcs
        rwc = next(w for w in wcs if w.opcode == e.IBV_WC_RECV)
        assert rwc.qp_num == recv[n % 2].qp_num and rwc.byte_len == len(text)
        got[rwc.wr_id] = dst.read(len(text), 64 * (rwc.wr_id - 100))
    assert got == {100: b"to the first QP", 101: b"to the second QP", 102: b"first again"}


def test_the_limit_fires_once_and_disarms(res):
    ctx, pd, cq = res
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8)))
    a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 1)), QPAttr())
    b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=QPCap(1, 0)),
           QPAttr())
    _connect(ctx, a, b)
    mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    for i in range(3):
        srq.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    srq.modify(SrqAttr(srq_limit=2), e.IBV_SRQ_LIMIT)
    events = host.host().machine.hcas[0].async_events
    srqn = srq.get_srq_num()
    a.post_send(SendWR(wr_id=9, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)]))
    _poll(cq, 2)
    assert ("srq_limit", srqn) not in events and srq.query().srq_limit == 2   # 2 left
    a.post_send(SendWR(wr_id=10, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)]))
    _poll(cq, 2)
    assert events.count(("srq_limit", srqn)) == 1 and srq.query().srq_limit == 0


def test_an_srq_in_use_cannot_be_destroyed_and_closes_after_its_qps(res):
    from userspace.libibverbs import verbs as v
    ctx, pd, cq = res
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4)))
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq))
    assert v.ibv_destroy_srq(srq.srq) == errno.EBUSY
    srq.close()                                      # closes the QP first
    assert qp._closed and not fw().srqs and not fw().qps

"""userspace/pyverbs async events: Context.get_async_event() -> AsyncEvent (event_type,
ack(), str()), translate_event_type, rdma-core's test_modify_srq_limit flow on real
traffic (the HCA's limit EQE through mlx5_core, mlx5_ib and uverbs), and the errors:
a read nothing will answer, an SRQ closed with its event unacknowledged."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from tests.userspace.pyverbs_face.test_pyverbs_srq import _connect, _poll
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from userspace.pyverbs.wr import SGE, RecvWR, SendWR


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 64, None, None, 0)
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=16)))
    a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 1)), QPAttr())
    b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=QPCap(1, 0)),
           QPAttr())
    _connect(ctx, a, b)
    mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    yield ctx, cq, srq, a, mr
    ctx.close()


def _consume(res, n: int) -> None:
    ctx, cq, srq, a, mr = res
    for i in range(n):
        a.post_send(SendWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)]))
        assert len(_poll(cq, 2)) == 2


def test_the_srq_limit_reaches_the_context_as_an_async_event(res):
    ctx, cq, srq, a, mr = res
    for i in range(10):
        srq.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    srq.modify(SrqAttr(srq_limit=7), e.IBV_SRQ_LIMIT)
    assert srq.query().srq_limit == 7
    _consume(res, 3)                                 # 7 left: not below the limit
    assert srq.query().srq_limit == 7
    _consume(res, 1)                                 # 6 left: fires, disarms
    assert srq.query().srq_limit == 0
    event = ctx.get_async_event()
    assert isinstance(event, d.AsyncEvent)
    assert event.event_type == e.IBV_EVENT_SRQ_LIMIT_REACHED
    assert event.event.element is srq.srq
    assert str(event) == f"{'Event Type':<24}: {'IBV_EVENT_SRQ_LIMIT_REACHED':<20}\n"
    event.ack()
    assert srq.srq.events_completed == 1
    srq.close()                                      # (its QP first) - acknowledged: fine


def test_an_srq_closed_with_its_event_unacknowledged_fails_edeadlk(res):
    ctx, cq, srq, a, mr = res
    for i in range(2):
        srq.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    srq.modify(SrqAttr(srq_limit=2), e.IBV_SRQ_LIMIT)
    _consume(res, 1)
    assert ctx.get_async_event().event_type == e.IBV_EVENT_SRQ_LIMIT_REACHED
    with pytest.raises(PyverbsRDMAError) as ex:
        srq.close()
    assert ex.value.error_code == errno.EDEADLK and "Failed to destroy SRQ" in str(ex.value)


def test_a_wait_nothing_will_end_fails_as_the_read_did():
    with d.Context(name="mlx5_0") as ctx:
        with pytest.raises(PyverbsRDMAError) as ex:
            ctx.get_async_event()
        assert ex.value.error_code == errno.EINTR
        assert "Failed to get async event" in str(ex.value)


def test_async_event_struct_and_translations():
    ev = d.AsyncEvent(e.IBV_EVENT_PORT_ACTIVE)
    assert ev.event_type == e.IBV_EVENT_PORT_ACTIVE
    ev.ack()                                         # a port event: nothing to count
    assert d.AsyncEvent().event_type == e.IBV_EVENT_CQ_ERR
    assert d.translate_event_type(e.IBV_EVENT_SRQ_ERR) == "IBV_EVENT_SRQ_ERR"
    assert d.translate_event_type(e.IBV_EVENT_QP_LAST_WQE_REACHED) == \
        ".IBV_EVENT_QP_LAST_WQE_REACHED"
    assert d.translate_event_type(99) == "Unknown event_type (99)"

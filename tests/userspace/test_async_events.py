"""libibverbs' async event verbs (userspace/libibverbs/verbs_async.py): ibv_get_async_event
turns the kernel's descriptor back into the SRQ, QP or CQ (or a port number),
ibv_ack_async_event counts it, the destroy verbs wait for the count - EDEADLK where
libibverbs would hang - and a failed read is the read's errno.  QP and CQ events are
raised here at uverbs' event handlers (no device model raises them yet)."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.ib_verbs import IB_EVENT_CQ_ERR, IB_EVENT_QP_FATAL, ib_event
from drivers.ib_core.uverbs_std_types_async_fd import (
    ib_uverbs_cq_event_handler,
    ib_uverbs_qp_event_handler,
)
from kernel_model.fs import O_NONBLOCK
from kernel_model.hw.mlx5_engine import EQE_RSC_SRQ, EQE_TYPE_SRQ_RQ_LIMIT
from tests.drivers.mlx5_ib.ladder import fw, host, kqp, open_ctx, rc_qp
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_async as va
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_cq import _handle_table


@pytest.fixture
def rig():
    m = host()
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd = v.ibv_alloc_pd(ctx)
    srq = v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(8, 1)))
    yield m, p, ctx, pd, srq
    if p.alive:
        p.exit(0)


def limit(m, srq) -> None:
    with m.kernel():
        assert m.hcas[0].engine.hca_async_eqe(EQE_TYPE_SRQ_RQ_LIMIT, EQE_RSC_SRQ, srq.srqn)


def test_the_event_names_the_srq_and_its_ack_lets_destroy_go(rig):
    m, p, ctx, pd, srq = rig
    limit(m, srq)
    ev = va.ibv_get_async_event(ctx)
    assert ev.element is srq and ev.event_type == va.IBV_EVENT_SRQ_LIMIT_REACHED
    assert srq.events_completed == 0
    va.ibv_ack_async_event(ev)
    assert srq.events_completed == 1
    assert v.ibv_destroy_srq(srq) == 0 and not fw(m).srqs
    assert v.ibv_dealloc_pd(pd) == 0


def test_destroy_with_an_unacknowledged_event_is_edeadlk(rig):
    m, p, ctx, pd, srq = rig
    limit(m, srq)
    va.ibv_get_async_event(ctx)
    assert v.ibv_destroy_srq(srq) == errno.EDEADLK   # a lone thread would wait forever
    assert not fw(m).srqs                            # the SRQ itself is gone
    assert v.ibv_dealloc_pd(pd) == 0


def test_an_unread_event_is_not_waited_for(rig):
    m, p, ctx, pd, srq = rig
    limit(m, srq)
    assert v.ibv_destroy_srq(srq) == 0               # never reported: nothing to ack


def test_a_failed_read_is_its_errno(rig):
    m, p, ctx, pd, srq = rig
    p.task.files.fdt[ctx.async_fd].f_flags |= O_NONBLOCK
    with pytest.raises(VerbsError) as ex:
        va.ibv_get_async_event(ctx)
    assert ex.value.errno == errno.EAGAIN


def test_an_event_of_an_object_the_library_lost_is_einval(rig):
    m, p, ctx, pd, srq = rig
    limit(m, srq)
    handles = _handle_table(p)[1]
    uh = next(k for k, o in handles.items() if o is srq)
    del handles[uh]
    with pytest.raises(VerbsError) as ex:
        va.ibv_get_async_event(ctx)
    assert ex.value.errno == errno.EINVAL
    handles[uh] = srq


def test_device_fatal_carries_a_port_number_and_needs_no_ack(rig):
    m, p, ctx, pd, srq = rig
    m.unload_module("mlx5_ib")
    ev = va.ibv_get_async_event(ctx)
    assert (ev.element, ev.event_type) == (0, va.IBV_EVENT_DEVICE_FATAL)
    va.ibv_ack_async_event(ev)                       # nothing to count
    assert srq.events_completed == 0


def raise_at(m, handler, obj, event: int) -> None:
    """A driver reports an async event for the kernel object (ib_event -> its handler)."""
    with m.kernel():
        handler(ib_event(obj.device, event, obj), None)


def test_a_qp_event_names_the_qp_and_destroy_waits_for_its_ack(rig):
    m, p, ctx, pd, srq = rig
    cq = v.ibv_create_cq(ctx, 16)
    a, b = rc_qp(ctx, pd, cq), rc_qp(ctx, pd, cq)
    raise_at(m, ib_uverbs_qp_event_handler, kqp(p, ctx, a), IB_EVENT_QP_FATAL)
    raise_at(m, ib_uverbs_qp_event_handler, kqp(p, ctx, b), IB_EVENT_QP_FATAL)
    ev = va.ibv_get_async_event(ctx)
    assert (ev.element, ev.event_type) == (a, va.IBV_EVENT_QP_FATAL)
    va.ibv_ack_async_event(ev)
    assert a.events_completed == 1 and v.ibv_destroy_qp(a) == 0
    assert va.ibv_get_async_event(ctx).element is b          # read, never acknowledged
    n = len(fw(m).qps)
    assert v.ibv_destroy_qp(b) == errno.EDEADLK and len(fw(m).qps) == n - 1
    assert v.ibv_destroy_cq(cq) == 0


def test_destroying_a_qp_drops_its_queued_events(rig):
    m, p, ctx, pd, srq = rig
    qp = rc_qp(ctx, pd)
    raise_at(m, ib_uverbs_qp_event_handler, kqp(p, ctx, qp), IB_EVENT_QP_FATAL)
    q = p.task.files.fdt[ctx.async_fd].private_data.ev_queue
    assert len(q.event_list) == 1
    assert v.ibv_destroy_qp(qp) == 0 and not q.event_list     # unread: nothing to wait for


def test_a_qp_without_a_uobject_reports_nothing(rig):
    m, p, ctx, pd, srq = rig
    qp = rc_qp(ctx, pd)
    k = kqp(p, ctx, qp)
    uobj, k.uobject = k.uobject, None                 # as an XRC target's shared QP
    raise_at(m, ib_uverbs_qp_event_handler, k, IB_EVENT_QP_FATAL)
    k.uobject = uobj
    assert not p.task.files.fdt[ctx.async_fd].private_data.ev_queue.event_list
    assert v.ibv_destroy_qp(qp) == 0


def test_a_cq_error_names_the_cq_and_destroy_waits_for_its_ack(rig):
    m, p, ctx, pd, srq = rig
    cq = v.ibv_create_cq(ctx, 16)
    kcq = p.task.files.fdt[ctx.cmd_fd].private_data.idr[cq.handle].object
    raise_at(m, ib_uverbs_cq_event_handler, kcq, IB_EVENT_CQ_ERR)
    raise_at(m, ib_uverbs_cq_event_handler, kcq, IB_EVENT_CQ_ERR)
    ev = va.ibv_get_async_event(ctx)
    assert (ev.element, ev.event_type) == (cq, va.IBV_EVENT_CQ_ERR)
    va.ibv_ack_async_event(ev)
    va.ibv_get_async_event(ctx)
    assert cq.async_events_completed == 1
    assert v.ibv_destroy_cq(cq) == errno.EDEADLK and not fw(m).cqs

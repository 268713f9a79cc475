"""QP async events from the HCA: an SRQ-attached QP entering ERR raises SRQ_LAST_WQE
(IBV_EVENT_QP_LAST_WQE_REACHED), a catastrophic error WQ_CATAS_ERROR (IBV_EVENT_QP_FATAL);
mlx5_ib's QP table (rsc_event_notifier -> mlx5_ib_qp_event) hands them to uverbs, and
DESTROY_QP counts the ones read.  Each way the table and the notifier answer."""

from __future__ import annotations

import errno
import struct

from drivers.mlx5_core.eq import MLX5_EVENT_TYPE_SRQ_LAST_WQE, MLX5_EVENT_TYPE_SRQ_RQ_LIMIT
from drivers.mlx5_ib.qpc import rsc_event_notifier
from kernel_model.notifier import NOTIFY_DONE, NOTIFY_OK
from tests.drivers.mlx5_ib.ladder import fw, ib_dev, kqp, to_state
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_async as va


def srq_qp(ctx):
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    srq = v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(8, 1)))
    qp = v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq, srq=srq,
                                                cap=v.ibv_qp_cap(4, 0, 1, 0)))
    return pd, cq, srq, qp


def to_err(qp) -> None:
    if qp.state == v.IBV_QPS_RESET:
        to_state(qp, 1)                              # RESET -> ERR is no transition
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_ERR), v.IBV_QP_STATE) == 0


def queued(p, ctx) -> list:
    return list(p.task.files.fdt[ctx.async_fd].private_data.ev_queue.event_list)


def teardown(pd, cq, srq, *qps) -> None:
    for qp in qps:
        assert v.ibv_destroy_qp(qp) == 0
    assert v.ibv_destroy_srq(srq) == 0
    assert v.ibv_destroy_cq(cq) == 0 and v.ibv_dealloc_pd(pd) == 0


def test_an_srq_qp_moved_to_err_reports_its_last_wqe(m, app):
    p, ctx = app
    pd, cq, srq, qp = srq_qp(ctx)
    to_state(qp, 1)                                  # INIT
    assert not queued(p, ctx)
    to_err(qp)
    ev = va.ibv_get_async_event(ctx)
    assert (ev.element, ev.event_type) == (qp, va.IBV_EVENT_QP_LAST_WQE_REACHED)
    to_err(qp)                                       # ERR -> ERR: nothing new
    assert not queued(p, ctx)
    va.ibv_ack_async_event(ev)
    teardown(pd, cq, srq, qp)


def test_a_qp_with_its_own_receive_queue_reports_nothing_at_err(m, app):
    p, ctx = app
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    qp = v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq,
                                                cap=v.ibv_qp_cap(4, 4, 1, 1)))
    to_err(qp)
    assert not queued(p, ctx)
    assert v.ibv_destroy_qp(qp) == 0 and v.ibv_destroy_cq(cq) == 0
    assert v.ibv_dealloc_pd(pd) == 0


def test_a_catastrophic_error_is_qp_fatal_then_last_wqe(m, app):
    p, ctx = app
    pd, cq, srq, qp = srq_qp(ctx)
    to_state(qp, 1)
    with m.kernel():
        m.hcas[0].engine.hca_qp_error(fw(m).qps[qp.qp_num], "test", catastrophic=True)
    events = [va.ibv_get_async_event(ctx) for _ in range(2)]
    assert [(e.element, e.event_type) for e in events] == [
        (qp, va.IBV_EVENT_QP_FATAL), (qp, va.IBV_EVENT_QP_LAST_WQE_REACHED)]
    va.ibv_ack_async_event(events[0])
    n = len(fw(m).qps)
    assert v.ibv_destroy_qp(qp) == errno.EDEADLK and len(fw(m).qps) == n - 1
    assert v.ibv_destroy_srq(srq) == 0
    assert v.ibv_destroy_cq(cq) == 0 and v.ibv_dealloc_pd(pd) == 0


def test_destroy_qp_counts_the_events_read(m, app):
    p, ctx = app
    pd, cq, srq, qp = srq_qp(ctx)
    to_err(qp)
    va.ibv_ack_async_event(va.ibv_get_async_event(ctx))
    resp = c.ibv_cmd_destroy_qp(ctx, qp.handle)
    assert resp.events_reported == 1
    assert v.ibv_destroy_srq(srq) == 0
    assert v.ibv_destroy_cq(cq) == 0 and v.ibv_dealloc_pd(pd) == 0


def test_rsc_event_notifier_takes_only_qp_events_of_live_qps(m, app):
    p, ctx = app
    table = ib_dev(m).qp_table
    pd, cq, srq, qp = srq_qp(ctx)
    assert table.tree[qp.qp_num] is kqp(p, ctx, qp)
    eqe = bytearray(64)
    eqe[1] = MLX5_EVENT_TYPE_SRQ_LAST_WQE
    struct.pack_into(">I", eqe, 0x38, 0xABCDE)       # no such QP
    with m.kernel():
        assert rsc_event_notifier(table.nb, MLX5_EVENT_TYPE_SRQ_LAST_WQE, bytes(eqe)) == \
            NOTIFY_OK
        assert rsc_event_notifier(table.nb, MLX5_EVENT_TYPE_SRQ_RQ_LIMIT, bytes(eqe)) == \
            NOTIFY_DONE
        eqe[0x34] = 1                                # the QP's number, but typed as an RQ
        struct.pack_into(">I", eqe, 0x38, qp.qp_num)
        assert rsc_event_notifier(table.nb, MLX5_EVENT_TYPE_SRQ_LAST_WQE, bytes(eqe)) == \
            NOTIFY_OK
    assert not queued(p, ctx)
    qpn = qp.qp_num
    teardown(pd, cq, srq, qp)
    assert qpn not in table.tree


def test_a_qp_without_an_event_handler_is_skipped(m, app):
    p, ctx = app
    pd, cq, srq, qp = srq_qp(ctx)
    k = kqp(p, ctx, qp)
    handler, k.event_handler = k.event_handler, None
    to_err(qp)
    k.event_handler = handler
    assert not queued(p, ctx)
    teardown(pd, cq, srq, qp)

"""SRQ async events through the kernel: the HCA's SRQ_RQ_LIMIT EQE on mlx5_core's async
EQ (mlx5_eq_async_int -> events.c's forward_event), mlx5_ib's SRQ table
(srq_event_notifier -> mlx5_ib_srq_event), uverbs' async event file
(ib_uverbs_srq_event_handler -> ib_uverbs_async_handler, ib_uverbs_async_event_read)
and DESTROY_SRQ's events_reported - each errno and each way an event is freed."""

from __future__ import annotations

import errno
import struct

from drivers.ib_core.ib_verbs import (
    IB_EVENT_DEVICE_FATAL,
    IB_EVENT_SRQ_ERR,
    IB_EVENT_SRQ_LIMIT_REACHED,
)
from drivers.mlx5_core.eq import (
    MLX5_ASYNC_EVENT_MASK,
    MLX5_EMU_ASYNC_EQ_VECTOR,
    MLX5_EVENT_TYPE_PATH_MIG,
    MLX5_EVENT_TYPE_SRQ_CATAS_ERROR,
    MLX5_EVENT_TYPE_SRQ_RQ_LIMIT,
)
from drivers.mlx5_core.events import mlx5_notifier_register, mlx5_notifier_unregister
from drivers.mlx5_ib.srq import mlx5_ib_srq_event, srq_event_notifier
from kernel_model.fs import O_NONBLOCK
from kernel_model.hw.mlx5_engine import EQE_RSC_SRQ, EQE_TYPE_SRQ_RQ_LIMIT
from kernel_model.hw.mlx5_ifc import MLX5_CMD_OP_DESTROY_SRQ, MLX5_CMD_STAT_BAD_RES_STATE_ERR
from kernel_model.notifier import NOTIFY_DONE, NOTIFY_OK, notifier_block
from kernel_model.uapi import ib_user_verbs as uv
from tests.drivers.mlx5_ib.ladder import fw, ib_dev, last_error, open_ctx, raw_ctx, user_pages
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError

DESC = uv.ib_uverbs_async_event_desc


def make_srq(ctx, max_wr: int = 8):
    pd = v.ibv_alloc_pd(ctx)
    return pd, v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(max_wr, 1)))


def fire(m, srqn: int, event_type: int = EQE_TYPE_SRQ_RQ_LIMIT) -> bool:
    """The HCA raises an async event naming the SRQ (what hca_srq_take does at the limit)."""
    with m.kernel():
        return m.hcas[0].engine.hca_async_eqe(event_type, EQE_RSC_SRQ, srqn)


def async_queue(p, ctx):
    return p.task.files.fdt[ctx.async_fd].private_data.ev_queue


def ksrq_uobj(p, ctx, srq):
    return p.task.files.fdt[ctx.cmd_fd].private_data.idr[srq.handle]


def read_event(p, ctx, buf) -> tuple[int, int]:
    assert p.read(ctx.async_fd, buf, DESC.SIZE) == DESC.SIZE
    d = DESC.unpack(p.load(buf, DESC.SIZE))
    return d.element, d.event_type


def destroy_srq_resp(ctx, srq) -> int:
    return c.ibv_cmd_destroy_srq(srq).events_reported


# -- mlx5_core: the async EQ ------------------------------------------------------------------
def test_the_async_eq_takes_the_async_events_on_its_own_vector(m):
    mdev = ib_dev(m).mdev
    eq = mdev.priv.eq_table.async_eq
    feq = fw(m).eqs[eq.eqn]
    assert feq.event_bitmask == MLX5_ASYNC_EVENT_MASK and feq.eqc["intr"] == eq.vecidx
    assert eq.vecidx == MLX5_EMU_ASYNC_EQ_VECTOR
    assert MLX5_ASYNC_EVENT_MASK >> MLX5_EVENT_TYPE_SRQ_RQ_LIMIT & 1
    # forward_event sits on NOTIFY_ANY; mlx5_ib's SRQ table on the interfaces' chain
    assert ib_dev(m).srq_table.nb in mdev.priv.events.nh.head


def test_an_eqe_reaches_every_interface_notifier_once(m):
    mdev = ib_dev(m).mdev
    eq = mdev.priv.eq_table.async_eq
    seen = []
    nb = notifier_block(lambda nb, t, eqe: seen.append((t, eqe[0x38:0x3C])) or NOTIFY_OK)
    with m.kernel():
        assert mlx5_notifier_register(mdev, nb) == 0
        assert mlx5_notifier_register(mdev, nb) == -errno.EEXIST
    ci = eq.cons_index
    assert fire(m, 0x123) and fire(m, 0x456, MLX5_EVENT_TYPE_PATH_MIG)
    assert seen == [(MLX5_EVENT_TYPE_SRQ_RQ_LIMIT, struct.pack(">I", 0x123)),
                    (MLX5_EVENT_TYPE_PATH_MIG, struct.pack(">I", 0x456))]
    assert eq.cons_index == ci + 2
    with m.kernel():
        assert mlx5_notifier_unregister(mdev, nb) == 0
        assert mlx5_notifier_unregister(mdev, nb) == -errno.ENOENT
    assert fire(m, 0x123) and len(seen) == 2


def test_an_event_no_eq_takes_is_lost(m):
    assert not fire(m, 1, 0x0C)       # PAGE_FAULT: no ODP EQ made yet


def test_unloading_takes_the_async_eq_and_its_notifiers_away(m):
    hca = m.hcas[0]
    mdev = ib_dev(m).mdev
    eqn = mdev.priv.eq_table.async_eq.eqn
    m.unload_module("mlx5_ib")
    assert mdev.priv.events.nh.head == []          # the SRQ table is off the chain
    m.unload_module("mlx5_core")     # (mdev is freed with it)
    assert eqn not in hca.fw.eqs and not hca.fw.eqs
    assert not hca.pdev.__dict__.get("irq_actions")


# -- mlx5_ib: the SRQ table --------------------------------------------------------------------
def test_srq_event_notifier_takes_only_srq_events_of_live_srqs(m, app):
    p, ctx = app
    table = ib_dev(m).srq_table
    eqe = bytearray(64)
    eqe[1] = MLX5_EVENT_TYPE_PATH_MIG
    with m.kernel():
        assert srq_event_notifier(table.nb, MLX5_EVENT_TYPE_PATH_MIG, bytes(eqe)) == NOTIFY_DONE
        eqe[1] = MLX5_EVENT_TYPE_SRQ_RQ_LIMIT
        struct.pack_into(">I", eqe, 0x38, 0x777)      # no such SRQ
        assert srq_event_notifier(table.nb, MLX5_EVENT_TYPE_SRQ_RQ_LIMIT, bytes(eqe)) == \
            NOTIFY_OK
    pd, srq = make_srq(ctx)
    srqn = srq.srqn
    assert table.array[srqn].srqn == srqn
    assert v.ibv_destroy_srq(srq) == 0 and srqn not in table.array
    assert v.ibv_dealloc_pd(pd) == 0


def test_an_unexpected_event_type_is_warned_about(m, app):
    p, ctx = app
    pd, srq = make_srq(ctx)
    msrq = ib_dev(m).srq_table.array[srq.srqn]
    with m.kernel():
        mlx5_ib_srq_event(msrq, MLX5_EVENT_TYPE_PATH_MIG)
    assert f"Unexpected event type 1 on SRQ {srq.srqn:06x}" in ib_dev(m).mdev.log[-1]
    assert not async_queue(p, ctx).event_list
    assert v.ibv_destroy_srq(srq) == 0 and v.ibv_dealloc_pd(pd) == 0


def test_a_failed_destroy_puts_the_srq_back_in_the_table(m, app):
    p, ctx = app
    pd, srq = make_srq(ctx)
    table = ib_dev(m).srq_table
    fw(m).inject(MLX5_CMD_OP_DESTROY_SRQ, MLX5_CMD_STAT_BAD_RES_STATE_ERR)
    assert v.ibv_destroy_srq(srq) != 0
    assert table.array[srq.srqn] is not None
    assert fire(m, srq.srqn)                          # still gets its events
    assert len(async_queue(p, ctx).event_list) == 1
    assert v.ibv_destroy_srq(srq) == 0 and srq.srqn not in table.array
    assert not async_queue(p, ctx).event_list          # the queued one went with it
    assert v.ibv_dealloc_pd(pd) == 0


# -- uverbs: the async event file --------------------------------------------------------------
def test_the_limit_event_is_read_as_the_srqs_user_handle_and_counted_at_destroy(m, app):
    p, ctx = app
    pd, srq = make_srq(ctx)
    uobj = ksrq_uobj(p, ctx, srq)
    q = async_queue(p, ctx)
    buf = user_pages(p)
    p.task.files.fdt[ctx.async_fd].f_flags |= O_NONBLOCK       # nothing queued: EAGAIN
    assert p.read(ctx.async_fd, buf, DESC.SIZE) == -errno.EAGAIN
    assert "no event queued" in last_error(p)
    p.task.files.fdt[ctx.async_fd].f_flags &= ~O_NONBLOCK
    assert fire(m, srq.srqn) and fire(m, srq.srqn)
    assert len(q.event_list) == 2 and len(uobj.event_list) == 2
    assert p.read(ctx.async_fd, buf, DESC.SIZE - 1) == -errno.EINVAL   # stays queued
    assert len(q.event_list) == 2 and uobj.events_reported == 0
    assert read_event(p, ctx, buf) == (uobj.user_handle, IB_EVENT_SRQ_LIMIT_REACHED)
    assert uobj.user_handle != 0 and uobj.events_reported == 1
    # a buffer that faults: the event is taken (and counted) first, as in the kernel
    assert p.read(ctx.async_fd, 0x10, DESC.SIZE) == -errno.EFAULT
    assert not q.event_list and uobj.events_reported == 2
    assert destroy_srq_resp(ctx, srq) == 2
    assert v.ibv_dealloc_pd(pd) == 0


def test_a_catastrophic_srq_error_is_ib_event_srq_err(m, app):
    p, ctx = app
    pd, srq = make_srq(ctx)
    assert fire(m, srq.srqn, MLX5_EVENT_TYPE_SRQ_CATAS_ERROR)
    buf = user_pages(p)
    assert read_event(p, ctx, buf) == (ksrq_uobj(p, ctx, srq).user_handle, IB_EVENT_SRQ_ERR)
    assert destroy_srq_resp(ctx, srq) == 1
    assert v.ibv_dealloc_pd(pd) == 0


def test_destroying_an_srq_drops_its_unread_events(m, app):
    p, ctx = app
    pd, a = make_srq(ctx)
    b = v.ibv_create_srq(pd, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(8, 1)))
    assert fire(m, a.srqn) and fire(m, b.srqn) and fire(m, a.srqn)
    q = async_queue(p, ctx)
    assert len(q.event_list) == 3
    assert destroy_srq_resp(ctx, a) == 0
    ub = ksrq_uobj(p, ctx, b)
    assert [e.desc.element for e in q.event_list] == [ub.user_handle]
    buf = user_pages(p)
    assert read_event(p, ctx, buf) == (ub.user_handle, IB_EVENT_SRQ_LIMIT_REACHED)
    assert destroy_srq_resp(ctx, b) == 1
    assert v.ibv_dealloc_pd(pd) == 0


def test_closing_the_async_fd_frees_the_queue_and_later_events_are_dropped(m, app):
    p, ctx = app
    pd, srq = make_srq(ctx)
    assert fire(m, srq.srqn)
    q = async_queue(p, ctx)
    uobj = ksrq_uobj(p, ctx, srq)
    assert p.close(ctx.async_fd) == 0
    ctx.async_fd = -1
    assert q.is_closed and not q.event_list and not uobj.event_list
    assert fire(m, srq.srqn) and not q.event_list          # nobody to tell
    assert destroy_srq_resp(ctx, srq) == 0
    assert v.ibv_dealloc_pd(pd) == 0


def test_exit_with_events_queued_leaks_nothing(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd, srq = make_srq(ctx)
    assert fire(m, srq.srqn) and fire(m, srq.srqn)
    p.exit(0)                         # the conftest leak check: the events were kfree'd


def test_device_removal_ends_the_stream_with_device_fatal(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd, srq = make_srq(ctx)
    assert fire(m, srq.srqn)
    m.unload_module("mlx5_ib")        # disassociate: the SRQ (and its event) goes
    buf = user_pages(p)
    assert read_event(p, ctx, buf) == (0, IB_EVENT_DEVICE_FATAL)
    p.task.files.fdt[ctx.async_fd].f_flags |= O_NONBLOCK
    assert p.read(ctx.async_fd, buf, DESC.SIZE) == -errno.EAGAIN
    p.exit(0)


def test_a_read_nothing_will_wake_ends_with_eintr(m, app):
    p, ctx = app
    buf = user_pages(p)
    assert p.read(ctx.async_fd, buf, DESC.SIZE) == -errno.EINTR
    assert "interrupted" in last_error(p)


def test_async_event_alloc_needs_a_context_and_its_file_is_not_the_default(m):
    p = m.spawn("app")
    ctx = raw_ctx(p)                                  # uverbs0 open, no GET_CONTEXT
    try:
        c.ibv_cmd_alloc_async_fd(ctx)
    except VerbsError as ex:
        assert ex.errno == errno.EINVAL
    else:
        raise AssertionError("ASYNC_EVENT_ALLOC without a ucontext succeeded")
    p.exit(0)
    p = m.spawn("app2")
    ctx = open_ctx(p)
    first = ctx.async_fd
    c.ibv_cmd_alloc_async_fd(ctx)
    second = ctx.async_fd
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    assert ufile.default_async_file is p.task.files.fdt[first].private_data
    pd, srq = make_srq(ctx)
    assert fire(m, srq.srqn)          # to the default file, not the new one
    assert len(p.task.files.fdt[first].private_data.ev_queue.event_list) == 1
    assert not p.task.files.fdt[second].private_data.ev_queue.event_list
    assert p.close(second) == 0
    ctx.async_fd = first
    p.exit(0)

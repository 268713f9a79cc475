"""Tests for the kernel side of extended CQs, completion channels and resize:
ib_uverbs_ex_create_cq, ib_uverbs_create_comp_channel and the event file
(uverbs_comp_event.py), mlx5_ib_resize_cq + MODIFY_CQ, the completion EQ's
interrupt handler (mlx5_eq_comp_int) and request_irq - each errno, each unwind."""

from __future__ import annotations

import errno
import struct
from functools import partial

import pytest

from drivers.ib_core.uverbs_comp_event import ib_uverbs_comp_handler
from drivers.mlx5_core.eq import MLX5_EQE_SIZE, mlx5_eq_comp_int
from kernel_model.errno import KernelError
from kernel_model.fs import O_NONBLOCK
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import MLX5_CMD_OP_MODIFY_CQ, MLX5_CMD_STAT_LIM_ERR
from kernel_model.interrupt import free_irq, msix_raise, request_irq
from kernel_model.page_alloc import page_to_phys
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_cq_resp, mlx5_ib_resize_cq
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    cq_ucmd,
    create_cq_raw,
    errno_of,
    fw,
    host,
    last_error,
    open_ctx,
    state,
    user_pages,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_cq as vcq
from userspace.libibverbs.cmd import VerbsError

EXR = uv.ib_uverbs_ex_create_cq_resp


def ex_create(ctx, ucmd, **kw):
    """The extended CREATE_CQ with this driver request: (core resp, mlx5 resp)."""
    kw.setdefault("cqe", 31)
    kw.setdefault("comp_channel", -1)
    raw = c.execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_CQ,
                             uv.ib_uverbs_ex_create_cq(**kw), EXR.SIZE, "ex_create_cq", ucmd,
                             mlx5_ib_create_cq_resp.SIZE)
    return EXR.unpack(raw[:EXR.SIZE]), mlx5_ib_create_cq_resp.unpack(raw[EXR.SIZE:])


def ev_file(p, fd):
    return p.task.files.fdt[fd].private_data


def kcq(p, ctx, handle):
    return p.task.files.fdt[ctx.cmd_fd].private_data.idr[handle].object


# -- the extended CREATE_CQ --------------------------------------------------------------------
@pytest.mark.parametrize("kw, what", [(dict(comp_mask=1), "comp_mask 0x1"),
                                      (dict(reserved=1), "reserved field set")])
def test_ex_create_cq_comp_mask_and_reserved_are_einval(m, app, kw, what):
    p, ctx = app
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    assert errno_of(partial(ex_create, ctx, ucmd, **kw)) == errno.EINVAL
    assert what in last_error(p) and state(p, ctx) == before


def test_ex_create_cq_unknown_flag_is_eopnotsupp_and_unwinds(m, app):
    p, ctx = app
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    assert errno_of(partial(ex_create, ctx, ucmd, flags=1 << 2)) == errno.EOPNOTSUPP
    assert "create flags 0x4" in last_error(p) and state(p, ctx) == before


def test_ex_create_cq_overrun_ignore_sets_oi_and_reports_its_length(m, app):
    p, ctx = app
    core, drv = ex_create(ctx, cq_ucmd(p), flags=uv.IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN
                          | uv.IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION)
    assert core.base.cqe == 31 and core.response_length == EXR.SIZE
    assert fw(m).cqs[drv.cqn].cqc["oi"] == 1
    assert kcq(p, ctx, core.base.cq_handle).create_flags == 3


def test_overrun_ignore_without_cq_oi_is_eopnotsupp():
    m = host(hca=Mlx5Config(caps={"cq_oi": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    assert errno_of(partial(ex_create, ctx, ucmd, flags=uv.IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN)) \
        == errno.EOPNOTSUPP
    assert "overrun ignore" in last_error(p) and state(p, ctx) == before
    p.exit(0)


# -- completion channels ------------------------------------------------------------------------
def test_a_cq_on_an_fd_that_is_no_channel_is_ebadf(m, app):
    p, ctx = app
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    for fd in (999, ctx.cmd_fd, ctx.async_fd):
        req = uv.ib_uverbs_ex_create_cq(cqe=31, comp_channel=fd)
        with pytest.raises(VerbsError) as ei:
            c.execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_CQ, uv.ib_uverbs_create_cq(
                cqe=req.cqe, comp_channel=fd), uv.ib_uverbs_create_cq_resp, ucmd,
                mlx5_ib_create_cq_resp)
        assert ei.value.errno == errno.EBADF
    assert state(p, ctx) == before


def test_events_are_read_one_by_one_and_counted_at_destroy(m, app):
    p, ctx = app
    ch = vcq.ibv_create_comp_channel(ctx)
    cq = v.ibv_create_cq(ctx, 16, None, ch)
    assert ch.refcnt == 1
    kernel_cq = kcq(p, ctx, cq.handle)
    q = ev_file(p, ch.fd).ev_queue
    # nothing queued: O_NONBLOCK is EAGAIN
    p.task.files.fdt[ch.fd].f_flags |= O_NONBLOCK
    buf = user_pages(p)
    assert p.read(ch.fd, buf, 8) == -errno.EAGAIN
    p.task.files.fdt[ch.fd].f_flags &= ~O_NONBLOCK
    with m.kernel():
        for _ in range(3):
            ib_uverbs_comp_handler(kernel_cq, kernel_cq.cq_context)
    assert len(q.event_list) == 3
    assert p.read(ch.fd, buf, 7) == -errno.EINVAL and len(q.event_list) == 3
    # a buffer that faults: the event was taken (and counted) first, as in the kernel
    assert p.read(ch.fd, 0x10, 8) == -errno.EFAULT and len(q.event_list) == 2
    assert p.read(ch.fd, buf, 64) == 8
    handle = struct.unpack("<Q", p.load(buf, 8))[0]     # the CQ's user_handle
    assert vcq._handle_table(cq.context.proc)[1][handle] is cq
    assert kernel_cq.uobject.user_handle == handle == 0x1000  # the process's first CQ
    got, ctx_ = vcq.ibv_get_cq_event(ch)
    assert got is cq and ctx_ is None and not q.event_list
    with m.kernel():
        ib_uverbs_comp_handler(kernel_cq, kernel_cq.cq_context)
    assert kernel_cq.uobject.comp_events_reported == 3 and len(q.event_list) == 1
    vcq.ibv_ack_cq_events(cq, 3)
    n = len(fw(m).cmd_log)
    assert v.ibv_destroy_cq(cq) == 0          # the event still queued goes with the CQ
    assert cmds(m, n) == ["DESTROY_CQ"] and not q.event_list and ch.refcnt == 0
    assert vcq.ibv_destroy_comp_channel(ch) == 0


def test_destroy_with_an_unacknowledged_event_is_edeadlk(m, app):
    p, ctx = app
    ch = vcq.ibv_create_comp_channel(ctx)
    cq = v.ibv_create_cq(ctx, 16, None, ch)
    kernel_cq = kcq(p, ctx, cq.handle)
    with m.kernel():
        ib_uverbs_comp_handler(kernel_cq, kernel_cq.cq_context)
    vcq.ibv_get_cq_event(ch)
    assert v.ibv_destroy_cq(cq) == errno.EDEADLK  # a lone thread would wait forever
    assert not fw(m).cqs                          # the CQ itself is gone
    ch.refcnt = 0
    assert vcq.ibv_destroy_comp_channel(ch) == 0


def test_closing_the_channel_fd_first_keeps_the_file_until_the_cq_goes(m, app):
    p, ctx = app
    ch = vcq.ibv_create_comp_channel(ctx)
    cq = v.ibv_create_cq(ctx, 16, None, ch)
    f = p.task.files.fdt[ch.fd]
    assert f.f_count == 2                       # the fd and the CQ
    p.close(ch.fd)
    assert f.f_count == 1 and not f.private_data.ev_queue.is_closed
    kernel_cq = kcq(p, ctx, cq.handle)
    with m.kernel():
        ib_uverbs_comp_handler(kernel_cq, kernel_cq.cq_context)
    assert v.ibv_destroy_cq(cq) == 0
    assert f.f_count == 0 and f.private_data.ev_queue.is_closed


def test_a_read_nothing_will_wake_ends_with_eintr(m, app):
    p, ctx = app
    ch = vcq.ibv_create_comp_channel(ctx)
    with pytest.raises(VerbsError) as ei:
        vcq.ibv_get_cq_event(ch)
    assert ei.value.errno == errno.EINTR and "interrupted" in last_error(p)
    assert vcq.ibv_destroy_comp_channel(ch) == 0


# -- the interrupt: EQE -> handler -> comp handler ------------------------------------------------
def test_the_hca_event_reaches_the_channel_through_the_eq(m, app):
    p, ctx = app
    ch = vcq.ibv_create_comp_channel(ctx)
    cq = v.ibv_create_cq(ctx, 16, None, ch)
    eq = m.hcas[0].pdev.dev.driver_data.priv.eq_table.comp_eqs[0]
    ci = eq.cons_index
    assert vcq.ibv_req_notify_cq(cq) == 0
    hca = m.hcas[0]
    assert hca.engine.cq_armed == {cq.cqn: 0}
    assert hca.uar_log[-1].kind == "cq_db" and hca.uar_log[-1].data[4:] == \
        cq.cqn.to_bytes(4, "big")
    assert p.load(cq.dbrec + 4, 4) == bytes(4)         # arm_sn 0, REQ_NOT, ci 0
    hca.engine.hca_comp_event(hca.fw.cqs[cq.cqn])      # as a CQE on an armed CQ does
    assert eq.cons_index == ci + 1
    eqe = m.phys_read(page_to_phys(eq.buf) + ci % eq.nent * MLX5_EQE_SIZE, MLX5_EQE_SIZE)
    assert eqe[1] == 0 and int.from_bytes(eqe[56:60], "big") == cq.cqn
    got, _ = vcq.ibv_get_cq_event(ch)
    assert got is cq and cq.arm_sn == 1
    vcq.ibv_ack_cq_events(cq, 1)
    assert v.ibv_destroy_cq(cq) == 0
    assert vcq.ibv_destroy_comp_channel(ch) == 0


def test_an_eqe_for_a_bogus_cq_is_skipped(m, app):
    eq = m.hcas[0].pdev.dev.driver_data.priv.eq_table.comp_eqs[0]
    ci = eq.cons_index
    at = page_to_phys(eq.buf) + ci % eq.nent * MLX5_EQE_SIZE
    owner = ci // eq.nent & 1
    m.phys_write(at, bytes(56) + (0xABCDE).to_bytes(4, "big") + bytes(3) + bytes([owner]))
    with m.kernel():
        mlx5_eq_comp_int(0, eq)
    assert eq.cons_index == ci + 1


def test_request_irq_refuses_a_taken_or_negative_vector(m):
    pdev = m.hcas[0].pdev
    with m.kernel():
        with pytest.raises(KernelError) as ei:
            request_irq(pdev, 0, lambda nr, d: 1, "again", object())
        assert ei.value.errno == errno.EBUSY
        with pytest.raises(KernelError) as ei:
            request_irq(pdev, -1, lambda nr, d: 1, "neg", object())
        assert ei.value.errno == errno.EINVAL
        tok = object()
        request_irq(pdev, 5, lambda nr, d: 1, "five", tok)
        assert msix_raise(pdev, 5) == 1
        free_irq(pdev, 5, tok)
    assert msix_raise(pdev, 5) == 0 and pdev.spurious_irqs == 1


def test_a_cq_doorbell_on_another_uar_page_is_ignored(m, app):
    p, ctx = app
    ch = vcq.ibv_create_comp_channel(ctx)
    cq = v.ibv_create_cq(ctx, 16, None, ch)
    q = m.hcas[0]
    other = ctx.uar[1].reg if ctx.uar[1].reg != ctx.cq_uar_reg else ctx.uar[2].reg
    p.store(other + 0x20, struct.pack(">II", 0, cq.cqn))
    assert cq.cqn not in q.engine.cq_armed
    assert ("bad_cq_doorbell", cq.cqn, q.uar_log[-1].uar) in q.async_events
    assert v.ibv_destroy_cq(cq) == 0
    assert vcq.ibv_destroy_comp_channel(ch) == 0


# -- resize ----------------------------------------------------------------------------------------
def resize_raw(p, cq, cqe, entries=None, **kw):
    kw.setdefault("buf_addr", user_pages(p, max(1, -(-(entries or cqe + 1) * 64 // 4096))))
    kw.setdefault("cqe_size", 64)
    return c.ibv_cmd_resize_cq(cq, cqe, mlx5_ib_resize_cq(**kw))


@pytest.mark.parametrize("cqe, kw, what", [
    (0, {}, "wrong entries number 0"),
    ((1 << 22) + 1, {}, "wrong entries number"),
    (63, dict(reserved1=1), "reserved fields set"),
])
def test_resize_bad_requests_are_einval(m, app, cqe, kw, what):
    p, ctx = app
    cq = v.ibv_create_cq(ctx, 16)
    before = state(p, ctx)
    assert errno_of(partial(resize_raw, p, cq, cqe, 64, **kw)) == errno.EINVAL
    assert what in last_error(p) and state(p, ctx) == before
    assert v.ibv_destroy_cq(cq) == 0


def test_resize_to_the_same_size_runs_no_command(m, app):
    p, ctx = app
    cq = v.ibv_create_cq(ctx, 16)
    n = len(fw(m).cmd_log)
    assert resize_raw(p, cq, 20) == 31 and cmds(m, n) == []
    assert v.ibv_destroy_cq(cq) == 0


def test_resize_moves_the_ring_and_unpins_the_old_one(m, app):
    p, ctx = app
    cq = v.ibv_create_cq(ctx, 16)
    before = p.mm.pinned_vm
    n = len(fw(m).cmd_log)
    assert resize_raw(p, cq, 127) == 127
    assert cmds(m, n) == ["MODIFY_CQ"] and fw(m).cqs[cq.cqn].cqc["log_cq_size"] == 7
    assert p.mm.pinned_vm == before + 2 - 1          # two new pages pinned, the old one not
    assert v.ibv_destroy_cq(cq) == 0


def test_firmware_refusal_unpins_the_new_ring(m, app):
    p, ctx = app
    cq = v.ibv_create_cq(ctx, 16)
    before = state(p, ctx)
    fw(m).inject(MLX5_CMD_OP_MODIFY_CQ, MLX5_CMD_STAT_LIM_ERR)
    assert errno_of(resize_raw, p, cq, 63) == errno.ENOMEM
    assert state(p, ctx) == before
    assert v.ibv_destroy_cq(cq) == 0


def test_resize_without_the_cap_is_enosys():
    m = host(hca=Mlx5Config(caps={"cq_resize": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    cq = v.ibv_create_cq(ctx, 16)
    assert errno_of(resize_raw, p, cq, 63) == errno.ENOSYS
    assert "does not support resize" in last_error(p)
    assert v.ibv_destroy_cq(cq) == 0
    p.exit(0)


def test_create_cq_raw_still_takes_the_legacy_request(m, app):
    p, ctx = app
    core, drv = create_cq_raw(ctx, cq_ucmd(p))
    assert core.cqe == 31 and drv.cqn in fw(m).cqs


def test_a_channel_outliving_its_uverbs_file_reads_eio(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    ch = vcq.ibv_create_comp_channel(ctx)
    cq = v.ibv_create_cq(ctx, 16, None, ch)
    kernel_cq = kcq(p, ctx, cq.handle)
    with m.kernel():
        ib_uverbs_comp_handler(kernel_cq, kernel_cq.cq_context)
    q = ev_file(p, ch.fd).ev_queue
    v.ibv_close_device(ctx)                 # the uverbs file goes: its CQ, then the channel
    assert q.is_closed and not q.event_list
    buf = user_pages(p)
    assert p.read(ch.fd, buf, 8) == -errno.EIO and "disassociated" in last_error(p)
    assert p.close(ch.fd) == 0
    p.exit(0)

"""userspace/providers/mlx5/verbs.py: mlx5_modify_qp and mlx5_query_qp, the library's half
of the QP state machine - which queues may post in which state, what RESET cleans."""

from __future__ import annotations

import struct

import pytest

from drivers.ib_core.cache import make_default_gid
from tests.drivers.mlx5_ib.ladder import (
    RC_INIT_MASK,
    RC_RTR_MASK,
    RC_RTS_MASK,
    fw,
    host,
    init_attr,
    rc_qp,
    rtr_attr,
    rts_attr,
    to_state,
)
from userspace.libibverbs import verbs as v
from userspace.providers.mlx5.verbs import read_dbrec


@pytest.fixture
def rig():
    m = host()
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    yield p, ctx, rc_qp(ctx), make_default_gid(fw(m).vport.mac.to_bytes(6, "big"))
    p.exit(0)


def _set_state(qp, state):
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=state), v.IBV_QP_STATE) == 0


def test_which_queue_may_post_follows_the_state(rig):
    p, ctx, qp, gid = rig
    sq, rq = qp.sq.max_gs, qp.rq.max_gs
    assert (qp.sq.qp_state_max_gs, qp.rq.qp_state_max_gs) == (-1, -1)
    steps = [(init_attr(), RC_INIT_MASK, (-1, rq)),
             (rtr_attr(gid, qp.qp_num), RC_RTR_MASK, (-1, rq)),
             (rts_attr(), RC_RTS_MASK, (sq, rq)),
             (v.ibv_qp_attr(qp_state=v.IBV_QPS_ERR), v.IBV_QP_STATE, (-1, -1))]
    for attr, mask, may_post in steps:
        assert v.ibv_modify_qp(qp, attr, mask) == 0
        assert (qp.sq.qp_state_max_gs, qp.rq.qp_state_max_gs) == may_post
    assert qp.state == v.IBV_QPS_ERR


def test_a_failed_modify_changes_nothing_in_the_library(rig):
    p, ctx, qp, _ = rig
    qp.sq.head = 3
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTS), v.IBV_QP_STATE) != 0
    assert (qp.state, qp.sq.qp_state_max_gs, qp.sq.head) == (v.IBV_QPS_RESET, -1, 3)


def test_reset_cleans_the_cq_and_starts_the_queues_over(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)
    cq = qp.recv_cq
    # a completion of this QP the application never polled (user index, owner parity 0)
    cqe = bytearray(64)
    struct.pack_into(">I", cqe, 32, qp.uidx)
    cqe[63] = 0x00                                   # opcode REQ, owner bit 0: software's
    p.store(cq.buf, bytes(cqe))
    qp.sq.head = qp.sq.cur_post = qp.rq.head = 5
    p.store(qp.db, struct.pack(">II", 5, 5))
    _set_state(qp, v.IBV_QPS_RESET)
    assert cq.cons_index == 1                        # the CQE is dropped
    assert (qp.sq.head, qp.sq.cur_post, qp.rq.head, qp.rq.tail) == (0, 0, 0, 0)
    assert read_dbrec(qp) == (0, 0)
    assert (qp.state, qp.sq.qp_state_max_gs, qp.rq.qp_state_max_gs) == (v.IBV_QPS_RESET, -1, -1)


def test_destroy_cleans_the_cqs_so_a_reused_user_index_sees_nothing(rig):
    """mlx5_destroy_qp runs __mlx5_cq_clean on both CQs: the destroyed QP's unpolled
    completion does not reach the next QP given its user index (found by the fuzzer:
    the next QP, with no send queue, took it and polled out of its wrid array)."""
    p, ctx, qp, gid = rig
    cq, uidx = qp.recv_cq, qp.uidx
    cqe = bytearray(64)
    struct.pack_into(">I", cqe, 32, uidx)
    cqe[63] = 0xD0                                   # REQ_ERR, owner bit 0: software's
    cqe[55] = 0x05                                   # syndrome: work request flushed
    p.store(cq.buf, bytes(cqe))
    assert v.ibv_destroy_qp(qp) == 0
    again = rc_qp(ctx)
    assert again.uidx == uidx                        # the user index is reused
    assert v.ibv_poll_cq(cq, 4) == []                # and the stale CQE is gone


def test_query_takes_the_send_queue_sizes_from_the_library(rig):
    p, ctx, qp, _ = rig
    attr, init = v.ibv_query_qp(qp, v.IBV_QP_STATE | v.IBV_QP_CAP)
    assert (init.cap.max_send_wr, init.cap.max_send_sge, init.cap.max_inline_data) == \
        (qp.sq.max_post, qp.sq.max_gs, qp.max_inline_data)
    assert attr.cap == init.cap and attr.qp_state == v.IBV_QPS_RESET


def test_qp_signatures_reach_the_kernel_and_the_qpc():
    """MLX5_QP_SIGNATURE: create_qp sets MLX5_QP_FLAG_SIGNATURE, so the kernel sizes the
    RQ with the signature segment (one SGE in a 32-byte WQE, not two) and the QPC has
    wq_signature - the library and the kernel agree on max_recv_sge."""
    m = host()
    p = m.spawn("app", environ={"MLX5_QP_SIGNATURE": "1"})
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    qp = rc_qp(ctx)
    assert qp.wq_sig and qp.rq.max_gs == 1
    _, init = v.ibv_query_qp(qp, 0)
    assert init.cap.max_recv_sge == 1
    assert fw(m).qps[qp.qp_num].qpc["wq_signature"] == 1
    p.exit(0)


def test_close_device_after_the_program_closed_its_command_fd():
    """A program that closes the command fd under libibverbs (dyn_uar: the NC UAR object
    is then already gone with the file) still gets 0 from ibv_close_device, as in C,
    where mlx5dv_devx_free_uar is void; a second free of the same register is a no-op
    (found by peermem fuzz: the first close raised EBADF half-way, the retry KeyError)."""
    from kernel_model.emu.platform import rdma_host
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib", dyn_uar=1)
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    nc = ctx.nc_uar
    assert nc is not None and nc.uar in ctx.uar_obj_handles
    assert p.close(ctx.cmd_fd) == 0                  # the kernel tears the context down
    assert v.ibv_close_device(ctx) == 0
    assert ctx.uar_obj_handles == {}
    ctx.free_uar_obj(nc)                             # forgotten: nothing to destroy again
    p.exit(0)

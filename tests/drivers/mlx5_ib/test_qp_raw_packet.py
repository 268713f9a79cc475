"""Tests for IBV_QPT_RAW_PACKET QPs on mlx5 (drivers/mlx5_ib/qp_raw.py): libmlx5's two
buffers, CREATE_QP through uverbs (CAP_NET_RAW), create_raw_packet_qp's TIS, SQ, RQ and
TIR, the transitions as SQ/RQ states, query, destroy, and every step's unwinding."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.ib_verbs import (
    IB_QP_RATE_LIMIT,
    IB_QPS_ERR,
    IB_QPS_RESET,
    IB_QPS_RTS,
    IB_QPS_SQE,
)
from drivers.mlx5_core.transobj import mlx5_core_destroy_rq
from drivers.mlx5_ib.cmd import mlx5_cmd_destroy_tir
from drivers.mlx5_ib.qp_raw import (
    MLX5_IB_CREATE_QP_RESP_MASK_RQN,
    MLX5_IB_CREATE_QP_RESP_MASK_SQN,
    MLX5_IB_CREATE_QP_RESP_MASK_TIRN,
    MLX5_IB_CREATE_QP_RESP_MASK_TISN,
    MLX5_RQ_STATE_NA,
    MLX5_SQ_STATE_NA,
    modify_raw_packet_qp,
    sqrq_state_to_qp_state,
)
from kernel_model.current import running
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_CREATE_RQ,
    MLX5_CMD_OP_CREATE_SQ,
    MLX5_CMD_OP_CREATE_TIR,
    MLX5_CMD_OP_CREATE_TIS,
    MLX5_CMD_OP_DESTROY_TIR,
    MLX5_CMD_OP_INIT2RTR_QP,
    MLX5_CMD_OP_MODIFY_RQ,
    MLX5_CMD_OP_MODIFY_SQ,
    MLX5_CMD_OP_QUERY_SQ,
    MLX5_CMD_OP_RTR2RTS_QP,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_INT_ERR,
)
from kernel_model.task import cred
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    create_qp_raw,
    errno_of,
    fw,
    get_context,
    ib_dev,
    kqp,
    last_error,
    qp_cmd,
    qp_ucmd,
    raw_cq,
    raw_pd,
    state,
    ucontext,
    ucontext_req,
    user_pages,
)
from userspace.libibverbs import verbs as v

CAP_NET_RAW = 13
RST, RDY, ERR = 0, 1, 3


def _caps(p, net_raw: bool) -> None:
    caps = p.task.cred.cap_effective
    caps = caps | 1 << CAP_NET_RAW if net_raw else caps & ~(1 << CAP_NET_RAW)
    p.task.cred = cred(p.task.cred.uid, caps)


@pytest.fixture
def res(app):
    p, ctx = app
    _caps(p, True)
    return p, ctx, v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)


def _raw_attr(cq, send: int = 4, recv: int = 4) -> v.ibv_qp_init_attr:
    return v.ibv_qp_init_attr(qp_type=v.IBV_QPT_RAW_PACKET, send_cq=cq, recv_cq=cq,
                              cap=v.ibv_qp_cap(send, recv, 1, 1))


def _raw_qp(pd, cq, send: int = 4, recv: int = 4) -> v.ibv_qp:
    return v.ibv_create_qp(pd, _raw_attr(cq, send, recv))


def _queues(p, ctx, qp):
    """(the firmware SQ, RQ) of a raw packet QP (None for a queue it lacks)."""
    raw = kqp(p, ctx, qp).raw_packet_qp
    f = fw(p.machine)
    return f.sqs.get(raw.sq.base.mqp.qpn), f.rqs.get(raw.rq.base.mqp.qpn)


def _states(p, ctx, qp) -> tuple[int, int, int]:
    """(SQ state, RQ state, the driver's qp->state)."""
    sq, rq = _queues(p, ctx, qp)
    return sq.state, rq.state, kqp(p, ctx, qp).state


def _modify(qp, state: int, mask: int = 0) -> int:
    return v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=state, port_num=1),
                           v.IBV_QP_STATE | mask)


# -- create ---------------------------------------------------------------------------------
def test_a_raw_packet_qp_is_a_tis_sq_rq_and_tir(res):
    p, ctx, pd, cq = res
    m = p.machine
    before = len(fw(m).cmd_log)
    qp = _raw_qp(pd, cq)
    f = fw(m)
    assert cmds(m, before)[-4:] == ["CREATE_TIS", "CREATE_SQ", "CREATE_RQ", "CREATE_TIR"]
    assert "CREATE_QP" not in cmds(m, before) and qp.qp_num not in f.qps
    k = kqp(p, ctx, qp)
    sq, rq = _queues(p, ctx, qp)
    assert qp.qp_num == sq.num == k.mqp.qpn          # the QP is named by its SQ
    [tis] = f.tises.values()
    [tir] = f.tirs.values()
    assert sq.sqc["tis_num_0"] == tis.num and tir.ctx["inline_rqn"] == rq.num
    assert sq.sqc["cqn"] == rq.rqc["cqn"] == cq.cqn
    assert sq.wq["pd"] == rq.wq["pd"] == pd.pdn
    assert tis.ctx["transport_domain"] == tir.ctx["transport_domain"] == ucontext(p, ctx).tdn
    # the SQ's WQ is the library's separate buffer, 64-byte WQEBBs; the RQ's the main one
    assert 1 << sq.wq["log_wq_sz"] == k.sq.wqe_cnt and sq.wq["log_wq_stride"] == 6
    assert 1 << rq.wq["log_wq_sz"] == k.rq.wqe_cnt
    assert k.raw_packet_qp.sq.ubuffer.umem is not None and k.trans_qp.base.umem is not None
    assert sq.state == rq.state == RST and rq.rqc["vsd"] == 1   # VLANs stripped by default
    assert sq.sqc["user_index"] == rq.rqc["user_index"] == qp.uidx
    assert v.ibv_destroy_qp(qp) == 0
    assert not (f.tises or f.sqs or f.rqs or f.tirs)


def test_the_numbers_reach_a_devx_context_s_response(res):
    """uid != 0 (open_ctx is a DEVX context): tisn, sqn, rqn and tirn in the response."""
    p, ctx, pd, cq = res
    _caps(p, True)
    ucmd = qp_ucmd(p, sq=8, rq=8, sq_buf_addr=user_pages(p), uidx=5)
    core, resp = create_qp_raw(ctx, qp_cmd(pd, cq, 8, 8, qp_type=v.IBV_QPT_RAW_PACKET), ucmd)
    f = fw(p.machine)
    [tis], [tir] = f.tises.values(), f.tirs.values()
    [sq], [rq] = f.sqs.values(), f.rqs.values()
    assert resp.comp_mask == MLX5_IB_CREATE_QP_RESP_MASK_TIRN | \
        MLX5_IB_CREATE_QP_RESP_MASK_TISN | MLX5_IB_CREATE_QP_RESP_MASK_RQN | \
        MLX5_IB_CREATE_QP_RESP_MASK_SQN
    assert (resp.tisn, resp.sqn, resp.rqn, resp.tirn) == (tis.num, sq.num, rq.num, tir.num)
    assert core.qpn == sq.num and sq.uid == tis.uid == rq.uid == tir.uid != 0


def test_without_a_receive_queue_there_is_no_rq_or_tir(res):
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq, send=4, recv=0)
    f = fw(p.machine)
    assert len(f.tises) == len(f.sqs) == 1 and not f.rqs and not f.tirs
    assert qp.qp_num in f.sqs
    assert _modify(qp, v.IBV_QPS_INIT, v.IBV_QP_PORT) == 0
    assert _modify(qp, v.IBV_QPS_RTR) == 0 and _modify(qp, v.IBV_QPS_RTS) == 0
    assert f.sqs[qp.qp_num].state == RDY
    attr, _ = v.ibv_query_qp(qp, v.IBV_QP_STATE)
    assert attr.qp_state == IB_QPS_RTS
    assert v.ibv_destroy_qp(qp) == 0 and not f.sqs and not f.tises


def test_without_a_send_queue_the_qp_is_named_by_its_rq(res):
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq, send=0, recv=4)
    f = fw(p.machine)
    assert not f.tises and not f.sqs and len(f.rqs) == len(f.tirs) == 1
    assert qp.qp_num in f.rqs
    assert v.ibv_destroy_qp(qp) == 0 and not f.rqs and not f.tirs


def test_a_raw_packet_qp_needs_cap_net_raw(res):
    p, ctx, pd, cq = res
    _caps(p, False)
    before = state(p, ctx)
    assert errno_of(_raw_qp, pd, cq) == errno.EPERM
    assert "CAP_NET_RAW" in last_error(p)
    assert state(p, ctx) == before


def test_a_cqe_version_0_context_cannot_have_one(m):
    """check_valid_flow: EINVAL, before the driver request is even read."""
    p = m.spawn("v0")
    _caps(p, True)
    ctx, resp = get_context(p, ucontext_req(max_cqe_version=0))
    assert resp.cqe_version == 0
    pd, cq = raw_pd(ctx), raw_cq(p, ctx)
    ucmd = qp_ucmd(p, sq=8, rq=8, sq_buf_addr=user_pages(p), uidx=0xFFFFFF)
    with pytest.raises(Exception) as ei:
        create_qp_raw(ctx, qp_cmd(pd, cq, 8, 8, qp_type=v.IBV_QPT_RAW_PACKET), ucmd)
    assert ei.value.errno == errno.EINVAL
    assert "CQE version > 0" in last_error(p)
    assert not fw(m).tises and not fw(m).sqs
    p.exit(0)


@pytest.mark.parametrize("opcode,gone", [
    (MLX5_CMD_OP_CREATE_TIS, []),
    (MLX5_CMD_OP_CREATE_SQ, ["DESTROY_TIS"]),
    (MLX5_CMD_OP_CREATE_RQ, ["DESTROY_SQ", "DESTROY_TIS"]),
    (MLX5_CMD_OP_CREATE_TIR, ["DESTROY_RQ", "DESTROY_SQ", "DESTROY_TIS"]),
])
def test_a_firmware_failure_unwinds_every_step_before_it(res, opcode, gone):
    p, ctx, pd, cq = res
    m = p.machine
    before = state(p, ctx)
    fw(m).inject(opcode, MLX5_CMD_STAT_BAD_PARAM_ERR)
    start = len(fw(m).cmd_log)
    assert errno_of(_raw_qp, pd, cq) == errno.EINVAL
    assert [c for c in cmds(m, start) if c.startswith("DESTROY")] == gone
    assert state(p, ctx) == before                # pins, bfregs, doorbells, fw objects


def test_an_sq_buffer_no_page_size_fits_is_einval(res):
    """create_raw_packet_qp_sq: the SQ buffer at an address whose offset cannot be
    expressed in the WQ's page_offset quanta."""
    p, ctx, pd, cq = res
    before = state(p, ctx)
    ucmd = qp_ucmd(p, sq=8, rq=8, sq_buf_addr=user_pages(p, 2) + 8, uidx=7)
    with pytest.raises(Exception) as ei:
        create_qp_raw(ctx, qp_cmd(pd, cq, 8, 8, qp_type=v.IBV_QPT_RAW_PACKET), ucmd)
    assert ei.value.errno == errno.EINVAL and "SQ buffer" in last_error(p)
    assert state(p, ctx)[3:] == before[3:]


# -- modify, query --------------------------------------------------------------------------
def test_the_transitions_drive_the_sq_and_rq(res):
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq)
    assert _modify(qp, v.IBV_QPS_INIT, v.IBV_QP_PORT) == 0
    assert _states(p, ctx, qp) == (RST, RDY, v.IBV_QPS_INIT)     # receive first
    assert _modify(qp, v.IBV_QPS_RTR) == 0
    assert _states(p, ctx, qp) == (RST, RDY, v.IBV_QPS_RTR)      # nothing to do
    assert _modify(qp, v.IBV_QPS_RTS) == 0
    assert _states(p, ctx, qp) == (RDY, RDY, v.IBV_QPS_RTS)
    attr, init = v.ibv_query_qp(qp, v.IBV_QP_STATE | v.IBV_QP_CAP)
    assert attr.qp_state == IB_QPS_RTS and attr.port_num == 1
    assert init.cap.max_recv_wr >= 4 and init.cap.max_send_wr >= 4
    assert _modify(qp, v.IBV_QPS_ERR) == 0
    assert _states(p, ctx, qp) == (ERR, ERR, v.IBV_QPS_ERR)
    assert _modify(qp, v.IBV_QPS_RESET) == 0
    assert _states(p, ctx, qp) == (RST, RST, v.IBV_QPS_RESET)
    assert v.ibv_destroy_qp(qp) == 0


def test_init_needs_the_port(res):
    """qp_state_table: RESET -> INIT of a RAW_PACKET QP requires IB_QP_PORT."""
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq)
    assert _modify(qp, v.IBV_QPS_INIT) == errno.EINVAL
    assert _states(p, ctx, qp) == (RST, RST, v.IBV_QPS_RESET)


@pytest.mark.parametrize("opcode,target,expect", [
    (MLX5_CMD_OP_MODIFY_RQ, v.IBV_QPS_INIT, (RST, RST, v.IBV_QPS_RESET)),
    (MLX5_CMD_OP_MODIFY_SQ, v.IBV_QPS_RTS, (RST, RDY, v.IBV_QPS_RTR)),
])
def test_a_refused_queue_transition_leaves_the_qp_where_it_was(res, opcode, target, expect):
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq)
    steps = [(v.IBV_QPS_INIT, v.IBV_QP_PORT), (v.IBV_QPS_RTR, 0), (v.IBV_QPS_RTS, 0)]
    for st, mask in steps:
        if st == target:
            break
        assert _modify(qp, st, mask) == 0
    fw(p.machine).inject(opcode, MLX5_CMD_STAT_INT_ERR)
    mask = dict(steps)[target]
    assert _modify(qp, target, mask) != 0
    assert _states(p, ctx, qp) == expect
    assert _modify(qp, target, mask) == 0          # the queue's state was kept right


@pytest.mark.parametrize("op", [MLX5_CMD_OP_RTR2RTS_QP, MLX5_CMD_OP_INIT2RTR_QP, 0x7FF])
def test_a_raw_parameter_or_an_unknown_operation_is_einval(res, op):
    """modify_raw_packet_qp: a rate limit (RTR2RTS; not modelled), raw parameters on
    INIT2RTR, an operation that is no transition.  (libibverbs' legacy MODIFY_QP never
    sends IB_QP_RATE_LIMIT: the driver is called directly.)"""
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq)
    with running(p.task), pytest.raises(KernelError) as ei:
        modify_raw_packet_qp(ib_dev(p.machine), kqp(p, ctx, qp), op,
                             0 if op == 0x7FF else IB_QP_RATE_LIMIT)
    assert ei.value.errno == errno.EINVAL
    assert _states(p, ctx, qp) == (RST, RST, v.IBV_QPS_RESET)


def test_a_failed_query_is_its_errno(res):
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq)
    fw(p.machine).inject(MLX5_CMD_OP_QUERY_SQ, MLX5_CMD_STAT_INT_ERR)
    assert errno_of(v.ibv_query_qp, qp, v.IBV_QP_STATE) == errno.EIO


@pytest.mark.parametrize("sq,rq,qp_state,want", [
    (RST, RST, IB_QPS_RESET, IB_QPS_RESET),
    (RST, RDY, 1, 1), (RDY, RDY, 3, 3),               # the QP's own state decides
    (ERR, RDY, 3, IB_QPS_SQE), (ERR, ERR, 3, IB_QPS_ERR),
    (MLX5_SQ_STATE_NA, ERR, 3, IB_QPS_ERR), (RDY, MLX5_RQ_STATE_NA, 3, 3),
    (MLX5_SQ_STATE_NA, RST, 0, IB_QPS_RESET),
])
def test_the_sq_rq_pair_names_the_qp_state(sq, rq, qp_state, want):
    class _qp:
        state = qp_state
    assert sqrq_state_to_qp_state(sq, rq, _qp) == want


@pytest.mark.parametrize("sq,rq", [(RDY, RST), (ERR, RST), (RST, ERR), (RDY, ERR),
                                   (MLX5_SQ_STATE_NA, MLX5_RQ_STATE_NA)])
def test_a_pair_no_transition_leaves_is_einval(res, sq, rq):
    p, ctx, pd, cq = res
    qp = kqp(p, ctx, _raw_qp(pd, cq))
    with pytest.raises(KernelError) as ei:
        sqrq_state_to_qp_state(sq, rq, qp)
    assert ei.value.errno == errno.EINVAL and "Buggy Raw Packet QP state" in str(ei.value)


# -- destroy --------------------------------------------------------------------------------
def test_destroying_an_rts_qp_resets_its_queues_first(res):
    p, ctx, pd, cq = res
    m = p.machine
    before = state(p, ctx)
    qp = _raw_qp(pd, cq)
    for st, mask in ((v.IBV_QPS_INIT, v.IBV_QP_PORT), (v.IBV_QPS_RTR, 0), (v.IBV_QPS_RTS, 0)):
        assert _modify(qp, st, mask) == 0
    start = len(fw(m).cmd_log)
    assert v.ibv_destroy_qp(qp) == 0
    assert cmds(m, start) == ["MODIFY_RQ", "MODIFY_SQ", "DESTROY_TIR", "DESTROY_RQ",
                              "DESTROY_SQ", "DESTROY_TIS"]
    assert state(p, ctx) == before


def test_a_failing_destroy_command_is_only_warned_about(res):
    """destroy_raw_packet_qp goes on past a failed DESTROY_TIR (the kernel warns)."""
    p, ctx, pd, cq = res
    m = p.machine
    qp = _raw_qp(pd, cq)
    uid = kqp(p, ctx, qp).mqp.uid
    fw(m).inject(MLX5_CMD_OP_DESTROY_TIR, MLX5_CMD_STAT_INT_ERR)
    assert v.ibv_destroy_qp(qp) == 0
    f = fw(m)
    # the TIR the firmware kept still holds its RQ (RES_BUSY): both stay behind
    assert len(f.tirs) == len(f.rqs) == 1 and not f.sqs and not f.tises
    assert any("destroy_raw_packet_qp: TIR" in line for line in ib_dev(m).mdev.log)
    [tirn], [rqn] = list(f.tirs), list(f.rqs)
    with running(p.task):                                # what a retry would do
        mlx5_cmd_destroy_tir(ib_dev(m).mdev, tirn, uid)
        mlx5_core_destroy_rq(ib_dev(m).mdev, rqn, uid)


def test_a_send_lands_in_the_sq_buffer_and_the_device_ignores_it(res):
    """libmlx5 writes a RAW_PACKET QP's send WQEs to its own SQ buffer (sq_start), never
    into the RQ's; the model's device does not execute an SQ (no raw data path): the
    doorbell names no QP it has, which it records as a bad doorbell."""
    p, ctx, pd, cq = res
    qp = _raw_qp(pd, cq)
    for st, mask in ((v.IBV_QPS_INIT, v.IBV_QP_PORT), (v.IBV_QPS_RTR, 0), (v.IBV_QPS_RTS, 0)):
        assert _modify(qp, st, mask) == 0
    rq_before = p.load(qp.buf, qp.buf_size)
    frame = bytes(range(60))
    buf = p.mmap(0, 4096)
    p.store(buf, frame)
    mr = v.ibv_reg_mr(pd, buf, 4096, v.IBV_ACCESS_LOCAL_WRITE)
    wr = v.ibv_send_wr(wr_id=1, sg_list=[v.ibv_sge(buf, len(frame), mr.lkey)],
                       opcode=v.IBV_WR_SEND, send_flags=v.IBV_SEND_SIGNALED)
    assert v.ibv_post_send(qp, wr) == 0
    ctrl = p.load(qp.sq_buf, 16)
    assert ctrl[3] == 0x0A and int.from_bytes(ctrl[4:7], "big") == qp.qp_num  # SEND, sqn
    assert p.load(qp.buf, qp.buf_size) == rq_before
    assert ("bad_doorbell", qp.qp_num) == fw(p.machine).hca.engine.async_events[-1][:2]
    assert v.ibv_dereg_mr(mr) == 0

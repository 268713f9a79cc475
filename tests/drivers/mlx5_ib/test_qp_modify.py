"""Tests for drivers/mlx5_ib/qp_modify.py and qpc.py: mlx5_ib_modify_qp / __mlx5_ib_modify_qp
/ mlx5_set_path / mlx5_ib_query_qp, and the 2RST step of destroy.

The connect cycle is checked in the firmware's QPC after each step; every errno
of the driver leaves the QP where it was (firmware state, driver state,
libibverbs state); the command and optional-field mask of each transition come
from the firmware's own record of what it was sent.
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.cache import make_default_gid
from drivers.ib_core.ib_verbs import (
    IB_RATE_PORT_CURRENT,
    ib_qp_attr,
    ib_udata,
    rdma_calc_flow_label,
    rdma_flow_label_to_udp_sport,
)
from drivers.mlx5_ib.qp_modify import (
    ib_mask_to_mlx5_opt,
    ib_rate_to_mlx5,
    mlx5_ib_modify_qp,
    opt_mask,
    optab,
)
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_2RST_QP,
    MLX5_CMD_STAT_INT_ERR,
    MLX5_GET,
    MLX5_QP_OPTPAR_RAE,
    MLX5_QP_OPTPAR_RNR_TIMEOUT,
    MLX5_QP_OPTPAR_RRE,
    MLX5_QP_OPTPAR_RWE,
    MLX5_QPC_ST_RC,
    MLX5_SET,
)
from kernel_model.trace import Tracer
from kernel_model.uapi.mlx5_abi import mlx5_ib_modify_qp as ucmd_cls
from kernel_model.uapi.mlx5_abi import mlx5_ib_modify_qp_resp
from tests.drivers.mlx5_ib.ladder import (
    RC_INIT_MASK,
    RC_RTR_MASK,
    RC_RTS_MASK,
    cmds,
    fw,
    hole,
    host,
    ib_dev,
    init_attr,
    kqp,
    qp_states,
    rc_qp,
    rtr_attr,
    rts_attr,
    to_state,
    user_pages,
)
from userspace.libibverbs import verbs as v

INIT, RTR, RTS = (v.IBV_QPS_INIT,) * 3, (v.IBV_QPS_RTR,) * 3, (v.IBV_QPS_RTS,) * 3


@pytest.fixture
def rig(app):
    """(p, ctx, qp in RESET, the port's default GID)."""
    p, ctx = app
    gid = make_default_gid(fw(p.machine).vport.mac.to_bytes(6, "big"))
    return p, ctx, rc_qp(ctx), gid


def sent(m):
    """Record every firmware command's input from now on: a list of IfcStruct copies."""
    log, execute = [], fw(m).execute

    def record(in_, out):
        log.append(in_.copy())
        return execute(in_, out)

    fw(m).execute = record
    return log


def qpc(p, qp):
    return fw(p.machine).qps[qp.qp_num].qpc


# -- the connect cycle ----------------------------------------------------------------------
def test_reset_init_rtr_rts_err_reset_in_the_firmware(rig):
    p, ctx, qp, gid = rig
    m = p.machine
    n = len(fw(m).cmd_log)
    c = qpc(p, qp)
    assert v.ibv_modify_qp(qp, init_attr(), RC_INIT_MASK) == 0
    assert (c["state"], c["primary_address_path.vhca_port_num"], c["rwe"], c["rre"],
            c["rae"]) == (1, 1, 1, 0, 0)  # no responder depth yet: remote write only
    assert v.ibv_modify_qp(qp, rtr_attr(gid, 0x4321), RC_RTR_MASK) == 0
    path = MLX5_ADDR_OF("qpc", c, "primary_address_path")
    assert (c["state"], c["mtu"], c["remote_qpn"], c["next_rcv_psn"], c["min_rnr_nak"],
            c["log_rra_max"], c["rwe"], c["rre"]) == (2, v.IBV_MTU_1024, 0x4321, 0x77, 12, 0, 1, 1)
    assert bytes(MLX5_ADDR_OF("ads", path, "rgid_rip")) == gid
    assert (path["rmac_47_32"] << 32 | path["rmac_31_0"]) == fw(m).vport.mac  # own port
    assert (path["src_addr_index"], path["hop_limit"], path["vhca_port_num"], path["grh"],
            path["udp_sport"]) == (0, 1, 1, 0, 0)  # RoCE v1: no UDP; grh is an IB-port bit
    assert v.ibv_modify_qp(qp, rts_attr(), RC_RTS_MASK) == 0
    assert (c["state"], c["next_send_psn"], c["retry_count"], c["rnr_retry"], c["log_sra_max"],
            path["ack_timeout"], c["remote_qpn"]) == (3, 0x55, 7, 7, 0, 14, 0x4321)
    assert qp_states(p, ctx, qp) == RTS
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_ERR), v.IBV_QP_STATE) == 0
    assert qp_states(p, ctx, qp) == (v.IBV_QPS_ERR,) * 3
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RESET), v.IBV_QP_STATE) == 0
    assert qp_states(p, ctx, qp) == (v.IBV_QPS_RESET,) * 3
    assert (c["remote_qpn"], c["next_send_psn"], path["rmac_31_0"], c["pd"] != 0) == \
        (0, 0, 0, True)
    assert cmds(m, n) == ["RST2INIT_QP", "INIT2RTR_QP", "RTR2RTS_QP", "2ERR_QP", "2RST_QP"]
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)   # and around again
    assert qp_states(p, ctx, qp) == RTS


def test_each_transition_sends_its_optional_fields(rig):
    p, ctx, qp, gid = rig
    log = sent(p.machine)
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(min_rnr_timer=3), v.IBV_QP_MIN_RNR_TIMER) == 0
    rrr = MLX5_QP_OPTPAR_RRE | MLX5_QP_OPTPAR_RAE | MLX5_QP_OPTPAR_RWE
    assert [(i.typ, i["opt_param_mask"]) for i in log] == [
        ("rst2init_qp_in", 0),                 # RST2INIT has no optional fields
        ("init2rtr_qp_in", rrr),               # the responder depth recomputes rre/rae/rwe
        ("rtr2rts_qp_in", 0),                  # timeout, retries, sra_max are required there
        ("rts2rts_qp_in", MLX5_QP_OPTPAR_RNR_TIMEOUT)]
    assert qpc(p, qp)["min_rnr_nak"] == 3
    assert all(i["uid"] == kqp(p, ctx, qp).mqp.uid != 0 for i in log)  # the QP's DEVX uid


def test_access_flags_change_in_rts(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)
    attr = v.ibv_qp_attr(qp_access_flags=v.IBV_ACCESS_REMOTE_READ)
    assert v.ibv_modify_qp(qp, attr, v.IBV_QP_ACCESS_FLAGS) == 0
    assert (qpc(p, qp)["rwe"], qpc(p, qp)["rre"]) == (0, 1)
    assert kqp(p, ctx, qp).trans_qp.atomic_rd_en == v.IBV_ACCESS_REMOTE_READ


def test_a_roce_v2_source_gid_sets_udp_sport_and_dscp(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_INIT)
    attr = rtr_attr(gid, 0x4321, sgid_index=1)
    attr.ah_attr.grh.traffic_class, attr.ah_attr.sl = 0x68, 5
    assert v.ibv_modify_qp(qp, attr, RC_RTR_MASK) == 0
    path = MLX5_ADDR_OF("qpc", qpc(p, qp), "primary_address_path")
    sport = rdma_flow_label_to_udp_sport(rdma_calc_flow_label(qp.qp_num, 0x4321))
    assert (path["src_addr_index"], path["udp_sport"], path["dscp"], path["tclass"],
            path["eth_prio"]) == (1, sport, 0x68 >> 2, 0x68, 5)
    assert sport >= 0xC000


def test_a_ud_qp_goes_to_rts_without_an_address(app):
    p, ctx = app
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
    qp = v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq, qp_type=v.IBV_QPT_UD,
                                                cap=v.ibv_qp_cap(4, 4, 1, 1)))
    mask = v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT | v.IBV_QP_QKEY
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, port_num=1,
                                             qkey=0x11111111), mask) == 0
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTR), v.IBV_QP_STATE) == 0
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTS, sq_psn=9),
                           v.IBV_QP_STATE | v.IBV_QP_SQ_PSN) == 0
    c = qpc(p, qp)
    assert (c["state"], c["q_key"], c["mtu"], c["log_msg_max"], c["next_send_psn"]) == \
        (3, 0x11111111, v.IBV_MTU_4096, 12, 9)


@pytest.mark.parametrize("asked, log2", [(1, 0), (2, 1), (3, 2), (5, 3), (12, 4), (16, 4)])
def test_rd_atomic_depths_round_up_to_a_power_of_two(rig, asked, log2):
    """Upstream 78ed28e08e74: fls(n - 1), so 12 asks the firmware for 16 (ilog2 gave 8);
    query_qp reports what the QPC holds."""
    p, ctx, qp, gid = rig
    assert v.ibv_modify_qp(qp, init_attr(), RC_INIT_MASK) == 0
    assert v.ibv_modify_qp(qp, rtr_attr(gid, qp.qp_num, max_dest_rd_atomic=asked),
                           RC_RTR_MASK) == 0
    assert v.ibv_modify_qp(qp, rts_attr(max_rd_atomic=asked), RC_RTS_MASK) == 0
    c = qpc(p, qp)
    assert (c["log_rra_max"], c["log_sra_max"]) == (log2, log2)
    attr, _ = v.ibv_query_qp(qp, v.IBV_QP_MAX_QP_RD_ATOMIC | v.IBV_QP_MAX_DEST_RD_ATOMIC)
    assert (attr.max_rd_atomic, attr.max_dest_rd_atomic) == (1 << log2, 1 << log2)


# -- the driver's refusals --------------------------------------------------------------------
@pytest.mark.parametrize("state, attr_kw, mask, err", [
    (v.IBV_QPS_RESET, dict(pkey_index=1), RC_INIT_MASK, errno.EINVAL),      # one P_Key
    (v.IBV_QPS_INIT, dict(max_dest_rd_atomic=32), RC_RTR_MASK, errno.EINVAL),
    (v.IBV_QPS_INIT, dict(static_rate=30), RC_RTR_MASK, errno.EINVAL),     # no such rate
    (v.IBV_QPS_RTR, dict(max_rd_atomic=32), RC_RTS_MASK, errno.EINVAL),
    (v.IBV_QPS_RTS, dict(qp_state=v.IBV_QPS_SQD), v.IBV_QP_STATE, errno.EINVAL),  # no RTS2SQD
    (v.IBV_QPS_RTS, dict(rnr_retry=3), v.IBV_QP_RNR_RETRY, errno.EINVAL),  # not in RTS->RTS
    (v.IBV_QPS_RTS, dict(qp_state=v.IBV_QPS_INIT), v.IBV_QP_STATE, errno.EINVAL),
])
def test_driver_errors_leave_the_qp_where_it_was(rig, state, attr_kw, mask, err):
    p, ctx, qp, gid = rig
    to_state(qp, state, gid, qp.qp_num)
    n = len(fw(p.machine).cmd_log)
    attr = {v.IBV_QPS_RESET: init_attr(), v.IBV_QPS_INIT: rtr_attr(gid, qp.qp_num),
            v.IBV_QPS_RTR: rts_attr(), v.IBV_QPS_RTS: v.ibv_qp_attr()}[state]
    for key, value in attr_kw.items():
        setattr(attr.ah_attr if key == "static_rate" else attr, key, value)
    assert v.ibv_modify_qp(qp, attr, mask) == err
    assert qp_states(p, ctx, qp) == (state,) * 3
    assert cmds(p.machine, n) == []                     # refused before the firmware


def test_reset_to_reset_is_nothing_to_do(rig):
    p, ctx, qp, _ = rig
    n = len(fw(p.machine).cmd_log)
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RESET), v.IBV_QP_STATE) == 0
    assert cmds(p.machine, n) == []


def test_remote_atomics_need_the_atomic_capability():
    m = host(Mlx5Config(caps={"atomic": 0}))
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    qp = rc_qp(ctx)
    gid = make_default_gid(fw(m).vport.mac.to_bytes(6, "big"))
    attr = init_attr(access=v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_ATOMIC)
    assert v.ibv_modify_qp(qp, attr, RC_INIT_MASK) == 0   # no responder depth yet
    assert v.ibv_modify_qp(qp, rtr_attr(gid, qp.qp_num), RC_RTR_MASK) == errno.EOPNOTSUPP
    assert qp_states(p, ctx, qp) == INIT
    p.exit(0)


def test_the_firmware_refuses_what_the_driver_let_through(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_INIT)
    kept = fw(p.machine).roce_addresses.pop(0)           # the device lost GID 0
    assert v.ibv_modify_qp(qp, rtr_attr(gid, qp.qp_num), RC_RTR_MASK) == errno.EINVAL
    assert qp_states(p, ctx, qp) == INIT
    assert "INIT2RTR_QP" in str(p.task.last_error)
    fw(p.machine).roce_addresses[0] = kept
    assert v.ibv_modify_qp(qp, rtr_attr(gid, qp.qp_num), RC_RTR_MASK) == 0


def test_a_firmware_state_the_driver_did_not_expect(rig):
    """The device moved the QP to ERR on its own (as the data path does): a modify
    from RTS is BAD_QP_STATE (EINVAL) and changes nothing; QUERY_QP reads the truth."""
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)
    MLX5_SET("qpc", qpc(p, qp), "state", 6)
    attr = v.ibv_qp_attr(qp_state=v.IBV_QPS_RTS, min_rnr_timer=1)
    assert v.ibv_modify_qp(qp, attr, v.IBV_QP_STATE | v.IBV_QP_MIN_RNR_TIMER) == errno.EINVAL
    assert qp_states(p, ctx, qp) == (v.IBV_QPS_ERR, v.IBV_QPS_RTS, v.IBV_QPS_RTS)
    assert qpc(p, qp)["min_rnr_nak"] == 12
    assert v.ibv_query_qp(qp, v.IBV_QP_STATE)[0].qp_state == v.IBV_QPS_ERR
    assert qp_states(p, ctx, qp) == (v.IBV_QPS_ERR,) * 3


# -- the driver request (only MODIFY_QP_EX carries one: called directly here) --------------------
def _udata(p, request: bytes, outlen: int = 0) -> ib_udata:
    buf = user_pages(p)
    p.store(buf, request)
    return ib_udata(buf, buf + 2048, len(request), outlen)


def _modify(p, ctx, qp, udata, attr=None, mask=None):
    attr = attr or ib_qp_attr(qp_state=v.IBV_QPS_INIT, port_num=1, qp_access_flags=1)
    try:
        p.run(mlx5_ib_modify_qp, kqp(p, ctx, qp), attr, RC_INIT_MASK if mask is None else mask,
              udata)
    except KernelError as e:
        return e.errno
    return 0


@pytest.mark.parametrize("request_, mask, err", [
    (bytes(8), None, errno.EINVAL),                                   # shorter than ece_options
    (ucmd_cls().pack() + b"\x01" + bytes(7), None, errno.EOPNOTSUPP),  # unknown trailing bytes
    (ucmd_cls(comp_mask=1).pack(), None, errno.EOPNOTSUPP),
    (ucmd_cls().pack()[:8] + b"\x00\x00\x01\x00" + bytes(4), None, errno.EOPNOTSUPP),  # reserved
    (b"", RC_INIT_MASK | 1 << 21, errno.EOPNOTSUPP),                  # past the standard bits
])
def test_driver_request_checks(rig, request_, mask, err):
    p, ctx, qp, _ = rig
    assert _modify(p, ctx, qp, _udata(p, request_), mask=mask) == err
    assert qp_states(p, ctx, qp) == (v.IBV_QPS_RESET,) * 3


def test_the_ece_answer_is_written_back(rig):
    p, ctx, qp, _ = rig
    udata = _udata(p, ucmd_cls(ece_options=0x1234).pack() + bytes(8), outlen=16)
    assert _modify(p, ctx, qp, udata) == 0
    resp = mlx5_ib_modify_qp_resp.unpack(p.load(udata.outbuf, 16))
    assert (resp.response_length, resp.ece_options) == (16, 0)  # the firmware answers 0
    assert kqp(p, ctx, qp).state == v.IBV_QPS_INIT


def test_an_unwritable_answer_is_efault_after_the_move(rig):
    p, ctx, qp, _ = rig
    udata = _udata(p, ucmd_cls().pack(), outlen=16)
    udata.outbuf = hole(p)
    assert _modify(p, ctx, qp, udata) == errno.EFAULT
    assert fw(p.machine).qps[qp.qp_num].state == v.IBV_QPS_INIT   # the user must destroy it


# -- destroy -------------------------------------------------------------------------------------
def test_destroy_moves_a_live_qp_to_reset_first(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)
    n = len(fw(p.machine).cmd_log)
    with Tracer() as t:
        assert p.run(v.ibv_destroy_qp, qp) == 0
    assert_call_flow(t.trace, ["mlx5_ib_destroy_qp", "mlx5_core_qp_modify", "mlx5_cmd_exec",
                               "mlx5_core_destroy_qp", "destroy_qp_user"])
    assert cmds(p.machine, n) == ["2RST_QP", "DESTROY_QP"]


def test_destroy_of_a_qp_in_reset_needs_no_2rst(rig):
    p, ctx, qp, _ = rig
    n = len(fw(p.machine).cmd_log)
    assert v.ibv_destroy_qp(qp) == 0
    assert cmds(p.machine, n) == ["DESTROY_QP"]


def test_a_failing_2rst_is_warned_about_and_the_qp_still_destroyed(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_INIT)
    fw(p.machine).inject(MLX5_CMD_OP_2RST_QP, MLX5_CMD_STAT_INT_ERR)
    assert v.ibv_destroy_qp(qp) == 0
    assert qp.qp_num not in fw(p.machine).qps
    assert any("to RESET failed" in line for line in ib_dev(p.machine).mdev.log)


# -- the tables ----------------------------------------------------------------------------------
def test_optab_and_opt_mask_shapes():
    assert len(optab) == 7 * 2 + 7           # to RST and ERR from 7 states, 7 transitions
    assert (3, 5) not in optab               # RTS -> SQD: mlx5 has no command
    rc_rtr = ib_mask_to_mlx5_opt(RC_RTR_MASK) & opt_mask[(1, 2)][MLX5_QPC_ST_RC]
    assert rc_rtr == MLX5_QP_OPTPAR_RRE | MLX5_QP_OPTPAR_RAE | MLX5_QP_OPTPAR_RWE


@pytest.mark.parametrize("rate, mlx5", [(IB_RATE_PORT_CURRENT, 0), (2, 7), (3, 8), (16, 3)])
def test_ib_rate_to_mlx5(m, rate, mlx5):
    with m.kernel():
        assert ib_rate_to_mlx5(ib_dev(m), rate) == mlx5


def test_query_reads_the_firmware_context(rig):
    p, ctx, qp, gid = rig
    to_state(qp, v.IBV_QPS_RTR, gid, 0x999)
    attr, init = v.ibv_query_qp(qp, v.IBV_QP_STATE)
    assert (attr.qp_state, attr.dest_qp_num, attr.rq_psn, attr.ah_attr.grh.dgid) == \
        (v.IBV_QPS_RTR, 0x999, 0x77, gid)
    assert MLX5_GET("qpc", qpc(p, qp), "state") == v.IBV_QPS_RTR

"""Tests for kernel_model/hw/mlx5_fw_qp.py: the modify commands and the RoCE address table,
issued straight to a ConnectX (no driver)."""

from __future__ import annotations

import pytest

from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_SET_ROCE_ADDRESS,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_QP_STATE_ERR,
    MLX5_CMD_STAT_BAD_RES_ERR,
    MLX5_GET,
    MLX5_QP_OPTPAR_RNR_TIMEOUT,
    MLX5_QP_OPTPAR_RWE,
    MLX5_QP_OPTPAR_SRA_MAX,
    MLX5_QPC_STATE_ERR,
    MLX5_QPC_STATE_INIT,
    MLX5_QPC_STATE_RST,
    MLX5_QPC_STATE_RTR,
    MLX5_QPC_STATE_RTS,
    MLX5_SET,
    IfcStruct,
)
from tests.kernel_model.hw.fwcmd import fails, ladder, ok, qp_fields

BAD_PARAM, BAD_STATE = MLX5_CMD_STAT_BAD_PARAM_ERR, MLX5_CMD_STAT_BAD_QP_STATE_ERR
GID = bytes.fromhex("fe80000000000000bacef6fffe000000")


@pytest.fixture
def qp(up):
    """An RC QP of uid 0 in RESET, RoCE address 0 programmed; (hca, qpn, state log)."""
    objs = ladder(up)
    qpn = MLX5_GET("create_qp_out", ok(up, "create_qp", pas=5, **qp_fields(objs)), "qpn")
    _set_gid(up, 0)
    log: list[tuple[int, int, int]] = []
    up.qp_state_changed = lambda q, old, new: log.append((q.num, old, new))
    return up, qpn, log


def _set_gid(hca, index: int, gid: bytes = GID, **fields: int) -> int:
    """SET_ROCE_ADDRESS with a GID (a byte string, which fwcmd.run cannot set)."""
    in_ = IfcStruct("set_roce_address_in")
    MLX5_SET("set_roce_address_in", in_, "opcode", MLX5_CMD_OP_SET_ROCE_ADDRESS)
    MLX5_SET("set_roce_address_in", in_, "roce_address_index", index)
    for field, value in fields.items():
        MLX5_SET("set_roce_address_in", in_, field, value)
    addr = MLX5_ADDR_OF("set_roce_address_in", in_, "roce_address")
    MLX5_ADDR_OF("roce_addr_layout", addr, "source_l3_address")[:] = gid
    return hca.fw.execute(in_, IfcStruct("set_roce_address_out"))


def qpc(hca, qpn):
    return hca.fw.qps[qpn].qpc


RTR = dict(qpc__mtu=3, qpc__log_msg_max=30, qpc__remote_qpn=0x123,
           qpc__primary_address_path__rmac_47_32=0xbace, qpc__primary_address_path__rmac_31_0=1,
           qpc__primary_address_path__src_addr_index=0, qpc__primary_address_path__hop_limit=1,
           qpc__primary_address_path__vhca_port_num=1, qpc__next_rcv_psn=7,
           qpc__min_rnr_nak=12, qpc__log_rra_max=0)


def to_rtr(hca, qpn, **over):
    ok(hca, "rst2init_qp", qpn=qpn, qpc__primary_address_path__vhca_port_num=1, qpc__rwe=1,
       qpc__rre=1)
    ok(hca, "init2rtr_qp", qpn=qpn, **{**RTR, **over})


def test_the_connect_cycle_keeps_what_each_transition_carries(qp):
    hca, qpn, log = qp
    to_rtr(hca, qpn)
    c = qpc(hca, qpn)
    assert (c["state"], c["mtu"], c["remote_qpn"], c["next_rcv_psn"], c["min_rnr_nak"]) == \
        (MLX5_QPC_STATE_RTR, 3, 0x123, 7, 12)
    assert (c["rwe"], c["rre"], c["primary_address_path.vhca_port_num"]) == (1, 1, 1)
    ok(hca, "rtr2rts_qp", qpn=qpn, qpc__next_send_psn=5, qpc__retry_count=7, qpc__rnr_retry=7,
       qpc__primary_address_path__ack_timeout=14)
    assert (c["state"], c["next_send_psn"], c["retry_count"], c["rnr_retry"],
            c["primary_address_path.ack_timeout"], c["remote_qpn"]) == (3, 5, 7, 7, 14, 0x123)
    ok(hca, "qp_2err", qpn=qpn)
    assert hca.fw.qps[qpn].state == c["state"] == 6     # Mlx5Qp.state reads qpc.state
    ok(hca, "qp_2rst", qpn=qpn)
    assert hca.fw.qps[qpn].state == c["state"] == 0
    assert log == [(qpn, 0, 1), (qpn, 1, 2), (qpn, 2, 3), (qpn, 3, 6), (qpn, 6, 0)]


def test_a_transition_from_the_wrong_state_is_bad_qp_state(qp):
    hca, qpn, log = qp
    fails(hca, "init2rtr_qp", BAD_STATE, "init2rtr_qp_bad_state", qpn=qpn, **RTR)
    fails(hca, "rtr2rts_qp", BAD_STATE, "rtr2rts_qp_bad_state", qpn=qpn)
    fails(hca, "rts2rts_qp", BAD_STATE, "rts2rts_qp_bad_state", qpn=qpn)
    fails(hca, "sqerr2rts_qp", BAD_STATE, "sqerr2rts_qp_bad_state", qpn=qpn)
    fails(hca, "sqd2rts_qp", BAD_STATE, "sqd2rts_qp_bad_state", qpn=qpn)
    fails(hca, "init2init_qp", BAD_STATE, "init2init_qp_bad_state", qpn=qpn)
    ok(hca, "rst2init_qp", qpn=qpn, qpc__primary_address_path__vhca_port_num=1)
    fails(hca, "rst2init_qp", BAD_STATE, "rst2init_qp_bad_state", qpn=qpn,
          qpc__primary_address_path__vhca_port_num=1)
    assert qpc(hca, qpn)["state"] == MLX5_QPC_STATE_INIT and log == [(qpn, 0, 1)]


def test_2err_and_2rst_go_from_any_state(qp):
    hca, qpn, log = qp
    ok(hca, "qp_2err", qpn=qpn)           # even from RESET
    ok(hca, "qp_2err", qpn=qpn)           # and ERR
    ok(hca, "qp_2rst", qpn=qpn)
    ok(hca, "qp_2rst", qpn=qpn)
    assert [e[2] for e in log] == [MLX5_QPC_STATE_ERR] * 2 + [MLX5_QPC_STATE_RST] * 2


def test_reset_clears_what_the_transitions_set_but_not_creation(qp):
    hca, qpn, _ = qp
    c = qpc(hca, qpn)
    created = {f: c[f] for f in ("pd", "cqn_snd", "uar_page", "log_sq_size", "dbr_addr", "st")}
    to_rtr(hca, qpn, qpc__pd=0x77, qpc__log_sq_size=2, qpc__st=2, qpc__uar_page=9)
    assert {f: c[f] for f in created} == created   # create-time fields never move
    c.vals["hw_sq_wqebb_counter"] = 9              # as the data path leaves it
    ok(hca, "qp_2rst", qpn=qpn)
    assert (c["remote_qpn"], c["mtu"], c["next_rcv_psn"], c["rwe"], c["hw_sq_wqebb_counter"],
            c["primary_address_path.vhca_port_num"]) == (0, 0, 0, 0, 0, 0)
    assert bytes(MLX5_ADDR_OF("qpc", c, "primary_address_path.rgid_rip")) == bytes(16)
    assert {f: c[f] for f in created} == created


@pytest.mark.parametrize("over, check", [
    (dict(qpc__mtu=0), "init2rtr_qp_mtu"),
    (dict(qpc__remote_qpn=0), "init2rtr_qp_remote_qpn"),
    (dict(qpc__primary_address_path__rmac_47_32=0, qpc__primary_address_path__rmac_31_0=0),
     "init2rtr_qp_rmac"),
    (dict(qpc__primary_address_path__src_addr_index=3), "init2rtr_qp_src_addr_index"),
    (dict(opt_param_mask=MLX5_QP_OPTPAR_SRA_MAX), "init2rtr_qp_opt_param_mask"),
])
def test_init2rtr_checks_leave_the_qp_in_init(qp, over, check):
    hca, qpn, log = qp
    ok(hca, "rst2init_qp", qpn=qpn, qpc__primary_address_path__vhca_port_num=1)
    fails(hca, "init2rtr_qp", BAD_PARAM, check, qpn=qpn, **{**RTR, **over})
    c = qpc(hca, qpn)
    assert (c["state"], c["remote_qpn"], c["mtu"]) == (MLX5_QPC_STATE_INIT, 0, 0)
    assert log == [(qpn, 0, 1)]


def test_rst2init_needs_a_port(qp):
    hca, qpn, _ = qp
    fails(hca, "rst2init_qp", BAD_PARAM, "rst2init_qp_port", qpn=qpn)
    fails(hca, "rst2init_qp", BAD_PARAM, "rst2init_qp_port", qpn=qpn,
          qpc__primary_address_path__vhca_port_num=2)
    assert qpc(hca, qpn)["state"] == MLX5_QPC_STATE_RST


def test_optional_fields_change_only_with_their_bit(qp):
    hca, qpn, _ = qp
    to_rtr(hca, qpn)
    ok(hca, "rtr2rts_qp", qpn=qpn, qpc__next_send_psn=1)
    c = qpc(hca, qpn)
    ok(hca, "rts2rts_qp", qpn=qpn, qpc__rwe=0, qpc__min_rnr_nak=3)   # no bits: nothing
    assert (c["rwe"], c["min_rnr_nak"], c["state"]) == (1, 12, MLX5_QPC_STATE_RTS)
    ok(hca, "rts2rts_qp", qpn=qpn, opt_param_mask=MLX5_QP_OPTPAR_RWE | MLX5_QP_OPTPAR_RNR_TIMEOUT,
       qpc__rwe=0, qpc__min_rnr_nak=3)
    assert (c["rwe"], c["min_rnr_nak"]) == (0, 3)
    fails(hca, "rts2rts_qp", BAD_PARAM, "rts2rts_qp_opt_param_mask", qpn=qpn,
          opt_param_mask=MLX5_QP_OPTPAR_SRA_MAX)


def test_a_qp_is_named_by_number_and_uid(qp):
    hca, qpn, _ = qp
    fails(hca, "rst2init_qp", MLX5_CMD_STAT_BAD_RES_ERR, "qp_not_found", qpn=qpn + 1)
    uid = MLX5_GET("create_uctx_out", ok(hca, "create_uctx"), "uid")
    fails(hca, "qp_2err", BAD_PARAM, "qp_uid_mismatch", qpn=qpn, uid=uid)
    ok(hca, "destroy_uctx", uid=uid)
    assert qpc(hca, qpn)["state"] == MLX5_QPC_STATE_RST


def test_set_roce_address_programs_and_clears_an_index(up):
    assert _set_gid(up, 256) == BAD_PARAM           # roce_address_table_size 256
    uid = MLX5_GET("create_uctx_out", ok(up, "create_uctx"), "uid")
    assert _set_gid(up, 1, uid=uid) == BAD_PARAM     # the kernel's table only
    ok(up, "destroy_uctx", uid=uid)
    assert up.fw.roce_addresses == {}
    assert _set_gid(up, 5, **{"roce_address.roce_version": 2}) == 0
    kept = up.fw.roce_addresses[5]
    assert bytes(MLX5_ADDR_OF("roce_addr_layout", kept, "source_l3_address")) == GID
    assert kept["roce_version"] == 2
    ok(up, "set_roce_address", roce_address_index=5)   # the zero GID clears it
    assert up.fw.roce_addresses == {}

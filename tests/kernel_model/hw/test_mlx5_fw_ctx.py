"""Tests for kernel_model/hw/mlx5_fw_ctx.py and mlx5_fw_port.py: QP, mkey, port queries."""

from __future__ import annotations

from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_fw_port import DUMP_FILL_MKEY
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_ERR,
    MLX5_CMD_STAT_LIM_ERR,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
    MLX5_QPC_STATE_RST,
    MLX5_REG_PMTU,
    MLX5_REG_PTYS,
    MLX5_ZERO_LEN_RQ,
    be64_to_cpu,
)
from tests.kernel_model.hw.fwcmd import bring_up, fails, ladder, ok, qp_fields

BAD_PARAM, BAD_RES, BUSY = MLX5_CMD_STAT_BAD_PARAM_ERR, MLX5_CMD_STAT_BAD_RES_ERR, \
    MLX5_CMD_STAT_RES_BUSY
INP_LEN = MLX5_CMD_STAT_BAD_INP_LEN_ERR


# -- QP ---------------------------------------------------------------------------------
def test_create_qp_keeps_the_context_and_pas_as_given(up):
    objs = ladder(up)
    pages = [0x7000, 0x9000, 0x3000, 0xB000, 0x1000]
    out = ok(up, "create_qp", pas=pages, **qp_fields(objs))
    qpn = MLX5_GET("create_qp_out", out, "qpn")
    qp = up.fw.qps[qpn]
    assert qpn == 0x100 and qp.state == MLX5_QPC_STATE_RST
    assert qp.qpc["uar_page"] == objs["uar"] and qp.qpc["log_sq_size"] == 8
    assert qp.qpc["log_rq_size"] == 6 and qp.qpc["dbr_addr"] == 0x200040
    assert qp.qpc["user_index"] == 1 and qp.qpc["ts_format"] == 1
    assert [be64_to_cpu(v) for v in qp.pas.tolist()] == pages
    assert repr(qp) == "QP 0x100 RST RC pd=0x1 uar=0x3 cqn_snd=0x400 cqn_rcv=0x400 uid=0"
    assert up.fw.pds[objs["pd"]].users == 1 and up.fw.cqs[objs["cqn"]].users == 2
    q = ok(up, "query_qp", qpn=qpn)
    assert MLX5_GET("query_qp_out", q, "qpc.log_sq_size") == 8
    fails(up, "dealloc_pd", BUSY, "pd_busy", pd=objs["pd"])
    ok(up, "destroy_qp", qpn=qpn)
    fails(up, "destroy_qp", BAD_RES, "qp_not_found", qpn=qpn)
    assert up.fw.cqs[objs["cqn"]].users == 0
    ok(up, "dealloc_pd", pd=objs["pd"])


def test_create_qp_checks(up):
    objs = ladder(up)
    cases = [(dict(qpc__st=0x4), "create_qp_st"),
             (dict(qpc__pd=9), "create_qp_pd"),
             (dict(qpc__uar_page=50), "create_qp_uar"),
             (dict(qpc__cqn_snd=0x999), "create_qp_cqn_snd"),
             (dict(qpc__cqn_rcv=0x999), "create_qp_cqn_rcv"),
             (dict(qpc__log_rq_stride=7), "create_qp_rq_stride"),
             (dict(qpc__ts_format=3), "create_qp_ts_format"),
             (dict(qpc__dbr_addr=0x200042), "create_qp_dbr_align"),
             (dict(wq_umem_valid=1), "create_qp_umem")]
    for over, check in cases:
        fails(up, "create_qp", BAD_PARAM, check, pas=64, **qp_fields(objs, **over))
    # RQ 1 KiB + SQ 16 KiB = 17408 bytes: five 4 KiB pages, or one 32 KiB page
    fails(up, "create_qp", INP_LEN, "create_qp_pas", pas=4, **qp_fields(objs))
    fails(up, "create_qp", INP_LEN, "create_qp_pas", pas=5,
          **qp_fields(objs, qpc__page_offset=63))  # a 4032-byte offset needs a sixth page
    ok(up, "create_qp", pas=1, **qp_fields(objs, qpc__log_page_size=3))
    # no SQ and a zero-length RQ: no buffer, no PAS, no CQs needed
    ok(up, "create_qp", **qp_fields(objs, qpc__no_sq=1, qpc__rq_type=MLX5_ZERO_LEN_RQ,
                                    qpc__cqn_snd=0, qpc__cqn_rcv=0))
    assert len(up.fw.qps) == 2


def test_qp_uids_and_limits(new_hca):
    hca = new_hca(Mlx5Config(caps={"log_max_qp": 1, "log_max_qp_sz": 8}))
    bring_up(hca)
    objs = ladder(hca)
    fails(hca, "create_qp", BAD_PARAM, "create_qp_log_size", pas=9,
          **qp_fields(objs, qpc__log_sq_size=9))
    uid = MLX5_GET("create_uctx_out", ok(hca, "create_uctx"), "uid")
    user = ladder(hca, uid=uid, eqn=objs["eqn"])
    fails(hca, "create_qp", BAD_PARAM, "create_qp_uar", uid=uid, pas=5,
          **qp_fields(user, qpc__uar_page=objs["uar"]))  # another owner's UAR
    fails(hca, "create_qp", BAD_PARAM, "create_qp_pd", pas=5,
          **qp_fields(objs, qpc__pd=user["pd"]))  # the kernel may not use a user's PD
    qpn = MLX5_GET("create_qp_out", ok(hca, "create_qp", uid=uid, pas=5, **qp_fields(user)),
                   "qpn")
    fails(hca, "destroy_qp", BAD_PARAM, "qp_uid_mismatch", qpn=qpn)
    ok(hca, "create_qp", pas=5, **qp_fields(objs))
    fails(hca, "create_qp", MLX5_CMD_STAT_LIM_ERR, "qp_table_full", pas=5, **qp_fields(objs))
    ok(hca, "destroy_qp", qpn=qpn, uid=uid)


# -- mkey -------------------------------------------------------------------------------
def mkey_fields(pd: int, **over: int) -> dict[str, int]:
    """An MTT mkey over 0x7f0000001000 + 0x3000 bytes in 4 KiB pages, key byte 0x5a."""
    f = dict(memory_key_mkey_entry__access_mode_1_0=1, memory_key_mkey_entry__lr=1,
             memory_key_mkey_entry__lw=1, memory_key_mkey_entry__rr=1,
             memory_key_mkey_entry__rw=1, memory_key_mkey_entry__pd=pd,
             memory_key_mkey_entry__mkey_7_0=0x5A,
             memory_key_mkey_entry__start_addr=0x7F0000001000,
             memory_key_mkey_entry__len=0x3000, memory_key_mkey_entry__log_page_size=12,
             memory_key_mkey_entry__translations_octword_size=2,
             translations_octword_actual_size=2)
    f.update(over)
    return f


def test_create_mkey_index_key_context_and_mtt(up):
    pd = MLX5_GET("alloc_pd_out", ok(up, "alloc_pd"), "pd")
    out = ok(up, "create_mkey", pas=3, **mkey_fields(pd))
    index = MLX5_GET("create_mkey_out", out, "mkey_index")
    mk = up.fw.mkeys[index]
    assert index == 8 and mk.mkey == 0x85A  # index << 8 | the driver's key byte
    assert mk.mkc["start_addr"] == 0x7F0000001000 and len(mk.pas) == 3
    assert repr(mk) == "MKEY 0x85a pd=0x1 va=0x7f0000001000 len=0x3000 MTT lr lw rr rw uid=0"
    q = ok(up, "query_mkey", mkey_index=index)
    assert MLX5_GET("query_mkey_out", q, "memory_key_mkey_entry.len") == 0x3000
    fails(up, "dealloc_pd", BUSY, "pd_busy", pd=pd)
    free = ok(up, "create_mkey", **mkey_fields(pd, memory_key_mkey_entry__free=1,
                                              memory_key_mkey_entry__umr_en=1))
    assert "free" in repr(up.fw.mkeys[MLX5_GET("create_mkey_out", free, "mkey_index")])
    ok(up, "destroy_mkey", mkey_index=index)
    fails(up, "destroy_mkey", BAD_RES, "mkey_not_found", mkey_index=index)


def test_create_mkey_checks(up):
    pd = MLX5_GET("alloc_pd_out", ok(up, "alloc_pd"), "pd")
    e = "memory_key_mkey_entry__"
    for over, check in (({e + "pd": 5}, "create_mkey_pd"),
                        ({e + "access_mode_4_2": 2}, "create_mkey_access_mode"),
                        # MEMIC (5) over on-chip memory nobody allocated
                        ({e + "access_mode_4_2": 1}, "create_mkey_memic_range"),
                        ({e + "log_page_size": 11}, "create_mkey_log_page_size"),
                        ({e + "translations_octword_size": 1}, "create_mkey_octwords"),
                        ({"mkey_umem_valid": 1}, "create_mkey_umem")):
        fails(up, "create_mkey", BAD_PARAM, check, pas=3, **mkey_fields(pd, **over))
    fails(up, "create_mkey", INP_LEN, "create_mkey_mtt", pas=2, **mkey_fields(pd))
    # the same range at an unaligned address needs one more page
    fails(up, "create_mkey", INP_LEN, "create_mkey_mtt", pas=3,
          **mkey_fields(pd, **{e + "start_addr": 0x7F0000001040}))


def test_destroy_mkey_by_the_kernel_or_the_owner_only(up):
    uid = MLX5_GET("create_uctx_out", ok(up, "create_uctx"), "uid")
    other = MLX5_GET("create_uctx_out", ok(up, "create_uctx"), "uid")
    pd = MLX5_GET("alloc_pd_out", ok(up, "alloc_pd", uid=uid), "pd")
    a = MLX5_GET("create_mkey_out", ok(up, "create_mkey", uid=uid, pas=3,
                                       **mkey_fields(pd)), "mkey_index")
    b = MLX5_GET("create_mkey_out", ok(up, "create_mkey", uid=uid, pas=3,
                                       **mkey_fields(pd)), "mkey_index")
    fails(up, "destroy_mkey", BAD_PARAM, "mkey_uid_mismatch", mkey_index=a, uid=other)
    ok(up, "destroy_mkey", mkey_index=a)           # mlx5_core_destroy_mkey: no uid
    ok(up, "destroy_mkey", mkey_index=b, uid=uid)  # the owner


# -- port, vport, adapter, special contexts -----------------------------------------------------
def test_nic_vport_context_query_and_modify(up):
    def ctx(field):
        out = ok(up, "query_nic_vport_context")
        return MLX5_GET("nic_vport_context",
                        MLX5_ADDR_OF("query_nic_vport_context_out", out, "nic_vport_context"),
                        field)
    v = up.fw.vport
    assert ctx("node_guid") == v.node_guid == ctx("system_image_guid") == ctx("port_guid")
    assert (ctx("mtu"), ctx("min_wqe_inline_mode"), ctx("roce_en")) == (1522, 1, 0)
    ok(up, "modify_nic_vport_context", field_select__roce_en=1, nic_vport_context__roce_en=1,
       field_select__disable_uc_local_lb=1, nic_vport_context__disable_uc_local_lb=1,
       nic_vport_context__mtu=9000)  # mtu not selected: unchanged
    assert (ctx("roce_en"), ctx("disable_uc_local_lb"), ctx("mtu")) == (1, 1, 1522)
    fails(up, "modify_nic_vport_context", BAD_PARAM, "modify_vport_pf_field",
          field_select__node_guid=1)
    fails(up, "query_nic_vport_context", BAD_PARAM, "vport_not_own", other_vport=1,
          vport_number=1)


def test_port_registers(up):
    out = ok(up, "access_register", op_mod=1, register_id=MLX5_REG_PTYS,
             register_data__local_port=1)
    data = MLX5_ADDR_OF("access_register_out", out, "register_data")
    assert MLX5_GET("ptys_reg", data, "eth_proto_oper") == 1 << 20  # 100GBASE_CR4
    out = ok(up, "access_register", op_mod=1, register_id=MLX5_REG_PMTU,
             register_data__local_port=1)
    data = MLX5_ADDR_OF("access_register_out", out, "register_data")
    assert (MLX5_GET("pmtu_reg", data, "max_mtu"), MLX5_GET("pmtu_reg", data, "oper_mtu")) == (
        9978, 1522)
    ok(up, "access_register", op_mod=0, register_id=MLX5_REG_PMTU, register_data__local_port=1,
       register_data__admin_mtu=4200)
    assert up.fw.vport.mtu == 4200
    fails(up, "access_register", BAD_PARAM, "pmtu_local_port", op_mod=1,
          register_id=MLX5_REG_PMTU, register_data__local_port=2)
    fails(up, "access_register", BAD_PARAM, "ptys_access", op_mod=0,
          register_id=MLX5_REG_PTYS, register_data__local_port=1)
    fails(up, "access_register", BAD_PARAM, "access_reg_unknown_register", op_mod=1,
          register_id=0x9999)


def test_adapter_and_special_contexts(up, new_hca):
    out = ok(up, "query_adapter")
    psid = MLX5_ADDR_OF("query_adapter_out", out, "query_adapter_struct.vsd_contd_psid")
    assert bytes(psid).rstrip(b"\0") == b"MT_0000000359"
    out = ok(up, "query_special_contexts")
    assert MLX5_GET("query_special_contexts_out", out, "dump_fill_mkey") == DUMP_FILL_MKEY \
        == 1792
    assert MLX5_GET("query_special_contexts_out", out, "resd_lkey") == 0x100
    plain = new_hca(Mlx5Config(caps={"dump_fill_mkey": 0}))
    bring_up(plain)
    out = ok(plain, "query_special_contexts")
    assert MLX5_GET("query_special_contexts_out", out, "dump_fill_mkey") == 0

"""Tests for kernel_model/hw/mlx5_fw.py: dispatch, lifecycle, capabilities, small resources."""

from __future__ import annotations

import pytest

from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_fw import SYNDROMES, syndrome
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_ALLOC_PD,
    MLX5_CMD_OP_QUERY_HCA_CAP,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_OP_ERR,
    MLX5_CMD_STAT_BAD_OUTP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_ERR,
    MLX5_CMD_STAT_BAD_SYS_STATE_ERR,
    MLX5_CMD_STAT_INT_ERR,
    MLX5_CMD_STAT_LIM_ERR,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from tests.kernel_model.hw.fwcmd import bring_up, fails, ladder, ok, qp_fields

BAD_PARAM, BAD_RES, BUSY = MLX5_CMD_STAT_BAD_PARAM_ERR, MLX5_CMD_STAT_BAD_RES_ERR, \
    MLX5_CMD_STAT_RES_BUSY


def cap(hca, field, op_mod=1, layout="cmd_hca_cap"):
    out = ok(hca, "query_hca_cap", op_mod=op_mod)
    return MLX5_GET(layout, MLX5_ADDR_OF("query_hca_cap_out", out, "capability"), field)


# -- dispatch -------------------------------------------------------------------------------
def test_unknown_opcode_and_mismatched_layouts(up):
    in_, out = IfcStruct("alloc_pd_in"), IfcStruct("alloc_pd_out")
    MLX5_SET("alloc_pd_in", in_, "opcode", 0x7FF)
    assert up.fw.execute(in_, out) == MLX5_CMD_STAT_BAD_OP_ERR
    assert MLX5_GET("alloc_pd_out", out, "syndrome") == syndrome("bad_opcode")
    assert SYNDROMES[syndrome("bad_opcode")] == "bad_opcode"
    MLX5_SET("alloc_pd_in", in_, "opcode", MLX5_CMD_OP_QUERY_HCA_CAP)  # wrong input layout
    assert up.fw.execute(in_, out) == MLX5_CMD_STAT_BAD_INP_LEN_ERR
    MLX5_SET("alloc_pd_in", in_, "opcode", MLX5_CMD_OP_ALLOC_PD)
    assert up.fw.execute(in_, IfcStruct("dealloc_pd_out")) == MLX5_CMD_STAT_BAD_OUTP_LEN_ERR
    assert up.fw.cmd_log[-1] == ("ALLOC_PD", 0, MLX5_CMD_STAT_BAD_OUTP_LEN_ERR,
                                 syndrome("alloc_pd_outlen"))


def test_lifecycle_gates_commands(hca):
    fails(hca, "query_hca_cap", MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "query_hca_cap_hca_disabled")
    ok(hca, "enable_hca")
    ok(hca, "enable_hca")  # enabling an enabled function is harmless
    fails(hca, "alloc_pd", MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "alloc_pd_hca_enabled")
    fails(hca, "teardown_hca", MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "teardown_hca_hca_enabled")
    ok(hca, "init_hca")
    fails(hca, "init_hca", MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "init_hca_twice")
    fails(hca, "set_hca_cap", MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "set_hca_cap_after_init")
    ok(hca, "teardown_hca")
    assert hca.fw.state == "enabled" and hca.fw.leaked == []
    ok(hca, "disable_hca")
    assert hca.fw.state == "disabled"


def test_injected_failures_hit_the_next_matching_commands(up):
    up.fw.inject(MLX5_CMD_OP_ALLOC_PD, MLX5_CMD_STAT_INT_ERR, "pd_cache", count=2)
    fails(up, "alloc_pd", MLX5_CMD_STAT_INT_ERR, "pd_cache")
    fails(up, "alloc_pd", MLX5_CMD_STAT_INT_ERR, "pd_cache")
    assert MLX5_GET("alloc_pd_out", ok(up, "alloc_pd"), "pd") == 1
    up.fw.inject(MLX5_CMD_OP_QUERY_HCA_CAP, MLX5_CMD_STAT_INT_ERR, op_mod=1)
    ok(up, "query_hca_cap", op_mod=0)  # other op_mod: not this injection
    fails(up, "query_hca_cap", MLX5_CMD_STAT_INT_ERR, "injected", op_mod=1)


# -- capabilities -----------------------------------------------------------------------------
def test_default_capabilities_reproduce_the_reference_device(hca):
    ok(hca, "enable_hca")
    expect = dict(log_bf_reg_size=9, log_max_qp=18, max_wqe_sz_sq=1024, max_wqe_sz_rq=512,
                  log_max_qp_sz=15, log_max_srq_sz=15, num_ports=1, cqe_version=1,
                  dump_fill_mkey=1, log_max_cq_sz=22, log_max_cq=24, log_max_pd=24,
                  log_max_mkey=24, log_max_msg=30, max_qp_mcg=240, port_type=1, roce=1,
                  bf=1, uar_sz=5, log_pg_sz=12)
    for field, value in expect.items():
        assert cap(hca, field, op_mod=0) == value == cap(hca, field), field
    assert (cap(hca, "uar_4k", 0), cap(hca, "uar_4k")) == (1, 0)  # supported, off
    assert (cap(hca, "num_of_uars_per_page"), cap(hca, "log_uar_page_sz")) == (1, 0)
    assert cap(hca, "roce_address_table_size", 9, "roce_cap") == 256
    assert cap(hca, "roce_version", 9, "roce_cap") == 0x5
    assert cap(hca, "wqe_inline_mode", 3, "per_protocol_networking_offload_caps") == 1
    fails(hca, "query_hca_cap", BAD_PARAM, "query_hca_cap_type", op_mod=0x40 << 1 | 1)


def test_set_hca_cap_checks_writable_fields_against_the_maximum(new_hca):
    hca = new_hca(Mlx5Config(caps={"uar_4k": 0}, write_combining=False))
    ok(hca, "enable_hca")
    assert cap(hca, "bf") == 0  # no write-combining: the device says no BlueFlame
    page = dict(capability__log_max_qp=18, capability__log_uar_page_sz=4)
    fails(hca, "set_hca_cap", BAD_PARAM, "set_hca_cap_log_max_qp",
          **{**page, "capability__log_max_qp": 19})
    fails(hca, "set_hca_cap", BAD_PARAM, "set_hca_cap_uar_4k", capability__uar_4k=1, **page)
    fails(hca, "set_hca_cap", BAD_PARAM, "set_hca_cap_cmdif_checksum",
          capability__cmdif_checksum=1, **page)
    fails(hca, "set_hca_cap", BAD_PARAM, "set_hca_cap_type", op_mod=4 << 1, **page)
    ok(hca, "set_hca_cap", capability__log_max_qp=12, capability__log_uar_page_sz=4,
       capability__log_max_uctx=1)  # not writable: ignored
    assert (cap(hca, "log_max_qp"), cap(hca, "log_uar_page_sz")) == (12, 4)
    assert cap(hca, "log_max_uctx") == 7 and hca.fw.uar_page_size == 65536
    for bad in ({"bogus.field": 1}, {"log_max_pizza": 1}, {"roce.log_max_qp": 1}):
        with pytest.raises(ValueError):
            Mlx5Config(caps=bad)


# -- UAR, PD, transport domain, uctx ----------------------------------------------------------
def test_uar_pd_and_transport_domain_allocation(up):
    uars = [MLX5_GET("alloc_uar_out", ok(up, "alloc_uar"), "uar") for _ in range(2)]
    pds = [MLX5_GET("alloc_pd_out", ok(up, "alloc_pd"), "pd") for _ in range(2)]
    tdn = MLX5_GET("alloc_transport_domain_out", ok(up, "alloc_transport_domain"),
                   "transport_domain")
    assert (uars, pds, tdn) == ([3, 4], [1, 2], 1)
    assert repr(up.fw.uars[3]) == "UAR 0x3 uid=0"
    ok(up, "dealloc_uar", uar=3)
    fails(up, "dealloc_uar", BAD_RES, "uar_not_found", uar=3)
    ok(up, "dealloc_pd", pd=1)
    fails(up, "dealloc_pd", BAD_RES, "pd_not_found", pd=1)
    fails(up, "dealloc_transport_domain", BAD_RES, "transport_domain_not_found",
          transport_domain=9)
    ok(up, "dealloc_transport_domain", transport_domain=tdn)
    assert MLX5_GET("alloc_uar_out", ok(up, "alloc_uar"), "uar") == 5  # cyclic numbering
    assert sorted(up.fw.uars) == [4, 5] and list(up.fw.pds) == [2]


def test_with_uar_4k_alloc_uar_hands_out_a_whole_system_page(hca, new_hca):
    """mlx5_core's alloc_uars_page maps one system page per ALLOC_UAR and numbers its
    bfregs up->index + dbi / 4: with 64 KiB pages the answer is a page's first UAR and
    all 16 are the caller's (never a page holding the init segment or another's UARs)."""
    ok(hca, "enable_hca")
    ok(hca, "set_hca_cap", capability__uar_4k=1, capability__log_uar_page_sz=4)
    ok(hca, "init_hca")
    assert hca.fw.uars_per_page == 16 and hca.fw.first_uar == 16
    objs = ladder(hca)                        # its UAR: page 1 (UARs 0x10..0x1f)
    other = MLX5_GET("alloc_uar_out", ok(hca, "alloc_uar"), "uar")
    assert (objs["uar"], other) == (16, 32) and sorted(hca.fw.uars) == [16, 32]
    assert repr(hca.fw.uars[16]) == "UAR 0x10 uid=0 users=2 uars=16"
    # any UAR of an allocated page may go in a context, and counts on the page
    ok(hca, "create_cq", pas=1, cq_context__log_cq_size=6, cq_context__uar_page=16 + 15,
       cq_context__c_eqn_or_apu_element=objs["eqn"])
    qpn = MLX5_GET("create_qp_out", ok(hca, "create_qp", pas=5,
                                       **qp_fields(objs, qpc__uar_page=16 + 2)), "qpn")
    assert hca.fw.qps[qpn].qpc["uar_page"] == 18 and hca.fw.uars[16].users == 4
    fails(hca, "create_cq", BAD_PARAM, "create_cq_uar", pas=1, cq_context__log_cq_size=6,
          cq_context__uar_page=48 + 1, cq_context__c_eqn_or_apu_element=objs["eqn"])
    # a doorbell in any UAR of the page is the device's; past it, a device error
    hca.machine.phys_write(hca.bar.start + 18 * 4096 + 0x800, bytes(8))
    assert (hca.uar_log[-1].uar, hca.uar_log[-1].valid) == (18, True)
    hca.machine.phys_write(hca.bar.start + 50 * 4096 + 0x800, bytes(8))
    assert (hca.uar_log[-1].uar, hca.uar_log[-1].valid) == (50, False)
    hca.device_errors.clear()
    # DEALLOC_UAR names the page by its first UAR, and only once nothing uses it
    fails(hca, "dealloc_uar", BAD_RES, "uar_not_found", uar=17)
    fails(hca, "dealloc_uar", BUSY, "uar_busy", uar=16)
    ok(hca, "dealloc_uar", uar=32)
    assert MLX5_GET("alloc_uar_out", ok(hca, "alloc_uar"), "uar") == 48  # cyclic, by page
    # the table holds the BAR's system pages below the MEMIC window (its last 256 KiB)
    # but the first: 1 MiB - 256 KiB = 12 pages, 11 UARs
    small = new_hca(Mlx5Config(bar_size=1 << 20))
    ok(small, "enable_hca")
    ok(small, "set_hca_cap", capability__uar_4k=1, capability__log_uar_page_sz=4)
    ok(small, "init_hca")
    got = [MLX5_GET("alloc_uar_out", ok(small, "alloc_uar"), "uar") for _ in range(11)]
    assert got == [16 * i for i in range(1, 12)]
    fails(small, "alloc_uar", MLX5_CMD_STAT_LIM_ERR, "uar_table_full")


def test_user_contexts_own_their_objects(up):
    uid = MLX5_GET("create_uctx_out", ok(up, "create_uctx"), "uid")
    assert uid == 1 and repr(up.fw.uctxs[1]) == "UCTX 0x1 uid=1"
    fails(up, "alloc_pd", BAD_PARAM, "alloc_pd_bad_uid", uid=7)  # no such context
    fails(up, "create_uctx", BAD_PARAM, "create_uctx_with_uid", uid=uid)
    pd = MLX5_GET("alloc_pd_out", ok(up, "alloc_pd", uid=uid), "pd")
    assert up.fw.pds[pd].uid == uid
    fails(up, "dealloc_pd", BAD_PARAM, "pd_uid_mismatch", pd=pd)  # the kernel's uid 0
    fails(up, "destroy_uctx", BUSY, "uctx_busy", uid=uid)
    ok(up, "dealloc_pd", pd=pd, uid=uid)
    ok(up, "destroy_uctx", uid=uid)
    fails(up, "destroy_uctx", BAD_RES, "uctx_not_found", uid=uid)


def test_tables_are_limited_by_the_current_capabilities(new_hca):
    hca = new_hca(Mlx5Config(caps={"log_max_pd": 1, "log_max_uctx": 0}))
    bring_up(hca)
    ok(hca, "alloc_pd")
    ok(hca, "alloc_pd")
    fails(hca, "alloc_pd", MLX5_CMD_STAT_LIM_ERR, "pd_table_full")
    ok(hca, "create_uctx")
    fails(hca, "create_uctx", MLX5_CMD_STAT_LIM_ERR, "uctx_table_full")


# -- EQ and CQ --------------------------------------------------------------------------------
def test_eq_and_cq_contexts_are_kept_with_their_pas(up):
    objs = ladder(up)
    eq, cq = up.fw.eqs[objs["eqn"]], up.fw.cqs[objs["cqn"]]
    assert (objs["eqn"], objs["cqn"]) == (7, 0x400)
    assert repr(eq) == "EQ 0x7 size=2^10 uar=0x3 intr=0"
    assert repr(cq) == "CQ 0x400 size=2^6 cqe=64 uar=0x3 eqn=0x7 uid=0"
    assert cq.cqc["log_cq_size"] == 6 and cq.pas.tolist() == [0x0000100000000000]  # be64
    assert up.fw.uars[objs["uar"]].users == 2 and eq.users == 1
    out = ok(up, "query_cq", cqn=objs["cqn"])
    assert MLX5_GET("query_cq_out", out, "cq_context.uar_page") == objs["uar"]
    fails(up, "dealloc_uar", BUSY, "uar_busy", uar=objs["uar"])
    fails(up, "destroy_eq", BUSY, "eq_busy", eq_number=objs["eqn"])
    ok(up, "destroy_cq", cqn=objs["cqn"])
    fails(up, "destroy_cq", BAD_RES, "cq_not_found", cqn=objs["cqn"])
    ok(up, "destroy_eq", eq_number=objs["eqn"])
    ok(up, "dealloc_uar", uar=objs["uar"])


def test_eq_checks(up):
    uar = MLX5_GET("alloc_uar_out", ok(up, "alloc_uar"), "uar")
    good = dict(eq_context_entry__log_eq_size=6, eq_context_entry__uar_page=uar)
    fails(up, "create_eq", BAD_PARAM, "create_eq_uar", pas=1,
          **{**good, "eq_context_entry__uar_page": 99})
    fails(up, "create_eq", BAD_PARAM, "create_eq_log_size", pas=1,
          **{**good, "eq_context_entry__log_eq_size": 23})
    fails(up, "create_eq", MLX5_CMD_STAT_BAD_INP_LEN_ERR, "create_eq_pas", pas=0, **good)
    uid = MLX5_GET("create_uctx_out", ok(up, "create_uctx"), "uid")
    fails(up, "create_eq", BAD_PARAM, "create_eq_uid", pas=1, uid=uid, **good)
    fails(up, "destroy_eq", BAD_RES, "eq_not_found", eq_number=7)


def test_cq_checks(up):
    objs = ladder(up)
    good = dict(cq_context__log_cq_size=6, cq_context__uar_page=objs["uar"],
                cq_context__c_eqn_or_apu_element=objs["eqn"])
    for field, value, check in (("cq_context__log_cq_size", 23, "create_cq_log_size"),
                                ("cq_context__cqe_sz", 3, "create_cq_cqe_sz"),
                                ("cq_context__uar_page", 77, "create_cq_uar"),
                                ("cq_context__c_eqn_or_apu_element", 8, "create_cq_eqn"),
                                ("cq_umem_valid", 1, "create_cq_umem")):
        fails(up, "create_cq", BAD_PARAM, check, pas=1, **{**good, field: value})
    # 128-byte CQEs need two pages for 64 entries, 64-byte ones one
    fails(up, "create_cq", MLX5_CMD_STAT_BAD_INP_LEN_ERR, "create_cq_pas", pas=1,
          cq_context__cqe_sz=1, **good)
    uid = MLX5_GET("create_uctx_out", ok(up, "create_uctx"), "uid")
    fails(up, "create_cq", BAD_PARAM, "create_cq_uar", pas=1, uid=uid, **good)  # kernel UAR?
    user_uar = MLX5_GET("alloc_uar_out", ok(up, "alloc_uar", uid=uid), "uar")
    cqn = MLX5_GET("create_cq_out", ok(up, "create_cq", pas=1, uid=uid, **{
        **good, "cq_context__uar_page": user_uar}), "cqn")  # the EQ is shared (uid 0)
    fails(up, "destroy_cq", BAD_PARAM, "cq_uid_mismatch", cqn=cqn)
    ok(up, "destroy_cq", cqn=cqn, uid=uid)
    ok(up, "create_qp", pas=5, **qp_fields(objs))
    fails(up, "destroy_cq", BUSY, "cq_busy", cqn=objs["cqn"])

"""Tests for kernel_model/hw/mlx5_fw_wq.py: the TIS, SQ, RQ and TIR a raw packet QP is made of."""

from __future__ import annotations

import pytest

from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_fw import syndrome
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_CREATE_RQT,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_ERR,
    MLX5_CMD_STAT_BAD_RES_STATE_ERR,
    MLX5_CMD_STAT_LIM_ERR,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from tests.kernel_model.hw.fwcmd import bring_up, fails, ladder, ok, qp_fields, run

BAD_PARAM, BUSY = MLX5_CMD_STAT_BAD_PARAM_ERR, MLX5_CMD_STAT_RES_BUSY
RDY, ERR = 1, 3


def _td(hca, uid: int = 0) -> int:
    out = ok(hca, "alloc_transport_domain", uid=uid)
    return MLX5_GET("alloc_transport_domain_out", out, "transport_domain")


def _tis(hca, td: int, uid: int = 0) -> int:
    return MLX5_GET("create_tis_out", ok(hca, "create_tis", uid=uid, ctx__transport_domain=td),
                    "tisn")


def sq_fields(objs: dict[str, int], tisn: int, **over: int) -> dict[str, int]:
    """An SQ of 2^6 WQEBBs (one page)."""
    f = dict(ctx__flush_in_error_en=1, ctx__cqn=objs["cqn"], ctx__tis_lst_sz=1,
             ctx__tis_num_0=tisn, ctx__wq__wq_type=1, ctx__wq__pd=objs["pd"],
             ctx__wq__uar_page=objs["uar"], ctx__wq__dbr_addr=0x200040,
             ctx__wq__log_wq_stride=6, ctx__wq__log_wq_sz=6)
    f.update(over)
    return f


def rq_fields(objs: dict[str, int], **over: int) -> dict[str, int]:
    """An RQ of 2^6 16-byte WQEs (a quarter page)."""
    f = dict(ctx__vsd=1, ctx__flush_in_error_en=1, ctx__cqn=objs["cqn"], ctx__wq__wq_type=1,
             ctx__wq__pd=objs["pd"], ctx__wq__dbr_addr=0x200040, ctx__wq__log_wq_stride=4,
             ctx__wq__log_wq_sz=6)
    f.update(over)
    return f


@pytest.fixture
def raw(up):
    """The objects of a raw packet QP but its own: UAR, PD, EQ, CQ, a transport domain."""
    objs = ladder(up)
    objs["td"] = _td(up)
    return up, objs


def test_a_raw_packet_qp_s_objects_and_their_life(raw):
    hca, objs = raw
    fw = hca.fw
    tisn = _tis(hca, objs["td"])
    sqn = MLX5_GET("create_sq_out", ok(hca, "create_sq", pas=1, **sq_fields(objs, tisn)), "sqn")
    rqn = MLX5_GET("create_rq_out", ok(hca, "create_rq", pas=1, **rq_fields(objs)), "rqn")
    tirn = MLX5_GET("create_tir_out", ok(hca, "create_tir", ctx__inline_rqn=rqn,
                                         ctx__transport_domain=objs["td"]), "tirn")
    qpn = MLX5_GET("create_qp_out", ok(hca, "create_qp", pas=5, **qp_fields(objs)), "qpn")
    assert len({sqn, rqn, qpn}) == 3 and sqn >= 0x100 and rqn >= 0x100  # one number space
    assert fw.sqs[sqn].state == fw.rqs[rqn].state == 0                    # created in RST
    assert fw.sqs[sqn].wq["log_wq_sz"] == 6 and fw.tirs[tirn].ctx["inline_rqn"] == rqn
    # in use: the TIS by the SQ, the RQ by the TIR, the CQ and PD by both queues
    fails(hca, "destroy_tis", BUSY, "tis_busy", tisn=tisn)
    fails(hca, "destroy_rq", BUSY, "rq_busy", rqn=rqn)
    fails(hca, "destroy_cq", BUSY, "cq_busy", cqn=objs["cqn"])
    # RST -> RDY -> ERR -> RST, each naming the state the queue is in
    ok(hca, "modify_sq", sqn=sqn, sq_state=0, ctx__state=RDY)
    ok(hca, "modify_rq", rqn=rqn, rq_state=0, ctx__state=RDY)
    out = ok(hca, "query_sq", sqn=sqn)
    assert MLX5_GET("sqc", MLX5_ADDR_OF("query_sq_out", out, "sq_context"), "state") == RDY
    fails(hca, "modify_sq", MLX5_CMD_STAT_BAD_RES_STATE_ERR, "modify_sq_bad_state", sqn=sqn,
          sq_state=0, ctx__state=ERR)
    ok(hca, "modify_sq", sqn=sqn, sq_state=RDY, ctx__state=ERR)
    ok(hca, "modify_rq", rqn=rqn, rq_state=RDY, ctx__state=ERR)
    out = ok(hca, "query_rq", rqn=rqn)
    assert MLX5_GET("rqc", MLX5_ADDR_OF("query_rq_out", out, "rq_context"), "state") == ERR
    ok(hca, "modify_sq", sqn=sqn, sq_state=ERR, ctx__state=0)
    fails(hca, "modify_rq", BAD_PARAM, "modify_rq_state", rqn=rqn, rq_state=ERR, ctx__state=2)
    fails(hca, "modify_rq", BAD_PARAM, "modify_rq_bitmask", rqn=rqn, rq_state=ERR,
          modify_bitmask=1, ctx__state=0)
    ok(hca, "modify_rq", rqn=rqn, rq_state=ERR, modify_bitmask=2, ctx__state=ERR, ctx__vsd=0)
    assert fw.rqs[rqn].rqc["vsd"] == 0 and fw.rqs[rqn].state == ERR   # VSD: modifiable
    # destroyed in the driver's order, everything let go of
    ok(hca, "destroy_tir", tirn=tirn)
    ok(hca, "destroy_rq", rqn=rqn)
    ok(hca, "destroy_sq", sqn=sqn)
    ok(hca, "destroy_tis", tisn=tisn)
    ok(hca, "destroy_qp", qpn=qpn)
    assert not (fw.tises or fw.sqs or fw.rqs or fw.tirs)
    fails(hca, "destroy_sq", MLX5_CMD_STAT_BAD_RES_ERR, "sq_not_found", sqn=sqn)
    assert fw.pds[objs["pd"]].users == fw.cqs[objs["cqn"]].users == 0
    assert fw.tds[objs["td"]].users == 0


@pytest.mark.parametrize("over,check", [
    (dict(ctx__state=RDY), "create_sq_state"),
    (dict(ctx__tis_lst_sz=0), "create_sq_tis_lst_sz"),
    (dict(ctx__hairpin=1), "create_sq_unsupported"),
    (dict(ctx__wq__log_wq_stride=4), "create_sq_log_wq_stride"),
    (dict(ctx__wq__wq_type=0), "create_sq_wq_type"),
    (dict(ctx__wq__log_wq_sz=31), "create_sq_log_wq_sz"),
    (dict(ctx__wq__dbr_addr=0x200042), "create_sq_dbr_align"),
    (dict(ctx__wq__wq_umem_valid=1), "create_sq_umem"),
    (dict(ctx__tis_num_0=0x77), "create_sq_tis"),
    (dict(ctx__cqn=0x77), "create_sq_cqn"),
    (dict(ctx__wq__pd=0x77), "create_sq_pd"),
    (dict(ctx__wq__uar_page=0x7fff), "create_sq_uar"),
])
def test_create_sq_checks(raw, over, check):
    hca, objs = raw
    tisn = _tis(hca, objs["td"])
    fails(hca, "create_sq", BAD_PARAM, check, pas=1, **sq_fields(objs, tisn, **over))
    assert not hca.fw.sqs and hca.fw.tises[tisn].users == 0


def test_create_sq_needs_a_pas_covering_the_wq(raw):
    hca, objs = raw
    tisn = _tis(hca, objs["td"])
    fails(hca, "create_sq", MLX5_CMD_STAT_BAD_INP_LEN_ERR, "create_sq_pas", pas=1,
          **sq_fields(objs, tisn, ctx__wq__log_wq_sz=7))   # 8 KiB on one page


@pytest.mark.parametrize("over,check", [
    (dict(ctx__state=ERR), "create_rq_state"),
    (dict(ctx__mem_rq_type=1), "create_rq_mem_rq_type"),
    (dict(ctx__wq__log_wq_stride=3), "create_rq_log_wq_stride"),
    (dict(ctx__wq__log_wq_stride=10), "create_rq_log_wq_stride"),
    (dict(ctx__wq__wq_type=0), "create_rq_wq_type"),
    (dict(ctx__cqn=0x77), "create_rq_cqn"),
    (dict(ctx__wq__pd=0x77), "create_rq_pd"),
])
def test_create_rq_checks(raw, over, check):
    hca, objs = raw
    fails(hca, "create_rq", BAD_PARAM, check, pas=1, **rq_fields(objs, **over))
    assert not hca.fw.rqs


def test_create_tis_and_tir_checks(raw):
    hca, objs = raw
    fails(hca, "create_tis", BAD_PARAM, "create_tis_transport_domain", ctx__transport_domain=9)
    rqn = MLX5_GET("create_rq_out", ok(hca, "create_rq", pas=1, **rq_fields(objs)), "rqn")
    fails(hca, "create_tir", BAD_PARAM, "create_tir_disp_type", ctx__disp_type=1,
          ctx__inline_rqn=rqn, ctx__transport_domain=objs["td"])
    fails(hca, "create_tir", BAD_PARAM, "create_tir_unsupported", ctx__lro_enable_mask=1,
          ctx__inline_rqn=rqn, ctx__transport_domain=objs["td"])
    fails(hca, "create_tir", BAD_PARAM, "create_tir_inline_rqn", ctx__inline_rqn=rqn + 1,
          ctx__transport_domain=objs["td"])
    fails(hca, "create_tir", BAD_PARAM, "create_tir_transport_domain", ctx__inline_rqn=rqn,
          ctx__transport_domain=objs["td"] + 1)
    assert not hca.fw.tirs and hca.fw.rqs[rqn].users == 0
    ok(hca, "destroy_rq", rqn=rqn)


def test_objects_are_their_uid_s(raw):
    """A user context's TIR cannot point at the kernel's RQ; destroying another uid's
    object is BAD_PARAM; QUERY from the kernel (uid 0) sees any."""
    hca, objs = raw
    uid = MLX5_GET("create_uctx_out", ok(hca, "create_uctx"), "uid")
    utd = _td(hca, uid)
    rqn = MLX5_GET("create_rq_out", ok(hca, "create_rq", pas=1, **rq_fields(objs)), "rqn")
    fails(hca, "create_tir", BAD_PARAM, "create_tir_inline_rqn", uid=uid, ctx__inline_rqn=rqn,
          ctx__transport_domain=utd)
    tisn = _tis(hca, utd, uid)
    fails(hca, "destroy_tis", BAD_PARAM, "tis_uid_mismatch", tisn=tisn)
    ok(hca, "destroy_tis", uid=uid, tisn=tisn)
    ok(hca, "destroy_rq", rqn=rqn)
    ok(hca, "dealloc_transport_domain", uid=uid, transport_domain=utd)
    ok(hca, "destroy_uctx", uid=uid)


def test_tables_are_bounded_by_the_capabilities(new_hca):
    hca = new_hca(Mlx5Config(caps={"log_max_tis": 0, "log_max_sq": 0}))
    bring_up(hca)
    objs = ladder(hca)
    td = _td(hca)
    tisn = _tis(hca, td)
    fails(hca, "create_tis", MLX5_CMD_STAT_LIM_ERR, "tis_table_full", ctx__transport_domain=td)
    ok(hca, "create_sq", pas=1, **sq_fields(objs, tisn))
    status, _ = run(hca, "create_sq", pas=1, **sq_fields(objs, tisn))
    assert status == MLX5_CMD_STAT_LIM_ERR


def _rqt(hca, rqns: list[int], actual: int, max_: int, uid: int = 0) -> tuple[int, int]:
    """CREATE_RQT naming rqns; (status, rqtn or the syndrome)."""
    in_ = IfcStruct("create_rqt_in", rq_num=len(rqns))
    MLX5_SET("create_rqt_in", in_, "opcode", MLX5_CMD_OP_CREATE_RQT)
    MLX5_SET("create_rqt_in", in_, "uid", uid)
    ctx = MLX5_ADDR_OF("create_rqt_in", in_, "rqt_context")
    MLX5_SET("rqtc", ctx, "rqt_actual_size", actual)
    MLX5_SET("rqtc", ctx, "rqt_max_size", max_)
    arr = MLX5_ADDR_OF("create_rqt_in", in_, "rq_num")
    for i, n in enumerate(rqns):
        arr[i] = n
    out = IfcStruct("create_rqt_out")
    status = hca.fw.execute(in_, out)
    return status, (MLX5_GET("create_rqt_out", out, "rqtn") if status == 0
                    else MLX5_GET("mbox_out", out, "syndrome"))


def test_an_rq_table_holds_its_rqs(raw):
    hca, objs = raw
    rqns = [MLX5_GET("create_rq_out", ok(hca, "create_rq", pas=1, **rq_fields(objs)), "rqn")
            for _ in range(2)]
    status, rqtn = _rqt(hca, rqns, 2, 2)
    assert status == 0 and repr(hca.fw.rqts[rqtn]).startswith(f"RQT {rqtn:#x} rqs=[")
    assert all(hca.fw.rqs[n].users == 1 for n in rqns)
    fails(hca, "destroy_rq", BUSY, "rq_busy", rqn=rqns[0])
    ok(hca, "destroy_rqt", rqtn=rqtn)
    for n in rqns:
        ok(hca, "destroy_rq", rqn=n)


@pytest.mark.parametrize("n,actual,max_,status,check", [
    (3, 0, 2, BAD_PARAM, "create_rqt_size"),
    (3, 3, 2, BAD_PARAM, "create_rqt_size"),
    (3, 2, 1 << 12, BAD_PARAM, "create_rqt_size"),
    (1, 2, 2, MLX5_CMD_STAT_BAD_INP_LEN_ERR, "create_rqt_rq_num"),
    (-1, 1, 1, BAD_PARAM, "create_rqt_rqn"),
])
def test_create_rqt_checks(raw, n, actual, max_, status, check):
    hca, objs = raw
    rqn = MLX5_GET("create_rq_out", ok(hca, "create_rq", pas=1, **rq_fields(objs)), "rqn")
    rqns = [rqn + 7] if n < 0 else [rqn] * n
    assert _rqt(hca, rqns, actual, max_) == (status, syndrome(check))
    assert not hca.fw.rqts and hca.fw.rqs[rqn].users == 0
    ok(hca, "destroy_rq", rqn=rqn)

"""The firmware's transport objects: TIS, TIR, SQ, RQ (device model, not kernel code).

An Ethernet (raw packet) queue pair is not a QP to the firmware but four
objects mlx5_ib creates one after the other (create_raw_packet_qp):

    TIS   the send side's transport interface: its transport domain
    SQ    the send work queue: a cyclic WQ of 64-byte WQEBBs, its CQ, the TIS
          it sends through, the PD, UAR and doorbell record of the WQ
    RQ    the receive work queue: a cyclic WQ of receive WQEs and its CQ (also
          what an ibv_create_wq makes)
    RQT   an RQ table (an RSS indirection table: ibv_create_rwq_ind_table)
    TIR   the receive side's transport interface: DIRECT dispatch to one RQ
          (flow steering rules name a TIR as their destination)

Each keeps its context as the command carried it (fw.sqs[sqn].sqc["state"],
.wq is the nested WQ context) and its PAS.  SQ and RQ numbers come from the
QP number space, as on the device (a raw packet QP's qp_num is its SQ's
number, or its RQ's without a send queue).

An SQ or RQ is created in RST and moves by MODIFY_SQ / MODIFY_RQ, which name
the state the caller believes it is in (sq_state / rq_state: BAD_RES_STATE
when it is not) and the new state in the context: RST, RDY or ERR.  Objects
in use refuse destruction (RES_BUSY): a TIS its SQs, an RQ its TIRs, and a
CQ, PD, UAR or transport domain the objects naming them.

Checks are the cheap ones: the uid's objects (or the kernel's, uid 0), field
ranges against the capabilities (log_max_wq_sz, max_wqe_sz_rq,
log_max_tis_per_sq, the table sizes log_max_tis/tir/sq/rq), a cyclic WQ,
the PAS covering the WQ.
# EMU: no data path yet - the HCA does not execute an SQ's WQEs nor deliver
# packets to an RQ; RMP-backed RQs, indirect (RSS) TIRs, hairpin, rate limits
# and modify_bitmask fields but VSD (counter set ids...) are refused with BAD_PARAM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from c_ext import U64Array
from kernel_model.hw.mlx5_fw_cmd import FwError, FwObject, fw_command
from kernel_model.hw.mlx5_fw_ctx import Mlx5Ctx, _check_pas, _copy_pas, destroy_ctx
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_CREATE_RQ,
    MLX5_CMD_OP_CREATE_RQT,
    MLX5_CMD_OP_CREATE_SQ,
    MLX5_CMD_OP_CREATE_TIR,
    MLX5_CMD_OP_CREATE_TIS,
    MLX5_CMD_OP_DESTROY_RQ,
    MLX5_CMD_OP_DESTROY_RQT,
    MLX5_CMD_OP_DESTROY_SQ,
    MLX5_CMD_OP_DESTROY_TIR,
    MLX5_CMD_OP_DESTROY_TIS,
    MLX5_CMD_OP_MODIFY_RQ,
    MLX5_CMD_OP_MODIFY_SQ,
    MLX5_CMD_OP_QUERY_RQ,
    MLX5_CMD_OP_QUERY_SQ,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_STATE_ERR,
    MLX5_CMD_STAT_LIM_ERR,
    MLX5_GET,
    MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE,
    MLX5_RQC_STATE_ERR,
    MLX5_RQC_STATE_RDY,
    MLX5_RQC_STATE_RST,
    MLX5_SET,
    MLX5_SQC_STATE_RST,
    MLX5_TIRC_DISP_TYPE_DIRECT,
    MLX5_WQ_TYPE_CYCLIC,
    IfcStruct,
    memcpy_ifc,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware

_STATES = {MLX5_RQC_STATE_RST: "RST", MLX5_RQC_STATE_RDY: "RDY", MLX5_RQC_STATE_ERR: "ERR"}


class Mlx5Tis(Mlx5Ctx):
    kind = "TIS"

    def __repr__(self) -> str:
        return f"TIS {self.num:#x} td={self.ctx['transport_domain']:#x} uid={self.uid}"


class Mlx5Tir(Mlx5Ctx):
    kind = "TIR"

    def __repr__(self) -> str:
        return (f"TIR {self.num:#x} rqn={self.ctx['inline_rqn']:#x} "
                f"td={self.ctx['transport_domain']:#x} uid={self.uid}")


class Mlx5Rqt(Mlx5Ctx):
    """An RQ table: its context and the RQs it names (pas holds the RQ numbers)."""

    kind = "RQT"

    def __repr__(self) -> str:
        rqns = ",".join(hex(int(self.pas[i])) for i in range(self.ctx["rqt_actual_size"]))
        return f"RQT {self.num:#x} rqs=[{rqns}] uid={self.uid}"


class Mlx5Wq(Mlx5Ctx):
    """An SQ or RQ: its context (sqc / rqc, with the WQ nested) and its PAS."""

    @property
    def state(self) -> int:
        return self.ctx["state"]

    @property
    def wq(self) -> IfcStruct:
        return self.ctx.subs["wq"]

    def __repr__(self) -> str:
        wq = self.wq
        return (f"{self.kind} {self.num:#x} {_STATES.get(self.state, self.state)} "
                f"size=2^{wq['log_wq_sz']} stride=2^{wq['log_wq_stride']} "
                f"cqn={self.ctx['cqn']:#x} pd={wq['pd']:#x} uid={self.uid}")


class Mlx5Sq(Mlx5Wq):
    kind = "SQ"

    @property
    def sqc(self) -> IfcStruct:
        return self.ctx


class Mlx5Rq(Mlx5Wq):
    kind = "RQ"

    @property
    def rqc(self) -> IfcStruct:
        return self.ctx


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


def _bad(check: str) -> FwError:
    return FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, check)


def _limit(fw: Firmware, table: dict, cap: str, what: str) -> None:
    """LIM when the object's table holds 1 << cap objects already."""
    if len(table) >= 1 << fw.cap(cap):
        raise FwError(MLX5_CMD_STAT_LIM_ERR, f"{what}_table_full")


def _wq_number(fw: Firmware) -> int:
    """An SQ or RQ number: from the QP number space, free among QPs, SQs and RQs."""
    return fw.new_id("qp", {**fw.qps, **getattr(fw, "dcts", {}), **fw.sqs, **fw.rqs})


# -- TIS ----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_TIS, "create_tis")
def create_tis(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    uid = _uid(in_)
    tisc = MLX5_ADDR_OF("create_tis_in", in_, "ctx")
    td = fw.ref(fw.tds, tisc["transport_domain"], uid, "create_tis_transport_domain")
    tisn = fw.new_id("tis", fw.tises)
    fw.tises[tisn] = Mlx5Tis(tisn, uid, tisc.copy(), U64Array(0), [td])
    MLX5_SET("create_tis_out", out, "tisn", tisn)


@fw_command(MLX5_CMD_OP_DESTROY_TIS, "destroy_tis")
def destroy_tis(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    tis = fw.lookup(fw.tises, MLX5_GET("destroy_tis_in", in_, "tisn"), _uid(in_), "tis")
    destroy_ctx(fw, fw.tises, tis, "tis")


# -- the WQ common to SQ and RQ -------------------------------------------------------------
def _check_wq(fw: Firmware, wq: IfcStruct, pas: U64Array, what: str) -> None:
    """A cyclic WQ of at most 2^log_max_wq_sz entries, its doorbell record aligned,
    no umem, the PAS covering it."""
    if wq["wq_umem_valid"] or wq["dbr_umem_valid"]:
        raise _bad(f"create_{what}_umem")
    if wq["wq_type"] != MLX5_WQ_TYPE_CYCLIC:
        raise _bad(f"create_{what}_wq_type")
    if wq["log_wq_sz"] > fw.cap("log_max_wq_sz"):
        raise _bad(f"create_{what}_log_wq_sz")
    if wq["dbr_addr"] & 3:
        raise _bad(f"create_{what}_dbr_align")
    _check_pas(pas, wq["log_wq_pg_sz"], wq["page_offset"],
               (1 << wq["log_wq_sz"]) << wq["log_wq_stride"], f"create_{what}_pas")


#: modify_bitmask bits MODIFY_RQ / MODIFY_SQ take, and the context field each changes
#: (MLX5_MODIFY_RQ_IN_MODIFY_BITMASK_VSD: VLAN stripping on or off)
_MODIFIABLE = {"rq": {1 << 1: "vsd"}, "sq": {}}


def _modify_wq(fw: Firmware, table: dict, what: str, in_: IfcStruct) -> None:
    """MODIFY_SQ / MODIFY_RQ: the object in the state the caller names, a new state of
    RST, RDY or ERR; of the context's other fields only those modify_bitmask selects
    (an RQ's vsd; any other bit: BAD_PARAM)."""
    typ = in_.typ
    obj = fw.lookup(table, MLX5_GET(typ, in_, f"{what}n"), _uid(in_), what)
    bitmask = MLX5_GET(typ, in_, "modify_bitmask")
    if bitmask & ~sum(_MODIFIABLE[what]):
        raise _bad(f"modify_{what}_bitmask")
    if MLX5_GET(typ, in_, f"{what}_state") != obj.state:
        raise FwError(MLX5_CMD_STAT_BAD_RES_STATE_ERR, f"modify_{what}_bad_state")
    new = MLX5_ADDR_OF(typ, in_, "ctx")["state"]
    if new not in _STATES:
        raise _bad(f"modify_{what}_state")
    for bit, field in _MODIFIABLE[what].items():
        if bitmask & bit:
            MLX5_SET(obj.ctx.typ, obj.ctx, field, MLX5_ADDR_OF(typ, in_, "ctx")[field])
    MLX5_SET(obj.ctx.typ, obj.ctx, "state", new)


# -- SQ -----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_SQ, "create_sq")
def create_sq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """An SQ in RST: 64-byte WQEBBs, sending through one TIS, completing to its CQ."""
    uid = _uid(in_)
    sqc = MLX5_ADDR_OF("create_sq_in", in_, "ctx")
    wq = MLX5_ADDR_OF("sqc", sqc, "wq")
    pas = MLX5_ADDR_OF("create_sq_in", in_, "pas")
    _limit(fw, fw.sqs, "log_max_sq", "sq")
    if sqc["state"] != MLX5_SQC_STATE_RST:
        raise _bad("create_sq_state")
    if sqc["hairpin"] or sqc["packet_pacing_rate_limit_index"]:
        raise _bad("create_sq_unsupported")
    if not 1 <= sqc["tis_lst_sz"] <= 1 << fw.cap("log_max_tis_per_sq"):
        raise _bad("create_sq_tis_lst_sz")
    if wq["log_wq_stride"] != 6:
        raise _bad("create_sq_log_wq_stride")
    _check_wq(fw, wq, pas, "sq")
    refs: list[FwObject] = [
        fw.ref(fw.tises, sqc["tis_num_0"], uid, "create_sq_tis"),
        fw.ref(fw.cqs, sqc["cqn"], uid, "create_sq_cqn"),
        fw.ref(fw.pds, wq["pd"], uid, "create_sq_pd"),
        fw.ref_uar(wq["uar_page"], uid, "create_sq_uar", shared=False)]
    sqn = _wq_number(fw)
    fw.sqs[sqn] = Mlx5Sq(sqn, uid, sqc.copy(), _copy_pas(pas), refs)
    MLX5_SET("create_sq_out", out, "sqn", sqn)


@fw_command(MLX5_CMD_OP_MODIFY_SQ, "modify_sq")
def modify_sq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    _modify_wq(fw, fw.sqs, "sq", in_)


@fw_command(MLX5_CMD_OP_QUERY_SQ, "query_sq")
def query_sq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    sq = fw.lookup(fw.sqs, MLX5_GET("query_sq_in", in_, "sqn"), _uid(in_), "sq",
                   kernel_any=True)
    memcpy_ifc(MLX5_ADDR_OF("query_sq_out", out, "sq_context"), sq.sqc)


@fw_command(MLX5_CMD_OP_DESTROY_SQ, "destroy_sq")
def destroy_sq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    sq = fw.lookup(fw.sqs, MLX5_GET("destroy_sq_in", in_, "sqn"), _uid(in_), "sq")
    destroy_ctx(fw, fw.sqs, sq, "sq")


# -- RQ -----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_RQ, "create_rq")
def create_rq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """An RQ in RST: receive WQEs of 16 bytes or more, inline in its own WQ."""
    uid = _uid(in_)
    rqc = MLX5_ADDR_OF("create_rq_in", in_, "ctx")
    wq = MLX5_ADDR_OF("rqc", rqc, "wq")
    pas = MLX5_ADDR_OF("create_rq_in", in_, "pas")
    _limit(fw, fw.rqs, "log_max_rq", "rq")
    if rqc["state"] != MLX5_RQC_STATE_RST:
        raise _bad("create_rq_state")
    if rqc["mem_rq_type"] != MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE or rqc["hairpin"]:
        raise _bad("create_rq_mem_rq_type")
    if not 4 <= wq["log_wq_stride"] or 1 << wq["log_wq_stride"] > fw.cap("max_wqe_sz_rq"):
        raise _bad("create_rq_log_wq_stride")
    _check_wq(fw, wq, pas, "rq")
    refs: list[FwObject] = [fw.ref(fw.cqs, rqc["cqn"], uid, "create_rq_cqn"),
                            fw.ref(fw.pds, wq["pd"], uid, "create_rq_pd")]
    rqn = _wq_number(fw)
    fw.rqs[rqn] = Mlx5Rq(rqn, uid, rqc.copy(), _copy_pas(pas), refs)
    MLX5_SET("create_rq_out", out, "rqn", rqn)


@fw_command(MLX5_CMD_OP_MODIFY_RQ, "modify_rq")
def modify_rq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    _modify_wq(fw, fw.rqs, "rq", in_)


@fw_command(MLX5_CMD_OP_QUERY_RQ, "query_rq")
def query_rq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    rq = fw.lookup(fw.rqs, MLX5_GET("query_rq_in", in_, "rqn"), _uid(in_), "rq",
                   kernel_any=True)
    memcpy_ifc(MLX5_ADDR_OF("query_rq_out", out, "rq_context"), rq.rqc)


@fw_command(MLX5_CMD_OP_DESTROY_RQ, "destroy_rq")
def destroy_rq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    rq = fw.lookup(fw.rqs, MLX5_GET("destroy_rq_in", in_, "rqn"), _uid(in_), "rq")
    destroy_ctx(fw, fw.rqs, rq, "rq")


# -- TIR ----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_TIR, "create_tir")
def create_tir(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """A TIR dispatching directly to one RQ of the caller's, in a transport domain."""
    uid = _uid(in_)
    tirc = MLX5_ADDR_OF("create_tir_in", in_, "ctx")
    if tirc["disp_type"] != MLX5_TIRC_DISP_TYPE_DIRECT:
        raise _bad("create_tir_disp_type")
    if tirc["lro_enable_mask"] or tirc["tls_en"]:
        raise _bad("create_tir_unsupported")
    refs: list[FwObject] = [
        fw.ref(fw.rqs, tirc["inline_rqn"], uid, "create_tir_inline_rqn", shared=False),
        fw.ref(fw.tds, tirc["transport_domain"], uid, "create_tir_transport_domain")]
    tirn = fw.new_id("tir", fw.tirs)
    fw.tirs[tirn] = Mlx5Tir(tirn, uid, tirc.copy(), U64Array(0), refs)
    MLX5_SET("create_tir_out", out, "tirn", tirn)


@fw_command(MLX5_CMD_OP_DESTROY_TIR, "destroy_tir")
def destroy_tir(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    tir = fw.lookup(fw.tirs, MLX5_GET("destroy_tir_in", in_, "tirn"), _uid(in_), "tir")
    destroy_ctx(fw, fw.tirs, tir, "tir")


# -- RQT ----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_RQT, "create_rqt")
def create_rqt(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """An RQ table of rqt_actual_size of the caller's RQs (each busy while named), at
    most rqt_max_size <= 2^log_max_rqt_size entries."""
    uid = _uid(in_)
    rqtc = MLX5_ADDR_OF("create_rqt_in", in_, "rqt_context")
    rq_num = MLX5_ADDR_OF("create_rqt_in", in_, "rq_num")
    size, max_size = rqtc["rqt_actual_size"], rqtc["rqt_max_size"]
    if not 1 <= size <= max_size or max_size > 1 << fw.cap("log_max_rqt_size"):
        raise _bad("create_rqt_size")
    if len(rq_num) < size:
        raise FwError(MLX5_CMD_STAT_BAD_INP_LEN_ERR, "create_rqt_rq_num")
    refs: list[FwObject] = [fw.ref(fw.rqs, int(rq_num[i]) & 0xFFFFFF, uid, "create_rqt_rqn",
                                   shared=False) for i in range(size)]
    rqtn = fw.new_id("rqt", fw.rqts)
    fw.rqts[rqtn] = Mlx5Rqt(rqtn, uid, rqtc.copy(), _copy_pas(rq_num), refs)
    MLX5_SET("create_rqt_out", out, "rqtn", rqtn)


@fw_command(MLX5_CMD_OP_DESTROY_RQT, "destroy_rqt")
def destroy_rqt(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    rqt = fw.lookup(fw.rqts, MLX5_GET("destroy_rqt_in", in_, "rqtn"), _uid(in_), "rqt")
    destroy_ctx(fw, fw.rqts, rqt, "rqt")

"""The firmware's shared receive queues and XRC domains: CREATE_SRQ, DESTROY_SRQ,
QUERY_SRQ, ARM_RQ, ALLOC_XRCD, DEALLOC_XRCD (device model).

An SRQ is a ring of receive WQEs in the owner's memory that any number of
QPs (QPC rq_type SRQ, srqn_rmpn_xrqn) take their receives from.  The
firmware keeps the context the driver wrote (srqc: log_srq_size,
log_rq_stride, pd, cqn, lwm, dbr_addr, page_size/offset) and the PAS, as for
a QP, and counts the QPs attached to it (DESTROY_SRQ: RES_BUSY while any
is).  The data path (mlx5_engine.py) follows the ring's linked list.

    fw.srqs[srqn].srqc["log_srq_size"]    fw.srqs[srqn].srqc["lwm"]

ARM_RQ (op_mod SRQ) sets the limit watermark: when a receive leaves fewer
WQEs posted than `lwm`, the device raises the SRQ-limit event once and the
watermark returns to 0 (disarmed) until the next ARM_RQ.

An XRC SRQ names an XRC domain (srqc.xrcd) and the CQ its completions go to
(srqc.cqn), and carries a user index for them; it is the kernel's (uid 0)
and may name any uid's PD and CQ.  An XRC domain (ALLOC_XRCD) is busy while
SRQs or QPs name it.

# EMU: mlx5_ib creates a basic SRQ with the legacy CREATE_SRQ command (the
# path a device without ISSI 1 takes) rather than CREATE_RMP, and an XRC SRQ
# with the same command and context rather than CREATE_XRC_SRQ / xrc_srqc;
# the srqc holds the fields the RMP's wq and the xrc_srqc would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.hw.mlx5_fw_cmd import FwError, FwObject, fw_command
from kernel_model.hw.mlx5_fw_ctx import Mlx5Ctx, _check_pas, _copy_pas, destroy_ctx
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_ARM_RQ_IN_OP_MOD_SRQ,
    MLX5_CMD_OP_ALLOC_XRCD,
    MLX5_CMD_OP_ARM_RQ,
    MLX5_CMD_OP_CREATE_SRQ,
    MLX5_CMD_OP_DEALLOC_XRCD,
    MLX5_CMD_OP_DESTROY_SRQ,
    MLX5_CMD_OP_QUERY_SRQ,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
    memcpy_ifc,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware


class Mlx5Srq(Mlx5Ctx):
    kind = "SRQ"

    @property
    def srqc(self) -> IfcStruct:
        return self.ctx

    def __repr__(self) -> str:
        s = self.srqc
        return (f"SRQ {self.num:#x} size=2^{s['log_srq_size']} "
                f"stride={16 << s['log_rq_stride']} pd={s['pd']:#x} lwm={s['lwm']} "
                f"uid={self.uid}")


class Mlx5Xrcd(FwObject):
    kind = "XRCD"


def _ref(fw: Firmware, table: dict, num: int, uid: int, check: str) -> FwObject:
    """fw.ref(), except that the kernel (uid 0) may name any uid's object."""
    obj = table.get(num)
    if obj is not None and uid == 0:
        return obj
    return fw.ref(table, num, uid, check)


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


def _bad(check: str) -> FwError:
    return FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, check)


@fw_command(MLX5_CMD_OP_CREATE_SRQ, "create_srq")
def create_srq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """Range checks (size against log_max_srq_sz, stride against max_wqe_sz_rq, the
    watermark within the ring, an aligned doorbell record), the PD (and a CQ if one
    is named) the caller's or shared, the PAS covering the ring."""
    uid = _uid(in_)
    srqc = MLX5_ADDR_OF("create_srq_in", in_, "srq_context_entry")
    if srqc["log_srq_size"] > fw.cap("log_max_srq_sz"):
        raise _bad("create_srq_log_size")
    if 16 << srqc["log_rq_stride"] > fw.cap("max_wqe_sz_rq"):
        raise _bad("create_srq_stride")
    if srqc["lwm"] >= 1 << srqc["log_srq_size"]:
        raise _bad("create_srq_lwm")
    if srqc["dbr_addr"] & 3:
        raise _bad("create_srq_dbr_align")
    refs = [_ref(fw, fw.pds, srqc["pd"], uid, "create_srq_pd")]
    if srqc["xrcd"]:
        refs.append(_ref(fw, fw.xrcds, srqc["xrcd"], uid, "create_srq_xrcd"))
    if srqc["cqn"]:
        refs.append(_ref(fw, fw.cqs, srqc["cqn"], uid, "create_srq_cqn"))
    pas = MLX5_ADDR_OF("create_srq_in", in_, "pas")
    _check_pas(pas, srqc["log_page_size"], srqc["page_offset"],
               (1 << srqc["log_srq_size"]) << (srqc["log_rq_stride"] + 4), "create_srq_pas")
    srqn = fw.new_id("srq", fw.srqs)
    keep = srqc.copy()
    fw.srqs[srqn] = Mlx5Srq(srqn, uid, keep, _copy_pas(pas), refs)
    MLX5_SET("create_srq_out", out, "srqn", srqn)


@fw_command(MLX5_CMD_OP_DESTROY_SRQ, "destroy_srq")
def destroy_srq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """RES_BUSY while a QP takes its receives from it."""
    srq = fw.lookup(fw.srqs, MLX5_GET("destroy_srq_in", in_, "srqn"), _uid(in_), "srq")
    destroy_ctx(fw, fw.srqs, srq, "srq")


@fw_command(MLX5_CMD_OP_QUERY_SRQ, "query_srq")
def query_srq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    srq = fw.lookup(fw.srqs, MLX5_GET("query_srq_in", in_, "srqn"), _uid(in_), "srq")
    memcpy_ifc(MLX5_ADDR_OF("query_srq_out", out, "srq_context_entry"), srq.srqc)


@fw_command(MLX5_CMD_OP_ARM_RQ, "arm_rq")
def arm_rq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """op_mod SRQ: the new limit watermark (BAD_PARAM beyond the ring)."""
    if MLX5_GET("mbox_in", in_, "op_mod") != MLX5_ARM_RQ_IN_OP_MOD_SRQ:
        raise _bad("arm_rq_op_mod")     # EMU: only SRQs are armed here
    srq = fw.lookup(fw.srqs, MLX5_GET("arm_rq_in", in_, "srq_number"), _uid(in_), "srq")
    lwm = MLX5_GET("arm_rq_in", in_, "lwm")
    if lwm >= 1 << srq.srqc["log_srq_size"]:
        raise _bad("arm_rq_lwm")
    MLX5_SET("srqc", srq.srqc, "lwm", lwm)
    srq.hw_cache = None


@fw_command(MLX5_CMD_OP_ALLOC_XRCD, "alloc_xrcd")
def alloc_xrcd(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    xrcdn = fw.new_id("xrcd", fw.xrcds)
    fw.xrcds[xrcdn] = Mlx5Xrcd(xrcdn, _uid(in_))
    MLX5_SET("alloc_xrcd_out", out, "xrcd", xrcdn)


@fw_command(MLX5_CMD_OP_DEALLOC_XRCD, "dealloc_xrcd")
def dealloc_xrcd(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """RES_BUSY while an SRQ or a QP names it."""
    xrcd = fw.lookup(fw.xrcds, MLX5_GET("dealloc_xrcd_in", in_, "xrcd"), _uid(in_), "xrcd")
    fw.release(xrcd, "xrcd")
    del fw.xrcds[xrcd.num]

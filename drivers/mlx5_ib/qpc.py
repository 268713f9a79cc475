"""Mirrors drivers/infiniband/hw/mlx5/qpc.c: the QP firmware commands mlx5_ib issues.

CREATE_QP, DESTROY_QP, the modify commands (one opcode per state transition,
each with its own mailbox: modify_qp_mbox_alloc) and QUERY_QP.  Every command
but QUERY_QP carries the QP's uid (a DEVX context's QPs belong to its uid).

Lock order: none (one firmware command each).
"""

from __future__ import annotations

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import (
    LAYOUTS,
    MLX5_ADDR_OF,
    MLX5_CMD_OP_2ERR_QP,
    MLX5_CMD_OP_2RST_QP,
    MLX5_CMD_OP_CREATE_QP,
    MLX5_CMD_OP_DESTROY_QP,
    MLX5_CMD_OP_INIT2INIT_QP,
    MLX5_CMD_OP_INIT2RTR_QP,
    MLX5_CMD_OP_QUERY_QP,
    MLX5_CMD_OP_RST2INIT_QP,
    MLX5_CMD_OP_RTR2RTS_QP,
    MLX5_CMD_OP_RTS2RTS_QP,
    MLX5_CMD_OP_SQD_RTS_QP,
    MLX5_CMD_OP_SQERR2RTS_QP,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
    memcpy_ifc,
)
from drivers.mlx5_ib.mlx5_ib import mlx5_core_qp, mlx5_ib_dev, mlx5_ib_qp, mlx5_ib_warn
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced

#: modify_qp_mbox_alloc(): each modify opcode's mailbox (the layout stem)
MODIFY_QP_MBOX = {
    MLX5_CMD_OP_2RST_QP: "qp_2rst", MLX5_CMD_OP_2ERR_QP: "qp_2err",
    MLX5_CMD_OP_RST2INIT_QP: "rst2init_qp", MLX5_CMD_OP_INIT2RTR_QP: "init2rtr_qp",
    MLX5_CMD_OP_RTR2RTS_QP: "rtr2rts_qp", MLX5_CMD_OP_RTS2RTS_QP: "rts2rts_qp",
    MLX5_CMD_OP_SQERR2RTS_QP: "sqerr2rts_qp", MLX5_CMD_OP_SQD_RTS_QP: "sqd2rts_qp",
    MLX5_CMD_OP_INIT2INIT_QP: "init2init_qp",
}


@traced
def mlx5_qpc_create_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, in_: IfcStruct) -> None:
    """Mirrors mlx5_qpc_create_qp(): CREATE_QP; the qpn."""
    out = IfcStruct("create_qp_out")
    MLX5_SET("create_qp_in", in_, "opcode", MLX5_CMD_OP_CREATE_QP)
    mlx5_cmd_exec(dev.mdev, in_, out)
    qp.mqp.qpn = MLX5_GET("create_qp_out", out, "qpn")


@traced
def mlx5_core_destroy_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> None:
    """Mirrors mlx5_core_destroy_qp(): DESTROY_QP with the QP's uid."""
    in_ = IfcStruct("destroy_qp_in")
    MLX5_SET("destroy_qp_in", in_, "opcode", MLX5_CMD_OP_DESTROY_QP)
    MLX5_SET("destroy_qp_in", in_, "qpn", qp.mqp.qpn)
    MLX5_SET("destroy_qp_in", in_, "uid", qp.mqp.uid)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("destroy_qp_out"))


def modify_qp_mbox_alloc(dev: mlx5_ib_dev, opcode: int, qpn: int, opt_param_mask: int,
                         qpc: IfcStruct | None, uid: int, ece: int) -> tuple[IfcStruct,
                                                                            IfcStruct]:
    """Mirrors modify_qp_mbox_alloc(): the opcode's in/out mailboxes - qpn and uid
    always; opt_param_mask and a copy of the QPC for the transitions that carry
    one; ece where the layout has it.  EINVAL for an opcode that is no transition."""
    stem = MODIFY_QP_MBOX.get(opcode)
    if stem is None:
        mlx5_ib_warn(dev, f"Unknown transition for modify QP: OP({opcode:#x}) QPN({qpn:#x})")
        raise KernelError(EINVAL, f"modify_qp_mbox_alloc: opcode {opcode:#x} is no transition")
    typ = stem + "_in"
    in_ = IfcStruct(typ)
    MLX5_SET(typ, in_, "opcode", opcode)
    MLX5_SET(typ, in_, "qpn", qpn)
    MLX5_SET(typ, in_, "uid", uid)
    if "qpc" in LAYOUTS[typ]:
        MLX5_SET(typ, in_, "opt_param_mask", opt_param_mask)
        memcpy_ifc(MLX5_ADDR_OF(typ, in_, "qpc"), qpc)
    if "ece" in LAYOUTS[typ]:
        MLX5_SET(typ, in_, "ece", ece)
    return in_, IfcStruct(stem + "_out")


@traced
def mlx5_core_qp_modify(dev: mlx5_ib_dev, opcode: int, opt_param_mask: int,
                        qpc: IfcStruct | None, qp: mlx5_core_qp, ece: list[int] | None = None
                        ) -> None:
    """Mirrors mlx5_core_qp_modify(): one transition command; `ece` (a one-element
    list standing for the u32 pointer) is sent and gets the firmware's answer."""
    in_, out = modify_qp_mbox_alloc(dev, opcode, qp.qpn, opt_param_mask, qpc, qp.uid,
                                    ece[0] if ece else 0)
    try:
        mlx5_cmd_exec(dev.mdev, in_, out)
    finally:
        if ece is not None:  # get_ece_from_mbox()
            ece[0] = MLX5_GET(out.typ, out, "ece") if "ece" in LAYOUTS[out.typ] else 0


@traced
def mlx5_core_qp_query(dev: mlx5_ib_dev, qp: mlx5_core_qp, qpc_ext: bool = False) -> IfcStruct:
    """Mirrors mlx5_core_qp_query(): QUERY_QP; the output (the QPC as the firmware keeps it).

    # EMU: the uid is sent.  mlx5_core_qp_query() sends none - the kernel's uid 0
    # may query any QP - but the firmware model's QUERY_QP checks the uid as
    # for a user's own object.
    """
    in_, out = IfcStruct("query_qp_in"), IfcStruct("query_qp_out")
    MLX5_SET("query_qp_in", in_, "opcode", MLX5_CMD_OP_QUERY_QP)
    MLX5_SET("query_qp_in", in_, "qpn", qp.qpn)
    MLX5_SET("query_qp_in", in_, "qpc_ext", int(qpc_ext))
    MLX5_SET("query_qp_in", in_, "uid", qp.uid)
    mlx5_cmd_exec(dev.mdev, in_, out)
    return out

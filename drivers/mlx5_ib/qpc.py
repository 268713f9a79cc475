"""Mirrors drivers/infiniband/hw/mlx5/qpc.c: the QP firmware commands mlx5_ib issues.

CREATE_QP, DESTROY_QP, the modify commands (one opcode per state transition,
each with its own mailbox: modify_qp_mbox_alloc) and QUERY_QP.  Every command
but QUERY_QP carries the QP's uid (a DEVX context's QPs belong to its uid).

Async events: the device's QP table (mlx5_init_qp_table: rsn = qpn | resource type
<< 24 -> QP, filled at create, emptied at destroy - create_resource_common /
destroy_resource_common) listens on mlx5_core's async events; a QP event EQE
(SRQ_LAST_WQE, WQ_CATAS_ERROR, ...) naming a live QP goes to mlx5_ib_qp_event,
which gives the QP's event_handler the ib_event.
# EMU: the table holds the mlx5_ib_qp and every QP's callback is mlx5_ib_qp_event
# (the kernel's mqp.event); that function (qp.c's) is here beside its one caller,
# and runs at once - the kernel defers it to mlx5_ib_event_wq, since an
# event_handler may sleep (uverbs' does not).  The resource refcount that makes
# a destroy wait for a running notifier is not modelled (the interrupt runs to
# its end first).  DCT events are not modelled.

Lock order: qp_table.lock is taken in interrupt context and by create/destroy,
nothing inside it.
"""

from __future__ import annotations

from drivers.ib_core.ib_verbs import (
    IB_EVENT_COMM_EST,
    IB_EVENT_PATH_MIG,
    IB_EVENT_PATH_MIG_ERR,
    IB_EVENT_QP_ACCESS_ERR,
    IB_EVENT_QP_FATAL,
    IB_EVENT_QP_LAST_WQE_REACHED,
    IB_EVENT_QP_REQ_ERR,
    IB_EVENT_SQ_DRAINED,
    ib_event,
)
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.eq import (
    EQE_QP_SRQ_N,
    EQE_QP_SRQ_TYPE,
    MLX5_EVENT_TYPE_COMM_EST,
    MLX5_EVENT_TYPE_PATH_MIG,
    MLX5_EVENT_TYPE_PATH_MIG_FAILED,
    MLX5_EVENT_TYPE_SQ_DRAINED,
    MLX5_EVENT_TYPE_SRQ_LAST_WQE,
    MLX5_EVENT_TYPE_WQ_ACCESS_ERROR,
    MLX5_EVENT_TYPE_WQ_CATAS_ERROR,
    MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR,
)
from drivers.mlx5_core.events import mlx5_notifier_register, mlx5_notifier_unregister
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
from kernel_model.locking import spin_lock_init
from kernel_model.notifier import NOTIFY_DONE, NOTIFY_OK, notifier_block
from kernel_model.trace import traced

MLX5_USER_INDEX_LEN = 24
MLX5_RES_QP = 0                       # enum mlx5_res_type (= MLX5_EVENT_QUEUE_TYPE_QP)

#: mlx5_ib_handle_qp_event()'s translation: the QP event types and their ib_event
QP_EVENTS = {
    MLX5_EVENT_TYPE_PATH_MIG: IB_EVENT_PATH_MIG,
    MLX5_EVENT_TYPE_COMM_EST: IB_EVENT_COMM_EST,
    MLX5_EVENT_TYPE_SQ_DRAINED: IB_EVENT_SQ_DRAINED,
    MLX5_EVENT_TYPE_SRQ_LAST_WQE: IB_EVENT_QP_LAST_WQE_REACHED,
    MLX5_EVENT_TYPE_WQ_CATAS_ERROR: IB_EVENT_QP_FATAL,
    MLX5_EVENT_TYPE_PATH_MIG_FAILED: IB_EVENT_PATH_MIG_ERR,
    MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR: IB_EVENT_QP_REQ_ERR,
    MLX5_EVENT_TYPE_WQ_ACCESS_ERROR: IB_EVENT_QP_ACCESS_ERR,
}


class mlx5_qp_table:
    """Mirrors struct mlx5_qp_table: rsn -> QP, and the notifier on the async events."""

    def __init__(self) -> None:
        self.lock = spin_lock_init("&dev->qp_table.lock")
        self.tree: dict[int, mlx5_ib_qp] = {}
        self.nb = notifier_block(rsc_event_notifier)
        self.nb.table = self

    def __repr__(self) -> str:
        return f"mlx5_qp_table {len(self.tree)} QPs"


@traced
def rsc_event_notifier(nb: notifier_block, type_: int, data: bytes) -> int:
    """Mirrors rsc_event_notifier(): a QP event EQE names its resource (the number,
    and the type in the top byte of the rsn); a live QP gets mlx5_ib_qp_event
    (NOTIFY_OK, also for an rsn not in the table); other events are NOTIFY_DONE."""
    if type_ not in QP_EVENTS:
        return NOTIFY_DONE
    table: mlx5_qp_table = nb.table
    rsn = int.from_bytes(data[EQE_QP_SRQ_N:EQE_QP_SRQ_N + 4], "big") & 0xFFFFFF
    rsn |= data[EQE_QP_SRQ_TYPE] << MLX5_USER_INDEX_LEN
    with table.lock:                                   # mlx5_get_rsc()
        qp = table.tree.get(rsn)
    if qp is not None:
        mlx5_ib_qp_event(qp, type_)
    return NOTIFY_OK


@traced
def mlx5_ib_qp_event(qp: mlx5_ib_qp, type_: int) -> None:
    """Mirrors mlx5_ib_qp_event() + mlx5_ib_handle_qp_event(): the QP's event_handler,
    if any, gets the ib_event of the mlx5 event type (see the module's EMU)."""
    if qp.event_handler is None:
        return
    qp.event_handler(ib_event(qp.device, QP_EVENTS[type_], qp), qp.qp_context)


@traced
def mlx5_init_qp_table(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_init_qp_table(): an empty table listening on the async events."""
    dev.qp_table = mlx5_qp_table()
    mlx5_notifier_register(dev.mdev, dev.qp_table.nb)


@traced
def mlx5_cleanup_qp_table(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_cleanup_qp_table(): off the async events."""
    table = getattr(dev, "qp_table", None)
    if table is None:
        return
    mlx5_notifier_unregister(dev.mdev, table.nb)
    dev.qp_table = None


def create_resource_common(dev: mlx5_ib_dev, qp: mlx5_ib_qp, rsc_type: int) -> None:
    """Mirrors create_resource_common(): the QP into the table under its rsn."""
    table = dev.qp_table
    with table.lock:
        table.tree[qp.mqp.qpn | rsc_type << MLX5_USER_INDEX_LEN] = qp


def destroy_resource_common(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> None:
    """Mirrors destroy_resource_common(): the QP out of the table (no events for it
    from here on)."""
    table = dev.qp_table
    with table.lock:
        table.tree.pop(qp.mqp.qpn | MLX5_RES_QP << MLX5_USER_INDEX_LEN, None)

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
    """Mirrors mlx5_qpc_create_qp(): CREATE_QP; the qpn; the QP into the QP table."""
    out = IfcStruct("create_qp_out")
    MLX5_SET("create_qp_in", in_, "opcode", MLX5_CMD_OP_CREATE_QP)
    mlx5_cmd_exec(dev.mdev, in_, out)
    qp.mqp.qpn = MLX5_GET("create_qp_out", out, "qpn")
    create_resource_common(dev, qp, MLX5_RES_QP)


@traced
def mlx5_core_destroy_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> None:
    """Mirrors mlx5_core_destroy_qp(): the QP out of the QP table, then DESTROY_QP
    with the QP's uid."""
    destroy_resource_common(dev, qp)
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

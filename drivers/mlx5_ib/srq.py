"""Mirrors drivers/infiniband/hw/mlx5/srq.c and srq_cmd.c: user shared receive queues.

ibv_create_srq (libmlx5 has sized the ring - a power of two of WQEs, each a
16-byte next segment then max_gs data segments, rounded to a power of two of
at least 32 bytes - allocated it and a doorbell record, and linked every WQE
to the next) reaches mlx5_ib_create_srq():

    max_wr check -> sizes (max, desc_size, wqe_shift) -> create_srq_user:
        copy ucmd (reserved fields zero, trailing bytes zero), wq_sig,
        ib_umem_get of the ring, mlx5_ib_db_map_user of the record
    -> mlx5_cmd_create_srq -> create_srq_cmd: best page size + quantized
       offset, PAS, the srqc (log_srq_size, log_rq_stride, pd, lwm,
       dbr_addr, page size and offset), CREATE_SRQ
    -> the response: srqn; attr.max_wr = max - 1 (one WQE is the list's tail)

An XRC SRQ (init_attr.srq_type IB_SRQT_XRC) also names its XRC domain and the
CQ its completions go to, and a user index for them (get_srq_user_index); it
belongs to the kernel (uid 0), as it may serve QPs of several processes.
XRC domains themselves are mlx5_ib_alloc_xrcd / mlx5_ib_dealloc_xrcd (ALLOC_XRCD,
DEALLOC_XRCD, uid 0: shared by processes).

MODIFY_SRQ arms the limit (ARM_RQ with the watermark; resizing is EINVAL),
QUERY_SRQ reads it back, DESTROY_SRQ frees the firmware object, then the
doorbell record and the umem.
# EMU: a basic SRQ names no XRC domain and no CQ (the kernel puts the device's
# own devr.xrcdn0 / devr.c0 there, resources not modelled): xrcd and cqn stay 0.
# CREATE_SRQ rather than CREATE_RMP (see kernel_model/hw/mlx5_fw_srq.py).

Async events: the device's SRQ table (mlx5_init_srq_table: srqn -> SRQ, filled at
create, emptied at destroy) listens on mlx5_core's async events; an SRQ_RQ_LIMIT
(or SRQ_CATAS_ERROR) EQE naming a live SRQ becomes mlx5_ib_srq_event ->
IB_EVENT_SRQ_LIMIT_REACHED (IB_EVENT_SRQ_ERR) for the SRQ's event_handler.
# EMU: the SRQ's refcount/completion pair, which makes a destroy wait for an
# event notifier still running on another CPU, is not modelled: the interrupt
# runs to its end on the raising task before anything else does.

Lock order: srq.mutex (modify) is a leaf; srq_table.lock is taken in interrupt
context (the notifier) and by create/destroy, nothing inside it.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.device import ib_device
from drivers.ib_core.ib_verbs import (
    IB_EVENT_SRQ_ERR,
    IB_EVENT_SRQ_LIMIT_REACHED,
    IB_SRQ_LIMIT,
    IB_SRQ_MAX_WR,
    IB_SRQT_BASIC,
    IB_SRQT_XRC,
    ib_copy_from_udata,
    ib_event,
    ib_is_udata_cleared,
    ib_respond_udata,
    ib_srq,
    ib_srq_attr,
    ib_srq_init_attr,
    ib_udata,
    ib_xrcd,
)
from drivers.ib_core.umem import ib_umem, ib_umem_get, ib_umem_num_dma_blocks, ib_umem_release
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.eq import (
    EQE_QP_SRQ_N,
    EQE_TYPE,
    MLX5_EVENT_TYPE_SRQ_CATAS_ERROR,
    MLX5_EVENT_TYPE_SRQ_RQ_LIMIT,
)
from drivers.mlx5_core.events import mlx5_notifier_register, mlx5_notifier_unregister
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_ADDR_OF,
    MLX5_ARM_RQ_IN_OP_MOD_SRQ,
    MLX5_CMD_OP_ALLOC_XRCD,
    MLX5_CMD_OP_ARM_RQ,
    MLX5_CMD_OP_CREATE_SRQ,
    MLX5_CMD_OP_DEALLOC_XRCD,
    MLX5_CMD_OP_DESTROY_SRQ,
    MLX5_CMD_OP_QUERY_SRQ,
    MLX5_GET,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from drivers.mlx5_ib.doorbell import mlx5_ib_db_map_user, mlx5_ib_db_unmap_user
from drivers.mlx5_ib.main import rdma_udata_to_drv_context
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas, mlx5_umem_find_best_quantized_pgoff
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_CQE_VERSION_V1,
    MLX5_IB_DEFAULT_UIDX,
    MLX5_USER_ASSIGNED_UIDX_MASK,
    ilog2,
    mlx5_db,
    mlx5_ib_dev,
    mlx5_ib_warn,
    order_base_2,
    roundup_pow_of_two,
    to_mcq,
    to_mdev,
    to_mpd,
)
from kernel_model.errno import EFAULT, EINVAL, EOPNOTSUPP, KernelError
from kernel_model.locking import mutex_init, spin_lock_init
from kernel_model.notifier import NOTIFY_DONE, NOTIFY_OK, notifier_block
from kernel_model.trace import traced
from kernel_model.uapi import mlx5_abi as abi

MLX5_SRQ_FLAG_SIGNATURE = 1 << 0      # mlx5_ib_create_srq.flags (rdma/mlx5-abi.h)
MLX5_WQE_SRQ_NEXT_SEG_SIZE = 16       # sizeof(struct mlx5_wqe_srq_next_seg)
MLX5_WQE_DATA_SEG_SIZE = 16           # sizeof(struct mlx5_wqe_data_seg)


class mlx5_ib_xrcd(ib_xrcd):
    """Mirrors struct mlx5_ib_xrcd: the firmware XRC domain."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.xrcdn = 0


def to_mxrcd(xrcd: ib_xrcd) -> mlx5_ib_xrcd:
    """Mirrors to_mxrcd()."""
    return xrcd  # type: ignore[return-value]


@traced
def mlx5_ib_alloc_xrcd(ibxrcd: ib_xrcd, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_alloc_xrcd(): EOPNOTSUPP without the xrc capability, then
    mlx5_cmd_xrcd_alloc (ALLOC_XRCD, uid 0)."""
    dev = to_mdev(ibxrcd.device)
    if not MLX5_CAP_GEN(dev.mdev, "xrc"):
        raise KernelError(EOPNOTSUPP, "mlx5_ib_alloc_xrcd: no XRC support")
    in_ = IfcStruct("alloc_xrcd_in")
    MLX5_SET("alloc_xrcd_in", in_, "opcode", MLX5_CMD_OP_ALLOC_XRCD)
    out = IfcStruct("alloc_xrcd_out")
    mlx5_cmd_exec(dev.mdev, in_, out)
    to_mxrcd(ibxrcd).xrcdn = MLX5_GET("alloc_xrcd_out", out, "xrcd")


@traced
def mlx5_ib_dealloc_xrcd(ibxrcd: ib_xrcd, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_dealloc_xrcd(): mlx5_cmd_xrcd_dealloc (DEALLOC_XRCD)."""
    dev = to_mdev(ibxrcd.device)
    in_ = IfcStruct("dealloc_xrcd_in")
    MLX5_SET("dealloc_xrcd_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_XRCD)
    MLX5_SET("dealloc_xrcd_in", in_, "xrcd", to_mxrcd(ibxrcd).xrcdn)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("dealloc_xrcd_out"))


class mlx5_core_srq:
    """Mirrors struct mlx5_core_srq: the firmware SRQ and its geometry."""

    def __init__(self) -> None:
        self.srqn = 0
        self.uid = 0
        self.user_index = MLX5_IB_DEFAULT_UIDX
        self.max = 0            # WQEs in the ring (a power of two)
        self.max_gs = 0
        self.max_avail_gather = 0
        self.wqe_shift = 0
        self.event: Any = None      # (mlx5_core_srq, event type): mlx5_ib_srq_event
        self.ibsrq: Any = None      # container_of: the mlx5_ib_srq this is part of


class mlx5_ib_srq(ib_srq):
    """Mirrors struct mlx5_ib_srq (the user flavour)."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.msrq = mlx5_core_srq()
        self.msrq.ibsrq = self
        self.umem: ib_umem | None = None
        self.db = mlx5_db()
        self.wq_sig = False
        self.mutex = mutex_init("&srq->mutex")

    def __repr__(self) -> str:
        return (f"mlx5_ib_srq {self.msrq.srqn:#x} max={self.msrq.max} "
                f"stride={1 << self.msrq.wqe_shift}")


def to_msrq(srq: ib_srq) -> mlx5_ib_srq:
    """Mirrors to_msrq()."""
    return srq  # type: ignore[return-value]


def to_mibsrq(msrq: mlx5_core_srq) -> mlx5_ib_srq:
    """Mirrors to_mibsrq(): the mlx5_ib_srq around a core SRQ."""
    return msrq.ibsrq


# -- the SRQ table and its async events (srq_cmd.c) ----------------------------------------
class mlx5_srq_table:
    """Mirrors struct mlx5_srq_table: srqn -> core SRQ (None: being destroyed, the
    index kept), and the notifier block on mlx5_core's async events."""

    def __init__(self) -> None:
        self.lock = spin_lock_init("&dev->srq_table.array.xa_lock")
        self.array: dict[int, mlx5_core_srq | None] = {}
        self.nb = notifier_block(srq_event_notifier)
        self.nb.table = self

    def __repr__(self) -> str:
        return f"mlx5_srq_table {len(self.array)} SRQs"


@traced
def srq_event_notifier(nb: notifier_block, type_: int, data: bytes) -> int:
    """Mirrors srq_event_notifier(): an SRQ_CATAS_ERROR or SRQ_RQ_LIMIT EQE goes to
    the event callback of the SRQ it names (NOTIFY_OK; an SRQ not in the table -
    destroyed meanwhile - is skipped); any other event is NOTIFY_DONE."""
    if type_ not in (MLX5_EVENT_TYPE_SRQ_CATAS_ERROR, MLX5_EVENT_TYPE_SRQ_RQ_LIMIT):
        return NOTIFY_DONE
    table: mlx5_srq_table = nb.table
    srqn = int.from_bytes(data[EQE_QP_SRQ_N:EQE_QP_SRQ_N + 4], "big") & 0xFFFFFF
    with table.lock:
        srq = table.array.get(srqn)
    if srq is None:
        return NOTIFY_OK
    srq.event(srq, data[EQE_TYPE])
    return NOTIFY_OK


@traced
def mlx5_init_srq_table(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_init_srq_table(): an empty table listening on the async events."""
    dev.srq_table = mlx5_srq_table()
    mlx5_notifier_register(dev.mdev, dev.srq_table.nb)


@traced
def mlx5_cleanup_srq_table(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_cleanup_srq_table(): off the async events."""
    table = getattr(dev, "srq_table", None)
    if table is None:
        return
    mlx5_notifier_unregister(dev.mdev, table.nb)
    dev.srq_table = None


@traced
def mlx5_ib_srq_event(srq: mlx5_core_srq, type_: int) -> None:
    """Mirrors mlx5_ib_srq_event(): the SRQ's event_handler, if any, gets
    IB_EVENT_SRQ_LIMIT_REACHED (SRQ_RQ_LIMIT) or IB_EVENT_SRQ_ERR (SRQ_CATAS_ERROR);
    any other type is warned about."""
    ibsrq = to_mibsrq(srq)
    if ibsrq.event_handler is None:
        return
    if type_ == MLX5_EVENT_TYPE_SRQ_RQ_LIMIT:
        event = IB_EVENT_SRQ_LIMIT_REACHED
    elif type_ == MLX5_EVENT_TYPE_SRQ_CATAS_ERROR:
        event = IB_EVENT_SRQ_ERR
    else:
        mlx5_ib_warn(to_mdev(ibsrq.device), f"Unexpected event type {type_} on SRQ "
                     f"{srq.srqn:06x}")
        return
    ibsrq.event_handler(ib_event(ibsrq.device, event, ibsrq), ibsrq.srq_context)


@traced
def create_srq_user(dev: mlx5_ib_dev, srq: mlx5_ib_srq, udata: ib_udata, buf_size: int) -> None:
    """Mirrors create_srq_user(): the request (EINVAL for reserved fields or
    non-zero trailing bytes), the ring's umem and the doorbell record."""
    ucmdlen = min(udata.inlen, abi.mlx5_ib_create_srq.SIZE)
    ucmd = ib_copy_from_udata(abi.mlx5_ib_create_srq, udata, ucmdlen)
    if ucmd.reserved0 or ucmd.reserved1:
        raise KernelError(EINVAL, "create_srq_user: reserved field set")
    size = abi.mlx5_ib_create_srq.SIZE
    if udata.inlen > size and not ib_is_udata_cleared(udata, size, udata.inlen - size):
        raise KernelError(EINVAL, "create_srq_user: unknown trailing request bytes")
    if srq.srq_type != IB_SRQT_BASIC:
        srq.msrq.user_index = get_srq_user_index(rdma_udata_to_drv_context(srq), ucmd,
                                                 udata.inlen)
    srq.wq_sig = bool(ucmd.flags & MLX5_SRQ_FLAG_SIGNATURE)
    srq.umem = ib_umem_get(srq.device, ucmd.buf_addr, buf_size, 0)
    try:
        mlx5_ib_db_map_user(rdma_udata_to_drv_context(srq), ucmd.db_addr, srq.db)
    except BaseException:
        ib_umem_release(srq.umem)
        srq.umem = None
        raise
    srq.msrq.uid = to_mpd(srq.pd).uid if srq.srq_type != IB_SRQT_XRC else 0


def get_srq_user_index(context: object, ucmd: abi.mlx5_ib_create_srq, inlen: int) -> int:
    """Mirrors get_srq_user_index() -> verify_assign_uidx(): a v1-CQE context names a
    24-bit user index (EINVAL otherwise, or for a request too short to hold one);
    a v0 one sends the default."""
    has_uidx = abi.mlx5_ib_create_srq.offsetof("uidx") + 4 <= inlen
    v1 = context.cqe_version == MLX5_CQE_VERSION_V1
    if has_uidx and not v1 and ucmd.uidx == MLX5_IB_DEFAULT_UIDX:
        return MLX5_IB_DEFAULT_UIDX
    if has_uidx != v1:
        raise KernelError(EINVAL, "get_srq_user_index: user index and CQE version disagree")
    if not v1:
        return MLX5_IB_DEFAULT_UIDX
    if ucmd.uidx & ~MLX5_USER_ASSIGNED_UIDX_MASK:
        raise KernelError(EINVAL, f"verify_assign_uidx: uidx {ucmd.uidx:#x}")
    return ucmd.uidx & MLX5_USER_ASSIGNED_UIDX_MASK


def destroy_srq_user(srq: mlx5_ib_srq) -> None:
    """Mirrors destroy_srq_user(): the doorbell record, then the ring."""
    mlx5_ib_db_unmap_user(rdma_udata_to_drv_context(srq), srq.db)
    ib_umem_release(srq.umem)
    srq.umem = None


@traced
def create_srq_cmd(dev: mlx5_ib_dev, srq: mlx5_ib_srq, lwm: int) -> None:
    """Mirrors create_srq_cmd() with set_srqc(): the best page size for the ring
    (EINVAL if none fits), its PAS, the context, CREATE_SRQ; the srqn."""
    page_size, page_offset_quantized = mlx5_umem_find_best_quantized_pgoff(
        srq.umem, "srqc", "log_page_size", MLX5_ADAPTER_PAGE_SHIFT, "page_offset", 64)
    if not page_size:
        raise KernelError(EINVAL, "create_srq_cmd: no page size fits the ring")
    in_ = IfcStruct("create_srq_in", pas=ib_umem_num_dma_blocks(srq.umem, page_size))
    MLX5_SET("create_srq_in", in_, "uid", srq.msrq.uid)
    srqc = MLX5_ADDR_OF("create_srq_in", in_, "srq_context_entry")
    MLX5_SET("srqc", srqc, "wq_signature", int(srq.wq_sig))
    MLX5_SET("srqc", srqc, "log_srq_size", ilog2(srq.msrq.max))
    MLX5_SET("srqc", srqc, "log_rq_stride", srq.msrq.wqe_shift - 4)
    MLX5_SET("srqc", srqc, "lwm", lwm)
    MLX5_SET("srqc", srqc, "pd", to_mpd(srq.pd).pdn)
    MLX5_SET64("srqc", srqc, "dbr_addr", srq.db.dma)
    if srq.srq_type == IB_SRQT_XRC:
        MLX5_SET("srqc", srqc, "xrcd", to_mxrcd(srq.xrcd).xrcdn)
        MLX5_SET("srqc", srqc, "cqn", to_mcq(srq.cq).mcq.cqn)
        MLX5_SET("srqc", srqc, "user_index", srq.msrq.user_index)
    MLX5_SET("srqc", srqc, "log_page_size", order_base_2(page_size) - MLX5_ADAPTER_PAGE_SHIFT)
    MLX5_SET("srqc", srqc, "page_offset", page_offset_quantized)
    mlx5_ib_populate_pas(srq.umem, page_size, MLX5_ADDR_OF("create_srq_in", in_, "pas"), 0)
    MLX5_SET("create_srq_in", in_, "opcode", MLX5_CMD_OP_CREATE_SRQ)
    out = IfcStruct("create_srq_out")
    mlx5_cmd_exec(dev.mdev, in_, out)
    srq.msrq.srqn = MLX5_GET("create_srq_out", out, "srqn")
    table = dev.srq_table
    with table.lock:                  # mlx5_cmd_create_srq(): xa_store_irq
        table.array[srq.msrq.srqn] = srq.msrq


@traced
def mlx5_cmd_destroy_srq(dev: mlx5_ib_dev, srq: mlx5_ib_srq) -> None:
    """Mirrors mlx5_cmd_destroy_srq() -> destroy_srq_cmd(): the table entry emptied
    (its index kept; events for the SRQ are dropped from here on), DESTROY_SRQ with
    its uid - on failure the entry is put back - then the index erased."""
    table = dev.srq_table
    srqn = srq.msrq.srqn
    with table.lock:
        table.array[srqn] = None      # xa_cmpxchg_irq(..., srq, XA_ZERO_ENTRY)
    in_ = IfcStruct("destroy_srq_in")
    MLX5_SET("destroy_srq_in", in_, "opcode", MLX5_CMD_OP_DESTROY_SRQ)
    MLX5_SET("destroy_srq_in", in_, "srqn", srqn)
    MLX5_SET("destroy_srq_in", in_, "uid", srq.msrq.uid)
    try:
        mlx5_cmd_exec(dev.mdev, in_, IfcStruct("destroy_srq_out"))
    except BaseException:
        with table.lock:
            table.array[srqn] = srq.msrq
        raise
    with table.lock:
        del table.array[srqn]         # xa_erase_irq


@traced
def mlx5_ib_create_srq(ib_srq_: ib_srq, init_attr: ib_srq_init_attr, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_create_srq() for a user basic SRQ (order in the module docstring).

    EINVAL for max_wr at or beyond the device's SRQ size or max_sge beyond what
    a receive WQE holds; EOPNOTSUPP for a kernel SRQ (# EMU: no kernel consumers)
    and for tag-matching SRQs (# EMU: not modelled);
    then the request, umem, doorbell and firmware errors, each undone; a
    response that cannot be copied destroys the SRQ (EFAULT).
    """
    dev = to_mdev(ib_srq_.device)
    srq = to_msrq(ib_srq_)
    max_srq_wqes = 1 << MLX5_CAP_GEN(dev.mdev, "log_max_srq_sz")
    attr = init_attr.attr
    if attr.max_wr >= max_srq_wqes:
        raise KernelError(EINVAL, f"mlx5_ib_create_srq: max_wr {attr.max_wr}, "
                          f"cap {max_srq_wqes}")
    if init_attr.srq_type not in (IB_SRQT_BASIC, IB_SRQT_XRC):
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_create_srq: SRQ type {init_attr.srq_type}")
    if udata is None:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_create_srq: kernel SRQs are not modelled")
    srq.msrq.event = mlx5_ib_srq_event
    srq.msrq.max = roundup_pow_of_two(attr.max_wr + 1)
    srq.msrq.max_gs = attr.max_sge
    desc_size = MLX5_WQE_SRQ_NEXT_SEG_SIZE + srq.msrq.max_gs * MLX5_WQE_DATA_SEG_SIZE
    if desc_size > MLX5_CAP_GEN(dev.mdev, "max_wqe_sz_rq"):
        raise KernelError(EINVAL, f"mlx5_ib_create_srq: max_sge {attr.max_sge} too large")
    desc_size = max(32, roundup_pow_of_two(desc_size))
    srq.msrq.max_avail_gather = (desc_size - MLX5_WQE_SRQ_NEXT_SEG_SIZE) // \
        MLX5_WQE_DATA_SEG_SIZE
    srq.msrq.wqe_shift = ilog2(desc_size)
    buf_size = srq.msrq.max * desc_size
    create_srq_user(dev, srq, udata, buf_size)
    try:
        create_srq_cmd(dev, srq, attr.srq_limit)
    except BaseException:
        destroy_srq_user(srq)
        raise
    srq.srq_num = srq.msrq.srqn
    try:
        ib_respond_udata(udata, abi.mlx5_ib_create_srq_resp(srqn=srq.msrq.srqn))
    except KernelError:
        mlx5_ib_destroy_srq(srq, udata)
        raise KernelError(EFAULT, "mlx5_ib_create_srq: response not copied") from None
    attr.max_wr = srq.msrq.max - 1


@traced
def mlx5_ib_modify_srq(ib_srq_: ib_srq, attr: ib_srq_attr, attr_mask: int,
                       udata: ib_udata) -> None:
    """Mirrors mlx5_ib_modify_srq(): resizing (IB_SRQ_MAX_WR) is EINVAL; a limit at or
    beyond the ring's size is EINVAL; IB_SRQ_LIMIT arms it (ARM_RQ)."""
    dev = to_mdev(ib_srq_.device)
    srq = to_msrq(ib_srq_)
    if attr_mask & IB_SRQ_MAX_WR:
        raise KernelError(EINVAL, "mlx5_ib_modify_srq: resizing an SRQ is not supported")
    if attr_mask & IB_SRQ_LIMIT:
        if attr.srq_limit >= srq.msrq.max:
            raise KernelError(EINVAL, f"mlx5_ib_modify_srq: srq_limit {attr.srq_limit} >= "
                              f"{srq.msrq.max}")
        with srq.mutex:
            mlx5_cmd_arm_srq(dev, srq, attr.srq_limit)


@traced
def mlx5_cmd_arm_srq(dev: mlx5_ib_dev, srq: mlx5_ib_srq, lwm: int) -> None:
    """Mirrors mlx5_cmd_arm_srq() -> arm_srq_cmd(): ARM_RQ (op_mod SRQ) with the
    watermark and the SRQ's uid."""
    in_ = IfcStruct("arm_rq_in")
    MLX5_SET("arm_rq_in", in_, "opcode", MLX5_CMD_OP_ARM_RQ)
    MLX5_SET("arm_rq_in", in_, "op_mod", MLX5_ARM_RQ_IN_OP_MOD_SRQ)
    MLX5_SET("arm_rq_in", in_, "srq_number", srq.msrq.srqn)
    MLX5_SET("arm_rq_in", in_, "lwm", lwm)
    MLX5_SET("arm_rq_in", in_, "uid", srq.msrq.uid)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("arm_rq_out"))


@traced
def mlx5_ib_query_srq(ib_srq_: ib_srq, srq_attr: ib_srq_attr) -> None:
    """Mirrors mlx5_ib_query_srq(): QUERY_SRQ for the armed limit (lwm); the sizes
    from the driver's geometry."""
    dev = to_mdev(ib_srq_.device)
    srq = to_msrq(ib_srq_)
    in_ = IfcStruct("query_srq_in")
    MLX5_SET("query_srq_in", in_, "opcode", MLX5_CMD_OP_QUERY_SRQ)
    MLX5_SET("query_srq_in", in_, "srqn", srq.msrq.srqn)
    MLX5_SET("query_srq_in", in_, "uid", srq.msrq.uid)
    out = IfcStruct("query_srq_out")
    mlx5_cmd_exec(dev.mdev, in_, out)
    srqc = MLX5_ADDR_OF("query_srq_out", out, "srq_context_entry")
    srq_attr.srq_limit = MLX5_GET("srqc", srqc, "lwm")
    srq_attr.max_wr = srq.msrq.max - 1
    srq_attr.max_sge = srq.msrq.max_gs


@traced
def mlx5_ib_destroy_srq(ib_srq_: ib_srq, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_destroy_srq(): DESTROY_SRQ (its failure is returned, the SRQ
    kept), then the doorbell record and the ring."""
    dev = to_mdev(ib_srq_.device)
    srq = to_msrq(ib_srq_)
    mlx5_cmd_destroy_srq(dev, srq)
    destroy_srq_user(srq)

"""Mirrors drivers/infiniband/hw/mlx5/cq.c (the user-CQ part): create and destroy.

A user CQ is a ring of 64- or 128-byte CQEs in the process's memory plus an
8-byte doorbell record; the HCA writes CQEs into the ring by DMA and reads
the consumer index from the record.  mlx5_ib_create_cq():

    entries   roundup_pow_of_two(cqe + 1)       (ibv_create_cq(16) -> 32 slots)
    buffer    ib_umem_get(buf_addr, entries * cqe_size, LOCAL_WRITE): pinned, mapped
    page      mlx5_umem_find_best_cq_quantized_pgoff (page size + offset quanta)
    doorbell  mlx5_ib_db_map_user (the record's page pinned once per context)
    UAR       uar_page_index from the library, or the context's first static page
    EQ        mlx5_comp_eqn_get(comp_vector)
    CQC       log_cq_size, cqe_sz, uar_page, c_eqn, page size/offset, dbr_addr
    firmware  mlx5_core_create_cq -> CREATE_CQ with the PAS of the buffer
    response  the cqn (4 bytes of udata)

mlx5_ib_destroy_cq() undoes it: DESTROY_CQ, the doorbell reference, the umem.

Lock order: context.db_page_mutex (doorbell.c); nothing else is held.
"""

from __future__ import annotations

from contextlib import ExitStack

from drivers.ib_core.ib_verbs import (
    IB_ACCESS_LOCAL_WRITE,
    ib_copy_from_udata,
    ib_copy_to_udata,
    ib_cq_init_attr,
    ib_udata,
)
from drivers.ib_core.umem import ib_umem_get, ib_umem_num_dma_blocks, ib_umem_release
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.cq import mlx5_core_cq, mlx5_core_create_cq, mlx5_core_destroy_cq
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.eq import mlx5_comp_eqn_get
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_ADDR_OF,
    MLX5_CMD_OP_MODIFY_CQ,
    MLX5_CQ_OPMOD_RESIZE,
    MLX5_MODIFY_CQ_MASK_LOG_SIZE,
    MLX5_MODIFY_CQ_MASK_PG_OFFSET,
    MLX5_MODIFY_CQ_MASK_PG_SIZE,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from drivers.mlx5_ib.doorbell import mlx5_ib_db_map_user, mlx5_ib_db_unmap_user
from drivers.mlx5_ib.main import rdma_udata_to_drv_context
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas, mlx5_umem_find_best_cq_quantized_pgoff
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_IB_CQ_PR_FLAGS_CQE_128_PAD,
    ilog2,
    mlx5_ib_cq,
    mlx5_ib_ucontext,
    order_base_2,
    roundup_pow_of_two,
    to_mdev,
)
from kernel_model.errno import EINVAL, ENOSYS, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import mlx5_abi as abi
from kernel_model.uapi.ib_user_verbs import (
    IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN,
    IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION,
)
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD,
    MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS,
    MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
)

_KNOWN_UCMD_FLAGS = (MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD | MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX
                     | MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS)
CQE_SIZE_64, CQE_SIZE_128, CQE_SIZE_128_PAD = 0, 1, 2


def cqe_sz_to_mlx_sz(size: int, padding_128_en: bool) -> int:
    """Mirrors cqe_sz_to_mlx_sz(): the cqc.cqe_sz encoding."""
    if size == 64:
        return CQE_SIZE_64
    return CQE_SIZE_128_PAD if padding_128_en else CQE_SIZE_128


def _read_ucmd(udata: ib_udata) -> abi.mlx5_ib_create_cq:
    """create_cq_user()'s request checks: length, flags, CQE size, reserved fields."""
    ucmdlen = min(udata.inlen, abi.mlx5_ib_create_cq.SIZE)
    if ucmdlen < abi.mlx5_ib_create_cq.offsetof("flags"):
        raise KernelError(EINVAL, f"create_cq_user: request of {udata.inlen} bytes")
    ucmd = ib_copy_from_udata(abi.mlx5_ib_create_cq, udata, ucmdlen)
    if ucmd.flags & ~_KNOWN_UCMD_FLAGS:
        raise KernelError(EINVAL, f"create_cq_user: flags {ucmd.flags:#x}")
    if ucmd.cqe_size not in (64, 128) or ucmd.reserved0 or ucmd.reserved1:
        raise KernelError(EINVAL, f"create_cq_user: cqe_size {ucmd.cqe_size} or reserved set")
    if ucmd.cqe_comp_en:
        # EMU: CQE compression (mini CQEs) is not modelled
        raise KernelError(EOPNOTSUPP, "create_cq_user: CQE compression is not supported")
    return ucmd


@traced
def create_cq_user(cq: mlx5_ib_cq, udata: ib_udata, entries: int,
                   unwind: ExitStack) -> tuple[IfcStruct, int]:
    """Mirrors create_cq_user(): pin the ring and the doorbell, build create_cq_in.

    Returns (create_cq_in, UAR index); pushes its undo steps on `unwind`.
    """
    dev = to_mdev(cq.device)
    context: mlx5_ib_ucontext = rdma_udata_to_drv_context(cq)
    ucmd = _read_ucmd(udata)
    cq.buf.umem = ib_umem_get(cq.device, ucmd.buf_addr, entries * ucmd.cqe_size,
                              IB_ACCESS_LOCAL_WRITE)
    unwind.callback(_release_buf, cq)                                  # err_umem:
    page_size, page_offset_quantized = mlx5_umem_find_best_cq_quantized_pgoff(
        cq.buf.umem, "cqc", "log_page_size", MLX5_ADAPTER_PAGE_SHIFT, "page_offset", 64)
    if not page_size:
        raise KernelError(EINVAL, "create_cq_user: no page size fits the CQ buffer")
    mlx5_ib_db_map_user(context, ucmd.db_addr, cq.db)
    unwind.callback(mlx5_ib_db_unmap_user, context, cq.db)             # err_db:
    ncont = ib_umem_num_dma_blocks(cq.buf.umem, page_size)
    in_ = IfcStruct("create_cq_in", pas=ncont)                         # kvzalloc(inlen)
    mlx5_ib_populate_pas(cq.buf.umem, page_size, MLX5_ADDR_OF("create_cq_in", in_, "pas"), 0)
    cqc = MLX5_ADDR_OF("create_cq_in", in_, "cq_context")
    MLX5_SET("cqc", cqc, "log_page_size", order_base_2(page_size) - MLX5_ADAPTER_PAGE_SHIFT)
    MLX5_SET("cqc", cqc, "page_offset", page_offset_quantized)
    if ucmd.flags & MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX:
        index = ucmd.uar_page_index
    elif context.bfregi.lib_uar_dyn:
        raise KernelError(EINVAL, "create_cq_user: a dynamic-UAR context must name its UAR")
    else:
        index = context.bfregi.sys_pages[0]
    if ucmd.cqe_size == 128 and ucmd.flags & MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD:
        if not MLX5_CAP_GEN(dev.mdev, "cqe_128_always"):
            raise KernelError(EOPNOTSUPP, "create_cq_user: CQE padding not supported")
        cq.private_flags |= MLX5_IB_CQ_PR_FLAGS_CQE_128_PAD
    cq.cqe_size = ucmd.cqe_size
    return in_, index


def _release_buf(cq: mlx5_ib_cq) -> None:
    ib_umem_release(cq.buf.umem)
    cq.buf.umem = None


@traced
def mlx5_ib_create_cq(ibcq: mlx5_ib_cq, attr: ib_cq_init_attr, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_create_cq() for a user CQ.

    EINVAL for a size beyond log_max_cq_sz (before and after rounding) or a
    bad request; EOPNOTSUPP for create flags; then create_cq_user's and the
    firmware's errors; EFAULT when the cqn cannot be copied back (the CQ is
    destroyed again).  Every step is undone on failure.
    """
    dev = to_mdev(ibcq.device)
    mdev = dev.mdev
    cq = ibcq
    entries = attr.cqe
    max_cqes = 1 << MLX5_CAP_GEN(mdev, "log_max_cq_sz")
    if entries < 0 or entries > max_cqes:
        raise KernelError(EINVAL, f"mlx5_ib_create_cq: {entries} entries > {max_cqes}")
    if attr.flags & ~(IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN
                      | IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION):
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_create_cq: create flags {attr.flags:#x}")
    if attr.flags & IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN and not MLX5_CAP_GEN(mdev, "cq_oi"):
        raise KernelError(EOPNOTSUPP, "mlx5_ib_create_cq: overrun ignore not supported")
    entries = roundup_pow_of_two(entries + 1)
    if entries > max_cqes:
        raise KernelError(EINVAL, f"mlx5_ib_create_cq: {entries} entries > {max_cqes}")
    cq.cqe = entries - 1
    with ExitStack() as unwind:
        in_, index = create_cq_user(cq, udata, entries, unwind)
        eqn = mlx5_comp_eqn_get(mdev, attr.comp_vector)
        cqc = MLX5_ADDR_OF("create_cq_in", in_, "cq_context")
        MLX5_SET("cqc", cqc, "cqe_sz", cqe_sz_to_mlx_sz(
            cq.cqe_size, bool(cq.private_flags & MLX5_IB_CQ_PR_FLAGS_CQE_128_PAD)))
        MLX5_SET("cqc", cqc, "log_cq_size", ilog2(entries))
        MLX5_SET("cqc", cqc, "uar_page", index)
        MLX5_SET("cqc", cqc, "c_eqn_or_apu_element", eqn)
        MLX5_SET64("cqc", cqc, "dbr_addr", cq.db.dma)
        if attr.flags & IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN:
            MLX5_SET("cqc", cqc, "oi", 1)
        cq.create_flags = attr.flags
        # EMU: the completion tasklet (mlx5_add_cq_to_tasklet) is folded in: the EQ's
        # handler calls mlx5_ib_cq_comp directly
        cq.mcq.comp = mlx5_ib_cq_comp
        cq.mcq.ibcq = cq
        uid = rdma_udata_to_drv_context(cq).devx_uid
        MLX5_SET("create_cq_in", in_, "uid", uid)
        mlx5_core_create_cq(mdev, cq.mcq, in_)
        unwind.callback(mlx5_core_destroy_cq, mdev, cq.mcq)            # err_cmd:
        ib_copy_to_udata(udata, cq.mcq.cqn.to_bytes(4, "little"), 4)
        unwind.pop_all()


@traced
def mlx5_ib_destroy_cq(cq: mlx5_ib_cq, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_destroy_cq(): DESTROY_CQ, then destroy_cq_user (doorbell, umem)."""
    dev = to_mdev(cq.device)
    mlx5_core_destroy_cq(dev.mdev, cq.mcq)
    mlx5_ib_db_unmap_user(rdma_udata_to_drv_context(cq), cq.db)
    _release_buf(cq)


def mlx5_ib_cq_comp(mcq: mlx5_core_cq, eqe: bytes) -> None:
    """Mirrors mlx5_ib_cq_comp(): a completion event for the CQ goes to its ib_cq's
    comp_handler (uverbs: the CQ's completion channel)."""
    ibcq = mcq.ibcq  # to_mibcq(): container_of
    if ibcq.comp_handler is not None:
        ibcq.comp_handler(ibcq, ibcq.cq_context)


def resize_user(cq: mlx5_ib_cq, entries: int, udata: ib_udata) -> int:
    """Mirrors resize_user(): the request (EINVAL for reserved bits), the new ring
    pinned as cq.resize_umem; returns the CQE size."""
    ucmd = ib_copy_from_udata(abi.mlx5_ib_resize_cq, udata, abi.mlx5_ib_resize_cq.SIZE)
    if ucmd.reserved0 or ucmd.reserved1:
        raise KernelError(EINVAL, "resize_user: reserved fields set")
    cq.resize_umem = ib_umem_get(cq.device, ucmd.buf_addr, ucmd.cqe_size * entries,
                                 IB_ACCESS_LOCAL_WRITE)
    return ucmd.cqe_size


@traced
def mlx5_ib_resize_cq(ibcq: mlx5_ib_cq, entries: int, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_resize_cq() for a user CQ: ENOSYS without the cq_resize cap;
    EINVAL for a size out of range (before or after rounding); the same size is a
    no-op; otherwise the new ring is pinned and MODIFY_CQ(resize) moves the CQ to it
    - the firmware refuses (EINVAL) a ring too small for the CQEs not yet polled.
    On success the old ring's umem is released and cqe is the new size - 1."""
    dev = to_mdev(ibcq.device)
    cq = ibcq
    if not MLX5_CAP_GEN(dev.mdev, "cq_resize"):
        raise KernelError(ENOSYS, "mlx5_ib_resize_cq: firmware does not support resize CQ")
    max_cqes = 1 << MLX5_CAP_GEN(dev.mdev, "log_max_cq_sz")
    if entries < 1 or entries > max_cqes:
        raise KernelError(EINVAL, f"mlx5_ib_resize_cq: wrong entries number {entries}")
    entries = roundup_pow_of_two(entries + 1)
    if entries > max_cqes + 1:
        raise KernelError(EINVAL, f"mlx5_ib_resize_cq: {entries} entries > {max_cqes}")
    if entries == cq.cqe + 1:
        return
    with cq.resize_mutex:
        cqe_size = resize_user(cq, entries, udata)
        try:
            page_size, page_offset_quantized = mlx5_umem_find_best_cq_quantized_pgoff(
                cq.resize_umem, "cqc", "log_page_size", MLX5_ADAPTER_PAGE_SHIFT,
                "page_offset", 64)
            if not page_size:
                raise KernelError(EINVAL, "mlx5_ib_resize_cq: no page size fits the ring")
            npas = ib_umem_num_dma_blocks(cq.resize_umem, page_size)
            in_ = IfcStruct("modify_cq_in", pas=npas)
            mlx5_ib_populate_pas(cq.resize_umem, page_size,
                                 MLX5_ADDR_OF("modify_cq_in", in_, "pas"), 0)
            MLX5_SET("modify_cq_in", in_, "modify_field_select",
                     MLX5_MODIFY_CQ_MASK_LOG_SIZE | MLX5_MODIFY_CQ_MASK_PG_OFFSET
                     | MLX5_MODIFY_CQ_MASK_PG_SIZE)
            cqc = MLX5_ADDR_OF("modify_cq_in", in_, "cq_context")
            MLX5_SET("cqc", cqc, "log_page_size", order_base_2(page_size)
                     - MLX5_ADAPTER_PAGE_SHIFT)
            MLX5_SET("cqc", cqc, "page_offset", page_offset_quantized)
            MLX5_SET("cqc", cqc, "cqe_sz", cqe_sz_to_mlx_sz(
                cqe_size, bool(cq.private_flags & MLX5_IB_CQ_PR_FLAGS_CQE_128_PAD)))
            MLX5_SET("cqc", cqc, "log_cq_size", ilog2(entries))
            MLX5_SET("modify_cq_in", in_, "opcode", MLX5_CMD_OP_MODIFY_CQ)
            MLX5_SET("modify_cq_in", in_, "op_mod", MLX5_CQ_OPMOD_RESIZE)
            MLX5_SET("modify_cq_in", in_, "cqn", cq.mcq.cqn)
            MLX5_SET("modify_cq_in", in_, "uid", cq.mcq.uid)
            mlx5_cmd_exec(dev.mdev, in_, IfcStruct("modify_cq_out"))  # mlx5_core_modify_cq
        except BaseException:
            ib_umem_release(cq.resize_umem)                            # ex_resize:
            cq.resize_umem = None
            raise
        cq.cqe = entries - 1
        ib_umem_release(cq.buf.umem)
        cq.buf.umem, cq.resize_umem = cq.resize_umem, None

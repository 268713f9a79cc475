"""Mirrors drivers/infiniband/hw/mlx5/qp.c (user QPs): bfregs, create_user_qp, destroy
(modify and query are in qp_modify.py, the firmware commands in qpc.py).

ibv_create_qp (libmlx5 has sized the queues, allocated the WQ buffer and a
doorbell record) reaches mlx5_ib_create_qp(), which runs, in this order:

    check_qp_type -> check_valid_flow -> process_udata_size -> check_ucmd_data
    -> copy ucmd -> process_vendor_flags -> get_qp_uidx -> process_create_flags
    -> create_user_qp:
         set_rq_size        RQ from the library's rq_wqe_count / rq_wqe_shift
         _create_user_qp    alloc_bfreg (the QP's BlueFlame register) ->
                            bfregn_to_uar_index -> set_user_buf_size (RQ first,
                            SQ after it) -> ib_umem_get (access 0: no FOLL_WRITE)
                            -> best page size + quantized offset ->
                            mlx5_ib_populate_pas -> mlx5_ib_db_map_user
         the QPC            st, pd, log_rq_stride/size, log_sq_size, rq_type,
                            cqn_snd/rcv, uar_page, dbr_addr, user_index, ...
         CREATE_QP          the firmware keeps the QPC and the PAS
    -> the response: resp.bfreg_index = adjust_bfregn(bfregn)

bfregs (static UAR registers, two per 4 KiB UAR; kernel numbering) come in
three classes:

    0                   no BlueFlame (a plain doorbell), the last resort
    [1, first_hi)       "medium": shared, the least used is handed out
    [first_hi, max)     "high" (low latency): exclusive, while one is free

so with 16 bfregs / 4 low-latency the first QPs get 12, 13, 14, 15, then
1..11, and the 16th QP already shares bfreg 1 (see docs/tour.md).

Lock order: bfregi.lock (alloc/free of a bfreg) is a leaf;
dev.reset_flow_resource_lock -> send CQ lock -> recv CQ lock (CQN order)
around the QP lists; context.db_page_mutex in doorbell.c.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack

from drivers.ib_core.ib_verbs import (
    IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK,
    IB_QP_CREATE_CROSS_CHANNEL,
    IB_QP_CREATE_CVLAN_STRIPPING,
    IB_QP_CREATE_IPOIB_UD_LSO,
    IB_QP_CREATE_MANAGED_RECV,
    IB_QP_CREATE_MANAGED_SEND,
    IB_QP_CREATE_PCI_WRITE_END_PADDING,
    IB_QP_CREATE_SCATTER_FCS,
    IB_QP_CREATE_SOURCE_QPN,
    IB_QPS_RESET,
    IB_QPT_DRIVER,
    IB_QPT_RAW_PACKET,
    IB_QPT_RC,
    IB_QPT_UC,
    IB_QPT_UD,
    IB_QPT_XRC_INI,
    IB_QPT_XRC_TGT,
    IB_SIGNAL_ALL_WR,
    ib_copy_from_udata,
    ib_is_udata_cleared,
    ib_qp_init_attr,
    ib_respond_udata,
    ib_udata,
)
from drivers.ib_core.umem import ib_umem_get, ib_umem_num_dma_blocks, ib_umem_release
from drivers.mlx5_core.driver import MLX5_CAP_ETH, MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_ADDR_OF,
    MLX5_CAP_PORT_TYPE_IB,
    MLX5_CMD_OP_2RST_QP,
    MLX5_NON_FP_BFREGS_PER_UAR,
    MLX5_NON_ZERO_RQ,
    MLX5_QPC_ST_DCI,
    MLX5_QPC_ST_RAW_DATAGRAM,
    MLX5_QPC_ST_RC,
    MLX5_QPC_ST_UC,
    MLX5_QPC_ST_UD,
    MLX5_QPC_ST_XRC,
    MLX5_SET,
    MLX5_SET64,
    MLX5_SRQ_RQ,
    MLX5_ZERO_LEN_RQ,
    IfcStruct,
)
from drivers.mlx5_ib.doorbell import mlx5_ib_db_map_user, mlx5_ib_db_unmap_user
from drivers.mlx5_ib.main import rdma_udata_to_drv_context
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas, mlx5_umem_find_best_quantized_pgoff
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_CQE_VERSION_V1,
    MLX5_IB_DEFAULT_UIDX,
    MLX5_IB_INVALID_BFREG,
    MLX5_IB_INVALID_UAR_INDEX,
    MLX5_IB_QPT_DCI,
    MLX5_IB_QPT_DCT,
    MLX5_SEND_WQE_BB,
    MLX5_USER_ASSIGNED_UIDX_MASK,
    get_uars_per_sys_page,
    ilog2,
    is_power_of_2,
    mlx5_bfreg_info,
    mlx5_ib_cq,
    mlx5_ib_dev,
    mlx5_ib_qp,
    mlx5_ib_ucontext,
    mlx5_ib_warn,
    order_base_2,
    to_mcq,
    to_mdev,
    to_mpd,
)
from drivers.mlx5_ib.qp_dc import check_qp_attr, create_dct, mlx5_ib_destroy_dct
from drivers.mlx5_ib.qp_raw import (
    create_raw_packet_qp,
    destroy_raw_packet_qp,
    modify_raw_packet_qp,
)
from drivers.mlx5_ib.qpc import mlx5_core_destroy_qp, mlx5_core_qp_modify, mlx5_qpc_create_qp
from drivers.mlx5_ib.srq import to_msrq, to_mxrcd
from kernel_model.errno import EINVAL, ENOMEM, EOPNOTSUPP, KernelError
from kernel_model.locking import spin_lock, spin_lock_irqsave, spin_unlock, spin_unlock_irqrestore
from kernel_model.trace import traced
from kernel_model.uapi import mlx5_abi as abi
from kernel_model.uapi.mlx5_abi import (
    MLX5_QP_FLAG_ALLOW_SCATTER_CQE,
    MLX5_QP_FLAG_BFREG_INDEX,
    MLX5_QP_FLAG_DCI_STREAM,
    MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE,
    MLX5_QP_FLAG_SCATTER_CQE,
    MLX5_QP_FLAG_SIGNATURE,
    MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC,
    MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC,
    MLX5_QP_FLAG_TUNNEL_OFFLOADS,
    MLX5_QP_FLAG_TYPE_DCI,
    MLX5_QP_FLAG_TYPE_DCT,
    MLX5_QP_FLAG_UAR_PAGE_INDEX,
    mlx5_ib_create_qp_resp,
)

MLX5_QP_PM_MIGRATED = 0x3
MLX5_WQ_END_PAD_MODE_ALIGN = 1
MLX5_WQE_CTRL_CQ_UPDATE = 2 << 2
MLX5_WQE_DATA_SEG_SIZE = 16
#: vendor flags the model implements; the rest of the known ones are EOPNOTSUPP
_MODELLED_FLAGS = (MLX5_QP_FLAG_SIGNATURE | MLX5_QP_FLAG_SCATTER_CQE
                   | MLX5_QP_FLAG_ALLOW_SCATTER_CQE | MLX5_QP_FLAG_BFREG_INDEX
                   | MLX5_QP_FLAG_UAR_PAGE_INDEX | MLX5_QP_FLAG_TYPE_DCI
                   | MLX5_QP_FLAG_TYPE_DCT)
_KNOWN_FLAGS = (_MODELLED_FLAGS | MLX5_QP_FLAG_TUNNEL_OFFLOADS | MLX5_QP_FLAG_TYPE_DCT
                | MLX5_QP_FLAG_TYPE_DCI | MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC
                | MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC | MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE
                | MLX5_QP_FLAG_DCI_STREAM)
#: to_mlx5_st(): the QPC service type of each modelled verbs QP type
_MLX5_ST = {IB_QPT_RC: MLX5_QPC_ST_RC, IB_QPT_UC: MLX5_QPC_ST_UC, IB_QPT_UD: MLX5_QPC_ST_UD,
            IB_QPT_XRC_INI: MLX5_QPC_ST_XRC, IB_QPT_XRC_TGT: MLX5_QPC_ST_XRC,
            IB_QPT_RAW_PACKET: MLX5_QPC_ST_RAW_DATAGRAM,  # MLX5_QP_ST_RAW_ETHERTYPE
            MLX5_IB_QPT_DCI: MLX5_QPC_ST_DCI}


# -- bfregs ---------------------------------------------------------------------------------
def max_bfregs(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors max_bfregs(): the static bfregs only."""
    return (get_uars_per_sys_page(dev, bfregi.lib_uar_4k) * bfregi.num_static_sys_pages
            * MLX5_NON_FP_BFREGS_PER_UAR)


def num_med_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors num_med_bfreg(): all but bfreg 0 and the low-latency ones."""
    return max(0, max_bfregs(dev, bfregi) - bfregi.num_low_latency_bfregs - 1)


def first_med_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors first_med_bfreg(): 1, or -ENOMEM when there are no medium bfregs."""
    return 1 if num_med_bfreg(dev, bfregi) else -ENOMEM


def first_hi_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors first_hi_bfreg()."""
    return num_med_bfreg(dev, bfregi) + 1


def alloc_high_class_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors alloc_high_class_bfreg(): the first unused low-latency bfreg."""
    for i in range(first_hi_bfreg(dev, bfregi), max_bfregs(dev, bfregi)):
        if not bfregi.count[i]:
            bfregi.count[i] += 1
            return i
    return -ENOMEM


def alloc_med_class_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors alloc_med_class_bfreg(): the least used medium bfreg (an unused one
    ends the search)."""
    minidx = first_med_bfreg(dev, bfregi)
    if minidx < 0:
        return minidx
    for i in range(minidx, first_hi_bfreg(dev, bfregi)):
        if bfregi.count[i] < bfregi.count[minidx]:
            minidx = i
        if not bfregi.count[minidx]:
            break
    bfregi.count[minidx] += 1
    return minidx


@traced
def alloc_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors alloc_bfreg(): high class, then medium (v2 ABI only), else bfreg 0.

    EINVAL for a dynamic-UAR context (it has no static bfregs).
    """
    if bfregi.lib_uar_dyn:
        raise KernelError(EINVAL, "alloc_bfreg: dynamic-UAR context has no static bfregs")
    with bfregi.lock:
        bfregn = -ENOMEM
        if bfregi.ver >= 2:
            bfregn = alloc_high_class_bfreg(dev, bfregi)
            if bfregn < 0:
                bfregn = alloc_med_class_bfreg(dev, bfregi)
        if bfregn < 0:
            bfregn = 0  # MLX5_CROSS_CHANNEL_BFREG: no BlueFlame, shared by all
            bfregi.count[bfregn] += 1
    return bfregn


@traced
def mlx5_ib_free_bfreg(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info, bfregn: int) -> None:
    """Mirrors mlx5_ib_free_bfreg(): one user fewer."""
    with bfregi.lock:
        bfregi.count[bfregn] -= 1


@traced
def bfregn_to_uar_index(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info, bfregn: int,
                        dyn_bfreg: bool) -> int:
    """Mirrors bfregn_to_uar_index(): the firmware UAR of a bfreg (static, or a
    dynamic one the library has mmapped); EINVAL otherwise."""
    if bfregi.lib_uar_dyn:
        raise KernelError(EINVAL, "bfregn_to_uar_index: dynamic-UAR context")
    bfregs_per_sys_page = get_uars_per_sys_page(dev, bfregi.lib_uar_4k) * \
        MLX5_NON_FP_BFREGS_PER_UAR
    index_of_sys_page = bfregn // bfregs_per_sys_page
    if dyn_bfreg:
        index_of_sys_page += bfregi.num_static_sys_pages
        if index_of_sys_page >= bfregi.num_sys_pages:
            raise KernelError(EINVAL, f"bfregn_to_uar_index: bfreg {bfregn} out of range")
        if bfregn > bfregi.num_dyn_bfregs or \
                bfregi.sys_pages[index_of_sys_page] == MLX5_IB_INVALID_UAR_INDEX:
            raise KernelError(EINVAL, f"bfregn_to_uar_index: dynamic bfreg {bfregn} "
                              "is not mapped")
    offset = bfregn % bfregs_per_sys_page // MLX5_NON_FP_BFREGS_PER_UAR
    return bfregi.sys_pages[index_of_sys_page] + offset


def adjust_bfregn(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info, bfregn: int) -> int:
    """Mirrors adjust_bfregn(): user space numbers 4 registers per UAR (2 fast-path)."""
    return bfregn // MLX5_NON_FP_BFREGS_PER_UAR * 4 + bfregn % MLX5_NON_FP_BFREGS_PER_UAR


# -- sizes ----------------------------------------------------------------------------------
def qp_has_rq(attr: ib_qp_init_attr) -> bool:
    """Mirrors qp_has_rq()."""
    return attr.qp_type not in (IB_QPT_XRC_INI, IB_QPT_XRC_TGT) and attr.srq is None \
        and attr.cap.max_recv_wr != 0


@traced
def set_rq_size(dev: mlx5_ib_dev, attr: ib_qp_init_attr, qp: mlx5_ib_qp,
                ucmd: abi.mlx5_ib_create_qp) -> None:
    """Mirrors set_rq_size() for a user QP: the RQ the library sized."""
    cap = attr.cap
    if cap.max_recv_wr > 1 << MLX5_CAP_GEN(dev.mdev, "log_max_qp_sz"):
        raise KernelError(EINVAL, f"set_rq_size: max_recv_wr {cap.max_recv_wr} too large")
    if not qp.has_rq:
        qp.rq.max_post = qp.rq.wqe_cnt = qp.rq.wqe_shift = 0
        cap.max_recv_wr = cap.max_recv_sge = 0
        return
    qp.rq.wqe_cnt = ucmd.rq_wqe_count
    if ucmd.rq_wqe_shift > 32:  # BITS_PER_BYTE * sizeof(ucmd->rq_wqe_shift)
        raise KernelError(EINVAL, f"set_rq_size: rq_wqe_shift {ucmd.rq_wqe_shift}")
    qp.rq.wqe_shift = ucmd.rq_wqe_shift
    if (1 << qp.rq.wqe_shift) // MLX5_WQE_DATA_SEG_SIZE < qp.wq_sig:
        raise KernelError(EINVAL, "set_rq_size: no room for the WQ signature")
    qp.rq.max_gs = (1 << qp.rq.wqe_shift) // MLX5_WQE_DATA_SEG_SIZE - qp.wq_sig
    qp.rq.max_post = qp.rq.wqe_cnt


@traced
def set_user_buf_size(dev: mlx5_ib_dev, qp: mlx5_ib_qp, ucmd: abi.mlx5_ib_create_qp) -> None:
    """Mirrors set_user_buf_size(): SQ of 64-byte WQEBBs after the RQ, one buffer."""
    mdev = dev.mdev
    if 1 << qp.sq.wqe_shift > MLX5_CAP_GEN(mdev, "max_wqe_sz_sq"):
        raise KernelError(EINVAL, "set_user_buf_size: SQ WQE larger than max_wqe_sz_sq")
    if ucmd.sq_wqe_count and not is_power_of_2(ucmd.sq_wqe_count):
        raise KernelError(EINVAL, f"set_user_buf_size: sq_wqe_count {ucmd.sq_wqe_count} "
                          "is not a power of two")
    qp.sq.wqe_cnt = ucmd.sq_wqe_count
    if qp.sq.wqe_cnt > 1 << MLX5_CAP_GEN(mdev, "log_max_qp_sz"):
        raise KernelError(EINVAL, f"set_user_buf_size: sq_wqe_count {qp.sq.wqe_cnt} too large")
    if qp.qp_type == IB_QPT_RAW_PACKET:   # the SQ has a buffer of its own
        qp.buf_size = qp.rq.wqe_cnt << qp.rq.wqe_shift
        qp.raw_packet_qp.sq.ubuffer.buf_size = qp.sq.wqe_cnt << 6
        return
    qp.buf_size = (qp.rq.wqe_cnt << qp.rq.wqe_shift) + (qp.sq.wqe_cnt << 6)


# -- create ---------------------------------------------------------------------------------
def _choose_uar(dev: mlx5_ib_dev, context: mlx5_ib_ucontext, qp: mlx5_ib_qp,
                ucmd: abi.mlx5_ib_create_qp, unwind: ExitStack) -> int:
    """Step 1 of _create_user_qp: the UAR the QP rings (and the bfreg, if the kernel
    allocated one)."""
    bfregi = context.bfregi
    flags = qp.flags_en & (MLX5_QP_FLAG_UAR_PAGE_INDEX | MLX5_QP_FLAG_BFREG_INDEX)
    if flags == MLX5_QP_FLAG_UAR_PAGE_INDEX:
        qp.bfregn = MLX5_IB_INVALID_BFREG
        return ucmd.bfreg_index  # a firmware UAR index; the kernel does not check it
    if flags == MLX5_QP_FLAG_BFREG_INDEX:
        qp.bfregn = MLX5_IB_INVALID_BFREG
        return bfregn_to_uar_index(dev, bfregi, ucmd.bfreg_index, True)
    if flags:
        raise KernelError(EINVAL, "_create_user_qp: both UAR_PAGE_INDEX and BFREG_INDEX")
    bfregn = alloc_bfreg(dev, bfregi)
    unwind.callback(mlx5_ib_free_bfreg, dev, bfregi, bfregn)           # err_bfreg:
    qp.bfregn = bfregn
    return bfregn_to_uar_index(dev, bfregi, bfregn, False)


@traced
def _create_user_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, ucmd: abi.mlx5_ib_create_qp,
                    resp: mlx5_ib_create_qp_resp, unwind: ExitStack) -> IfcStruct:
    """Mirrors _create_user_qp(): UAR, buffer sizes, umem, PAS, doorbell; returns
    create_qp_in with the PAS and the buffer fields of the QPC filled."""
    context: mlx5_ib_ucontext = rdma_udata_to_drv_context(qp)
    uar_index = _choose_uar(dev, context, qp, ucmd, unwind)
    qp.rq.offset = 0
    qp.sq.wqe_shift = ilog2(MLX5_SEND_WQE_BB)
    qp.sq.offset = qp.rq.wqe_cnt << qp.rq.wqe_shift
    set_user_buf_size(dev, qp, ucmd)
    base = qp.trans_qp.base
    page_size, page_offset_quantized, ncont = 0, 0, 0
    if ucmd.buf_addr and qp.buf_size:
        base.umem = ib_umem_get(qp.device, ucmd.buf_addr, qp.buf_size, 0)
        unwind.callback(_release_umem, qp)                             # err_umem:
        page_size, page_offset_quantized = mlx5_umem_find_best_quantized_pgoff(
            base.umem, "qpc", "log_page_size", MLX5_ADAPTER_PAGE_SHIFT, "page_offset", 64)
        if not page_size:
            raise KernelError(EINVAL, "_create_user_qp: no page size fits the WQ buffer")
        ncont = ib_umem_num_dma_blocks(base.umem, page_size)
    in_ = IfcStruct("create_qp_in", pas=ncont)                         # kvzalloc(inlen)
    base.mqp.uid = to_mpd(qp.pd).uid
    MLX5_SET("create_qp_in", in_, "uid", base.mqp.uid)
    qpc = MLX5_ADDR_OF("create_qp_in", in_, "qpc")
    if base.umem is not None:
        mlx5_ib_populate_pas(base.umem, page_size, MLX5_ADDR_OF("create_qp_in", in_, "pas"), 0)
        MLX5_SET("qpc", qpc, "log_page_size", order_base_2(page_size) - MLX5_ADAPTER_PAGE_SHIFT)
        MLX5_SET("qpc", qpc, "page_offset", page_offset_quantized)
    MLX5_SET("qpc", qpc, "uar_page", uar_index)
    if qp.bfregn != MLX5_IB_INVALID_BFREG:
        resp.bfreg_index = adjust_bfregn(dev, context.bfregi, qp.bfregn)
    else:
        resp.bfreg_index = MLX5_IB_INVALID_BFREG
    mlx5_ib_db_map_user(context, ucmd.db_addr, qp.db)
    unwind.callback(mlx5_ib_db_unmap_user, context, qp.db)             # err_free:
    return in_


def _release_umem(qp: mlx5_ib_qp) -> None:
    ib_umem_release(qp.trans_qp.base.umem)
    qp.trans_qp.base.umem = None


def mlx5_ib_lock_cqs(send_cq: mlx5_ib_cq | None, recv_cq: mlx5_ib_cq | None) -> None:
    """Mirrors mlx5_ib_lock_cqs(): both CQ locks, lower CQN first (once if the same)."""
    cqs = sorted({id(c): c for c in (send_cq, recv_cq) if c is not None}.values(),
                 key=lambda c: c.mcq.cqn)
    for cq in cqs:
        spin_lock(cq.lock)


def mlx5_ib_unlock_cqs(send_cq: mlx5_ib_cq | None, recv_cq: mlx5_ib_cq | None) -> None:
    """Mirrors mlx5_ib_unlock_cqs(): the reverse order."""
    cqs = sorted({id(c): c for c in (send_cq, recv_cq) if c is not None}.values(),
                 key=lambda c: c.mcq.cqn, reverse=True)
    for cq in cqs:
        spin_unlock(cq.lock)


def _qp_lists(dev: mlx5_ib_dev, qp: mlx5_ib_qp, op: Callable[[list, mlx5_ib_qp], None]) -> None:
    """Put the QP on (op=list.append) or take it off (list.remove) the device's QP list
    and its CQs' lists, under reset_flow_resource_lock and both CQ locks (CQN order),
    as create_qp_common / destroy_qp_common do."""
    send_cq, recv_cq = to_mcq(qp.send_cq), to_mcq(qp.recv_cq)
    flags = spin_lock_irqsave(dev.reset_flow_resource_lock)
    mlx5_ib_lock_cqs(send_cq, recv_cq)
    op(dev.qp_list, qp)
    if send_cq is not None:
        op(send_cq.list_send_qp, qp)
    if recv_cq is not None:
        op(recv_cq.list_recv_qp, qp)
    mlx5_ib_unlock_cqs(send_cq, recv_cq)
    spin_unlock_irqrestore(dev.reset_flow_resource_lock, flags)


def get_rx_type(qp: mlx5_ib_qp, attr: ib_qp_init_attr) -> int:
    """Mirrors get_rx_type(): an SRQ's QP receives from it, an XRC target from the
    SRQs of its domain; a QP without receive queue has a zero-length one.
    # EMU: an XRC initiator's is zero-length too (the kernel names the device's own
    # SRQ, devr.s0, which is not modelled; an initiator never receives)."""
    if attr.srq is not None or attr.qp_type == IB_QPT_XRC_TGT:
        return MLX5_SRQ_RQ
    return MLX5_NON_ZERO_RQ if qp.has_rq else MLX5_ZERO_LEN_RQ


def _fill_qpc(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr, qpc: IfcStruct,
              uidx: int) -> None:
    """The QPC fields create_user_qp() writes."""
    context: mlx5_ib_ucontext = rdma_udata_to_drv_context(qp)
    MLX5_SET("qpc", qpc, "st", _MLX5_ST[qp.type])
    MLX5_SET("qpc", qpc, "pm_state", MLX5_QP_PM_MIGRATED)
    MLX5_SET("qpc", qpc, "pd", to_mpd(qp.pd).pdn)
    MLX5_SET("qpc", qpc, "wq_signature", qp.wq_sig)
    if qp.rq.wqe_cnt:
        MLX5_SET("qpc", qpc, "log_rq_stride", qp.rq.wqe_shift - 4)
        MLX5_SET("qpc", qpc, "log_rq_size", ilog2(qp.rq.wqe_cnt))
    MLX5_SET("qpc", qpc, "ts_format", MLX5_CAP_GEN(dev.mdev, "sq_ts_format") and 1)
    MLX5_SET("qpc", qpc, "rq_type", get_rx_type(qp, attr))
    if qp.sq.wqe_cnt:
        MLX5_SET("qpc", qpc, "log_sq_size", ilog2(qp.sq.wqe_cnt))
    else:
        MLX5_SET("qpc", qpc, "no_sq", 1)
    # EMU: the device-global XRCD and SRQs (devr) are not modelled: xrcd stays 0, and
    # so does srqn_rmpn_xrqn for a QP without an SRQ
    if attr.srq is not None:
        MLX5_SET("qpc", qpc, "srqn_rmpn_xrqn", to_msrq(attr.srq).msrq.srqn)
    if attr.send_cq is not None:
        MLX5_SET("qpc", qpc, "cqn_snd", to_mcq(attr.send_cq).mcq.cqn)
    if attr.recv_cq is not None:
        MLX5_SET("qpc", qpc, "cqn_rcv", to_mcq(attr.recv_cq).mcq.cqn)
    MLX5_SET64("qpc", qpc, "dbr_addr", qp.db.dma)
    if context.cqe_version == MLX5_CQE_VERSION_V1:
        MLX5_SET("qpc", qpc, "user_index", uidx)
    if qp.flags & IB_QP_CREATE_CROSS_CHANNEL:
        MLX5_SET("qpc", qpc, "cd_master", 1)
    if qp.flags & IB_QP_CREATE_MANAGED_SEND:
        MLX5_SET("qpc", qpc, "cd_slave_send", 1)
    if qp.flags & IB_QP_CREATE_MANAGED_RECV:
        MLX5_SET("qpc", qpc, "cd_slave_receive", 1)
    if qp.flags & IB_QP_CREATE_PCI_WRITE_END_PADDING:
        MLX5_SET("qpc", qpc, "end_padding_mode", MLX5_WQ_END_PAD_MODE_ALIGN)
    # EMU: multicast is not modelled, so block_lb_mc changes nothing on the data path
    if qp.flags & IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK:
        MLX5_SET("qpc", qpc, "block_lb_mc", 1)


@traced
def create_user_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr,
                   ucmd: abi.mlx5_ib_create_qp, uidx: int,
                   resp: mlx5_ib_create_qp_resp) -> None:
    """Mirrors create_user_qp(): RQ size, buffers, QPC, CREATE_QP, the QP lists."""
    mdev = dev.mdev
    qp.has_rq = qp_has_rq(attr)
    set_rq_size(dev, attr, qp, ucmd)
    if ucmd.rq_wqe_shift != qp.rq.wqe_shift or ucmd.rq_wqe_count != qp.rq.wqe_cnt:
        raise KernelError(EINVAL, "create_user_qp: the RQ sizes do not match the caps")
    if ucmd.sq_wqe_count > 1 << MLX5_CAP_GEN(mdev, "log_max_qp_sz"):
        raise KernelError(EINVAL, f"create_user_qp: sq_wqe_count {ucmd.sq_wqe_count} > max")
    with ExitStack() as unwind:
        in_ = _create_user_qp(dev, qp, ucmd, resp, unwind)
        _fill_qpc(dev, qp, attr, MLX5_ADDR_OF("create_qp_in", in_, "qpc"), uidx)
        if attr.qp_type == IB_QPT_RAW_PACKET:
            qp.raw_packet_qp.sq.ubuffer.buf_addr = ucmd.sq_buf_addr
            create_raw_packet_qp(dev, qp, in_, resp)
        else:
            mlx5_qpc_create_qp(dev, qp, in_)
        unwind.pop_all()
    _qp_lists(dev, qp, list.append)


def _read_ucmd(udata: ib_udata) -> abi.mlx5_ib_create_qp:
    """process_udata_size + check_ucmd_data + the copy."""
    if udata.inlen < abi.mlx5_ib_create_qp.offsetof("ece_options"):
        raise KernelError(EINVAL, f"process_udata_size: request of {udata.inlen} bytes")
    if udata.inlen > abi.mlx5_ib_create_qp.SIZE and not ib_is_udata_cleared(
            udata, abi.mlx5_ib_create_qp.SIZE, udata.inlen - abi.mlx5_ib_create_qp.SIZE):
        raise KernelError(EINVAL, "check_ucmd_data: unknown trailing request bytes")
    ucmd = ib_copy_from_udata(abi.mlx5_ib_create_qp, udata, min(udata.inlen,
                                                          abi.mlx5_ib_create_qp.SIZE))
    if ucmd.reserved:
        raise KernelError(EINVAL, "check_ucmd_data: reserved field set")
    return ucmd


@traced
def process_vendor_flags(dev: mlx5_ib_dev, qp: mlx5_ib_qp, ucmd: abi.mlx5_ib_create_qp) -> None:
    """Mirrors process_vendor_flags(): EINVAL for an unknown flag, EOPNOTSUPP for a
    known one the device cannot do.  The DC subtype makes the QP a DCI or a DCT
    (qp.type); an IB_QPT_DRIVER QP without exactly one of them is EINVAL.
    # EMU: tunnel offloads, TIR loopback, credit mode and DCI streams are not
    # modelled and are EOPNOTSUPP."""
    flags = ucmd.flags
    subtype = flags & (MLX5_QP_FLAG_TYPE_DCT | MLX5_QP_FLAG_TYPE_DCI)
    if subtype == MLX5_QP_FLAG_TYPE_DCI:
        qp.type = MLX5_IB_QPT_DCI
    elif subtype == MLX5_QP_FLAG_TYPE_DCT:
        qp.type = MLX5_IB_QPT_DCT
    elif qp.type == IB_QPT_DRIVER:
        raise KernelError(EINVAL, f"process_vendor_flags: IB_QPT_DRIVER QP without a DC "
                          f"subtype (flags {flags:#x})")
    if flags & ~_KNOWN_FLAGS:
        raise KernelError(EINVAL, f"process_vendor_flags: unknown flags {flags:#x}")
    if flags & ~_MODELLED_FLAGS:
        raise KernelError(EOPNOTSUPP, f"process_vendor_flags: flags {flags:#x} not supported")
    if flags & MLX5_QP_FLAG_SIGNATURE:
        if not MLX5_CAP_GEN(dev.mdev, "wq_signature"):
            raise KernelError(EOPNOTSUPP, "process_vendor_flags: no WQ signature support")
        qp.wq_sig = True
    qp.flags_en = flags & (MLX5_QP_FLAG_SIGNATURE | MLX5_QP_FLAG_BFREG_INDEX
                           | MLX5_QP_FLAG_UAR_PAGE_INDEX | MLX5_QP_FLAG_SCATTER_CQE
                           | MLX5_QP_FLAG_TYPE_DCI | MLX5_QP_FLAG_TYPE_DCT)


def process_create_flag(dev: mlx5_ib_dev, flags: list[int], flag: int, cond: bool,
                        qp: mlx5_ib_qp) -> None:
    """Mirrors process_create_flag(): a flag asked for and supported (cond) moves from
    the remaining flags to qp.flags; an unsupported one stays (and fails the create)."""
    if not flags[0] & flag:
        return
    if cond:
        qp.flags |= flag
        flags[0] &= ~flag


@traced
def process_create_flags(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr) -> None:
    """Mirrors process_create_flags(): each flag the QP type may carry, when the device
    can (block_lb_mc, cd, end_pad; SCATTER_FCS and CVLAN_STRIPPING on a RAW_PACKET QP
    with the Ethernet offload caps; SOURCE_QPN and IPoIB LSO on a UD QP of an IB
    port); what is left is EOPNOTSUPP.
    # EMU: NETIF_QP and INTEGRITY_EN (kernel-only flags) are never granted."""
    mdev = dev.mdev
    if qp.type == MLX5_IB_QPT_DCT:
        if attr.create_flags:
            raise KernelError(EINVAL, f"process_create_flags: a DCT takes no create flags "
                              f"({attr.create_flags:#x})")
        return
    qp_type = attr.qp_type
    flags = [attr.create_flags]
    process_create_flag(dev, flags, IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK,
                        bool(MLX5_CAP_GEN(mdev, "block_lb_mc")), qp)
    for flag in (IB_QP_CREATE_CROSS_CHANNEL, IB_QP_CREATE_MANAGED_SEND,
                 IB_QP_CREATE_MANAGED_RECV):
        process_create_flag(dev, flags, flag, bool(MLX5_CAP_GEN(mdev, "cd")), qp)
    if qp_type == IB_QPT_UD:
        process_create_flag(dev, flags, IB_QP_CREATE_IPOIB_UD_LSO,
                            bool(MLX5_CAP_GEN(mdev, "ipoib_basic_offloads")), qp)
        process_create_flag(dev, flags, IB_QP_CREATE_SOURCE_QPN,
                            MLX5_CAP_GEN(mdev, "port_type") == MLX5_CAP_PORT_TYPE_IB, qp)
    if qp_type == IB_QPT_RAW_PACKET:
        offloads = bool(MLX5_CAP_GEN(mdev, "eth_net_offloads"))
        process_create_flag(dev, flags, IB_QP_CREATE_SCATTER_FCS,
                            offloads and bool(MLX5_CAP_ETH(mdev, "scatter_fcs")), qp)
        process_create_flag(dev, flags, IB_QP_CREATE_CVLAN_STRIPPING,
                            offloads and bool(MLX5_CAP_ETH(mdev, "vlan_cap")), qp)
    process_create_flag(dev, flags, IB_QP_CREATE_PCI_WRITE_END_PADDING,
                        bool(MLX5_CAP_GEN(mdev, "end_pad")), qp)
    if flags[0]:
        raise KernelError(EOPNOTSUPP, "process_create_flags: Create QP has unsupported "
                          f"flags {flags[0]:#x}")


@traced
def get_qp_uidx(qp: mlx5_ib_qp, ucmd: abi.mlx5_ib_create_qp) -> int:
    """Mirrors get_qp_uidx() -> verify_assign_uidx(): a v1-CQE context names a
    24-bit user index; a v0 one must send the default."""
    context: mlx5_ib_ucontext = rdma_udata_to_drv_context(qp)
    if context.cqe_version == MLX5_CQE_VERSION_V1:
        if ucmd.uidx == MLX5_IB_DEFAULT_UIDX or ucmd.uidx & ~MLX5_USER_ASSIGNED_UIDX_MASK:
            raise KernelError(EINVAL, f"verify_assign_uidx: uidx {ucmd.uidx:#x}")
        return ucmd.uidx & MLX5_USER_ASSIGNED_UIDX_MASK
    if ucmd.uidx != MLX5_IB_DEFAULT_UIDX:
        raise KernelError(EINVAL, f"verify_assign_uidx: uidx {ucmd.uidx:#x} on a v0 context")
    return MLX5_IB_DEFAULT_UIDX


@traced
def create_xrc_tgt_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr) -> None:
    """Mirrors create_xrc_tgt_qp(): a QP with no queues of its own (no SQ, receives
    from the SRQs of its XRC domain), the kernel's (uid 0), CREATE_QP.
    # EMU: the device-global PD, CQ and SRQ it names in the real QPC (devr.p0, c0,
    # s0) are not modelled: pd, cqn_snd/rcv and srqn stay 0 (the firmware takes an
    # XRC target's resources from the SRQ each request names)."""
    in_ = IfcStruct("create_qp_in", pas=0)
    qpc = MLX5_ADDR_OF("create_qp_in", in_, "qpc")
    MLX5_SET("qpc", qpc, "st", MLX5_QPC_ST_XRC)
    MLX5_SET("qpc", qpc, "pm_state", MLX5_QP_PM_MIGRATED)
    MLX5_SET("qpc", qpc, "rq_type", MLX5_SRQ_RQ)
    MLX5_SET("qpc", qpc, "no_sq", 1)
    MLX5_SET("qpc", qpc, "xrcd", to_mxrcd(attr.xrcd).xrcdn)
    MLX5_SET("qpc", qpc, "ts_format", MLX5_CAP_GEN(dev.mdev, "sq_ts_format") and 1)
    if MLX5_CAP_GEN(dev.mdev, "cqe_version") == MLX5_CQE_VERSION_V1:
        MLX5_SET("qpc", qpc, "user_index", MLX5_IB_DEFAULT_UIDX)
    qp.trans_qp.base.mqp.uid = 0
    mlx5_qpc_create_qp(dev, qp, in_)
    qp.has_rq = False
    qp.rq.wqe_cnt = qp.sq.wqe_cnt = 0
    attr.cap.max_recv_wr = attr.cap.max_send_wr = 0
    attr.cap.max_recv_sge = attr.cap.max_send_sge = attr.cap.max_inline_data = 0
    with _reset_flow_locked(dev):
        dev.qp_list.append(qp)


class _reset_flow_locked:
    """dev.reset_flow_resource_lock held (irqsave) for a with block."""

    def __init__(self, dev: mlx5_ib_dev):
        self.dev = dev

    def __enter__(self) -> None:
        self.flags = spin_lock_irqsave(self.dev.reset_flow_resource_lock)

    def __exit__(self, *exc: object) -> None:
        spin_unlock_irqrestore(self.dev.reset_flow_resource_lock, self.flags)


def check_valid_flow(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr) -> None:
    """Mirrors check_valid_flow() for a user QP: a RAW_PACKET QP needs a context with
    CQE version 1 (its CQEs name the QP by user index): EINVAL."""
    context: mlx5_ib_ucontext = rdma_udata_to_drv_context(qp)
    if attr.qp_type == IB_QPT_RAW_PACKET and not context.cqe_version:
        raise KernelError(EINVAL, "check_valid_flow: Raw Packet QP is only supported for "
                          "CQE version > 0")


@traced
def mlx5_ib_create_qp(ibqp: mlx5_ib_qp, attr: ib_qp_init_attr, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_create_qp() for a user RC/UC/UD QP (order in the docstring above;
    a RAW_PACKET QP's queues are qp_raw.py's, after check_valid_flow's EINVAL for a
    CQE version 0 context).

    EOPNOTSUPP for other QP types (# EMU: GSI is not modelled), IB_QPT_DRIVER
    without the dct cap, and create flags; a DCI is a user QP of service type DCI,
    a DCT is qp_dc.py's (check_qp_attr: EINVAL for a DCT without SRQ and receive CQ,
    a DCI with a receive queue); EINVAL for a short or dirty request, unknown
    vendor flags, a bad user index, RQ/SQ sizes the library did not derive
    from the caps or beyond the device; then the bfreg, umem, doorbell and
    firmware errors.  A response that cannot be copied destroys the QP
    (EFAULT).  Every step is undone on failure.
    """
    dev = to_mdev(ibqp.device)
    qp = ibqp
    if attr.qp_type == IB_QPT_DRIVER and not MLX5_CAP_GEN(dev.mdev, "dct"):
        raise KernelError(EOPNOTSUPP, "check_qp_type: no DC support (dct cap)")
    if attr.qp_type not in _MLX5_ST and attr.qp_type != IB_QPT_DRIVER:
        raise KernelError(EOPNOTSUPP, f"check_qp_type: QP type {attr.qp_type} not supported")
    qp.type = attr.qp_type
    if attr.qp_type in (IB_QPT_XRC_INI, IB_QPT_XRC_TGT) and not MLX5_CAP_GEN(dev.mdev, "xrc"):
        raise KernelError(EOPNOTSUPP, "check_qp_type: no XRC support")
    if attr.qp_type == IB_QPT_XRC_TGT:              # the core passes no udata for it
        create_xrc_tgt_qp(dev, qp, attr)
        qp.qp_num = qp.mqp.qpn
        return
    check_valid_flow(dev, qp, attr)
    ucmd = _read_ucmd(udata)
    process_vendor_flags(dev, qp, ucmd)
    uidx = get_qp_uidx(qp, ucmd)
    process_create_flags(dev, qp, attr)
    check_qp_attr(dev, qp, attr)
    resp = mlx5_ib_create_qp_resp()
    if qp.type == MLX5_IB_QPT_DCT:      # no firmware object until RTR; a zero response
        create_dct(dev, qp, attr, ucmd, uidx)
        if udata.outlen:
            try:
                ib_respond_udata(udata, resp)
            except BaseException:
                mlx5_ib_destroy_dct(qp)
                raise
        return
    if attr.sq_sig_type == IB_SIGNAL_ALL_WR:
        qp.sq_signal_bits = MLX5_WQE_CTRL_CQ_UPDATE
    create_user_qp(dev, qp, attr, ucmd, uidx, resp)
    qp.qp_num = qp.mqp.qpn
    if udata.outlen:
        try:
            ib_respond_udata(udata, resp)
        except BaseException:
            mlx5_ib_destroy_qp(qp, udata)
            raise


@traced
def destroy_qp_user(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> None:
    """Mirrors destroy_qp_user(): the doorbell, the buffer, and the bfreg if the kernel
    allocated it (UARs user space chose are not the kernel's to count)."""
    context: mlx5_ib_ucontext = rdma_udata_to_drv_context(qp)
    mlx5_ib_db_unmap_user(context, qp.db)
    _release_umem(qp)
    if qp.bfregn != MLX5_IB_INVALID_BFREG:
        mlx5_ib_free_bfreg(dev, context.bfregi, qp.bfregn)


@traced
def mlx5_ib_destroy_qp(qp: mlx5_ib_qp, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_destroy_qp() -> destroy_qp_common(): a QP not in RESET is
    moved there first (2RST: the device stops using its queues), then off the
    QP lists, DESTROY_QP, then destroy_qp_user.  Firmware failures are only
    warned about: the QP is freed regardless.  A DCT is mlx5_ib_destroy_dct's."""
    dev = to_mdev(qp.device)
    if qp.type == MLX5_IB_QPT_DCT:
        mlx5_ib_destroy_dct(qp)
        return
    if qp.state != IB_QPS_RESET:
        try:
            if qp.qp_type == IB_QPT_RAW_PACKET:     # the SQ and RQ back to RST
                modify_raw_packet_qp(dev, qp, MLX5_CMD_OP_2RST_QP)
            else:
                mlx5_core_qp_modify(dev, MLX5_CMD_OP_2RST_QP, 0, None, qp.mqp)
        except KernelError as e:
            mlx5_ib_warn(dev, f"mlx5_ib: modify QP {qp.mqp.qpn:#08x} to RESET failed: {e}")
    if qp.qp_type == IB_QPT_XRC_TGT:                # no queues, no CQs, no user memory
        with _reset_flow_locked(dev):
            dev.qp_list.remove(qp)
        try:
            mlx5_core_destroy_qp(dev, qp)
        except KernelError as e:
            mlx5_ib_warn(dev, f"mlx5_ib_destroy_qp: failed to destroy QP {qp.mqp.qpn:#x}: {e}")
        return
    _qp_lists(dev, qp, list.remove)
    if qp.qp_type == IB_QPT_RAW_PACKET:
        destroy_raw_packet_qp(dev, qp)
        destroy_qp_user(dev, qp)
        return
    try:
        mlx5_core_destroy_qp(dev, qp)
    except KernelError as e:  # the kernel warns and goes on freeing
        mlx5_ib_warn(dev, f"mlx5_ib_destroy_qp: failed to destroy QP {qp.mqp.qpn:#x}: {e}")
    destroy_qp_user(dev, qp)

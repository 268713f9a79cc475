"""Mirrors the raw packet QP part of drivers/infiniband/hw/mlx5/qp.c: an IB_QPT_RAW_PACKET
QP is no firmware QP but a send queue and a receive queue of the NIC, each with the
transport interface that ties it to the port:

    create_raw_packet_qp        (the QPC create_user_qp built is only read from)
      with a send queue:    create_raw_packet_qp_tis   CREATE_TIS in the context's
                                                       transport domain
                            create_raw_packet_qp_sq    the SQ's own user buffer
                                                       (ucmd.sq_buf_addr) pinned,
                                                       CREATE_SQ (cyclic WQ of WQEBBs)
      with a receive queue: create_raw_packet_qp_rq    CREATE_RQ on the QP buffer's
                                                       PAS (the RQ fills it alone)
                            create_raw_packet_qp_tir   CREATE_TIR, DIRECT to the RQ
      qp_num                the SQ's number (the RQ's when there is no SQ)

    modify_raw_packet_qp        each QP transition as SQ/RQ states:
                                RST2INIT: RQ ready, SQ reset; RTR2RTS/RTS2RTS: SQ
                                ready; 2ERR: both ERR; 2RST: both RST; INIT2INIT
                                and INIT2RTR change nothing
    query_raw_packet_qp_state   QUERY_SQ / QUERY_RQ, the QP state from the pair
    destroy_raw_packet_qp       TIR, RQ, then SQ (and its buffer), TIS

A DEVX context (uid != 0) gets the four object numbers in the response
(tirn, tisn, rqn, sqn with their comp_mask bits).  Every step is undone in
reverse when a later one fails.

# EMU: the main buffer's umem (the RQ's) stays in qp.trans_qp.base, where the
# model's create_user_qp keeps every user QP's; the kernel keeps it in
# raw_packet_qp.rq.base.  No vport flow rule for the SQ (representors are not
# modelled), no Q counters (RST2INIT sets no counter_set_id), no LAG tx
# affinity, no rate limits (IB_QP_RATE_LIMIT is EINVAL here).
"""

from __future__ import annotations

from contextlib import ExitStack

from drivers.ib_core.ib_verbs import (
    IB_QP_CREATE_CVLAN_STRIPPING,
    IB_QP_CREATE_PCI_WRITE_END_PADDING,
    IB_QP_CREATE_SCATTER_FCS,
    IB_QPS_ERR,
    IB_QPS_RESET,
    IB_QPS_SQE,
)
from drivers.ib_core.umem import ib_umem_get, ib_umem_num_dma_blocks, ib_umem_release
from drivers.mlx5_core.driver import MLX5_CAP_ETH, MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_ADDR_OF,
    MLX5_CMD_OP_2ERR_QP,
    MLX5_CMD_OP_2RST_QP,
    MLX5_CMD_OP_INIT2INIT_QP,
    MLX5_CMD_OP_INIT2RTR_QP,
    MLX5_CMD_OP_RST2INIT_QP,
    MLX5_CMD_OP_RTR2RTS_QP,
    MLX5_CMD_OP_RTS2RTS_QP,
    MLX5_GET,
    MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE,
    MLX5_RQC_STATE_ERR,
    MLX5_RQC_STATE_RDY,
    MLX5_RQC_STATE_RST,
    MLX5_SET,
    MLX5_SET64,
    MLX5_SQC_STATE_ERR,
    MLX5_SQC_STATE_RDY,
    MLX5_SQC_STATE_RST,
    MLX5_TIRC_DISP_TYPE_DIRECT,
    MLX5_WQ_TYPE_CYCLIC,
    IfcStruct,
)
from drivers.mlx5_core.transobj import (
    mlx5_core_create_rq,
    mlx5_core_create_sq,
    mlx5_core_create_tir,
    mlx5_core_create_tis,
    mlx5_core_destroy_rq,
    mlx5_core_destroy_sq,
    mlx5_core_modify_rq,
    mlx5_core_modify_sq,
    mlx5_core_query_rq,
    mlx5_core_query_sq_state,
)
from drivers.mlx5_ib.cmd import mlx5_cmd_destroy_tir, mlx5_cmd_destroy_tis
from drivers.mlx5_ib.main import rdma_udata_to_drv_context
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas, mlx5_umem_find_best_quantized_pgoff
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_SEND_WQE_BB,
    ilog2,
    mlx5_core_qp,
    mlx5_ib_cq,
    mlx5_ib_dev,
    mlx5_ib_qp,
    mlx5_ib_rq,
    mlx5_ib_sq,
    mlx5_ib_ucontext,
    mlx5_ib_warn,
    order_base_2,
    to_mcq,
    to_mpd,
)
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_qp_resp

# enum mlx5_ib_create_qp_resp_mask (mlx5-abi.h)
MLX5_IB_CREATE_QP_RESP_MASK_TIRN, MLX5_IB_CREATE_QP_RESP_MASK_TISN = 1 << 0, 1 << 1
MLX5_IB_CREATE_QP_RESP_MASK_RQN, MLX5_IB_CREATE_QP_RESP_MASK_SQN = 1 << 2, 1 << 3
# mlx5_ib_rq.flags
MLX5_IB_RQ_CVLAN_STRIPPING, MLX5_IB_RQ_PCI_WRITE_END_PADDING = 1 << 0, 1 << 1
MLX5_WQ_END_PAD_MODE_ALIGN = 1
# sqrq_state_to_qp_state(): "no such queue", and the table's two special answers
MLX5_SQ_STATE_NA = MLX5_SQC_STATE_ERR + 1
MLX5_RQ_STATE_NA = MLX5_RQC_STATE_ERR + 1
MLX5_QP_STATE = IB_QPS_ERR + 1          # the QP's own state (qp->state) decides
MLX5_QP_STATE_BAD = IB_QPS_ERR + 2      # a pair no transition leaves behind


def _sqrq_row(rst: int, rdy: int, err: int, na: int) -> dict[int, int]:
    return {MLX5_SQC_STATE_RST: rst, MLX5_SQC_STATE_RDY: rdy, MLX5_SQC_STATE_ERR: err,
            MLX5_SQ_STATE_NA: na}


#: Mirrors sqrq_state_to_qp_state()'s table: [rq_state][sq_state] -> the QP state
SQRQ_TRANS: dict[int, dict[int, int]] = {
    MLX5_RQC_STATE_RST: _sqrq_row(IB_QPS_RESET, MLX5_QP_STATE_BAD, MLX5_QP_STATE_BAD,
                                  IB_QPS_RESET),
    MLX5_RQC_STATE_RDY: _sqrq_row(MLX5_QP_STATE, MLX5_QP_STATE, IB_QPS_SQE, MLX5_QP_STATE),
    MLX5_RQC_STATE_ERR: _sqrq_row(MLX5_QP_STATE_BAD, MLX5_QP_STATE_BAD, IB_QPS_ERR,
                                  IB_QPS_ERR),
    MLX5_RQ_STATE_NA: _sqrq_row(MLX5_QP_STATE, MLX5_QP_STATE, MLX5_QP_STATE,
                                MLX5_QP_STATE_BAD),
}


# -- TIS ------------------------------------------------------------------------------------
@traced
def create_raw_packet_qp_tis(dev: mlx5_ib_dev, qp: mlx5_ib_qp, sq: mlx5_ib_sq, tdn: int,
                             uid: int) -> None:
    """Mirrors create_raw_packet_qp_tis(): CREATE_TIS in transport domain tdn."""
    in_ = IfcStruct("create_tis_in")
    MLX5_SET("create_tis_in", in_, "uid", uid)
    MLX5_SET("tisc", MLX5_ADDR_OF("create_tis_in", in_, "ctx"), "transport_domain", tdn)
    sq.tisn = mlx5_core_create_tis(dev.mdev, in_)


@traced
def destroy_raw_packet_qp_tis(dev: mlx5_ib_dev, sq: mlx5_ib_sq, uid: int) -> None:
    """Mirrors destroy_raw_packet_qp_tis()."""
    mlx5_cmd_destroy_tis(dev.mdev, sq.tisn, uid)


# -- SQ -------------------------------------------------------------------------------------
@traced
def create_raw_packet_qp_sq(dev: mlx5_ib_dev, qp: mlx5_ib_qp, sq: mlx5_ib_sq,
                            qpin: IfcStruct, uid: int, cq: mlx5_ib_cq) -> None:
    """Mirrors create_raw_packet_qp_sq(): pin the SQ's own buffer (EINVAL if no page
    size fits it), then CREATE_SQ in RST - flush in error, the QP's user index, the
    send CQ, the TIS, and a cyclic WQ of 64-byte WQEBBs on the QP's PD, UAR and
    doorbell record; the umem is released if the firmware refuses."""
    mdev = dev.mdev
    qpc = MLX5_ADDR_OF("create_qp_in", qpin, "qpc")
    ubuffer = sq.ubuffer
    ubuffer.umem = ib_umem_get(qp.device, ubuffer.buf_addr, ubuffer.buf_size, 0)
    try:
        page_size, page_offset_quantized = mlx5_umem_find_best_quantized_pgoff(
            ubuffer.umem, "wq", "log_wq_pg_sz", MLX5_ADAPTER_PAGE_SHIFT, "page_offset", 64)
        if not page_size:
            raise KernelError(EINVAL, "create_raw_packet_qp_sq: no page size fits the "
                              "SQ buffer")
        ncont = ib_umem_num_dma_blocks(ubuffer.umem, page_size)
        in_ = IfcStruct("create_sq_in", pas=ncont)
        MLX5_SET("create_sq_in", in_, "uid", uid)
        sqc = MLX5_ADDR_OF("create_sq_in", in_, "ctx")
        MLX5_SET("sqc", sqc, "flush_in_error_en", 1)
        if MLX5_CAP_ETH(mdev, "multi_pkt_send_wqe"):
            MLX5_SET("sqc", sqc, "allow_multi_pkt_send_wqe", 1)
        MLX5_SET("sqc", sqc, "state", MLX5_SQC_STATE_RST)
        # get_sq_ts_format(): the default format where the device has one
        MLX5_SET("sqc", sqc, "ts_format", MLX5_CAP_GEN(mdev, "sq_ts_format") and 1)
        MLX5_SET("sqc", sqc, "user_index", MLX5_GET("qpc", qpc, "user_index"))
        MLX5_SET("sqc", sqc, "cqn", cq.mcq.cqn)
        MLX5_SET("sqc", sqc, "tis_lst_sz", 1)
        MLX5_SET("sqc", sqc, "tis_num_0", sq.tisn)
        if MLX5_CAP_GEN(mdev, "eth_net_offloads") and MLX5_CAP_ETH(mdev, "swp"):
            MLX5_SET("sqc", sqc, "allow_swp", 1)
        wq = MLX5_ADDR_OF("sqc", sqc, "wq")
        MLX5_SET("wq", wq, "wq_type", MLX5_WQ_TYPE_CYCLIC)
        MLX5_SET("wq", wq, "pd", MLX5_GET("qpc", qpc, "pd"))
        MLX5_SET("wq", wq, "uar_page", MLX5_GET("qpc", qpc, "uar_page"))
        MLX5_SET64("wq", wq, "dbr_addr", MLX5_GET("qpc", qpc, "dbr_addr"))
        MLX5_SET("wq", wq, "log_wq_stride", ilog2(MLX5_SEND_WQE_BB))
        MLX5_SET("wq", wq, "log_wq_sz", MLX5_GET("qpc", qpc, "log_sq_size"))
        MLX5_SET("wq", wq, "log_wq_pg_sz", order_base_2(page_size) - MLX5_ADAPTER_PAGE_SHIFT)
        MLX5_SET("wq", wq, "page_offset", page_offset_quantized)
        mlx5_ib_populate_pas(ubuffer.umem, page_size,
                             MLX5_ADDR_OF("create_sq_in", in_, "pas"), 0)
        mlx5_core_create_sq_tracked(dev, in_, sq.base.mqp)
    except BaseException:
        ib_umem_release(ubuffer.umem)
        ubuffer.umem = None
        raise


@traced
def destroy_raw_packet_qp_sq(dev: mlx5_ib_dev, sq: mlx5_ib_sq) -> None:
    """Mirrors destroy_raw_packet_qp_sq(): DESTROY_SQ (a failure is ignored, as the
    kernel does; warned about here), then the SQ buffer's umem."""
    try:
        mlx5_core_destroy_sq_tracked(dev, sq.base.mqp)
    except KernelError as e:
        mlx5_ib_warn(dev, f"destroy_raw_packet_qp_sq: SQ {sq.base.mqp.qpn:#x}: {e}")
    ib_umem_release(sq.ubuffer.umem)
    sq.ubuffer.umem = None


# -- RQ -------------------------------------------------------------------------------------
def get_rq_pas_size(qpc: IfcStruct) -> int:
    """Mirrors get_rq_pas_size(): the PAS entries the RQ's part of the QPC needs (the
    kernel's answer is in bytes: eight per entry)."""
    log_page_size = MLX5_GET("qpc", qpc, "log_page_size") + 12
    po_quanta = 1 << (log_page_size - 6)
    rq_sz = 1 << (MLX5_GET("qpc", qpc, "log_rq_size") + 4
                  + MLX5_GET("qpc", qpc, "log_rq_stride"))
    page_size = 1 << log_page_size
    rq_sz_po = rq_sz + MLX5_GET("qpc", qpc, "page_offset") * po_quanta
    return (rq_sz_po + page_size - 1) // page_size


@traced
def create_raw_packet_qp_rq(dev: mlx5_ib_dev, qp: mlx5_ib_qp, rq: mlx5_ib_rq,
                            qpin: IfcStruct, uid: int, cq: mlx5_ib_cq) -> None:
    """Mirrors create_raw_packet_qp_rq(): CREATE_RQ in RST on the QP buffer (its PAS
    copied from the QP's mailbox: EINVAL if that holds fewer entries than the RQ
    needs) - VLAN stripping unless asked for (vsd), FCS scattered if asked, flush in
    error, the QP's user index, the receive CQ, the RQ's stride and size."""
    mdev = dev.mdev
    qpc = MLX5_ADDR_OF("create_qp_in", qpin, "qpc")
    rq_pas_size = get_rq_pas_size(qpc)
    qp_pas = MLX5_ADDR_OF("create_qp_in", qpin, "pas")
    if len(qp_pas) < rq_pas_size:
        raise KernelError(EINVAL, f"create_raw_packet_qp_rq: {len(qp_pas)} PAS entries, "
                          f"the RQ needs {rq_pas_size}")
    in_ = IfcStruct("create_rq_in", pas=rq_pas_size)
    MLX5_SET("create_rq_in", in_, "uid", uid)
    rqc = MLX5_ADDR_OF("create_rq_in", in_, "ctx")
    if not rq.flags & MLX5_IB_RQ_CVLAN_STRIPPING:
        MLX5_SET("rqc", rqc, "vsd", 1)
    MLX5_SET("rqc", rqc, "mem_rq_type", MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE)
    MLX5_SET("rqc", rqc, "ts_format", MLX5_CAP_GEN(mdev, "rq_ts_format") and 1)
    MLX5_SET("rqc", rqc, "state", MLX5_RQC_STATE_RST)
    MLX5_SET("rqc", rqc, "flush_in_error_en", 1)
    MLX5_SET("rqc", rqc, "user_index", MLX5_GET("qpc", qpc, "user_index"))
    MLX5_SET("rqc", rqc, "cqn", cq.mcq.cqn)
    if qp.flags & IB_QP_CREATE_SCATTER_FCS:
        MLX5_SET("rqc", rqc, "scatter_fcs", 1)
    wq = MLX5_ADDR_OF("rqc", rqc, "wq")
    MLX5_SET("wq", wq, "wq_type", MLX5_WQ_TYPE_CYCLIC)
    if rq.flags & MLX5_IB_RQ_PCI_WRITE_END_PADDING:
        MLX5_SET("wq", wq, "end_padding_mode", MLX5_WQ_END_PAD_MODE_ALIGN)
    MLX5_SET("wq", wq, "page_offset", MLX5_GET("qpc", qpc, "page_offset"))
    MLX5_SET("wq", wq, "pd", MLX5_GET("qpc", qpc, "pd"))
    MLX5_SET64("wq", wq, "dbr_addr", MLX5_GET("qpc", qpc, "dbr_addr"))
    MLX5_SET("wq", wq, "log_wq_stride", MLX5_GET("qpc", qpc, "log_rq_stride") + 4)
    MLX5_SET("wq", wq, "log_wq_pg_sz", MLX5_GET("qpc", qpc, "log_page_size"))
    MLX5_SET("wq", wq, "log_wq_sz", MLX5_GET("qpc", qpc, "log_rq_size"))
    pas = MLX5_ADDR_OF("create_rq_in", in_, "pas")
    pas.view[:rq_pas_size] = qp_pas.view[:rq_pas_size]
    mlx5_core_create_rq_tracked(dev, in_, rq.base.mqp)


@traced
def destroy_raw_packet_qp_rq(dev: mlx5_ib_dev, rq: mlx5_ib_rq) -> None:
    """Mirrors destroy_raw_packet_qp_rq() (a failure is ignored, as the kernel does;
    warned about here)."""
    try:
        mlx5_core_destroy_rq_tracked(dev, rq.base.mqp)
    except KernelError as e:
        mlx5_ib_warn(dev, f"destroy_raw_packet_qp_rq: RQ {rq.base.mqp.qpn:#x}: {e}")


# -- TIR ------------------------------------------------------------------------------------
@traced
def create_raw_packet_qp_tir(dev: mlx5_ib_dev, rq: mlx5_ib_rq, tdn: int, uid: int) -> None:
    """Mirrors create_raw_packet_qp_tir(): CREATE_TIR, DIRECT dispatch to the RQ, in
    transport domain tdn.  (Tunnel offloads and the self-loopback flags, which the TIR
    would carry, are EOPNOTSUPP at process_vendor_flags in the model.)"""
    in_ = IfcStruct("create_tir_in")
    MLX5_SET("create_tir_in", in_, "uid", uid)
    tirc = MLX5_ADDR_OF("create_tir_in", in_, "ctx")
    MLX5_SET("tirc", tirc, "disp_type", MLX5_TIRC_DISP_TYPE_DIRECT)
    MLX5_SET("tirc", tirc, "inline_rqn", rq.base.mqp.qpn)
    MLX5_SET("tirc", tirc, "transport_domain", tdn)
    rq.tirn = mlx5_core_create_tir(dev.mdev, in_)


@traced
def destroy_raw_packet_qp_tir(dev: mlx5_ib_dev, rq: mlx5_ib_rq, uid: int) -> None:
    """Mirrors destroy_raw_packet_qp_tir()."""
    mlx5_cmd_destroy_tir(dev.mdev, rq.tirn, uid)


# -- the tracked SQ/RQ (qpc.c) -----------------------------------------------------------
@traced
def mlx5_core_create_sq_tracked(dev: mlx5_ib_dev, in_: IfcStruct, sq: mlx5_core_qp) -> None:
    """Mirrors mlx5_core_create_sq_tracked() (qpc.c): CREATE_SQ; the sqn and uid."""
    sq.qpn = mlx5_core_create_sq(dev.mdev, in_)
    sq.uid = MLX5_GET("create_sq_in", in_, "uid")


@traced
def mlx5_core_destroy_sq_tracked(dev: mlx5_ib_dev, sq: mlx5_core_qp) -> None:
    """Mirrors mlx5_core_destroy_sq_tracked() (qpc.c): DESTROY_SQ with its uid."""
    mlx5_core_destroy_sq(dev.mdev, sq.qpn, sq.uid)


@traced
def mlx5_core_create_rq_tracked(dev: mlx5_ib_dev, in_: IfcStruct, rq: mlx5_core_qp) -> None:
    """Mirrors mlx5_core_create_rq_tracked() (qpc.c): CREATE_RQ; the rqn and uid."""
    rq.qpn = mlx5_core_create_rq(dev.mdev, in_)
    rq.uid = MLX5_GET("create_rq_in", in_, "uid")


@traced
def mlx5_core_destroy_rq_tracked(dev: mlx5_ib_dev, rq: mlx5_core_qp) -> None:
    """Mirrors mlx5_core_destroy_rq_tracked() (qpc.c): DESTROY_RQ with its uid."""
    mlx5_core_destroy_rq(dev.mdev, rq.qpn, rq.uid)


# -- the QP ---------------------------------------------------------------------------------
@traced
def create_raw_packet_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, in_: IfcStruct,
                         resp: mlx5_ib_create_qp_resp) -> None:
    """Mirrors create_raw_packet_qp() (see the module docstring): TIS and SQ for a send
    queue, RQ and TIR for a receive queue, each undone if a later step fails; the
    QP's number is its SQ's (its RQ's without one)."""
    raw = qp.raw_packet_qp
    sq, rq = raw.sq, raw.rq
    mucontext: mlx5_ib_ucontext = rdma_udata_to_drv_context(qp)
    tdn = mucontext.tdn
    uid = to_mpd(qp.pd).uid
    with ExitStack() as unwind:
        if qp.sq.wqe_cnt:
            create_raw_packet_qp_tis(dev, qp, sq, tdn, uid)
            unwind.callback(destroy_raw_packet_qp_tis, dev, sq, uid)          # err_destroy_tis
            create_raw_packet_qp_sq(dev, qp, sq, in_, uid, to_mcq(qp.send_cq))
            unwind.callback(destroy_raw_packet_qp_sq, dev, sq)                # err_destroy_sq
            if uid:
                resp.tisn, resp.sqn = sq.tisn, sq.base.mqp.qpn
                resp.comp_mask |= MLX5_IB_CREATE_QP_RESP_MASK_TISN | \
                    MLX5_IB_CREATE_QP_RESP_MASK_SQN
        if qp.rq.wqe_cnt:
            if qp.flags & IB_QP_CREATE_CVLAN_STRIPPING:
                rq.flags |= MLX5_IB_RQ_CVLAN_STRIPPING
            if qp.flags & IB_QP_CREATE_PCI_WRITE_END_PADDING:
                rq.flags |= MLX5_IB_RQ_PCI_WRITE_END_PADDING
            create_raw_packet_qp_rq(dev, qp, rq, in_, uid, to_mcq(qp.recv_cq))
            unwind.callback(destroy_raw_packet_qp_rq, dev, rq)                # err_destroy_rq
            create_raw_packet_qp_tir(dev, rq, tdn, uid)
            if uid:
                resp.rqn, resp.tirn = rq.base.mqp.qpn, rq.tirn
                resp.comp_mask |= MLX5_IB_CREATE_QP_RESP_MASK_RQN | \
                    MLX5_IB_CREATE_QP_RESP_MASK_TIRN
        unwind.pop_all()
    qp.trans_qp.base.mqp.qpn = sq.base.mqp.qpn if qp.sq.wqe_cnt else rq.base.mqp.qpn
    qp.trans_qp.base.mqp.uid = uid


@traced
def destroy_raw_packet_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> None:
    """Mirrors destroy_raw_packet_qp(): the receive side (TIR, RQ), then the send side
    (SQ, TIS).  The TIR and TIS commands' failures are warned about only."""
    raw = qp.raw_packet_qp
    uid = to_mpd(qp.pd).uid
    if qp.rq.wqe_cnt:
        try:
            destroy_raw_packet_qp_tir(dev, raw.rq, uid)
        except KernelError as e:
            mlx5_ib_warn(dev, f"destroy_raw_packet_qp: TIR {raw.rq.tirn:#x}: {e}")
        destroy_raw_packet_qp_rq(dev, raw.rq)
    if qp.sq.wqe_cnt:
        destroy_raw_packet_qp_sq(dev, raw.sq)
        try:
            destroy_raw_packet_qp_tis(dev, raw.sq, uid)
        except KernelError as e:
            mlx5_ib_warn(dev, f"destroy_raw_packet_qp: TIS {raw.sq.tisn:#x}: {e}")


# -- modify -------------------------------------------------------------------------------
@traced
def modify_raw_packet_qp_rq(dev: mlx5_ib_dev, qp: mlx5_ib_qp, rq: mlx5_ib_rq,
                            new_state: int) -> None:
    """Mirrors modify_raw_packet_qp_rq(): MODIFY_RQ from the state the driver last set;
    rq.state moves only once the firmware agreed."""
    in_ = IfcStruct("modify_rq_in")
    MLX5_SET("modify_rq_in", in_, "rq_state", rq.state)
    MLX5_SET("modify_rq_in", in_, "uid", to_mpd(qp.pd).uid)
    MLX5_SET("rqc", MLX5_ADDR_OF("modify_rq_in", in_, "ctx"), "state", new_state)
    mlx5_core_modify_rq(dev.mdev, rq.base.mqp.qpn, in_)
    rq.state = new_state


@traced
def modify_raw_packet_qp_sq(dev: mlx5_ib_dev, qp: mlx5_ib_qp, sq: mlx5_ib_sq,
                            new_state: int) -> None:
    """Mirrors modify_raw_packet_qp_sq(): MODIFY_SQ from the state the driver last set;
    sq.state moves only once the firmware agreed."""
    in_ = IfcStruct("modify_sq_in")
    MLX5_SET("modify_sq_in", in_, "uid", to_mpd(qp.pd).uid)
    MLX5_SET("modify_sq_in", in_, "sq_state", sq.state)
    MLX5_SET("sqc", MLX5_ADDR_OF("modify_sq_in", in_, "ctx"), "state", new_state)
    mlx5_core_modify_sq(dev.mdev, sq.base.mqp.qpn, in_)
    sq.state = new_state


@traced
def modify_raw_packet_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, operation: int,
                         set_mask: int = 0) -> None:
    """Mirrors modify_raw_packet_qp(): the QP transition `operation` as the states of
    its RQ (first) and SQ (see the module docstring).  EINVAL for a raw parameter
    (set_mask) a transition cannot carry, or an operation that is no transition."""
    raw = qp.raw_packet_qp
    modify_rq, modify_sq = bool(qp.rq.wqe_cnt), bool(qp.sq.wqe_cnt)
    if operation == MLX5_CMD_OP_RST2INIT_QP:
        rq_state, sq_state = MLX5_RQC_STATE_RDY, MLX5_SQC_STATE_RST
    elif operation == MLX5_CMD_OP_2ERR_QP:
        rq_state, sq_state = MLX5_RQC_STATE_ERR, MLX5_SQC_STATE_ERR
    elif operation == MLX5_CMD_OP_2RST_QP:
        rq_state, sq_state = MLX5_RQC_STATE_RST, MLX5_SQC_STATE_RST
    elif operation in (MLX5_CMD_OP_RTR2RTS_QP, MLX5_CMD_OP_RTS2RTS_QP):
        if set_mask:
            raise KernelError(EINVAL, "modify_raw_packet_qp: rate limits are not modelled")
        modify_rq, rq_state, sq_state = False, 0, MLX5_SQC_STATE_RDY
    elif operation in (MLX5_CMD_OP_INIT2INIT_QP, MLX5_CMD_OP_INIT2RTR_QP):
        if set_mask:
            raise KernelError(EINVAL, "modify_raw_packet_qp: INIT2INIT/INIT2RTR carry "
                              "no raw parameters")
        return
    else:
        raise KernelError(EINVAL, f"modify_raw_packet_qp: operation {operation:#x}")
    if modify_rq:
        modify_raw_packet_qp_rq(dev, qp, raw.rq, rq_state)
    if modify_sq:
        modify_raw_packet_qp_sq(dev, qp, raw.sq, sq_state)


# -- query --------------------------------------------------------------------------------
def sqrq_state_to_qp_state(sq_state: int, rq_state: int, qp: mlx5_ib_qp) -> int:
    """Mirrors sqrq_state_to_qp_state(): the QP state the SQ/RQ pair stands for;
    EINVAL (the kernel WARNs) for a pair no transition leaves behind."""
    state = SQRQ_TRANS.get(rq_state, {}).get(sq_state, MLX5_QP_STATE_BAD)
    if state == MLX5_QP_STATE_BAD:
        raise KernelError(EINVAL, f"sqrq_state_to_qp_state: Buggy Raw Packet QP state, "
                          f"SQ {qp.raw_packet_qp.sq.base.mqp.qpn:#x} state: {sq_state:#x}, "
                          f"RQ {qp.raw_packet_qp.rq.base.mqp.qpn:#x} state: {rq_state:#x}")
    return qp.state if state == MLX5_QP_STATE else state


@traced
def query_raw_packet_qp_state(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> int:
    """Mirrors query_raw_packet_qp_state(): QUERY_SQ and QUERY_RQ (a queue the QP lacks
    counts as NA); the driver's sq/rq states follow the firmware's."""
    raw = qp.raw_packet_qp
    sq_state, rq_state = MLX5_SQ_STATE_NA, MLX5_RQ_STATE_NA
    if qp.sq.wqe_cnt:
        sq_state = raw.sq.state = mlx5_core_query_sq_state(dev.mdev, raw.sq.base.mqp.qpn)
    if qp.rq.wqe_cnt:
        out = mlx5_core_query_rq(dev.mdev, raw.rq.base.mqp.qpn)
        rq_state = raw.rq.state = MLX5_GET(
            "rqc", MLX5_ADDR_OF("query_rq_out", out, "rq_context"), "state")
    return sqrq_state_to_qp_state(sq_state, rq_state, qp)

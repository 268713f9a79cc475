"""Mirrors the receive work queue (WQ) and RSS indirection table part of
drivers/infiniband/hw/mlx5/qp.c: mlx5_ib_create_wq, mlx5_ib_modify_wq, mlx5_ib_destroy_wq,
mlx5_ib_create_rwq_ind_table, mlx5_ib_destroy_rwq_ind_table (the ops of an Ethernet
port: mlx5_ib_dev_common_roce_ops).

A WQ is an RQ of the NIC (CREATE_RQ, as a raw packet QP's receive queue) on a buffer
libmlx5 sized and a doorbell record:

    mlx5_ib_create_wq   prepare_user_rq: the request (EINVAL short, EOPNOTSUPP for
                        unknown trailing bytes or comp_mask bits), set_user_rq_size
                        (EINVAL beyond log_max_wq_sz or without WQEs),
                        create_user_rq (the buffer pinned, its page size, the
                        doorbell record mapped); create_rq: CREATE_RQ in RST with
                        the CVLAN/FCS/end-padding flags the device can do
                        (EOPNOTSUPP otherwise); the RQ number is the WQ's
    mlx5_ib_modify_wq   MODIFY_RQ from the current state (IB_WQS_ERR is the RQ's
                        ERR), VLAN stripping switched by modify_bitmask VSD
    mlx5_ib_create_rwq_ind_table   CREATE_RQT of the WQs' RQ numbers (EINVAL past
                        log_max_rqt_size)

# EMU: striding RQs (MLX5_IB_CREATE_WQ_STRIDING_RQ), delay drop and Q counters are
# not modelled: EOPNOTSUPP for the first two; the RQ's counter_set_id stays 0.
"""

from __future__ import annotations

from drivers.ib_core.ib_verbs import (
    IB_WQ_FLAGS,
    IB_WQS_ERR,
    IB_WQS_RESET,
    IB_WQT_RQ,
    ib_copy_from_udata,
    ib_copy_to_udata,
    ib_is_udata_cleared,
    ib_pd,
    ib_rwq_ind_table,
    ib_rwq_ind_table_init_attr,
    ib_udata,
    ib_wq,
    ib_wq_attr,
    ib_wq_init_attr,
)
from drivers.ib_core.umem import ib_umem_get, ib_umem_num_dma_blocks, ib_umem_release
from drivers.mlx5_core.driver import MLX5_CAP_ETH, MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_ADDR_OF,
    MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE,
    MLX5_RQC_STATE_ERR,
    MLX5_RQC_STATE_RST,
    MLX5_SET,
    MLX5_SET64,
    MLX5_WQ_TYPE_CYCLIC,
    IfcStruct,
)
from drivers.mlx5_core.transobj import mlx5_core_create_rqt, mlx5_core_modify_rq
from drivers.mlx5_ib.cmd import mlx5_cmd_destroy_rqt
from drivers.mlx5_ib.doorbell import mlx5_ib_db_map_user, mlx5_ib_db_unmap_user
from drivers.mlx5_ib.main import rdma_udata_to_drv_context
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas, mlx5_umem_find_best_quantized_pgoff
from drivers.mlx5_ib.mlx5_ib import (
    ilog2,
    mlx5_core_qp,
    mlx5_db,
    mlx5_ib_dev,
    order_base_2,
    to_mcq,
    to_mdev,
    to_mpd,
)
from drivers.mlx5_ib.qp_raw import mlx5_core_create_rq_tracked, mlx5_core_destroy_rq_tracked
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import mlx5_abi as abi

# enum ib_wq_flags
IB_WQ_FLAGS_CVLAN_STRIPPING, IB_WQ_FLAGS_SCATTER_FCS = 1 << 0, 1 << 1
IB_WQ_FLAGS_DELAY_DROP, IB_WQ_FLAGS_PCI_WRITE_END_PADDING = 1 << 2, 1 << 3
MLX5_IB_CREATE_WQ_STRIDING_RQ = 1 << 0
MLX5_WQ_FLAG_SIGNATURE = 1 << 0
MLX5_WQ_END_PAD_MODE_ALIGN = 1
MLX5_MODIFY_RQ_IN_MODIFY_BITMASK_VSD = 1 << 1


class mlx5_ib_rwq(ib_wq):
    """Mirrors struct mlx5_ib_rwq: a WQ, its RQ (core_qp), buffer and doorbell."""

    def __init__(self, device: object):
        super().__init__(device)
        self.core_qp = mlx5_core_qp()
        self.umem = None
        self.db = mlx5_db()
        self.buf_size = 0
        self.wqe_count = self.wqe_shift = 0
        self.log_rq_stride = self.log_rq_size = 0
        self.rq_page_offset = self.rq_num_pas = self.page_shift = self.log_page_size = 0
        self.wq_sig = False
        self.user_index = 0
        self.create_flags = 0


class mlx5_ib_rwq_ind_table(ib_rwq_ind_table):
    """Mirrors struct mlx5_ib_rwq_ind_table: the RQT and its owner's uid."""

    def __init__(self, device: object):
        super().__init__(device)
        self.rqtn = 0
        self.uid = 0


def to_mrwq(wq: ib_wq) -> mlx5_ib_rwq:
    """Mirrors to_mrwq()."""
    return wq  # type: ignore[return-value]


# -- create ---------------------------------------------------------------------------------
@traced
def set_user_rq_size(dev: mlx5_ib_dev, init_attr: ib_wq_init_attr, ucmd: abi.mlx5_ib_create_wq,
                     rwq: mlx5_ib_rwq) -> None:
    """Mirrors set_user_rq_size(): EINVAL for more WRs than log_max_wq_sz allows, no
    WQE count, or a buffer size that overflows."""
    if init_attr.max_wr > 1 << MLX5_CAP_GEN(dev.mdev, "log_max_wq_sz"):
        raise KernelError(EINVAL, f"set_user_rq_size: max_wr {init_attr.max_wr} too large")
    if not ucmd.rq_wqe_count:
        raise KernelError(EINVAL, "set_user_rq_size: no rq_wqe_count")
    rwq.wqe_count, rwq.wqe_shift = ucmd.rq_wqe_count, ucmd.rq_wqe_shift
    rwq.buf_size = rwq.wqe_count << rwq.wqe_shift
    if rwq.wqe_shift >= 32 or rwq.buf_size >= 1 << 32:     # check_shl_overflow (u32)
        raise KernelError(EINVAL, "set_user_rq_size: buffer size overflows")
    rwq.log_rq_stride = rwq.wqe_shift
    rwq.log_rq_size = ilog2(rwq.wqe_count)


@traced
def create_user_rq(dev: mlx5_ib_dev, pd: ib_pd, rwq: mlx5_ib_rwq,
                   ucmd: abi.mlx5_ib_create_wq) -> None:
    """Mirrors create_user_rq(): EINVAL without a buffer; pin it (EINVAL if no page
    size fits it), map the doorbell record; the umem is released on failure."""
    context = rdma_udata_to_drv_context(pd)
    if not ucmd.buf_addr:
        raise KernelError(EINVAL, "create_user_rq: no buffer")
    rwq.umem = ib_umem_get(pd.device, ucmd.buf_addr, rwq.buf_size, 0)
    try:
        page_size, rwq.rq_page_offset = mlx5_umem_find_best_quantized_pgoff(
            rwq.umem, "wq", "log_wq_pg_sz", MLX5_ADAPTER_PAGE_SHIFT, "page_offset", 64)
        if not page_size:
            raise KernelError(EINVAL, "create_user_rq: bad offset")
        rwq.rq_num_pas = ib_umem_num_dma_blocks(rwq.umem, page_size)
        rwq.page_shift = order_base_2(page_size)
        rwq.log_page_size = rwq.page_shift - MLX5_ADAPTER_PAGE_SHIFT
        rwq.wq_sig = bool(ucmd.flags & MLX5_WQ_FLAG_SIGNATURE)
        mlx5_ib_db_map_user(context, ucmd.db_addr, rwq.db)
    except BaseException:
        ib_umem_release(rwq.umem)
        rwq.umem = None
        raise


def destroy_user_rq(dev: mlx5_ib_dev, pd: ib_pd, rwq: mlx5_ib_rwq) -> None:
    """Mirrors destroy_user_rq(): the doorbell record, then the buffer."""
    mlx5_ib_db_unmap_user(rdma_udata_to_drv_context(pd), rwq.db)
    ib_umem_release(rwq.umem)
    rwq.umem = None


@traced
def prepare_user_rq(pd: ib_pd, init_attr: ib_wq_init_attr, udata: ib_udata,
                    rwq: mlx5_ib_rwq) -> None:
    """Mirrors prepare_user_rq(): the driver request, the RQ's size, its memory."""
    dev = to_mdev(pd.device)
    required = abi.mlx5_ib_create_wq.offsetof("single_stride_log_num_of_bytes") + 4
    if udata.inlen < required:
        raise KernelError(EINVAL, f"prepare_user_rq: invalid inlen {udata.inlen}")
    size = abi.mlx5_ib_create_wq.SIZE
    if udata.inlen > size and not ib_is_udata_cleared(udata, size, udata.inlen - size):
        raise KernelError(EOPNOTSUPP, "prepare_user_rq: inlen is not supported")
    ucmd = ib_copy_from_udata(abi.mlx5_ib_create_wq, udata, min(size, udata.inlen))
    if ucmd.comp_mask & ~MLX5_IB_CREATE_WQ_STRIDING_RQ:
        raise KernelError(EOPNOTSUPP, f"prepare_user_rq: invalid comp mask {ucmd.comp_mask:#x}")
    if ucmd.comp_mask & MLX5_IB_CREATE_WQ_STRIDING_RQ:   # EMU: striding RQs not modelled
        raise KernelError(EOPNOTSUPP, "prepare_user_rq: striding RQs are not modelled")
    set_user_rq_size(dev, init_attr, ucmd, rwq)
    create_user_rq(dev, pd, rwq, ucmd)
    rwq.user_index = ucmd.user_index


@traced
def create_rq(rwq: mlx5_ib_rwq, pd: ib_pd, init_attr: ib_wq_init_attr) -> None:
    """Mirrors create_rq(): CREATE_RQ in RST - inline memory, the user index, the CQ,
    flush in error, a cyclic WQ of the library's stride and size on the pinned pages
    and the doorbell record; VLANs stripped unless CVLAN_STRIPPING keeps them;
    EOPNOTSUPP for a flag the device cannot do."""
    dev = to_mdev(pd.device)
    mdev = dev.mdev
    flags = init_attr.create_flags
    in_ = IfcStruct("create_rq_in", pas=rwq.rq_num_pas)
    MLX5_SET("create_rq_in", in_, "uid", to_mpd(pd).uid)
    rqc = MLX5_ADDR_OF("create_rq_in", in_, "ctx")
    MLX5_SET("rqc", rqc, "mem_rq_type", MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE)
    MLX5_SET("rqc", rqc, "user_index", rwq.user_index)
    MLX5_SET("rqc", rqc, "cqn", to_mcq(init_attr.cq).mcq.cqn)
    MLX5_SET("rqc", rqc, "state", MLX5_RQC_STATE_RST)
    MLX5_SET("rqc", rqc, "flush_in_error_en", 1)
    MLX5_SET("rqc", rqc, "ts_format", MLX5_CAP_GEN(mdev, "rq_ts_format") and 1)
    wq = MLX5_ADDR_OF("rqc", rqc, "wq")
    MLX5_SET("wq", wq, "wq_type", MLX5_WQ_TYPE_CYCLIC)
    if flags & IB_WQ_FLAGS_PCI_WRITE_END_PADDING:
        if not MLX5_CAP_GEN(mdev, "end_pad"):
            raise KernelError(EOPNOTSUPP, "create_rq: Scatter end padding is not supported")
        MLX5_SET("wq", wq, "end_padding_mode", MLX5_WQ_END_PAD_MODE_ALIGN)
    MLX5_SET("wq", wq, "log_wq_stride", rwq.log_rq_stride)
    MLX5_SET("wq", wq, "log_wq_sz", rwq.log_rq_size)
    MLX5_SET("wq", wq, "pd", to_mpd(pd).pdn)
    MLX5_SET("wq", wq, "page_offset", rwq.rq_page_offset)
    MLX5_SET("wq", wq, "log_wq_pg_sz", rwq.log_page_size)
    MLX5_SET("wq", wq, "wq_signature", int(rwq.wq_sig))
    MLX5_SET64("wq", wq, "dbr_addr", rwq.db.dma)
    offloads = bool(MLX5_CAP_GEN(mdev, "eth_net_offloads"))
    if flags & IB_WQ_FLAGS_CVLAN_STRIPPING:
        if not (offloads and MLX5_CAP_ETH(mdev, "vlan_cap")):
            raise KernelError(EOPNOTSUPP, "create_rq: VLAN offloads are not supported")
    else:
        MLX5_SET("rqc", rqc, "vsd", 1)
    if flags & IB_WQ_FLAGS_SCATTER_FCS:
        if not (offloads and MLX5_CAP_ETH(mdev, "scatter_fcs")):
            raise KernelError(EOPNOTSUPP, "create_rq: Scatter FCS is not supported")
        MLX5_SET("rqc", rqc, "scatter_fcs", 1)
    if flags & IB_WQ_FLAGS_DELAY_DROP:               # EMU: delay drop is not modelled
        raise KernelError(EOPNOTSUPP, "create_rq: delay drop is not modelled")
    mlx5_ib_populate_pas(rwq.umem, 1 << rwq.page_shift,
                         MLX5_ADDR_OF("create_rq_in", in_, "pas"), 0)
    mlx5_core_create_rq_tracked(dev, in_, rwq.core_qp)


@traced
def mlx5_ib_create_wq(pd: ib_pd, init_attr: ib_wq_init_attr, udata: ib_udata) -> ib_wq:
    """Mirrors mlx5_ib_create_wq(): EINVAL for a response buffer too short or a WQ type
    other than RQ; prepare_user_rq, create_rq; the response's length; each step undone
    on failure."""
    dev = to_mdev(pd.device)
    min_resp_len = abi.mlx5_ib_create_wq_resp.SIZE
    if udata.outlen and udata.outlen < min_resp_len:
        raise KernelError(EINVAL, f"mlx5_ib_create_wq: response of {udata.outlen} bytes")
    if init_attr.wq_type != IB_WQT_RQ:
        raise KernelError(EINVAL, f"mlx5_ib_create_wq: unsupported wq type {init_attr.wq_type}")
    rwq = mlx5_ib_rwq(pd.device)
    rwq.pd = pd
    prepare_user_rq(pd, init_attr, udata, rwq)
    try:
        create_rq(rwq, pd, init_attr)
    except BaseException:
        destroy_user_rq(dev, pd, rwq)                                   # err_user_rq:
        raise
    rwq.wq_num = rwq.core_qp.qpn
    rwq.state = IB_WQS_RESET
    if udata.outlen:
        resp = abi.mlx5_ib_create_wq_resp(response_length=4)   # offsetofend(response_length)
        try:
            ib_copy_to_udata(udata, resp.pack(), resp.response_length)
        except BaseException:
            mlx5_core_destroy_rq_tracked(dev, rwq.core_qp)              # err_copy:
            destroy_user_rq(dev, pd, rwq)
            raise
    rwq.event_handler = init_attr.event_handler
    return rwq


@traced
def mlx5_ib_destroy_wq(wq: ib_wq, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_destroy_wq(): DESTROY_RQ, then the doorbell and buffer."""
    dev, rwq = to_mdev(wq.device), to_mrwq(wq)
    mlx5_core_destroy_rq_tracked(dev, rwq.core_qp)
    destroy_user_rq(dev, wq.pd, rwq)


@traced
def mlx5_ib_modify_wq(wq: ib_wq, wq_attr: ib_wq_attr, wq_attr_mask: int,
                      udata: ib_udata) -> None:
    """Mirrors mlx5_ib_modify_wq(): the request (EINVAL short; EOPNOTSUPP for trailing
    bytes, a comp_mask or reserved bits); MODIFY_RQ from curr_wq_state to wq_state
    (IB_WQS_ERR is the RQ's ERR); IB_WQ_FLAGS may switch VLAN stripping (EOPNOTSUPP
    without the offload) but not end padding (EOPNOTSUPP).  The WQ's state moves only
    once the firmware agreed."""
    dev, rwq = to_mdev(wq.device), to_mrwq(wq)
    mdev = dev.mdev
    required = abi.mlx5_ib_modify_wq.SIZE
    if udata.inlen < required:
        raise KernelError(EINVAL, f"mlx5_ib_modify_wq: invalid inlen {udata.inlen}")
    if udata.inlen > required and not ib_is_udata_cleared(udata, required,
                                                          udata.inlen - required):
        raise KernelError(EOPNOTSUPP, "mlx5_ib_modify_wq: inlen is not supported")
    ucmd = ib_copy_from_udata(abi.mlx5_ib_modify_wq, udata, required)
    if ucmd.comp_mask or ucmd.reserved:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_modify_wq: comp_mask or reserved set")
    in_ = IfcStruct("modify_rq_in")
    rqc = MLX5_ADDR_OF("modify_rq_in", in_, "ctx")
    curr = MLX5_RQC_STATE_ERR if wq_attr.curr_wq_state == IB_WQS_ERR else \
        wq_attr.curr_wq_state
    new = MLX5_RQC_STATE_ERR if wq_attr.wq_state == IB_WQS_ERR else wq_attr.wq_state
    MLX5_SET("modify_rq_in", in_, "rq_state", curr)
    MLX5_SET("modify_rq_in", in_, "uid", to_mpd(wq.pd).uid)
    MLX5_SET("rqc", rqc, "state", new)
    if wq_attr_mask & IB_WQ_FLAGS:
        if wq_attr.flags_mask & IB_WQ_FLAGS_CVLAN_STRIPPING:
            if not (MLX5_CAP_GEN(mdev, "eth_net_offloads") and MLX5_CAP_ETH(mdev, "vlan_cap")):
                raise KernelError(EOPNOTSUPP, "mlx5_ib_modify_wq: VLAN offloads are not "
                                  "supported")
            MLX5_SET64("modify_rq_in", in_, "modify_bitmask",
                       MLX5_MODIFY_RQ_IN_MODIFY_BITMASK_VSD)
            MLX5_SET("rqc", rqc, "vsd",
                     0 if wq_attr.flags & IB_WQ_FLAGS_CVLAN_STRIPPING else 1)
        if wq_attr.flags_mask & IB_WQ_FLAGS_PCI_WRITE_END_PADDING:
            raise KernelError(EOPNOTSUPP, "mlx5_ib_modify_wq: Modifying scatter end "
                              "padding is not supported")
    mlx5_core_modify_rq(mdev, rwq.core_qp.qpn, in_)
    rwq.state = IB_WQS_ERR if new == MLX5_RQC_STATE_ERR else new


# -- the indirection table ----------------------------------------------------------------
@traced
def mlx5_ib_create_rwq_ind_table(ib_rwq_ind_tbl: ib_rwq_ind_table,
                                 init_attr: ib_rwq_ind_table_init_attr,
                                 udata: ib_udata) -> None:
    """Mirrors mlx5_ib_create_rwq_ind_table(): EOPNOTSUPP for a driver request that is
    not all zero; EINVAL for a table past log_max_rqt_size or a response buffer too
    short; CREATE_RQT of the WQs' numbers, with the first WQ's PD's uid."""
    tbl: mlx5_ib_rwq_ind_table = ib_rwq_ind_tbl  # type: ignore[assignment]
    dev = to_mdev(tbl.device)
    if udata.inlen > 0 and not ib_is_udata_cleared(udata, 0, udata.inlen):
        raise KernelError(EOPNOTSUPP, "mlx5_ib_create_rwq_ind_table: driver request set")
    if init_attr.log_ind_tbl_size > MLX5_CAP_GEN(dev.mdev, "log_max_rqt_size"):
        raise KernelError(EINVAL, f"mlx5_ib_create_rwq_ind_table: log_ind_tbl_size = "
                          f"{init_attr.log_ind_tbl_size} is bigger than supported = "
                          f"{MLX5_CAP_GEN(dev.mdev, 'log_max_rqt_size')}")
    if udata.outlen and udata.outlen < abi.mlx5_ib_create_rwq_ind_tbl_resp.SIZE:
        raise KernelError(EINVAL, f"mlx5_ib_create_rwq_ind_table: response of "
                          f"{udata.outlen} bytes")
    sz = 1 << init_attr.log_ind_tbl_size
    in_ = IfcStruct("create_rqt_in", rq_num=sz)
    rqtc = MLX5_ADDR_OF("create_rqt_in", in_, "rqt_context")
    MLX5_SET("rqtc", rqtc, "rqt_actual_size", sz)
    MLX5_SET("rqtc", rqtc, "rqt_max_size", sz)
    rq_num = MLX5_ADDR_OF("create_rqt_in", in_, "rq_num")
    for i, wq in enumerate(init_attr.ind_tbl):
        rq_num[i] = wq.wq_num
    tbl.uid = to_mpd(init_attr.ind_tbl[0].pd).uid
    MLX5_SET("create_rqt_in", in_, "uid", tbl.uid)
    tbl.rqtn = mlx5_core_create_rqt(dev.mdev, in_)
    tbl.ind_tbl_num = tbl.rqtn
    if udata.outlen:
        resp = abi.mlx5_ib_create_rwq_ind_tbl_resp(response_length=4)
        try:
            ib_copy_to_udata(udata, resp.pack(), resp.response_length)
        except BaseException:
            mlx5_cmd_destroy_rqt(dev.mdev, tbl.rqtn, tbl.uid)           # err_copy:
            raise


@traced
def mlx5_ib_destroy_rwq_ind_table(ib_rwq_ind_tbl: ib_rwq_ind_table) -> None:
    """Mirrors mlx5_ib_destroy_rwq_ind_table(): DESTROY_RQT with the owner's uid."""
    tbl: mlx5_ib_rwq_ind_table = ib_rwq_ind_tbl  # type: ignore[assignment]
    mlx5_cmd_destroy_rqt(to_mdev(tbl.device).mdev, tbl.rqtn, tbl.uid)

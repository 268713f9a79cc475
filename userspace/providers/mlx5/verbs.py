"""Mirrors rdma-core providers/mlx5/verbs.c: PD, MR, CQ and QP creation in libmlx5.

The provider's half of each verb: it sizes and allocates the memory the
HCA will read and write (CQ buffer, QP work-queue buffer, doorbell records -
all in the process's own memory), passes their addresses to the kernel in
the driver udata, and keeps what the kernel answers (CQN, QPN, the bfreg
the QP rings).  `mlx5_ctx_ops` is the table libibverbs dispatches through.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
    MLX5_QP_FLAG_SIGNATURE,
    MLX5_QP_FLAG_UAR_PAGE_INDEX,
    mlx5_ib_alloc_pd_resp,
    mlx5_ib_create_cq,
    mlx5_ib_create_cq_resp,
    mlx5_ib_create_qp,
    mlx5_ib_create_qp_resp,
)
from userspace.libc import free, posix_memalign
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cint import s32, u32
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.driver import verbs_context_ops, verbs_register_driver
from userspace.libibverbs.verbs_types import (
    IBV_QP_STATE,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    ibv_cq,
    ibv_mr,
    ibv_pd,
    ibv_qp,
    ibv_qp_attr,
    ibv_qp_init_attr,
)
from userspace.providers.mlx5 import env as mlx5_env
from userspace.providers.mlx5.cq import mlx5_cq_clean, mlx5_poll_cq
from userspace.providers.mlx5.dbrec import mlx5_alloc_dbrec, mlx5_free_db
from userspace.providers.mlx5.mlx5 import (
    MLX5_VENDOR_ID,
    mlx5_alloc_context,
    mlx5_context,
    mlx5_free_context,
)
from userspace.providers.mlx5.qp import mlx5_init_qp_indices, mlx5_post_recv, mlx5_post_send
from userspace.providers.mlx5.uar import (
    bf_for_bfreg_index,
    mlx5_bf,
    mlx5_get_qp_uar,
    mlx5_put_qp_uar,
)
from userspace.providers.mlx5.wqsize import (
    create_qp_buf_sizes,
    mlx5_calc_wq_size,
    mlx5_wq,
    roundup_pow_of_two,
)

MLX5_CQE_INVALID = 0xF
MLX5_CQE_OWNER_MASK = 1
MLX5_UIDX_DEFAULT = 0xFFFFFF
MLX5_MAX_CQE = 1 << 22  # what rdma-core checks before the kernel sees it
MLX5_WQE_CTRL_CQ_UPDATE = 2 << 2
_CAP_FIELDS = ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data")


@attrs.define(eq=False)
class mlx5_pd(ibv_pd):
    pdn: int = 0


@attrs.define(eq=False)
class mlx5_cq(ibv_cq):
    cqn: int = 0
    buf: int = 0
    buf_size: int = 0
    cqe_sz: int = 64
    dbrec: int = 0
    cons_index: int = 0   # CQEs consumed (poll_cq); the HCA learns it from the dbrec


@attrs.define(eq=False)
class mlx5_qp(ibv_qp):
    """Mirrors struct mlx5_qp: the buffers, doorbell record, bf and queue geometry."""

    sq: mlx5_wq = attrs.Factory(mlx5_wq)
    rq: mlx5_wq = attrs.Factory(mlx5_wq)
    buf: int = 0
    buf_size: int = 0
    db: int = 0
    bf: mlx5_bf | None = None
    uidx: int = MLX5_UIDX_DEFAULT
    wq_sig: bool = False
    flags: int = 0
    dc_type: int = 0
    max_inline_data: int = 0
    max_tso_header: int = 0
    sq_signal_bits: int = 0   # MLX5_WQE_CTRL_CQ_UPDATE when created with sq_sig_all
    fm_cache: int = 0         # the fence carried to the next WQE


@attrs.define(eq=False)
class _InitAttrEx:
    """The ibv_qp_init_attr_ex fields create_qp reads (mlx5_create_qp's attrx).

    rdma-core copies ibv_qp_init_attr into an ibv_qp_init_attr_ex and back;
    here `cap` is the caller's own ibv_qp_cap, so what create_qp writes to it
    (max_inline_data, the WR counts) reaches the caller without the copy back.
    """

    qp_type: int
    cap: Any
    srq: Any = None
    comp_mask: int = 0
    send_ops_flags: int = 0
    max_tso_header: int = 0
    pd: Any = None
    send_cq: Any = None
    recv_cq: Any = None
    sq_sig_all: int = 0


def _to_mctx(ctx) -> mlx5_context:
    return ctx


# -- port, PD, MR ---------------------------------------------------------------------
def mlx5_query_port(ctx, port: int):
    """Mirrors mlx5_query_port(): ibv_cmd_query_port."""
    return c.ibv_cmd_query_port(ctx, port)


@traced
def mlx5_alloc_pd(ctx) -> mlx5_pd:
    """Mirrors mlx5_alloc_pd(): ALLOC_PD; keeps the PDN the kernel returns."""
    resp, drv = c.ibv_cmd_alloc_pd(ctx, mlx5_ib_alloc_pd_resp)
    return mlx5_pd(ctx, resp.pd_handle, pdn=drv.pdn)


@traced
def mlx5_free_pd(pd: mlx5_pd) -> None:
    """Mirrors mlx5_free_pd()."""
    c.ibv_cmd_dealloc_pd(pd.context, pd.handle)


@traced
def mlx5_reg_mr(pd: ibv_pd, addr: int, length: int, hca_va: int, access: int) -> ibv_mr:
    """Mirrors mlx5_reg_mr(): REG_MR, nothing provider-private."""
    resp = c.ibv_cmd_reg_mr(pd.context, pd.handle, addr, length, hca_va, access)
    return ibv_mr(pd.context, pd, addr, length, resp.mr_handle, resp.lkey, resp.rkey)


@traced
def mlx5_dereg_mr(mr: ibv_mr) -> None:
    """Mirrors mlx5_dereg_mr()."""
    c.ibv_cmd_dereg_mr(mr.context, mr.handle)


# -- CQ -----------------------------------------------------------------------------
def _init_cq_buf(proc, buf: int, ncqe: int, cqe_sz: int) -> None:
    """Mirrors mlx5_alloc_cq_buf's init: every CQE invalid, owned by hardware."""
    op_own = bytes([MLX5_CQE_INVALID << 4 | MLX5_CQE_OWNER_MASK])
    cqe = bytes(cqe_sz - 1) + op_own
    proc.store(buf, cqe * ncqe)


@traced
def mlx5_create_cq(ctx, cqe: int, comp_vector: int = 0) -> mlx5_cq:
    """Mirrors create_cq(): a power-of-two ring of 64-byte CQEs, a doorbell
    record, and CREATE_CQ with both addresses (+ the NC UAR when there is one)."""
    mctx = _to_mctx(ctx)
    proc = mctx.proc
    cqe, comp_vector = s32(cqe), s32(comp_vector)   # both ints in mlx5_create_cq()
    if cqe <= 0 or cqe > MLX5_MAX_CQE:
        raise VerbsError(errno.EINVAL, f"mlx5_create_cq: cqe {cqe}")
    ncqe = roundup_pow_of_two(cqe + 1)  # align_queue_size()
    cqe_sz = 64
    size = ncqe * cqe_sz
    buf = posix_memalign(proc, mctx.page_size, size)
    try:
        _init_cq_buf(proc, buf, ncqe, cqe_sz)
        db = mlx5_alloc_dbrec(mctx)
        try:
            proc.store(db, bytes(8))  # cq->dbrec[MLX5_CQ_SET_CI] = [MLX5_CQ_ARM_DB] = 0
            drv = mlx5_ib_create_cq(buf_addr=buf, db_addr=db, cqe_size=cqe_sz)
            if mctx.nc_uar is not None:
                drv.flags |= MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX
                drv.uar_page_index = mctx.nc_uar.page_id
            resp, dresp = c.ibv_cmd_create_cq(ctx, ncqe - 1, comp_vector, drv,
                                              mlx5_ib_create_cq_resp)
        except BaseException:
            mlx5_free_db(mctx, db)
            raise
    except BaseException:
        free(proc, buf, size)
        raise
    return mlx5_cq(ctx, resp.cq_handle, resp.cqe, cqn=dresp.cqn, buf=buf, buf_size=size,
                   cqe_sz=cqe_sz, dbrec=db)


@traced
def mlx5_destroy_cq(cq: mlx5_cq) -> None:
    """Mirrors mlx5_destroy_cq(): DESTROY_CQ, then free the record and buffer."""
    c.ibv_cmd_destroy_cq(cq.context, cq.handle)
    mlx5_free_db(cq.context, cq.dbrec)
    free(cq.context.proc, cq.buf, cq.buf_size)


# -- QP -----------------------------------------------------------------------------
def _alloc_uidx(mctx: mlx5_context, qp: mlx5_qp) -> int:
    """mlx5_store_uidx(): the lowest free user index (cqe_version 1), naming
    the QP so poll_cq can find it from a CQE's srqn_uidx."""
    if mctx.cqe_version == 0:
        return MLX5_UIDX_DEFAULT
    i = 0
    while i in mctx.uidx_table:
        i += 1
    mctx.uidx_table[i] = qp
    return i


@traced
def mlx5_create_qp(pd: mlx5_pd, attr: ibv_qp_init_attr) -> mlx5_qp:
    """Mirrors mlx5_create_qp(), the ibv_create_qp op: attr as an
    ibv_qp_init_attr_ex (attrx, with the PD), then create_qp(context, &attrx, NULL)."""
    attrx = _InitAttrEx(attr.qp_type, attr.cap, attr.srq, pd=pd, send_cq=attr.send_cq,
                        recv_cq=attr.recv_cq, sq_sig_all=attr.sq_sig_all)
    return create_qp(pd.context, attrx)


@traced
def create_qp(context: mlx5_context, attr: _InitAttrEx, mlx5_qp_attr: Any = None) -> mlx5_qp:
    """Mirrors create_qp() (static in verbs.c): size the queues, allocate the
    buffer (RQ first, then SQ) and the doorbell record, choose the UAR,
    CREATE_QP (ibv_cmd_create_qp_ex), then map_uuar."""
    mctx = _to_mctx(context)
    proc = mctx.proc
    pd = attr.pd
    cap = attr.cap
    for name in _CAP_FIELDS:  # struct ibv_qp_cap holds uint32_t: what C would have stored
        setattr(cap, name, u32(getattr(cap, name)))
    qp = mlx5_qp(context, pd, attr.send_cq, attr.recv_cq, 0, 0, attr.qp_type,
                 wq_sig=mlx5_env.qp_sig_enabled(proc.environ))
    qp.sq_signal_bits = MLX5_WQE_CTRL_CQ_UPDATE if attr.sq_sig_all else 0
    wq_size = mlx5_calc_wq_size(mctx, attr, qp, mlx5_qp_attr)
    buf_size, _sq_buf_size = create_qp_buf_sizes(qp, attr.qp_type, wq_size)
    undo = []
    bf = None
    try:
        mlx5_alloc_qp_buf(mctx, attr, qp, buf_size)
        undo.append(lambda: free(proc, qp.buf, qp.buf_size))
        qp.db = mlx5_alloc_dbrec(mctx)
        undo.append(lambda: mlx5_free_db(mctx, qp.db))
        proc.store(qp.db, bytes(8))  # db[MLX5_RCV_DBR] = db[MLX5_SND_DBR] = 0
        qp.uidx = _alloc_uidx(mctx, qp)
        undo.append(lambda: mctx.uidx_table.pop(qp.uidx, None))
        drv = mlx5_ib_create_qp(buf_addr=qp.buf, db_addr=qp.db, sq_wqe_count=qp.sq.wqe_cnt,
                                rq_wqe_count=qp.rq.wqe_cnt, rq_wqe_shift=qp.rq.wqe_shift,
                                uidx=qp.uidx, ece_options=0)
        if qp.wq_sig:  # create_qp(): the kernel sizes the RQ and sets the QPC by this flag
            drv.flags |= MLX5_QP_FLAG_SIGNATURE
        if not mctx.bfs:  # dynamic UARs: the library picks the register
            qp.bf = bf = mlx5_get_qp_uar(mctx)
            undo.append(lambda: mlx5_put_qp_uar(mctx, bf))
            if bf is not None:
                drv.bfreg_index = bf.page_id
                drv.flags |= MLX5_QP_FLAG_UAR_PAGE_INDEX
        req = uv.ib_uverbs_create_qp(
            pd_handle=pd.handle, send_cq_handle=attr.send_cq.handle if attr.send_cq else 0,
            recv_cq_handle=attr.recv_cq.handle if attr.recv_cq else 0,
            max_send_wr=cap.max_send_wr, max_recv_wr=cap.max_recv_wr,
            max_send_sge=cap.max_send_sge, max_recv_sge=cap.max_recv_sge,
            max_inline_data=cap.max_inline_data, sq_sig_all=attr.sq_sig_all,
            qp_type=attr.qp_type)
        resp, dresp = c.ibv_cmd_create_qp_ex(context, req, drv, mlx5_ib_create_qp_resp)
    except BaseException:
        for fn in reversed(undo):
            fn()
        raise
    qp.handle, qp.qp_num = resp.qp_handle, resp.qpn
    map_uuar(mctx, qp, dresp.bfreg_index, bf)
    cap.max_send_wr, cap.max_recv_wr = qp.sq.max_post, qp.rq.max_post
    cap.max_recv_sge = u32(qp.rq.max_gs)
    return qp


@traced
def mlx5_alloc_qp_buf(context: mlx5_context, attr: _InitAttrEx, qp: mlx5_qp, size: int) -> None:
    """Mirrors mlx5_alloc_qp_buf(): the wrid / wqe_head / wr_data arrays of each
    queue, then the WQE buffer - `size` bytes rounded up to whole pages,
    page-aligned, in the process's own memory (zeroed, as anonymous pages are).

    # EMU: only the anonymous allocation: no huge pages (MLX5_QP_HUGE), custom
    # allocators or dma-buf; a RAW packet QP's separate SQ buffer is not allocated.
    """
    qp.buf_size = -(-size // context.page_size) * context.page_size
    for wq in (qp.sq, qp.rq):
        wq.wrid, wq.wqe_head, wq.wr_data = [0] * wq.wqe_cnt, [0] * wq.wqe_cnt, [0] * wq.wqe_cnt
    qp.buf = posix_memalign(context.proc, context.page_size, qp.buf_size)


@traced
def map_uuar(context: mlx5_context, qp: mlx5_qp, uuar_index: int,
             dyn_bf: mlx5_bf | None) -> None:
    """Mirrors map_uuar(): the register the QP rings - the dynamic UAR the
    library chose before CREATE_QP, or bfs[uuar_index], the bfreg the kernel
    answered with (static UARs mapped at open)."""
    if dyn_bf is None and context.bfs:
        qp.bf = bf_for_bfreg_index(context.bfs, uuar_index)
    else:
        qp.bf = dyn_bf


@traced
def mlx5_destroy_qp(qp: mlx5_qp) -> None:
    """Mirrors mlx5_destroy_qp(): DESTROY_QP; the CQs lose the QP's unpolled
    completions (__mlx5_cq_clean on the receive, then the send CQ), so a later QP
    given the same user index or QPN never sees them; then give back the UAR, the
    user index, the doorbell record and the buffer."""
    mctx = _to_mctx(qp.context)
    c.ibv_cmd_destroy_qp(mctx, qp.handle)
    rsn = qp.uidx if mctx.cqe_version else qp.qp_num
    mlx5_cq_clean(qp.recv_cq, rsn)
    if qp.send_cq is not qp.recv_cq:
        mlx5_cq_clean(qp.send_cq, rsn)
    if not mctx.bfs:
        mlx5_put_qp_uar(mctx, qp.bf)
    mctx.uidx_table.pop(qp.uidx, None)
    mlx5_free_db(mctx, qp.db)
    free(mctx.proc, qp.buf, qp.buf_size)


#: the states in which each queue may post (rdma-core sets qp_state_max_gs by them)
_SQ_POSTS = (IBV_QPS_RTS,)
_RQ_POSTS = (IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE)


@traced
def mlx5_modify_qp(qp: mlx5_qp, attr: ibv_qp_attr, attr_mask: int) -> None:
    """Mirrors mlx5_modify_qp(): MODIFY_QP (ibv_cmd_modify_qp).  On a state change
    the queues learn whether they may post (qp_state_max_gs); on a move to RESET
    the CQs lose the QP's unpolled completions (mlx5_cq_clean, by user index or
    QPN), the queues start over empty and the doorbell record is zeroed."""
    mctx = _to_mctx(qp.context)
    c.ibv_cmd_modify_qp(qp, attr, attr_mask)
    if not attr_mask & IBV_QP_STATE:
        return
    state = attr.qp_state
    qp.sq.qp_state_max_gs = qp.sq.max_gs if state in _SQ_POSTS else -1
    qp.rq.qp_state_max_gs = qp.rq.max_gs if state in _RQ_POSTS else -1
    if state == IBV_QPS_RESET:
        rsn = qp.uidx if mctx.cqe_version else qp.qp_num
        if qp.recv_cq is not None:
            mlx5_cq_clean(qp.recv_cq, rsn)
        if qp.send_cq is not qp.recv_cq and qp.send_cq is not None:
            mlx5_cq_clean(qp.send_cq, rsn)
        mlx5_init_qp_indices(qp)
        mctx.proc.store(qp.db, bytes(8))  # db[MLX5_RCV_DBR] = db[MLX5_SND_DBR] = 0


@traced
def mlx5_query_qp(qp: mlx5_qp, attr: ibv_qp_attr, attr_mask: int,
                  init_attr: ibv_qp_init_attr) -> None:
    """Mirrors mlx5_query_qp(): QUERY_QP, then the send queue's sizes, which only
    the library knows (the kernel reports none for a user QP)."""
    c.ibv_cmd_query_qp(qp, attr, attr_mask, init_attr)
    init_attr.cap.max_send_wr = qp.sq.max_post
    init_attr.cap.max_send_sge = qp.sq.max_gs
    init_attr.cap.max_inline_data = qp.max_inline_data
    attr.cap = attrs.evolve(init_attr.cap)


def read_dbrec(qp: mlx5_qp) -> tuple[int, int]:
    """The doorbell record's (receive, send) counters, as the HCA reads them (big-endian)."""
    return struct.unpack(">II", qp.context.proc.load(qp.db, 8))


mlx5_ctx_ops = verbs_context_ops(
    alloc_context=mlx5_alloc_context, free_context=mlx5_free_context,
    query_port=mlx5_query_port, alloc_pd=mlx5_alloc_pd, dealloc_pd=mlx5_free_pd,
    reg_mr=mlx5_reg_mr, dereg_mr=mlx5_dereg_mr, create_cq=mlx5_create_cq,
    destroy_cq=mlx5_destroy_cq, create_qp=mlx5_create_qp, modify_qp=mlx5_modify_qp,
    query_qp=mlx5_query_qp, destroy_qp=mlx5_destroy_qp,
    post_send=mlx5_post_send, post_recv=mlx5_post_recv, poll_cq=mlx5_poll_cq)

# PROVIDER_DRIVER(mlx5, mlx5_dev_ops): loading the provider offers it for the vendor's
# devices (its hca_table); libibverbs finds it through that table, never by name
verbs_register_driver(MLX5_VENDOR_ID, mlx5_ctx_ops)

"""Mirrors rdma-core providers/mlx5/verbs.c: receive work queues (mlx5_create_wq,
mlx5_modify_wq, mlx5_destroy_wq) and RSS indirection tables (mlx5_create_rwq_ind_table,
mlx5_destroy_rwq_ind_table).

A WQ is sized like an SRQ's ring (mlx5_calc_rwq_size: one 16-byte data segment per
SGE, a power of two, at least one 64-byte block in all), allocated in the process's
memory with a doorbell record and a user index, then created by CREATE_WQ with the
buffer, record, WQE count and stride in the driver request.  Moving a WQ from RESET
to ready cleans its CQ of the WQ's old completions and starts its indices and
record over.

# EMU: striding RQs (mlx5dv_create_wq) are not modelled, and receives are not posted
# to a WQ (the model's device delivers no packets to it).
"""

from __future__ import annotations

import errno
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import (
    mlx5_ib_create_rwq_ind_tbl_resp,
    mlx5_ib_create_wq,
    mlx5_ib_create_wq_resp,
    mlx5_ib_modify_wq,
)
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.wq import (
    IBV_WQ_ATTR_CURR_STATE,
    IBV_WQ_ATTR_STATE,
    IBV_WQS_RDY,
    IBV_WQS_RESET,
    IBV_WQT_RQ,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_wq,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_wq,
    ibv_cmd_modify_wq,
    ibv_rwq_ind_table,
    ibv_rwq_ind_table_init_attr,
    ibv_wq,
    ibv_wq_attr,
    ibv_wq_init_attr,
)
from userspace.providers.mlx5.buf import (
    MLX5DV_RES_TYPE_RWQ,
    mlx5_alloc_dbrec_pd,
    mlx5_alloc_prefered_buf,
    mlx5_free_actual_buf,
    mlx5_free_db_pd,
)
from userspace.providers.mlx5.cq import mlx5_cq_clean
from userspace.providers.mlx5.wqsize import ilog32, roundup_pow_of_two

MLX5_SEND_WQE_BB = 64
MLX5_WQE_DATA_SEG_SIZE = 16
MLX5_RWQE_SIG_SIZE = 16            # sizeof(struct mlx5_rwqe_sig)
MLX5_WQ_FLAG_SIGNATURE = 1 << 0
MLX5_RCV_DBR, MLX5_SND_DBR = 0, 1


@attrs.define
class mlx5_rwq_rq:
    """The receive ring of a WQ (struct mlx5_wq, the part a WQ uses)."""

    wqe_cnt: int = 0
    wqe_shift: int = 0
    max_post: int = 0
    max_gs: int = 0
    offset: int = 0
    head: int = 0
    tail: int = 0


@attrs.define(eq=False)
class mlx5_rwq(ibv_wq):
    """Mirrors struct mlx5_rwq: the ibv_wq, its ring, buffer, doorbell record and
    user index (rsc.rsn)."""

    rq: mlx5_rwq_rq = attrs.Factory(mlx5_rwq_rq)
    buf: int = 0
    buf_size: int = 0
    buf_type: int = 0
    db: int = 0
    custom_db: bool = False
    wq_sig: bool = False
    rsn: int = 0


def mlx5_calc_rwq_size(ctx: Any, rwq: mlx5_rwq, attr: ibv_wq_init_attr) -> int:
    """Mirrors mlx5_calc_rwq_size(): the ring's bytes; -EINVAL for no WRs or a WQE
    larger than max_rq_desc_sz."""
    if not attr.max_wr:
        return -errno.EINVAL
    num_scatter = max(attr.max_sge, 1)
    wqe_size = MLX5_WQE_DATA_SEG_SIZE * num_scatter
    if rwq.wq_sig:
        wqe_size += MLX5_RWQE_SIG_SIZE
    if wqe_size <= 0 or wqe_size > ctx.max_rq_desc_sz:
        return -errno.EINVAL
    wqe_size = roundup_pow_of_two(wqe_size)
    wq_size = max(roundup_pow_of_two(attr.max_wr) * wqe_size, MLX5_SEND_WQE_BB)
    rwq.rq.wqe_cnt = wq_size // wqe_size
    rwq.rq.wqe_shift = ilog32(wqe_size - 1)
    rwq.rq.max_post = 1 << ilog32(wq_size // wqe_size - 1)
    scat_spc = wqe_size - (MLX5_RWQE_SIG_SIZE if rwq.wq_sig else 0)
    rwq.rq.max_gs = scat_spc // MLX5_WQE_DATA_SEG_SIZE
    return wq_size


def mlx5_init_rwq_indices(rwq: mlx5_rwq) -> None:
    """Mirrors mlx5_init_rwq_indices()."""
    rwq.rq.head = rwq.rq.tail = 0


def _store_uidx(mctx: Any, rwq: mlx5_rwq) -> int:
    """mlx5_store_uidx(): the lowest free user index, naming the WQ."""
    i = 0
    while i in mctx.uidx_table:
        i += 1
    mctx.uidx_table[i] = rwq
    return i


@traced
def mlx5_create_wq(context: Any, attr: ibv_wq_init_attr) -> mlx5_rwq:
    """Mirrors mlx5_create_wq() -> create_wq(): EOPNOTSUPP for a WQ type other than RQ;
    size, buffer, doorbell record, user index, CREATE_WQ; each undone on failure."""
    mctx = context
    proc = mctx.proc
    if attr.wq_type != IBV_WQT_RQ:
        raise VerbsError(errno.EOPNOTSUPP, f"mlx5_create_wq: WQ type {attr.wq_type}")
    rwq = mlx5_rwq(context=context)
    rwq.wq_sig = "MLX5_RWQ_SIGNATURE" in proc.environ          # rwq_sig_enabled()
    drv = mlx5_ib_create_wq()
    if rwq.wq_sig:
        drv.flags = MLX5_WQ_FLAG_SIGNATURE
    ret = mlx5_calc_rwq_size(mctx, rwq, attr)
    if ret < 0:
        raise VerbsError(-ret, "mlx5_create_wq: mlx5_calc_rwq_size")
    undo: list = []
    try:
        rwq.buf_size = -(-ret // mctx.page_size) * mctx.page_size
        rwq.buf, rwq.buf_type = mlx5_alloc_prefered_buf(mctx, attr.pd, rwq.buf_size,
                                                        MLX5DV_RES_TYPE_RWQ)
        undo.append(lambda: mlx5_free_actual_buf(mctx, attr.pd, rwq.buf, rwq.buf_size,
                                                 rwq.buf_type, MLX5DV_RES_TYPE_RWQ))
        mlx5_init_rwq_indices(rwq)
        rwq.db, rwq.custom_db = mlx5_alloc_dbrec_pd(mctx, attr.pd)
        undo.append(lambda: mlx5_free_db_pd(mctx, rwq.db, attr.pd, rwq.custom_db))
        if not rwq.custom_db:
            proc.store(rwq.db, bytes(8))
        drv.buf_addr, drv.db_addr = rwq.buf, rwq.db
        drv.rq_wqe_count, drv.rq_wqe_shift = rwq.rq.wqe_cnt, rwq.rq.wqe_shift
        drv.user_index = _store_uidx(mctx, rwq)
        undo.append(lambda: mctx.uidx_table.pop(drv.user_index, None))
        ibv_cmd_create_wq(context, attr, rwq, drv, mlx5_ib_create_wq_resp)
    except BaseException:
        for fn in reversed(undo):
            fn()
        raise
    rwq.rsn = drv.user_index
    return rwq


@traced
def mlx5_modify_wq(wq: mlx5_rwq, attr: ibv_wq_attr) -> int:
    """Mirrors mlx5_modify_wq(): to RDY, a current state that is not the WQ's is
    -EINVAL (the C returns it negative); from RESET the CQ loses the WQ's old
    completions and the ring and doorbell record start over; then MODIFY_WQ."""
    if attr.attr_mask & IBV_WQ_ATTR_STATE and attr.wq_state == IBV_WQS_RDY:
        if attr.attr_mask & IBV_WQ_ATTR_CURR_STATE and attr.curr_wq_state != wq.state:
            return -errno.EINVAL
        if wq.state == IBV_WQS_RESET:
            mlx5_cq_clean(wq.cq, wq.rsn)
            mlx5_init_rwq_indices(wq)
            wq.context.proc.store(wq.db, bytes(8))
    ibv_cmd_modify_wq(wq, attr, mlx5_ib_modify_wq())
    return 0


@traced
def mlx5_destroy_wq(wq: mlx5_rwq) -> None:
    """Mirrors mlx5_destroy_wq(): DESTROY_WQ; then the CQ loses the WQ's completions,
    and the user index, doorbell record and buffer go."""
    mctx = wq.context
    ibv_cmd_destroy_wq(wq)
    mlx5_cq_clean(wq.cq, wq.rsn)
    mctx.uidx_table.pop(wq.rsn, None)
    mlx5_free_db_pd(mctx, wq.db, wq.pd, wq.custom_db)
    mlx5_free_actual_buf(mctx, wq.pd, wq.buf, wq.buf_size, wq.buf_type, MLX5DV_RES_TYPE_RWQ)


@traced
def mlx5_create_rwq_ind_table(context: Any,
                              init_attr: ibv_rwq_ind_table_init_attr) -> ibv_rwq_ind_table:
    """Mirrors mlx5_create_rwq_ind_table(): CREATE_RWQ_IND_TBL."""
    tbl = ibv_rwq_ind_table()
    ibv_cmd_create_rwq_ind_table(context, init_attr, tbl, mlx5_ib_create_rwq_ind_tbl_resp)
    return tbl


@traced
def mlx5_destroy_rwq_ind_table(tbl: ibv_rwq_ind_table) -> None:
    """Mirrors mlx5_destroy_rwq_ind_table()."""
    ibv_cmd_destroy_rwq_ind_table(tbl)


__all__ = ["mlx5_create_rwq_ind_table", "mlx5_create_wq", "mlx5_destroy_rwq_ind_table",
           "mlx5_destroy_wq", "mlx5_modify_wq", "mlx5_rwq", "ibv_wq"]

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
from kernel_model.uapi.ib_user_ioctl_cmds import UVERBS_OBJECT_PD
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
    MLX5_QP_FLAG_DCI_STREAM,
    MLX5_QP_FLAG_SCATTER_CQE,
    MLX5_QP_FLAG_SIGNATURE,
    MLX5_QP_FLAG_UAR_PAGE_INDEX,
    mlx5_ib_alloc_pd_resp,
    mlx5_ib_create_cq,
    mlx5_ib_create_cq_resp,
    mlx5_ib_create_qp,
    mlx5_ib_create_qp_resp,
)
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_QUERY_PD_HANDLE,
    MLX5_IB_ATTR_QUERY_PD_RESP_PDN,
    MLX5_IB_METHOD_PD_QUERY,
)
from userspace.libc import free, posix_memalign
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cint import s32, u32
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.driver import verbs_context_ops, verbs_register_driver
from userspace.libibverbs.verbs_async import verbs_obj_handle
from userspace.libibverbs.verbs_cq import ibv_destroy_cq_wait, verbs_cq_handle
from userspace.libibverbs.verbs_types import (
    IBV_CQ_INIT_ATTR_MASK_FLAGS,
    IBV_CQ_INIT_ATTR_MASK_PD,
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
    IBV_QP_INIT_ATTR_CREATE_FLAGS,
    IBV_QP_INIT_ATTR_IND_TABLE,
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_RX_HASH,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QP_INIT_ATTR_XRCD,
    IBV_QP_STATE,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_XRC_RECV,
    IBV_WC_STANDARD_FLAGS,
    ibv_cq_ex,
    ibv_cq_init_attr_ex,
    ibv_mr,
    ibv_mw,
    ibv_pd,
    ibv_qp,
    ibv_qp_attr,
    ibv_qp_init_attr,
    ibv_qp_init_attr_ex,
)
from userspace.providers.mlx5 import cq_ext
from userspace.providers.mlx5 import env as mlx5_env
from userspace.providers.mlx5.ah import mlx5_create_ah, mlx5_destroy_ah
from userspace.providers.mlx5.buf import (
    MLX5_ALLOC_TYPE_ANON,
    MLX5DV_RES_TYPE_CQ,
    MLX5DV_RES_TYPE_QP,
    mlx5_alloc_dbrec_pd,
    mlx5_alloc_prefered_buf,
    mlx5_free_actual_buf,
    mlx5_free_db_pd,
    to_mparent_domain,
)
from userspace.providers.mlx5.clock import mlx5_query_rt_values
from userspace.providers.mlx5.cq import mlx5_cq_clean, mlx5_poll_cq
from userspace.providers.mlx5.cq_ext import mlx5_arm_cq, mlx5_cq_event, mlx5_cq_fill_pfns
from userspace.providers.mlx5.dc import (
    MLX5DV_DCTYPE_DCT,
    MLX5DV_QP_INIT_ATTR_MASK_DC,
    MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
    create_dct,
    create_qp_dv_attr,
    modify_dct,
)
from userspace.providers.mlx5.dm import (
    mlx5_alloc_dm,
    mlx5_free_dm,
    mlx5_import_dm,
    mlx5_memcpy_from_dm,
    mlx5_memcpy_to_dm,
    mlx5_reg_dm_mr,
    mlx5_unimport_dm,
)
from userspace.providers.mlx5.mlx5 import (
    MLX5_VENDOR_ID,
    mlx5_alloc_context,
    mlx5_context,
    mlx5_free_context,
    mlx5_import_context,
)
from userspace.providers.mlx5.qp import mlx5_init_qp_indices, mlx5_post_recv, mlx5_post_send
from userspace.providers.mlx5.qp_ex import (
    MLX5DV_QP_EX_WITH_MEMCPY,
    mlx5_qp_fill_wr_pfns,
    set_qp_operational_state,
)
from userspace.providers.mlx5.srq import (
    mlx5_close_xrcd,
    mlx5_create_srq,
    mlx5_create_srq_ex,
    mlx5_destroy_srq,
    mlx5_get_srq_num,
    mlx5_modify_srq,
    mlx5_open_xrcd,
    mlx5_post_srq_recv,
    mlx5_query_srq,
)
from userspace.providers.mlx5.uar import (
    bf_for_bfreg_index,
    mlx5_bf,
    mlx5_get_qp_uar,
    mlx5_put_qp_uar,
)
from userspace.providers.mlx5.wq import (
    mlx5_create_rwq_ind_table,
    mlx5_create_wq,
    mlx5_destroy_rwq_ind_table,
    mlx5_destroy_wq,
    mlx5_modify_wq,
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
    """Mirrors struct mlx5_pd: refcount counts the parent domains (and, of a parent
    domain, the QPs and CQs) that use it; mprotection_domain is set on a parent domain."""

    pdn: int = 0
    refcount: int = 1
    mprotection_domain: Any = None


@attrs.define(eq=False)
class mlx5_parent_domain(mlx5_pd):
    """Mirrors struct mlx5_parent_domain: a PD wrapping a protection domain, with the
    application's allocators and their pd_context (buf.py uses them)."""

    mtd: Any = None
    alloc: Any = None
    free: Any = None
    pd_context: Any = None


@attrs.define(eq=False)
class mlx5_cq(ibv_cq_ex):
    cqn: int = 0
    buf: int = 0
    buf_size: int = 0
    cqe_sz: int = 64
    dbrec: int = 0
    cons_index: int = 0   # CQEs consumed (poll_cq); the HCA learns it from the dbrec
    arm_sn: int = 0       # events read (mlx5_cq_event); goes into the arm doorbell
    flags: int = 0        # MLX5_CQ_FLAGS_EXTENDED for ibv_create_cq_ex's CQs
    cur_cqe: bytes | None = None   # the extended poll's current CQE
    cur_vendor_err: int = 0
    parent_domain: Any = None      # IBV_CQ_INIT_ATTR_MASK_PD: its allocators made the CQ
    custom_db: bool = False        # the doorbell record came from those allocators
    buf_type: int = MLX5_ALLOC_TYPE_ANON
    last_clock_info: Any = None    # the wall-clock poll's mlx5dv_clock_info (clock.py)


@attrs.define(eq=False)
class mlx5_qp(ibv_qp):
    """Mirrors struct mlx5_qp: the buffers, doorbell record, bf and queue geometry."""

    sq: mlx5_wq = attrs.Factory(mlx5_wq)
    rq: mlx5_wq = attrs.Factory(mlx5_wq)
    buf: int = 0
    buf_size: int = 0
    sq_buf: int = 0           # RAW_PACKET: the SQ's own buffer (sq_start)
    sq_buf_size: int = 0
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
    atomics_enabled: bool = False   # the device has atomics (ctx->atomic_cap)
    custom_db: bool = False   # the doorbell record came from a parent domain's allocator
    buf_type: int = MLX5_ALLOC_TYPE_ANON


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
    xrcd: Any = None
    create_flags: int = 0
    source_qpn: int = 0


def _to_mctx(ctx) -> mlx5_context:
    return ctx


# -- port, PD, MR ---------------------------------------------------------------------
def mlx5_query_port(ctx, port: int):
    """Mirrors mlx5_query_port(): ibv_cmd_query_port."""
    return c.ibv_cmd_query_port(ctx, port)


@traced
def mlx5_query_device_ex(ctx, comp_mask: int = 0):
    """Mirrors mlx5_query_device_ex(): ibv_cmd_query_device_any.

    # EMU: no mlx5 driver response (struct mlx5_ib_query_device_resp) is asked
    # for, so tso_caps, the RSS hash fields, packet_pacing_caps and
    # pci_atomic_caps stay 0 (the model has none of those offloads).
    """
    return c.ibv_cmd_query_device_any(ctx, comp_mask)


@traced
def mlx5_alloc_pd(ctx) -> mlx5_pd:
    """Mirrors mlx5_alloc_pd(): ALLOC_PD; keeps the PDN the kernel returns."""
    resp, drv = c.ibv_cmd_alloc_pd(ctx, mlx5_ib_alloc_pd_resp)
    return mlx5_pd(ctx, resp.pd_handle, pdn=drv.pdn)


@traced
def mlx5_free_pd(pd: mlx5_pd) -> None:
    """Mirrors mlx5_free_pd(): a parent domain is mlx5_dealloc_parent_domain; a PD
    that a parent domain still wraps is EBUSY; else DEALLOC_PD."""
    mparent_domain = to_mparent_domain(pd)
    if mparent_domain is not None:
        mlx5_dealloc_parent_domain(mparent_domain)
        return
    if getattr(pd, "refcount", 1) > 1:   # (a bare ibv_pd has no parent domains)
        raise VerbsError(errno.EBUSY, "mlx5_free_pd: a parent domain uses the PD")
    c.ibv_cmd_dealloc_pd(pd.context, pd.handle)


@traced
def mlx5_import_pd(ctx, pd_handle: int) -> mlx5_pd:
    """Mirrors mlx5_import_pd(): MLX5_IB_METHOD_PD_QUERY for the PDN of the PD behind
    the handle (ENOENT for a handle the fd's context does not hold, EINVAL for one of
    another type); a new mlx5_pd on this context with that handle."""
    out = c.execute_ioctl(ctx, UVERBS_OBJECT_PD, MLX5_IB_METHOD_PD_QUERY,
                          [(MLX5_IB_ATTR_QUERY_PD_HANDLE, pd_handle, "in8"),
                           (MLX5_IB_ATTR_QUERY_PD_RESP_PDN, 0, "out4")], "mlx5_import_pd")
    return mlx5_pd(ctx, pd_handle, pdn=out[MLX5_IB_ATTR_QUERY_PD_RESP_PDN])


@traced
def mlx5_unimport_pd(pd: mlx5_pd) -> None:
    """Mirrors mlx5_unimport_pd() -> _mlx5_free_pd(pd, unimport): the library's PD goes,
    the kernel's stays (no DEALLOC_PD).  A parent domain is EINVAL and a PD a parent
    domain still uses EBUSY - rdma-core asserts on both (the call is void)."""
    if to_mparent_domain(pd) is not None:
        raise VerbsError(errno.EINVAL, "mlx5_unimport_pd: a parent domain")
    if getattr(pd, "refcount", 1) > 1:
        raise VerbsError(errno.EBUSY, "mlx5_unimport_pd: a parent domain uses the PD")


#: the comp_mask bits mlx5_alloc_parent_domain takes
MLX5_PARENT_DOMAIN_SUP_COMP_MASK = (v.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS
                                    | v.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)


@traced
def mlx5_alloc_parent_domain(ctx, attr: v.ibv_parent_domain_init_attr) -> mlx5_parent_domain:
    """Mirrors mlx5_alloc_parent_domain(): EINVAL without a PD or for an unknown
    comp_mask bit; a library object only (no command): it holds a reference on the
    protection domain (and the thread domain), takes its context and handle, and
    keeps the allocators and pd_context the comp_mask names."""
    v.ibv_check_alloc_parent_domain(attr)
    if attr.comp_mask & ~MLX5_PARENT_DOMAIN_SUP_COMP_MASK:
        raise VerbsError(errno.EINVAL, f"mlx5_alloc_parent_domain: comp_mask "
                         f"{attr.comp_mask:#x}")
    protection_domain = attr.pd
    while protection_domain.mprotection_domain is not None:   # to_mpd()
        protection_domain = protection_domain.mprotection_domain
    mparent_domain = mlx5_parent_domain(ctx, 0, pdn=protection_domain.pdn,
                                        mprotection_domain=protection_domain)
    if attr.td is not None:
        mparent_domain.mtd = attr.td
        attr.td.refcount += 1
    protection_domain.refcount += 1
    v.ibv_initialize_parent_domain(mparent_domain, protection_domain)
    if attr.comp_mask & v.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS:
        mparent_domain.alloc, mparent_domain.free = attr.alloc, attr.free
    if attr.comp_mask & v.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT:
        mparent_domain.pd_context = attr.pd_context
    return mparent_domain


@traced
def mlx5_dealloc_parent_domain(mparent_domain: mlx5_parent_domain) -> None:
    """Mirrors mlx5_dealloc_parent_domain(): EBUSY while a QP or CQ uses it; else
    the references on the protection (and thread) domain are dropped."""
    if mparent_domain.refcount > 1:
        raise VerbsError(errno.EBUSY, "mlx5_dealloc_parent_domain: a QP or CQ uses it")
    mparent_domain.mprotection_domain.refcount -= 1
    if mparent_domain.mtd is not None:
        mparent_domain.mtd.refcount -= 1


@traced
def mlx5_reg_mr(pd: ibv_pd, addr: int, length: int, hca_va: int, access: int) -> ibv_mr:
    """Mirrors mlx5_reg_mr(): REG_MR, nothing provider-private."""
    resp = c.ibv_cmd_reg_mr(pd.context, pd.handle, addr, length, hca_va, access)
    return ibv_mr(pd.context, pd, addr, length, resp.mr_handle, resp.lkey, resp.rkey)


@traced
def mlx5_rereg_mr(vmr: ibv_mr, flags: int, pd: ibv_pd | None, addr: int, length: int,
                  access: int) -> None:
    """Mirrors mlx5_rereg_mr(): REREG_MR with hca_va = addr (VerbsError on failure)."""
    c.ibv_cmd_rereg_mr(vmr, flags, addr, length, addr, access, pd)


@traced
def mlx5_alloc_mw(pd: ibv_pd, mw_type: int) -> ibv_mw:
    """Mirrors mlx5_alloc_mw(): ALLOC_MW, no provider data."""
    resp = c.ibv_cmd_alloc_mw(pd, mw_type)
    return ibv_mw(pd.context, pd, resp.rkey, resp.mw_handle, mw_type)


@traced
def mlx5_dealloc_mw(mw: ibv_mw) -> None:
    """Mirrors mlx5_dealloc_mw()."""
    c.ibv_cmd_dealloc_mw(mw)


@traced
def mlx5_bind_mw(qp: Any, mw: ibv_mw, mw_bind: Any) -> int:
    """Mirrors mlx5_bind_mw(): a BIND_MW work request with the window's next key, then
    the window takes that key.  EINVAL for a range without an MR or zero-based access,
    ENOTSUP for an MR that is not a plain one, EPERM for an MR of another PD; the
    post's errno."""
    info = mw_bind.bind_info
    if info.mr is None and (info.addr or info.length):
        return errno.EINVAL
    if info.mw_access_flags & v.IBV_ACCESS_ZERO_BASED:
        return errno.EINVAL
    if info.mr is not None:
        if info.mr.mr_type != v.IBV_MR_TYPE_MR:
            return errno.ENOTSUP
        if mw.pd is not info.mr.pd:
            return errno.EPERM
    wr = v.ibv_send_wr(wr_id=mw_bind.wr_id, opcode=v.IBV_WR_BIND_MW,
                       send_flags=mw_bind.send_flags,
                       bind_mw=v.ibv_bind_mw_wr(mw, v.ibv_inc_rkey(mw.rkey), info))
    ret = mlx5_post_send(qp, wr, [])
    if ret:
        return ret
    mw.rkey = wr.bind_mw.rkey
    return 0


@traced
def mlx5_dereg_mr(mr: ibv_mr) -> None:
    """Mirrors mlx5_dereg_mr()."""
    c.ibv_cmd_dereg_mr(mr.context, mr.handle)


@traced
def mlx5_import_mr(pd: ibv_pd, mr_handle: int) -> ibv_mr:
    """Mirrors mlx5_import_mr(): ibv_cmd_query_mr (UVERBS_METHOD_QUERY_MR)."""
    return c.ibv_cmd_query_mr(pd, mr_handle)


@traced
def mlx5_unimport_mr(mr: ibv_mr) -> None:
    """Mirrors mlx5_unimport_mr(): only the library's MR is freed."""


@traced
def mlx5_advise_mr(pd, advice: int, flags: int, sg_list: list) -> int:
    """Mirrors mlx5_advise_mr(): ibv_cmd_advise_mr; 0 or the errno."""
    return v.ibv_cmd_advise_mr(pd, advice, flags, sg_list)


# -- CQ -----------------------------------------------------------------------------
#: CQEs _init_cq_buf writes per store (1 MiB of 64-byte ones)
_CQE_INIT_BATCH = 16384


def _init_cq_buf(proc, buf: int, ncqe: int, cqe_sz: int) -> None:
    """Mirrors mlx5_alloc_cq_buf's init: every CQE invalid, owned by hardware.
    Written a batch of CQEs per store (libmlx5 writes them one by one), so a CQ
    of 2^22 entries is not first built as one 256 MiB string."""
    op_own = bytes([MLX5_CQE_INVALID << 4 | MLX5_CQE_OWNER_MASK])
    batch = (bytes(cqe_sz - 1) + op_own) * min(ncqe, _CQE_INIT_BATCH)
    for first in range(0, ncqe, _CQE_INIT_BATCH):
        n = min(_CQE_INIT_BATCH, ncqe - first)
        proc.store(buf + first * cqe_sz, batch if n == _CQE_INIT_BATCH else batch[:n * cqe_sz])


MLX5_CQ_FLAGS_EXTENDED = 1 << 3
CREATE_CQ_SUPPORTED_WC_FLAGS = (1 << 12) - 1   # the standard ones, timestamps, cvlan, ...
CREATE_CQ_SUPPORTED_COMP_MASK = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD
CREATE_CQ_SUPPORTED_FLAGS = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN


@traced
def create_cq(ctx, attr: ibv_cq_init_attr_ex, cq_alloc_flags: int,
              dv_cqe_size: int | None = None) -> mlx5_cq:
    """Mirrors create_cq(): EINVAL for cqe 0, an unknown comp_mask, unsupported
    creation flags, a PD that is no parent domain, a size beyond 2^24 or an
    MLX5_CQE_SIZE other than 64 or 128; ENOTSUP (EOPNOTSUPP) for wc_flags libmlx5
    cannot report; then a power-of-two ring of CQEs of that size, a doorbell
    record, and CREATE_CQ (the extended command when the CQ asks for timestamps or
    overrun ignore) with both addresses (+ the NC UAR)."""
    mctx = _to_mctx(ctx)
    proc = mctx.proc
    what = "mlx5_create_cq"
    if not attr.cqe:
        raise VerbsError(errno.EINVAL, f"{what}: cqe 0")
    if attr.comp_mask & ~CREATE_CQ_SUPPORTED_COMP_MASK:
        raise VerbsError(errno.EINVAL, f"{what}: comp_mask {attr.comp_mask:#x}")
    if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS and \
            attr.flags & ~CREATE_CQ_SUPPORTED_FLAGS:
        raise VerbsError(errno.EINVAL, f"{what}: flags {attr.flags:#x}")
    if attr.wc_flags & ~CREATE_CQ_SUPPORTED_WC_FLAGS:
        raise VerbsError(errno.EOPNOTSUPP, f"{what}: wc_flags {attr.wc_flags:#x}")
    parent_domain = None
    if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD:
        if to_mparent_domain(attr.parent_domain) is None:
            raise VerbsError(errno.EINVAL, f"{what}: not a parent domain")
        parent_domain = attr.parent_domain
    cq = mlx5_cq(ctx, 0, 0, flags=cq_alloc_flags, parent_domain=parent_domain)
    if cq_alloc_flags & MLX5_CQ_FLAGS_EXTENDED:
        rc = mlx5_cq_fill_pfns(cq, attr, mctx)
        if rc:
            raise VerbsError(rc, what)
    cqe = u32(attr.cqe)
    ncqe = roundup_pow_of_two(cqe + 1)  # align_queue_size()
    if ncqe > 1 << 24 or ncqe < cqe + 1:
        raise VerbsError(errno.EINVAL, f"{what}: ncqe {ncqe}")
    # get_cqe_size(): mlx5dv's cqe_size when given (MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE)
    cqe_sz = mlx5_env.get_cqe_size(proc.environ) if dv_cqe_size is None else \
        (dv_cqe_size if dv_cqe_size in (64, 128) else -errno.EINVAL)
    if cqe_sz < 0:
        raise VerbsError(-cqe_sz, f"{what}: MLX5_CQE_SIZE")
    size = ncqe * cqe_sz
    # mlx5_alloc_cq_buf(): the parent domain's allocator, if it has one
    buf, buf_type = mlx5_alloc_prefered_buf(mctx, parent_domain, size, MLX5DV_RES_TYPE_CQ)
    try:
        _init_cq_buf(proc, buf, ncqe, cqe_sz)
        db, custom_db = mlx5_alloc_dbrec_pd(mctx, parent_domain)
        try:
            proc.store(db, bytes(8))  # cq->dbrec[MLX5_CQ_SET_CI] = [MLX5_CQ_ARM_DB] = 0
            drv = mlx5_ib_create_cq(buf_addr=buf, db_addr=db, cqe_size=cqe_sz)
            if mctx.nc_uar is not None:
                drv.flags |= MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX
                drv.uar_page_index = mctx.nc_uar.page_id
            attr_ex = attrs.evolve(attr, cqe=ncqe - 1)
            handle, resp_cqe, dresp = c.ibv_cmd_create_cq_ex(
                ctx, attr_ex, drv, mlx5_ib_create_cq_resp, verbs_cq_handle(cq))
        except BaseException:
            mlx5_free_db_pd(mctx, db, parent_domain, custom_db)
            raise
    except BaseException:
        mlx5_free_actual_buf(mctx, parent_domain, buf, size, buf_type, MLX5DV_RES_TYPE_CQ)
        raise
    if parent_domain is not None:
        parent_domain.refcount += 1
    cq.handle, cq.cqe, cq.cqn = handle, resp_cqe, dresp.cqn
    cq.buf, cq.buf_size, cq.cqe_sz, cq.dbrec = buf, size, cqe_sz, db
    cq.buf_type, cq.custom_db = buf_type, custom_db
    return cq


@traced
def mlx5_create_cq(ctx, cqe: int, channel: Any = None, comp_vector: int = 0) -> mlx5_cq:
    """Mirrors mlx5_create_cq(): EINVAL for cqe <= 0 (an int in C), then create_cq
    with the standard wc_flags."""
    cqe, comp_vector = s32(cqe), s32(comp_vector)   # both ints in mlx5_create_cq()
    if cqe <= 0 or cqe > MLX5_MAX_CQE:
        raise VerbsError(errno.EINVAL, f"mlx5_create_cq: cqe {cqe}")
    return create_cq(ctx, ibv_cq_init_attr_ex(cqe=cqe, channel=channel,
                                              comp_vector=comp_vector,
                                              wc_flags=IBV_WC_STANDARD_FLAGS), 0)


@traced
def mlx5_create_cq_ex(ctx, attr: ibv_cq_init_attr_ex) -> mlx5_cq:
    """Mirrors mlx5_create_cq_ex(): create_cq with the extended poll API installed."""
    return create_cq(ctx, attr, MLX5_CQ_FLAGS_EXTENDED)


@traced
def mlx5dv_create_cq(ctx, attr: ibv_cq_init_attr_ex, cqe_size: int | None = None) -> mlx5_cq:
    """Mirrors _mlx5dv_create_cq() for the one mlx5dv attribute modelled here, the CQE
    size (None: MLX5_CQE_SIZE or 64); the caller runs verbs_init_cq."""
    return create_cq(ctx, attr, MLX5_CQ_FLAGS_EXTENDED, cqe_size)


@traced
def mlx5_destroy_cq(cq: mlx5_cq) -> None:
    """Mirrors mlx5_destroy_cq(): DESTROY_CQ (ibv_cmd_destroy_cq waits for the events
    it reported to be acknowledged), then free the record and buffer."""
    resp = c.ibv_cmd_destroy_cq(cq.context, cq.handle)
    mlx5_free_db_pd(cq.context, cq.dbrec, cq.parent_domain, cq.custom_db)
    mlx5_free_actual_buf(cq.context, cq.parent_domain, cq.buf, cq.buf_size, cq.buf_type,
                         MLX5DV_RES_TYPE_CQ)
    if cq.parent_domain is not None:
        cq.parent_domain.refcount -= 1
    ibv_destroy_cq_wait(cq, resp)


@traced
def mlx5_resize_cq(cq: mlx5_cq, cqe: int) -> None:
    """Mirrors mlx5_resize_cq() (cq_ext.py)."""
    cq_ext.mlx5_resize_cq(cq, cqe, _init_cq_buf)


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


#: the comp_mask bits libmlx5's create_qp takes (MLX5_CREATE_QP_SUP_COMP_MASK)
MLX5_CREATE_QP_SUP_COMP_MASK = (IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD
                                | IBV_QP_INIT_ATTR_CREATE_FLAGS
                                | IBV_QP_INIT_ATTR_MAX_TSO_HEADER | IBV_QP_INIT_ATTR_IND_TABLE
                                | IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
#: what create_qp needs the extended command for (MLX5_CREATE_QP_EX2_COMP_MASK)
MLX5_CREATE_QP_EX2_COMP_MASK = (IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
                                | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH)
#: the comp_mask bits mlx5_create_qp_ex hands on to create_qp in the model's attrx
MLX5_CREATE_QP_PASSED_COMP_MASK = (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
                                   | IBV_QP_INIT_ATTR_CREATE_FLAGS
                                   | IBV_QP_INIT_ATTR_MAX_TSO_HEADER)


@traced
def mlx5_create_qp_ex(context: mlx5_context, attr: ibv_qp_init_attr_ex,
                      mlx5_qp_attr: Any = None) -> mlx5_qp:
    """Mirrors mlx5_create_qp_ex(), the create_qp_ex op: create_qp(context, attr,
    NULL) - or, for mlx5dv_create_qp (dv.py), with its struct mlx5dv_qp_init_attr.
    A comp_mask bit libmlx5 does not know is EINVAL; without a PD (or an
    XRCD) there is nothing to create the QP on: EINVAL.

    An XRC receive QP is made in attr.xrcd (IBV_QP_INIT_ATTR_XRCD) and has no
    queues; an XRC send QP on a PD has no receive queue.
    # EMU: RSS (IND_TABLE / RX_HASH) is not modelled: EOPNOTSUPP.
    # The new post-send API (SEND_OPS_FLAGS) is qp_ex.py's.  Create flags and a TSO
    header travel in the extended CREATE_QP command (ibv_cmd_create_qp_ex2).
    """
    if attr.comp_mask & ~MLX5_CREATE_QP_SUP_COMP_MASK:
        raise VerbsError(errno.EINVAL, f"mlx5_create_qp_ex: comp_mask {attr.comp_mask:#x}")
    if attr.comp_mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH):
        raise VerbsError(errno.EOPNOTSUPP, "mlx5_create_qp_ex: RSS is not modelled")
    xrcd = attr.xrcd if attr.comp_mask & IBV_QP_INIT_ATTR_XRCD else None
    if (not attr.comp_mask & IBV_QP_INIT_ATTR_PD or attr.pd is None) and xrcd is None:
        raise VerbsError(errno.EINVAL, "mlx5_create_qp_ex: no PD")
    attrx = _InitAttrEx(attr.qp_type, attr.cap, attr.srq, pd=attr.pd, send_cq=attr.send_cq,
                        recv_cq=attr.recv_cq, sq_sig_all=attr.sq_sig_all,
                        comp_mask=attr.comp_mask & MLX5_CREATE_QP_PASSED_COMP_MASK,
                        send_ops_flags=attr.send_ops_flags, xrcd=xrcd,
                        create_flags=attr.create_flags, source_qpn=attr.source_qpn,
                        max_tso_header=attr.max_tso_header)
    return create_qp(context, attrx, mlx5_qp_attr)


@traced
def create_qp(context: mlx5_context, attr: _InitAttrEx, mlx5_qp_attr: Any = None) -> mlx5_qp:
    """Mirrors create_qp() (static in verbs.c): size the queues, allocate the
    buffer (RQ first, then SQ; a RAW_PACKET QP's SQ in a buffer of its own, whose
    address travels in sq_buf_addr) and the doorbell record, choose the UAR,
    CREATE_QP (ibv_cmd_create_qp_ex; the extended command, ibv_cmd_create_qp_ex2,
    for create flags or a TSO header), then map_uuar.  A TSO header on a QP other
    than RAW_PACKET is EINVAL."""
    mctx = _to_mctx(context)
    proc = mctx.proc
    pd = attr.pd
    cap = attr.cap
    for name in _CAP_FIELDS:  # struct ibv_qp_cap holds uint32_t: what C would have stored
        setattr(cap, name, u32(getattr(cap, name)))
    qp = mlx5_qp(context, pd, attr.send_cq, attr.recv_cq, 0, 0, attr.qp_type,
                 wq_sig=mlx5_env.qp_sig_enabled(proc.environ), srq=attr.srq)
    qp.sq_signal_bits = MLX5_WQE_CTRL_CQ_UPDATE if attr.sq_sig_all else 0
    qp.atomics_enabled = bool(mctx.atomic_cap)
    # the mlx5dv_qp_init_attr part (dc.py): vendor flags, DCI / DCT
    mlx5_create_flags = create_qp_dv_attr(mctx, attr, qp, mlx5_qp_attr)
    if qp.dc_type == MLX5DV_DCTYPE_DCT:
        return create_dct(mctx, attr, mlx5_qp_attr, qp, mlx5_create_flags, _alloc_uidx)
    dv_ops = mlx5_qp_attr is not None and \
        mlx5_qp_attr.comp_mask & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS
    if attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS or dv_ops:
        if mlx5_qp_attr is not None and mlx5_qp_attr.comp_mask & MLX5DV_QP_INIT_ATTR_MASK_DC:
            mlx5_create_flags &= ~MLX5_QP_FLAG_SCATTER_CQE   # not on the DC data path
        ret = mlx5_qp_fill_wr_pfns(qp, attr.send_ops_flags, mlx5_qp_attr)
        if not ret and dv_ops and mlx5_qp_attr.send_ops_flags & MLX5DV_QP_EX_WITH_MEMCPY:
            ret = errno.EOPNOTSUPP   # qp_init_wr_memcpy: the context has no DMA MMO caps
        if ret:
            raise VerbsError(ret, "create_qp: send_ops_flags "
                             f"{attr.send_ops_flags:#x} not supported on this QP type")
    if attr.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER and \
            attr.qp_type != v.IBV_QPT_RAW_PACKET:
        raise VerbsError(errno.EINVAL, "create_qp: a TSO header needs a RAW_PACKET QP")
    wq_size = mlx5_calc_wq_size(mctx, attr, qp, mlx5_qp_attr)
    buf_size, sq_buf_size = create_qp_buf_sizes(qp, attr.qp_type, wq_size)
    undo = []
    bf = None
    try:
        if buf_size:                # an XRC receive QP has no queues
            mlx5_alloc_qp_buf(mctx, attr, qp, buf_size)
            undo.append(lambda: mlx5_free_actual_buf(mctx, pd, qp.buf, qp.buf_size,
                                                     qp.buf_type, MLX5DV_RES_TYPE_QP))
        if sq_buf_size:             # RAW_PACKET: the SQ apart (mlx5_alloc_qp_buf's sq_buf)
            qp.sq_buf_size = -(-sq_buf_size // mctx.page_size) * mctx.page_size
            qp.sq_buf = posix_memalign(proc, mctx.page_size, qp.sq_buf_size)
            undo.append(lambda: free(proc, qp.sq_buf, qp.sq_buf_size))
        qp.db, qp.custom_db = mlx5_alloc_dbrec_pd(mctx, pd)
        undo.append(lambda: mlx5_free_db_pd(mctx, qp.db, pd, qp.custom_db))
        if not qp.custom_db:  # db[MLX5_RCV_DBR] = db[MLX5_SND_DBR] = 0
            proc.store(qp.db, bytes(8))
        qp.uidx = _alloc_uidx(mctx, qp)
        undo.append(lambda: mctx.uidx_table.pop(qp.uidx, None))
        drv = mlx5_ib_create_qp(buf_addr=qp.buf, db_addr=qp.db, sq_wqe_count=qp.sq.wqe_cnt,
                                rq_wqe_count=qp.rq.wqe_cnt, rq_wqe_shift=qp.rq.wqe_shift,
                                uidx=qp.uidx, ece_options=0, sq_buf_addr=qp.sq_buf)
        drv.flags = mlx5_create_flags
        if mlx5_create_flags & MLX5_QP_FLAG_DCI_STREAM:
            streams = mlx5_qp_attr.dc_init_attr.dci_streams
            drv.log_num_concurent = streams.log_num_concurent
            drv.log_num_errored = streams.log_num_errored
        if qp.wq_sig:  # create_qp(): the kernel sizes the RQ and sets the QPC by this flag
            drv.flags |= MLX5_QP_FLAG_SIGNATURE
        if not mctx.bfs:  # dynamic UARs: the library picks the register
            qp.bf = bf = mlx5_get_qp_uar(mctx)
            undo.append(lambda: mlx5_put_qp_uar(mctx, bf))
            if bf is not None:
                drv.bfreg_index = bf.page_id
                drv.flags |= MLX5_QP_FLAG_UAR_PAGE_INDEX
        req = uv.ib_uverbs_create_qp(
            user_handle=verbs_obj_handle(qp),
            pd_handle=attr.xrcd.handle if attr.xrcd is not None else pd.handle,
            send_cq_handle=attr.send_cq.handle if attr.send_cq else 0,
            recv_cq_handle=attr.recv_cq.handle if attr.recv_cq else 0,
            max_send_wr=cap.max_send_wr, max_recv_wr=cap.max_recv_wr,
            max_send_sge=cap.max_send_sge, max_recv_sge=cap.max_recv_sge,
            max_inline_data=cap.max_inline_data, sq_sig_all=attr.sq_sig_all,
            qp_type=attr.qp_type, is_srq=int(attr.srq is not None),
            srq_handle=attr.srq.handle if attr.srq is not None else 0)
        if attr.comp_mask & MLX5_CREATE_QP_EX2_COMP_MASK:
            resp, dresp = c.ibv_cmd_create_qp_ex2(context, attr, req, drv,
                                                  mlx5_ib_create_qp_resp)
        else:
            resp, dresp = c.ibv_cmd_create_qp_ex(context, req, drv, mlx5_ib_create_qp_resp)
    except BaseException:
        for fn in reversed(undo):
            fn()
        raise
    qp.handle, qp.qp_num = resp.qp_handle, resp.qpn
    mparent_domain = to_mparent_domain(pd)
    if mparent_domain is not None:
        mparent_domain.refcount += 1
    if attr.qp_type != IBV_QPT_XRC_RECV:
        map_uuar(mctx, qp, dresp.bfreg_index, bf)
    # EMU: the kernel answers an XRC receive QP without the driver's response (it has
    # no send queue); C points qp->bf at bfs[] of whatever the buffer held, never used
    cap.max_send_wr, cap.max_recv_wr = qp.sq.max_post, qp.rq.max_post
    cap.max_recv_sge = u32(qp.rq.max_gs)
    return qp


@traced
def mlx5_alloc_qp_buf(context: mlx5_context, attr: _InitAttrEx, qp: mlx5_qp, size: int) -> None:
    """Mirrors mlx5_alloc_qp_buf(): the wrid / wqe_head / wr_data arrays of each
    queue, then the WQE buffer - `size` bytes rounded up to whole pages,
    page-aligned, in the process's own memory (zeroed, as anonymous pages are).

    A QP on a parent domain with allocators asks them first (buf.py), for the size
    rounded up to the alignment mlx5_set_custom_qp_alignment() asks for; a buffer
    the application gave is not zeroed.

    # EMU: only the anonymous allocation besides those: no huge pages (MLX5_QP_HUGE)
    # or dma-buf; a RAW packet QP's separate SQ buffer is create_qp's (anonymous).
    """
    for wq in (qp.sq, qp.rq):
        wq.wrid, wq.wqe_head, wq.wr_data = [0] * wq.wqe_cnt, [0] * wq.wqe_cnt, [0] * wq.wqe_cnt
    req_align = context.page_size
    if to_mparent_domain(attr.pd) is not None and attr.qp_type != v.IBV_QPT_RAW_PACKET:
        req_align = mlx5_set_custom_qp_alignment(context, qp, size)
    qp.buf_size = -(-size // req_align) * req_align
    qp.buf, qp.buf_type = mlx5_alloc_prefered_buf(context, attr.pd, qp.buf_size,
                                                  MLX5DV_RES_TYPE_QP, req_align)


#: mlx5_ifc's QPC page_offset is in quanta of 1/64 of the QP's page
MLX5_QPC_PAGE_OFFSET_QUANTA = 64


def mlx5_set_custom_qp_alignment(context: mlx5_context, qp: mlx5_qp, buf_size: int) -> int:
    """Mirrors mlx5_set_custom_qp_alignment(): the alignment a custom QP buffer needs -
    the larger WQE stride, or 1/64 of the buffer's size rounded up to pages and to a
    power of two (the QPC's page offset counts in those quanta)."""
    buf_page = roundup_pow_of_two(-(-buf_size // context.page_size) * context.page_size)
    max_stride = max(1 << qp.sq.wqe_shift, 1 << qp.rq.wqe_shift)
    return max(max_stride, buf_page // MLX5_QPC_PAGE_OFFSET_QUANTA)


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
    qp.events_reported = c.ibv_cmd_destroy_qp(mctx, qp.handle).events_reported
    rsn = qp.uidx if mctx.cqe_version else qp.qp_num
    mlx5_cq_clean(qp.recv_cq, rsn, qp.srq)
    if qp.send_cq is not qp.recv_cq:
        mlx5_cq_clean(qp.send_cq, rsn)
    if not mctx.bfs:
        mlx5_put_qp_uar(mctx, qp.bf)
    mctx.uidx_table.pop(qp.uidx, None)
    if qp.dc_type == MLX5DV_DCTYPE_DCT:       # a DCT has no buffers
        return
    mlx5_free_db_pd(mctx, qp.db, qp.pd, qp.custom_db)
    if qp.sq_buf:
        free(mctx.proc, qp.sq_buf, qp.sq_buf_size)
    if qp.buf:
        mlx5_free_actual_buf(mctx, qp.pd, qp.buf, qp.buf_size, qp.buf_type,
                             MLX5DV_RES_TYPE_QP)
    mparent_domain = to_mparent_domain(qp.pd)
    if mparent_domain is not None:
        mparent_domain.refcount -= 1


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
    if qp.dc_type == MLX5DV_DCTYPE_DCT:
        modify_dct(qp, attr, attr_mask)
        return
    c.ibv_cmd_modify_qp(qp, attr, attr_mask)
    if not attr_mask & IBV_QP_STATE:
        return
    state = attr.qp_state
    qp.sq.qp_state_max_gs = qp.sq.max_gs if state in _SQ_POSTS else -1
    qp.rq.qp_state_max_gs = qp.rq.max_gs if state in _RQ_POSTS else -1
    set_qp_operational_state(qp, state)
    if state == IBV_QPS_RESET:
        rsn = qp.uidx if mctx.cqe_version else qp.qp_num
        if qp.recv_cq is not None:
            mlx5_cq_clean(qp.recv_cq, rsn, qp.srq)
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
    query_port=mlx5_query_port, query_device_ex=mlx5_query_device_ex,
    query_rt_values=mlx5_query_rt_values,
    alloc_pd=mlx5_alloc_pd, dealloc_pd=mlx5_free_pd,
    alloc_parent_domain=mlx5_alloc_parent_domain,
    reg_mr=mlx5_reg_mr, rereg_mr=mlx5_rereg_mr, dereg_mr=mlx5_dereg_mr,
    alloc_mw=mlx5_alloc_mw, dealloc_mw=mlx5_dealloc_mw, bind_mw=mlx5_bind_mw,
    create_cq=mlx5_create_cq,
    create_cq_ex=mlx5_create_cq_ex, resize_cq=mlx5_resize_cq, req_notify_cq=mlx5_arm_cq,
    cq_event=mlx5_cq_event,
    destroy_cq=mlx5_destroy_cq, create_qp=mlx5_create_qp, create_qp_ex=mlx5_create_qp_ex,
    modify_qp=mlx5_modify_qp,
    query_qp=mlx5_query_qp, destroy_qp=mlx5_destroy_qp,
    create_ah=mlx5_create_ah, destroy_ah=mlx5_destroy_ah,
    create_srq=mlx5_create_srq, create_srq_ex=mlx5_create_srq_ex, modify_srq=mlx5_modify_srq,
    query_srq=mlx5_query_srq, get_srq_num=mlx5_get_srq_num, destroy_srq=mlx5_destroy_srq,
    post_srq_recv=mlx5_post_srq_recv, open_xrcd=mlx5_open_xrcd, close_xrcd=mlx5_close_xrcd,
    post_send=mlx5_post_send, post_recv=mlx5_post_recv, poll_cq=mlx5_poll_cq,
    alloc_dm=mlx5_alloc_dm, free_dm=mlx5_free_dm, memcpy_to_dm=mlx5_memcpy_to_dm,
    memcpy_from_dm=mlx5_memcpy_from_dm, reg_dm_mr=mlx5_reg_dm_mr, advise_mr=mlx5_advise_mr,
    create_wq=mlx5_create_wq, modify_wq=mlx5_modify_wq, destroy_wq=mlx5_destroy_wq,
    create_rwq_ind_table=mlx5_create_rwq_ind_table,
    destroy_rwq_ind_table=mlx5_destroy_rwq_ind_table,
    import_context=mlx5_import_context, import_pd=mlx5_import_pd, unimport_pd=mlx5_unimport_pd,
    import_mr=mlx5_import_mr, unimport_mr=mlx5_unimport_mr, import_dm=mlx5_import_dm,
    unimport_dm=mlx5_unimport_dm)

# PROVIDER_DRIVER(mlx5, mlx5_dev_ops): loading the provider offers it for the vendor's
# devices (its hca_table); libibverbs finds it through that table, never by name
verbs_register_driver(MLX5_VENDOR_ID, mlx5_ctx_ops)

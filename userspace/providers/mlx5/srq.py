"""Mirrors rdma-core providers/mlx5/srq.c and the SRQ verbs of verbs.c: libmlx5's
shared receive queues.

An SRQ is a ring of receive WQEs in the process's memory, each a 16-byte next
segment (struct mlx5_wqe_srq_next_seg: the index of the next WQE, big-endian,
at byte 2) then max_gs data segments, padded to a power of two of at least 32
bytes.  The free WQEs form a linked list from `head` to `tail`:

    create      WQE i links to i + 1 (the last to 0); head 0, tail max - 1
    post        the WR goes into WQE head, head moves to the WQE head links
                to; a full SRQ is head == tail (one WQE is never posted: the
                list needs a tail); the doorbell record (one big-endian word)
                gets the count of WQEs ever posted
    completion  the CQE's wqe_counter names the WQE; it is linked after the
                tail and becomes the tail (mlx5_free_srq_wqe)

The HCA follows the same links from WQE 0 (kernel_model/hw/mlx5_engine.py).
The ring's memory follows MLX_SRQ_ALLOC_TYPE (mlx5_get_alloc_type): ANON (the
default), PREFER_HUGE / PREFER_CONTIG / ALL (anonymous after the preferred kind
failed), HUGE and CONTIG (no fallback: creating the SRQ fails).
# EMU: the emulated machine has no huge pages (the SHM_HUGETLB segment fails:
# ENOMEM) and the kernel has no contiguous-pages mmap (ENOSYS), so only the
# anonymous allocation succeeds.  Tag-matching SRQs are not modelled
# (create_srq_ex: EOPNOTSUPP).
An SRQ on a parent domain with allocators takes its ring from them (buf.py).

An XRC SRQ (mlx5_create_xrc_srq) has the same ring; it is a resource of its own
for the CQEs (MLX5_RSC_TYPE_XSRQ): with CQE version 1 it takes a user index
from the context's table, which the CQEs of its receives carry.  XRC domains
(mlx5_open_xrcd / mlx5_close_xrcd) are the libibverbs commands alone.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_srq, mlx5_ib_create_srq_resp
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cint import u32, u64
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_async import ibv_destroy_wait_events, verbs_obj_handle
from userspace.libibverbs.verbs_types import (
    IBV_SRQ_INIT_ATTR_TYPE,
    IBV_SRQT_BASIC,
    IBV_SRQT_XRC,
    ibv_srq,
    ibv_srq_attr,
    ibv_srq_init_attr,
    ibv_srq_init_attr_ex,
    ibv_xrcd,
    ibv_xrcd_init_attr,
)
from userspace.providers.mlx5 import env as mlx5_env
from userspace.providers.mlx5.buf import (
    MLX5_ALLOC_TYPE_ANON,
    MLX5_ALLOC_TYPE_CUSTOM,
    MLX5DV_RES_TYPE_SRQ,
    mlx5_alloc_dbrec_pd,
    mlx5_alloc_prefered_buf,
    mlx5_free_actual_buf,
    mlx5_free_db_pd,
    mlx5_is_custom_alloc,
)
from userspace.providers.mlx5.wqsize import roundup_pow_of_two

MLX5_INVALID_LKEY = 0x100
MLX5_SRQ_FLAG_SIGNATURE = 1 << 0
NEXT_SEG_SIZE = 16      # sizeof(struct mlx5_wqe_srq_next_seg)
DATA_SEG_SIZE = 16      # sizeof(struct mlx5_wqe_data_seg)


@attrs.define(eq=False)
class mlx5_srq(ibv_srq):
    """Mirrors struct mlx5_srq: the ring, its free list and the doorbell record."""

    srqn: int = 0
    buf: int = 0
    buf_size: int = 0
    db: int = 0
    max: int = 0          # WQEs in the ring
    max_gs: int = 0
    wqe_shift: int = 0
    head: int = 0
    tail: int = 0
    counter: int = 0      # WQEs ever posted (the doorbell record's value)
    wq_sig: bool = False
    wrid: list[int] = attrs.Factory(list)
    uidx: int = 0xFFFFFF  # an XRC SRQ's user index (cqe_version 1)
    custom_db: bool = False   # the doorbell record came from a parent domain's allocator
    buf_type: int = MLX5_ALLOC_TYPE_ANON


def get_wqe(srq: mlx5_srq, n: int) -> int:
    """Mirrors get_wqe() (srq.c): the user address of WQE n."""
    return srq.buf + (n << srq.wqe_shift)


def _set_next(srq: mlx5_srq, n: int, next_index: int) -> None:
    srq.context.proc.store(get_wqe(srq, n) + 2, struct.pack(">H", next_index & 0xFFFF))


def _get_next(srq: mlx5_srq, n: int) -> int:
    return struct.unpack(">H", srq.context.proc.load(get_wqe(srq, n) + 2, 2))[0]


def _srq_alloc_type(environ: dict) -> str:
    """mlx5_get_alloc_type() for the SRQ prefix: the MLX_SRQ_ALLOC_TYPE value
    (case-insensitive), ANON when unset or unknown."""
    value = environ.get("MLX_SRQ_ALLOC_TYPE", "").upper()
    return value if value in ("ANON", "HUGE", "CONTIG", "PREFER_HUGE", "PREFER_CONTIG",
                              "ALL") else "ANON"


@traced
def mlx5_alloc_srq_buf(context: Any, srq: mlx5_srq, max_wr: int) -> None:
    """Mirrors mlx5_alloc_srq_buf(): max = the power of two above max_wr; a WQE of
    the next segment plus max_gs data segments, at least 32 bytes, a power of two
    (EINVAL beyond max_rq_desc_sz); max_gs becomes what the WQE holds; the ring
    zeroed, every WQE linked to the next.  On a parent domain with allocators the
    ring is theirs (MLX5DV_RES_TYPE_SRQ, page-aligned) and is not zeroed."""
    srq.max = roundup_pow_of_two(max_wr + 1)
    size = max(32, NEXT_SEG_SIZE + srq.max_gs * DATA_SEG_SIZE)
    size = roundup_pow_of_two(size)
    if size > context.max_rq_desc_sz:
        raise VerbsError(errno.EINVAL, f"mlx5_alloc_srq_buf: WQE of {size} bytes > "
                         f"max_rq_desc_sz {context.max_rq_desc_sz}")
    srq.max_gs = (size - NEXT_SEG_SIZE) // DATA_SEG_SIZE
    srq.wqe_shift = size.bit_length() - 1
    srq.buf_size = -(-(srq.max * size) // context.page_size) * context.page_size
    kind = "CUSTOM" if mlx5_is_custom_alloc(srq.pd) else \
        _srq_alloc_type(context.proc.environ)
    if kind == "HUGE":          # mlx5_alloc_prefered_buf: no fallback
        raise VerbsError(errno.ENOMEM, "mlx5_alloc_srq_buf: no huge pages")
    if kind == "CONTIG":
        raise VerbsError(errno.ENOSYS, "mlx5_alloc_srq_buf: no contiguous pages")
    if kind == "CUSTOM":        # buf_size = max * size, as the allocator is asked
        srq.buf_size = srq.max * size
    srq.buf, srq.buf_type = mlx5_alloc_prefered_buf(context, srq.pd, srq.buf_size,
                                                    MLX5DV_RES_TYPE_SRQ)
    if srq.buf_type != MLX5_ALLOC_TYPE_CUSTOM:
        context.proc.store(srq.buf, bytes(srq.max * size))
    srq.head, srq.tail = 0, srq.max - 1
    srq.wrid = [0] * srq.max
    for i in range(srq.max):
        _set_next(srq, i, (i + 1) & (srq.max - 1))


@traced
def mlx5_create_srq(pd: Any, attr: ibv_srq_init_attr) -> mlx5_srq:
    """Mirrors mlx5_create_srq(): EINVAL for max_wr beyond max_srq_recv_wr or max_sge
    beyond what a receive WQE can hold; the ring and a doorbell record (zeroed);
    CREATE_SRQ with max_wr = max - 1 (the kernel learns of the tail WQE); attr.attr
    gets max_wr = max - 2 and the WQE's max_gs."""
    ctx = pd.context
    a = attr.attr
    if u32(a.max_wr) > ctx.max_srq_recv_wr:
        raise VerbsError(errno.EINVAL, f"mlx5_create_srq: max_wr {u32(a.max_wr)}, "
                         f"max_srq_recv_wr {ctx.max_srq_recv_wr}")
    if u32(a.max_sge) > ctx.max_rq_desc_sz // DATA_SEG_SIZE:
        raise VerbsError(errno.EINVAL, f"mlx5_create_srq: max_sge {u32(a.max_sge)}")
    srq = mlx5_srq(ctx, pd, max_gs=u32(a.max_sge))
    mlx5_alloc_srq_buf(ctx, srq, u32(a.max_wr))
    try:
        srq.db, srq.custom_db = mlx5_alloc_dbrec_pd(ctx, pd)
        try:
            if not srq.custom_db:
                ctx.proc.store(srq.db, bytes(4))
            srq.wq_sig = mlx5_env.srq_sig_enabled(ctx.proc.environ)
            drv = mlx5_ib_create_srq(buf_addr=srq.buf, db_addr=srq.db,
                                     flags=MLX5_SRQ_FLAG_SIGNATURE if srq.wq_sig else 0)
            a.max_sge = srq.max_gs
            a.max_wr = srq.max - 1
            resp, dresp = c.ibv_cmd_create_srq(pd, attr, drv, mlx5_ib_create_srq_resp,
                                               verbs_obj_handle(srq))
        except BaseException:
            mlx5_free_db_pd(ctx, srq.db, pd, srq.custom_db)
            raise
    except BaseException:
        mlx5_free_actual_buf(ctx, pd, srq.buf, srq.buf_size, srq.buf_type,
                             MLX5DV_RES_TYPE_SRQ)
        raise
    a.max_wr -= 1           # the kernel's answer counts the wrap-around WQE
    srq.handle = resp.srq_handle
    srq.srqn = dresp.srqn
    return srq


@traced
def mlx5_create_srq_ex(context: Any, attr: ibv_srq_init_attr_ex) -> mlx5_srq:
    """Mirrors mlx5_create_srq_ex(): a basic SRQ is mlx5_create_srq on attr.pd, an
    XRC one mlx5_create_xrc_srq; # EMU: tag-matching SRQs are not modelled:
    EOPNOTSUPP."""
    if not attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE or attr.srq_type == IBV_SRQT_BASIC:
        return mlx5_create_srq(attr.pd, attr)
    if attr.srq_type == IBV_SRQT_XRC:
        return mlx5_create_xrc_srq(context, attr)
    raise VerbsError(errno.EOPNOTSUPP, f"mlx5_create_srq_ex: SRQ type {attr.srq_type} "
                     "is not modelled")


@traced
def mlx5_create_xrc_srq(ctx: Any, attr: ibv_srq_init_attr_ex) -> mlx5_srq:
    """Mirrors mlx5_create_xrc_srq(): the size checks and ring of mlx5_create_srq;
    with CQE version 1 a user index from the context's table (the CQEs name the
    SRQ by it); CREATE_XSRQ with the domain and the CQ (ibv_cmd_create_srq_ex)."""
    a = attr.attr
    if u32(a.max_wr) > ctx.max_srq_recv_wr:
        raise VerbsError(errno.EINVAL, f"mlx5_create_xrc_srq: max_wr {u32(a.max_wr)}, "
                         f"max_srq_recv_wr {ctx.max_srq_recv_wr}")
    if u32(a.max_sge) > ctx.max_rq_desc_sz // DATA_SEG_SIZE:
        raise VerbsError(errno.EINVAL, f"mlx5_create_xrc_srq: max_sge {u32(a.max_sge)}")
    srq = mlx5_srq(ctx, attr.pd, max_gs=u32(a.max_sge))
    mlx5_alloc_srq_buf(ctx, srq, u32(a.max_wr))
    undo = [lambda: mlx5_free_actual_buf(ctx, srq.pd, srq.buf, srq.buf_size, srq.buf_type,
                                         MLX5DV_RES_TYPE_SRQ)]
    try:
        srq.db, srq.custom_db = mlx5_alloc_dbrec_pd(ctx, srq.pd)
        undo.append(lambda: mlx5_free_db_pd(ctx, srq.db, srq.pd, srq.custom_db))
        if not srq.custom_db:
            ctx.proc.store(srq.db, bytes(4))
        srq.wq_sig = mlx5_env.srq_sig_enabled(ctx.proc.environ)
        drv = mlx5_ib_create_srq(buf_addr=srq.buf, db_addr=srq.db,
                                 flags=MLX5_SRQ_FLAG_SIGNATURE if srq.wq_sig else 0)
        a.max_sge = srq.max_gs
        if ctx.cqe_version:
            i = 0
            while i in ctx.uidx_table:
                i += 1
            ctx.uidx_table[i] = srq
            srq.uidx = i
            undo.append(lambda: ctx.uidx_table.pop(srq.uidx, None))
        drv.uidx = srq.uidx
        a.max_wr = srq.max - 1
        resp, dresp = c.ibv_cmd_create_srq_ex(ctx, srq, attr, drv, mlx5_ib_create_srq_resp,
                                              verbs_obj_handle(srq))
    except BaseException:
        for fn in reversed(undo):
            fn()
        raise
    a.max_wr -= 1
    srq.handle = resp.srq_handle
    srq.srqn = dresp.srqn
    return srq


@traced
def mlx5_open_xrcd(context: Any, attr: ibv_xrcd_init_attr) -> ibv_xrcd:
    """Mirrors mlx5_open_xrcd(): ibv_cmd_open_xrcd."""
    return ibv_xrcd(context, c.ibv_cmd_open_xrcd(context, attr))


@traced
def mlx5_close_xrcd(xrcd: ibv_xrcd) -> None:
    """Mirrors mlx5_close_xrcd(): ibv_cmd_close_xrcd."""
    c.ibv_cmd_close_xrcd(xrcd)


@traced
def mlx5_post_srq_recv(srq: mlx5_srq, wr: Any, bad_wr: list | None = None) -> int:
    """Mirrors mlx5_post_srq_recv(): per WR, EINVAL for more SGEs than a WQE holds,
    ENOMEM when the SRQ is full (head == tail); the WQE at head (its data
    segments, ended by an invalid-lkey segment when short), head to the next
    free WQE; then the doorbell record = the posted count."""
    proc = srq.context.proc
    nreq, err = 0, 0
    while wr is not None:
        if len(wr.sg_list) > srq.max_gs:
            err = errno.EINVAL
            break
        if srq.head == srq.tail:
            err = errno.ENOMEM
            break
        srq.wrid[srq.head] = u64(wr.wr_id)
        wqe = get_wqe(srq, srq.head)
        nxt = _get_next(srq, srq.head)
        segs = [struct.pack(">IIQ", u32(s.length), u32(s.lkey), u64(s.addr))
                for s in wr.sg_list]
        if len(segs) < srq.max_gs:
            segs.append(struct.pack(">IIQ", 0, MLX5_INVALID_LKEY, 0))
        proc.store(wqe + NEXT_SEG_SIZE, b"".join(segs))
        srq.head = nxt & (srq.max - 1)
        nreq += 1
        wr = wr.next
    if nreq:
        srq.counter += nreq
        proc.store(srq.db, struct.pack(">I", srq.counter & 0xFFFFFFFF))
    if err and bad_wr is not None:
        bad_wr.append(wr)
    return err


def mlx5_free_srq_wqe(srq: mlx5_srq, ind: int) -> None:
    """Mirrors mlx5_free_srq_wqe(): link WQE ind after the tail; it is the new tail."""
    _set_next(srq, srq.tail, ind)
    srq.tail = ind


@traced
def mlx5_modify_srq(srq: mlx5_srq, attr: ibv_srq_attr, attr_mask: int) -> None:
    """Mirrors mlx5_modify_srq(): ibv_cmd_modify_srq."""
    c.ibv_cmd_modify_srq(srq, attr, attr_mask)


@traced
def mlx5_query_srq(srq: mlx5_srq, attr: ibv_srq_attr) -> None:
    """Mirrors mlx5_query_srq(): ibv_cmd_query_srq."""
    c.ibv_cmd_query_srq(srq, attr)


def mlx5_get_srq_num(srq: mlx5_srq) -> int:
    """Mirrors mlx5_get_srq_num(): the SRQ number the kernel answered."""
    return srq.srqn


@traced
def mlx5_destroy_srq(srq: mlx5_srq) -> None:
    """Mirrors mlx5_destroy_srq(): DESTROY_SRQ (EBUSY while a QP uses it: nothing
    freed; ibv_cmd_destroy_srq waits for the async events it reported to be
    acknowledged - here after the frees, see verbs_async), then the doorbell record
    and the ring."""
    resp = c.ibv_cmd_destroy_srq(srq)
    ctx = srq.context
    if srq.srq_type == IBV_SRQT_XRC and ctx.uidx_table.get(srq.uidx) is srq:
        del ctx.uidx_table[srq.uidx]               # mlx5_clear_uidx
    mlx5_free_db_pd(ctx, srq.db, srq.pd, srq.custom_db)
    mlx5_free_actual_buf(ctx, srq.pd, srq.buf, srq.buf_size, srq.buf_type,
                         MLX5DV_RES_TYPE_SRQ)
    ibv_destroy_wait_events(srq, "events_completed", resp.events_reported,
                            "ibv_destroy_srq")

"""Mirrors the queue-sizing functions of rdma-core providers/mlx5/verbs.c (mlx5_calc_*).

Before create_qp allocates the QP buffer it turns the caller's capabilities
into WQE sizes and counts:

    sq_overhead         the fixed segments in front of a send WQE's data:
                        the largest operation the QP may post (ctrl; +raddr;
                        +atomic; UMR/bind-MW 192) plus the transport's
                        segment (UD/DCI datagram 48, XRC 16, RAW eth 32)
    mlx5_calc_send_wqe  overhead + gather list or inline data, in 64-byte BBs
    mlx5_calc_sq_size   power-of-two SQ bytes; writes back max_inline_data
    mlx5_calc_rcv_wqe   16 bytes per scatter entry (+16 signature), pow2
    mlx5_calc_rq_size   power-of-two RQ bytes, at least one 64-byte BB
    mlx5_calc_wq_size   both; the RQ comes first in the buffer

The five mlx5_calc_* functions are @traced (sq_overhead is not: it is a
helper of them), so a create_qp trace shows the sizing steps rdma-core's
create_qp takes, in its order: sq, send_wqe, then rq, rcv_wqe.

Errors raise ProviderError(EINVAL, "function: reason") where rdma-core
returns -EINVAL (create_qp then sets errno and fails).  The functions read
and write the same fields as the C code: the QP's `sq`/`rq` (mlx5_wq),
`wq_sig`, `flags`, `dc_type`, `max_inline_data`, `max_tso_header`; the
caller's init attr (`qp_type`, `cap`, `srq`, `comp_mask`, `send_ops_flags`,
`max_tso_header`); the context limits from alloc_ucontext (`max_sq_desc_sz`,
`max_rq_desc_sz`, `max_send_wqebb`, `max_recv_wr`).

EMU: the out-of-order RQ variant of newer rdma-core (doubled receive WQEs)
is not modelled.
"""

from __future__ import annotations

import errno
from typing import Any, Protocol

import attrs

from kernel_model.trace import traced
from userspace.libibverbs.cint import s32, u16, u32, u64
from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5dv import (
    MLX5_QP_FLAGS_USE_UNDERLAY,
    MLX5_RWQE_SIG_SIZE,
    MLX5_SEND_WQE_BB,
    MLX5_SEND_WQE_SHIFT,
    MLX5_WQE_ATOMIC_SEG_SIZE,
    MLX5_WQE_CTRL_SEG_SIZE,
    MLX5_WQE_DATA_SEG_SIZE,
    MLX5_WQE_DATAGRAM_SEG_SIZE,
    MLX5_WQE_ETH_PAD_SIZE,
    MLX5_WQE_ETH_SEG_SIZE,
    MLX5_WQE_INL_DATA_SEG_SIZE,
    MLX5_WQE_MKEY_CONTEXT_SEG_SIZE,
    MLX5_WQE_RADDR_SEG_SIZE,
    MLX5_WQE_UMR_CTRL_SEG_SIZE,
    MLX5_WQE_UMR_KLM_SEG_SIZE,
    MLX5_WQE_XRC_SEG_SIZE,
    MLX5DV_DCTYPE_DCI,
    MLX5DV_QP_EX_WITH_MKEY_CONFIGURE,
    MLX5DV_QP_EX_WITH_MR_INTERLEAVED,
    MLX5DV_QP_EX_WITH_MR_LIST,
    MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
)

# libibverbs verbs.h: enum ibv_qp_type
IBV_QPT_RC = 2
IBV_QPT_UC = 3
IBV_QPT_UD = 4
IBV_QPT_RAW_PACKET = 8
IBV_QPT_XRC_SEND = 9
IBV_QPT_XRC_RECV = 10
IBV_QPT_DRIVER = 0xFF

# verbs.h: enum ibv_qp_init_attr_mask (the bits the sizing reads)
IBV_QP_INIT_ATTR_MAX_TSO_HEADER = 1 << 3
IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 1 << 6

# verbs.h: enum ibv_qp_create_send_ops_flags
IBV_QP_EX_WITH_RDMA_WRITE = 1 << 0
IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = 1 << 1
IBV_QP_EX_WITH_SEND = 1 << 2
IBV_QP_EX_WITH_SEND_WITH_IMM = 1 << 3
IBV_QP_EX_WITH_RDMA_READ = 1 << 4
IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = 1 << 5
IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = 1 << 6
IBV_QP_EX_WITH_LOCAL_INV = 1 << 7
IBV_QP_EX_WITH_BIND_MW = 1 << 8
IBV_QP_EX_WITH_SEND_WITH_INV = 1 << 9
IBV_QP_EX_WITH_TSO = 1 << 10

_RDMA_OPS = (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
             | IBV_QP_EX_WITH_RDMA_READ)
_ATOMIC_OPS = IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
_MW_OPS = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV
# the mlx5dv operations that post a UMR WQE (mkey configure included, as _sq_overhead)
_MLX5_MR_OPS = (MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MR_LIST
                | MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)

# the operations sq_overhead assumes when the caller names none
_CONNECTED_OPS = (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV
                  | IBV_QP_EX_WITH_SEND_WITH_IMM | _RDMA_OPS | _ATOMIC_OPS | _MW_OPS)
DEFAULT_SEND_OPS = {
    IBV_QPT_RC: _CONNECTED_OPS, IBV_QPT_UC: _CONNECTED_OPS, IBV_QPT_DRIVER: _CONNECTED_OPS,
    IBV_QPT_XRC_RECV: _CONNECTED_OPS, IBV_QPT_XRC_SEND: _CONNECTED_OPS,
    IBV_QPT_UD: IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_TSO,
    IBV_QPT_RAW_PACKET: IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_TSO,
}


@attrs.define
class mlx5_wq:
    """Mirrors the sizing fields of struct mlx5_wq (one send or receive queue)."""

    wqe_cnt: int = 0
    wqe_shift: int = 0
    max_post: int = 0
    max_gs: int = 0
    offset: int = 0     # byte offset of the queue in the QP buffer
    # the data path's indices (mlx5_init_qp_indices resets them)
    head: int = 0       # WRs posted
    tail: int = 0       # WRs completed (advanced by poll_cq)
    cur_post: int = 0   # SQ: WQE basic blocks posted
    # max_gs while the QP's state lets this queue post (SQ: RTS; RQ: INIT..RTS),
    # -1 otherwise: the data path's state check (rdma-core's qp_state_max_gs)
    qp_state_max_gs: int = -1
    wrid: list[int] = attrs.Factory(list)       # wr_id per WQE index
    wqe_head: list[int] = attrs.Factory(list)   # SQ: head at the time of each WQE
    wr_data: list[int] = attrs.Factory(list)

    def __repr__(self) -> str:
        return (f"wq cnt={self.wqe_cnt} stride={1 << self.wqe_shift if self.wqe_cnt else 0} "
                f"max_post={self.max_post} max_gs={self.max_gs} offset={self.offset:#x}")


class QpCap(Protocol):
    """struct ibv_qp_cap."""

    max_send_wr: int
    max_recv_wr: int
    max_send_sge: int
    max_recv_sge: int
    max_inline_data: int


class QpInitAttr(Protocol):
    """The struct ibv_qp_init_attr_ex fields the sizing reads (cap is written)."""

    qp_type: int
    cap: QpCap
    srq: Any            # only tested for None
    comp_mask: int
    send_ops_flags: int
    max_tso_header: int


class SizedQp(Protocol):
    """The struct mlx5_qp fields the sizing reads and writes."""

    sq: mlx5_wq
    rq: mlx5_wq
    wq_sig: bool
    flags: int
    dc_type: int
    max_inline_data: int
    max_tso_header: int


class QueueLimits(Protocol):
    """The mlx5_context limits copied from the alloc_ucontext response."""

    max_sq_desc_sz: int
    max_rq_desc_sz: int
    max_send_wqebb: int
    max_recv_wr: int


def align(val: int, a: int) -> int:
    """Mirrors util.h align(): round up to a multiple of the power of two a, in
    unsigned long (a negative int argument is sign-extended, the sum wraps)."""
    return u64(u64(val) + a - 1) & ~(a - 1)


def roundup_pow_of_two(n: int) -> int:
    """Mirrors util.h roundup_pow_of_two() on a uint64_t: 1 for 0 and 1.

    EMU: for 0 the C shifts 1ULL by 64, which x86 reads as a shift by 0 (1).
    """
    n = u64(n)
    return 1 << ((n - 1).bit_length() & 63) if n > 1 else 1


def c_div(a: int, b: int) -> int:
    """C's integer division, which truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def ilog32(v: int) -> int:
    """Mirrors ccan ilog32(): bits needed to hold v (0 for 0), i.e. floor(log2 v) + 1."""
    return v.bit_length()


def _einval(func: str, reason: str) -> ProviderError:
    return ProviderError(errno.EINVAL, f"{func}: {reason}")


def _sq_overhead(qp: SizedQp, qp_type: int, ops: int, mlx5_ops: int) -> int:
    """Mirrors _sq_overhead(): the largest operation's segments plus the transport's."""
    size = MLX5_WQE_CTRL_SEG_SIZE
    if ops & _RDMA_OPS:
        size = max(size, MLX5_WQE_CTRL_SEG_SIZE + MLX5_WQE_RADDR_SEG_SIZE)
    if ops & _ATOMIC_OPS:
        size = max(size, MLX5_WQE_CTRL_SEG_SIZE + MLX5_WQE_RADDR_SEG_SIZE
                   + MLX5_WQE_ATOMIC_SEG_SIZE)
    if ops & _MW_OPS or mlx5_ops & _MLX5_MR_OPS:
        size = max(size, MLX5_WQE_CTRL_SEG_SIZE + MLX5_WQE_UMR_CTRL_SEG_SIZE
                   + MLX5_WQE_MKEY_CONTEXT_SEG_SIZE + max(MLX5_WQE_UMR_KLM_SEG_SIZE, 64))
    if qp_type == IBV_QPT_DRIVER and qp.dc_type != MLX5DV_DCTYPE_DCI:
        raise _einval("_sq_overhead", "an IBV_QPT_DRIVER send queue must be a DCI")
    if qp_type in (IBV_QPT_DRIVER, IBV_QPT_UD):
        size += MLX5_WQE_DATAGRAM_SEG_SIZE
        if qp.flags & MLX5_QP_FLAGS_USE_UNDERLAY:
            size += MLX5_WQE_ETH_SEG_SIZE + MLX5_WQE_ETH_PAD_SIZE
    elif qp_type in (IBV_QPT_XRC_RECV, IBV_QPT_XRC_SEND):
        size += MLX5_WQE_XRC_SEG_SIZE
    elif qp_type == IBV_QPT_RAW_PACKET:
        size += MLX5_WQE_ETH_SEG_SIZE
    elif qp_type not in (IBV_QPT_RC, IBV_QPT_UC):
        raise _einval("_sq_overhead", f"no send queue for QP type {qp_type}")
    return size


def sq_overhead(qp: SizedQp, attr: QpInitAttr, mlx5_qp_attr: Any = None) -> int:
    """Mirrors sq_overhead(): the caller's send ops, or the QP type's defaults."""
    if attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS:
        ops = attr.send_ops_flags
    elif attr.qp_type in DEFAULT_SEND_OPS:
        ops = DEFAULT_SEND_OPS[attr.qp_type]
    else:
        raise _einval("sq_overhead", f"no default send ops for QP type {attr.qp_type}")
    mlx5_ops = 0
    if mlx5_qp_attr is not None and (mlx5_qp_attr.comp_mask
                                     & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS):
        mlx5_ops = mlx5_qp_attr.send_ops_flags
    return _sq_overhead(qp, attr.qp_type, ops, mlx5_ops)


@traced
def mlx5_calc_send_wqe(ctx: QueueLimits, attr: QpInitAttr, qp: SizedQp,
                       mlx5_qp_attr: Any = None) -> int:
    """Mirrors mlx5_calc_send_wqe(): one send WQE's size, a multiple of 64.

    Big enough for the overhead plus either the gather list (16 bytes per SGE)
    or the inline data (a 4-byte header, 16-byte aligned), whichever is larger.
    The C keeps sizes in ints and the caps in uint32_t and mixes them with
    size_t: every step wraps as it does there (a max_inline_data near 2^32
    wraps inl_size to a small number; a max_gather below 0 compares as a huge
    unsigned).  A negative result is the C's negative return, an errno.
    """
    cap = attr.cap
    size = sq_overhead(qp, attr, mlx5_qp_attr)
    inl_size = 0
    if u32(cap.max_inline_data):
        inl_size = s32(size + align(MLX5_WQE_INL_DATA_SEG_SIZE + u32(cap.max_inline_data), 16))
    if attr.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER:
        size = s32(size + align(u16(attr.max_tso_header), 16))
        qp.max_tso_header = u16(attr.max_tso_header)
    max_gather = s32(u64(ctx.max_sq_desc_sz - size) // MLX5_WQE_DATA_SEG_SIZE)
    if u32(cap.max_send_sge) > u32(max_gather):
        raise _einval("mlx5_calc_send_wqe",
                      f"max_send_sge {u32(cap.max_send_sge)} > max_gather {max_gather}")
    size = s32(size + u32(cap.max_send_sge) * MLX5_WQE_DATA_SEG_SIZE)
    tot_size = max(size, inl_size)
    if tot_size > ctx.max_sq_desc_sz:
        raise _einval("mlx5_calc_send_wqe",
                      f"WQE {tot_size} bytes > max_sq_desc_sz {ctx.max_sq_desc_sz}")
    return s32(align(tot_size, MLX5_SEND_WQE_BB))


@traced
def mlx5_calc_sq_size(ctx: QueueLimits, attr: QpInitAttr, qp: SizedQp,
                      mlx5_qp_attr: Any = None) -> int:
    """Mirrors mlx5_calc_sq_size(): SQ bytes (0 without send WRs).

    The inline data that fits in the rounded-up WQE is written back to
    attr.cap.max_inline_data, as rdma-core reports it to the caller.  Without
    SGEs or inline data that is the WQE minus the overhead minus the inline
    header: -4 in the QP's int, (u32)-4 in the caller's cap - and the QP is
    still created, as rdma-core creates it.
    """
    cap = attr.cap
    if not u32(cap.max_send_wr):
        return 0
    wqe_size = mlx5_calc_send_wqe(ctx, attr, qp, mlx5_qp_attr)
    if wqe_size < 0:
        raise ProviderError(-wqe_size, f"mlx5_calc_send_wqe: returned {wqe_size}")
    if wqe_size > ctx.max_sq_desc_sz:
        raise _einval("mlx5_calc_sq_size",
                      f"WQE {wqe_size} bytes > max_sq_desc_sz {ctx.max_sq_desc_sz}")
    qp.max_inline_data = s32(wqe_size - sq_overhead(qp, attr, mlx5_qp_attr)
                             - MLX5_WQE_INL_DATA_SEG_SIZE)
    cap.max_inline_data = u32(qp.max_inline_data)
    # keep max_send_wr * wqe_size inside an int, as the C code does
    if u32(cap.max_send_wr) > 0x7FFFFFFF // ctx.max_sq_desc_sz:
        raise _einval("mlx5_calc_sq_size", f"max_send_wr {u32(cap.max_send_wr)} overflows")
    wq_size = s32(roundup_pow_of_two(u32(u32(cap.max_send_wr) * u32(wqe_size))))
    qp.sq.wqe_cnt = u32(c_div(wq_size, MLX5_SEND_WQE_BB))
    if qp.sq.wqe_cnt > u32(ctx.max_send_wqebb):
        raise _einval("mlx5_calc_sq_size",
                      f"{qp.sq.wqe_cnt} WQEBBs > max_send_wqebb {ctx.max_send_wqebb}")
    qp.sq.wqe_shift = MLX5_SEND_WQE_SHIFT
    qp.sq.max_gs = s32(u32(cap.max_send_sge))
    qp.sq.max_post = u32(c_div(wq_size, wqe_size))
    return wq_size


@traced
def mlx5_calc_rcv_wqe(ctx: QueueLimits, attr: QpInitAttr, qp: SizedQp) -> int:
    """Mirrors mlx5_calc_rcv_wqe(): one receive WQE's size (0 with an SRQ); the
    size is a uint32_t, the scatter count an int."""
    if attr.srq is not None:
        return 0
    num_scatter = s32(max(u32(attr.cap.max_recv_sge), 1))
    size = u32(MLX5_WQE_DATA_SEG_SIZE * u64(num_scatter))
    if qp.wq_sig:
        size = u32(size + MLX5_RWQE_SIG_SIZE)
    if size > u32(ctx.max_rq_desc_sz):
        raise _einval("mlx5_calc_rcv_wqe",
                      f"WQE {size} bytes > max_rq_desc_sz {ctx.max_rq_desc_sz}")
    return s32(u32(roundup_pow_of_two(size)))


@traced
def mlx5_calc_rq_size(ctx: QueueLimits, attr: QpInitAttr, qp: SizedQp) -> int:
    """Mirrors mlx5_calc_rq_size(): RQ bytes (0 without receive WRs or with an SRQ)."""
    max_recv_wr = u32(attr.cap.max_recv_wr)
    if not max_recv_wr:
        return 0
    if max_recv_wr > u32(ctx.max_recv_wr):      # mlx5_get_max_recv_wr()
        raise _einval("mlx5_calc_rq_size", f"max_recv_wr {max_recv_wr} > {ctx.max_recv_wr}")
    wqe_size = mlx5_calc_rcv_wqe(ctx, attr, qp)
    if wqe_size < 0 or wqe_size > ctx.max_rq_desc_sz:
        raise _einval("mlx5_calc_rq_size",
                      f"WQE {wqe_size} bytes > max_rq_desc_sz {ctx.max_rq_desc_sz}")
    wq_size = s32(roundup_pow_of_two(max_recv_wr) * wqe_size)
    if wqe_size:
        wq_size = max(wq_size, MLX5_SEND_WQE_BB)
        qp.rq.wqe_cnt = u32(c_div(wq_size, wqe_size))
        qp.rq.wqe_shift = ilog32(u32(wqe_size - 1))
        qp.rq.max_post = u32(1 << (ilog32(u32(qp.rq.wqe_cnt - 1)) & 31))
        qp.rq.max_gs = s32(c_div(wqe_size - (MLX5_RWQE_SIG_SIZE if qp.wq_sig else 0),
                                 MLX5_WQE_DATA_SEG_SIZE))
    else:
        qp.rq.wqe_cnt = qp.rq.wqe_shift = qp.rq.max_post = qp.rq.max_gs = 0
    return wq_size


@traced
def mlx5_calc_wq_size(ctx: QueueLimits, attr: QpInitAttr, qp: SizedQp,
                      mlx5_qp_attr: Any = None) -> int:
    """Mirrors mlx5_calc_wq_size(): the QP buffer's bytes, RQ first then SQ."""
    result = mlx5_calc_sq_size(ctx, attr, qp, mlx5_qp_attr)
    rq_bytes = mlx5_calc_rq_size(ctx, attr, qp)
    qp.sq.offset = rq_bytes
    qp.rq.offset = 0
    return s32(result + rq_bytes)


def create_qp_buf_sizes(qp: SizedQp, qp_type: int, wq_size: int) -> tuple[int, int]:
    """Mirrors the buffer split in create_qp(): (buf_size, sq_buf_size).

    RAW packet and underlay QPs keep the SQ in a buffer of its own (the main
    buffer then holds the RQ only, and sq.offset becomes 0); every other QP has
    one buffer.  mlx5_alloc_qp_buf rounds each up to whole pages.
    """
    if qp_type == IBV_QPT_RAW_PACKET or qp.flags & MLX5_QP_FLAGS_USE_UNDERLAY:
        buf_size = qp.sq.offset
        qp.sq.offset = 0
        return buf_size, wq_size - buf_size
    return wq_size, 0

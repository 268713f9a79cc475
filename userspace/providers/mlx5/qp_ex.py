"""Mirrors rdma-core providers/mlx5/qp.c's new post-send API (mlx5_send_wr_*).

A QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS gets an ibv_qp_ex whose ops
mlx5_qp_fill_wr_pfns fills in by QP type - every op libmlx5 supports for that
type, whatever the caller asked for; a send_ops_flags bit outside the type's
set (or an atomic on a device without atomics) is EOPNOTSUPP.

A batch is wr_start, then per WR one builder (wr_send, wr_rdma_write,
wr_atomic_cmp_swp ...: the control segment with ibqp->wr_id / wr_flags, and the
remote-address and atomic segments) and its setters (wr_set_sge / _list,
wr_set_inline_data / _list; UD also wr_set_ud_addr), then wr_complete, which
rings the doorbell once as ibv_post_send does (post_send_db), or wr_abort.  The
WQE is finished by the setter that completes it: the data setter for RC/UC,
the second of (address, data) for UD.  A failure (a full queue, too many SGEs,
inline data beyond max_inline_data) is remembered in the QP and reported by
wr_complete, which then rolls the queue back: nothing of the batch is posted.
A QP moved to RESET answers wr_complete with EINVAL until it is back in RTS
(mlx5_qp_fill_wr_complete_error / _real).

The segments are the ones ibv_post_send writes (qp.py: set_raddr_seg,
set_atomic_seg, _data_seg, the datagram segment), stored into the SQ ring with
the same wrap at its end.

# EMU: each WQE is assembled here and stored into the ring when its last setter
# finishes it (C writes each segment into the ring as it goes; the ring's bytes
# after wr_complete are the same).  Of the mlx5dv_qp_ex ops only the DC address
# setters and the raw WQE; no TSO / raw packet QPs.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

import attrs

from userspace.libibverbs.cint import u32, u64
from userspace.libibverbs.verbs import ibv_qp_ex
from userspace.providers.mlx5.ah import set_datagram_seg
from userspace.providers.mlx5.qp import (
    IBV_ACCESS_ZERO_BASED,
    IBV_MW_TYPE_2,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_SEND,
    IBV_SEND_FENCE,
    IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
    IBV_WC_BIND_MW,
    IBV_WC_LOCAL_INV,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV,
    IBV_WR_RDMA_READ,
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
    IBV_WR_SEND_WITH_INV,
    MLX5_IB_OPCODE,
    MLX5_INLINE_SEG,
    MLX5_SEND_WQE_BB,
    MLX5_WQE_CTRL_CQ_UPDATE,
    MLX5_WQE_CTRL_FENCE,
    MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE,
    MLX5_WQE_CTRL_SOLICITED,
    _no_bind,
    _store_ring,
    mlx5_wq_overflow,
    post_send_db,
    set_atomic_seg,
    set_bind_wr,
    set_raddr_seg,
)

# verbs.h: enum ibv_qp_create_send_ops_flags
IBV_QP_EX_WITH_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = 1 << 0, 1 << 1
IBV_QP_EX_WITH_SEND, IBV_QP_EX_WITH_SEND_WITH_IMM = 1 << 2, 1 << 3
IBV_QP_EX_WITH_RDMA_READ, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = 1 << 4, 1 << 5
IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_LOCAL_INV = 1 << 6, 1 << 7
IBV_QP_EX_WITH_BIND_MW, IBV_QP_EX_WITH_SEND_WITH_INV = 1 << 8, 1 << 9
IBV_QP_EX_WITH_TSO = 1 << 10

# the send ops libmlx5 supports per QP type (MLX5_SUPPORTED_SEND_OPS_FLAGS_*)
MLX5_SUPPORTED_SEND_OPS_FLAGS_RC = (
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW)
MLX5_SUPPORTED_SEND_OPS_FLAGS_XRC = (
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW)
MLX5_SUPPORTED_SEND_OPS_FLAGS_UD = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM
MLX5_SUPPORTED_SEND_OPS_FLAGS_UC = (
    IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW)

WQE_REQ_SETTERS_UD_XRC_DC = 2
IBV_QPT_DRIVER = 0xFF
# mlx5dv.h: mlx5dv_qp_init_attr's comp_mask bits, dc_type and dv send ops the ops read
MLX5DV_QP_INIT_ATTR_MASK_DC, MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS = 1 << 1, 1 << 2
MLX5DV_DCTYPE_DCI = 2
MLX5DV_QP_EX_WITH_RAW_WQE, MLX5DV_QP_EX_WITH_MEMCPY = 1 << 3, 1 << 4
MLX5DV_QP_EX_ALL = (1 << 5) - 1     # MR interleaved, MR list, mkey configure, raw WQE, memcpy
IBV_WC_DRIVER2 = 136
IBV_QPS_RESET, IBV_QPS_RTS = 0, 3
DATAGRAM_SEG = 48
XRC_SEG = 16          # sizeof(struct mlx5_wqe_xrc_seg)


@attrs.define(eq=False)
class mlx5_qp_ex(ibv_qp_ex):
    """struct ibv_qp_ex plus the batch state libmlx5 keeps in struct mlx5_qp
    (cur_post_rb, fm_cache_rb, err, nreq, inl_wqe, cur_ctrl, cur_size,
    cur_setters_cnt); `wqe` is the WQE being built, None once it is stored."""

    cur_post_rb: int = 0
    fm_cache_rb: int = 0
    err: int = 0
    nreq: int = 0
    inl_wqe: bool = False
    cur_ctrl: bytes = b""
    cur_size: int = 0
    cur_setters_cnt: int = 0
    wqe: bytearray | None = None
    wqe_idx: int = 0
    complete_error: bool = False     # wr_complete is mlx5_send_wr_complete_error


def _set_err(qpx: mlx5_qp_ex, err: int) -> None:
    if not qpx.err:
        qpx.err = err


# -- start, complete, abort --------------------------------------------------------------
def mlx5_send_wr_start(qpx: mlx5_qp_ex) -> None:
    """Mirrors mlx5_send_wr_start(): remember where the queue was, clear the batch."""
    qp = qpx.qp_base
    qpx.cur_post_rb, qpx.fm_cache_rb = qp.sq.cur_post, qp.fm_cache
    qpx.err = qpx.nreq = 0
    qpx.inl_wqe = False
    qpx.wqe = None


def _rollback(qpx: mlx5_qp_ex) -> None:
    qp = qpx.qp_base
    qp.sq.cur_post, qp.fm_cache = qpx.cur_post_rb, qpx.fm_cache_rb
    qpx.wqe = None


def mlx5_send_wr_complete(qpx: mlx5_qp_ex) -> int:
    """Mirrors mlx5_send_wr_complete() / mlx5_send_wr_complete_error(): EINVAL and a
    rollback while the QP is out of RTS after a RESET; the first error of the batch
    and a rollback; else the doorbell record and doorbell for the batch's WQEs."""
    if qpx.complete_error:
        _rollback(qpx)
        return errno.EINVAL
    if qpx.err:
        _rollback(qpx)
        return qpx.err
    qp = qpx.qp_base
    post_send_db(qp, qp.bf, qpx.nreq, qpx.inl_wqe, qpx.cur_size, qpx.cur_ctrl)
    qpx.wqe = None
    return 0


def mlx5_send_wr_abort(qpx: mlx5_qp_ex) -> None:
    """Mirrors mlx5_send_wr_abort(): roll the queue back."""
    _rollback(qpx)


# -- builders ----------------------------------------------------------------------------
def _common_wqe_init(qpx: mlx5_qp_ex, ib_op: int, transport: bytes = b"") -> None:
    """Mirrors _common_wqe_init_op() and the builders' common tail: ENOMEM on a full
    queue; else the WR's wr_id in the queue's wrid[], a control segment from
    wr_flags (fence, CQ update, solicited) and the segments after it."""
    qp = qpx.qp_base
    qpx.wqe = None
    qpx.cur_setters_cnt = 0
    if mlx5_wq_overflow(qp.sq, qpx.nreq):
        _set_err(qpx, errno.ENOMEM)
        qpx.nreq += 1
        return
    idx = qp.sq.cur_post & (qp.sq.wqe_cnt - 1)
    qp.sq.wrid[idx] = u64(qpx.wr_id)
    qp.sq.wqe_head[idx] = qp.sq.head + qpx.nreq
    qp.sq.wr_data[idx] = 0
    flags = qpx.wr_flags
    fence = MLX5_WQE_CTRL_FENCE if flags & IBV_SEND_FENCE else qp.fm_cache
    qp.fm_cache = 0
    fm_ce_se = qp.sq_signal_bits | fence | \
        (MLX5_WQE_CTRL_CQ_UPDATE if flags & IBV_SEND_SIGNALED else 0) | \
        (MLX5_WQE_CTRL_SOLICITED if flags & IBV_SEND_SOLICITED else 0)
    ctrl = struct.pack(">IIBHBI", (qp.sq.cur_post & 0xFFFF) << 8 | MLX5_IB_OPCODE[ib_op],
                       0, 0, 0, fm_ce_se, 0)
    qpx.wqe = bytearray(ctrl + transport)
    qpx.wqe_idx = idx
    qpx.cur_size = len(qpx.wqe) // 16
    qpx.nreq += 1


def _set_imm(qpx: mlx5_qp_ex, imm_data: int) -> None:
    if qpx.wqe is not None:
        struct.pack_into(">I", qpx.wqe, 12, u32(imm_data))


def _common_wqe_finalize(qpx: mlx5_qp_ex) -> None:
    """Mirrors _common_wqe_finalize(): the size and QPN into the control segment;
    the WQE goes into the ring and the queue's counter moves past it."""
    wqe = qpx.wqe
    if wqe is None:
        return
    qp = qpx.qp_base
    struct.pack_into(">I", wqe, 4, qp.qp_num << 8 | qpx.cur_size)
    _store_ring(qp, qpx.wqe_idx, bytes(wqe) + bytes(-len(wqe) % MLX5_SEND_WQE_BB))
    qpx.cur_ctrl = bytes(wqe[:16])
    qp.sq.cur_post += -(-qpx.cur_size // 4)
    qpx.wqe = None


def _transport(qpx: mlx5_qp_ex) -> bytes:
    """The datagram segment's room in a UD WQE (filled by wr_set_ud_addr), the XRC
    segment's in an XRC send WQE (wr_set_xrc_srqn)."""
    qp_type = qpx.qp_base.qp_type
    if qp_type in (IBV_QPT_UD, IBV_QPT_DRIVER):       # a DCI's names the DCT
        return bytes(DATAGRAM_SEG)
    return bytes(XRC_SEG) if qp_type == IBV_QPT_XRC_SEND else b""


def mlx5_send_wr_send(qpx: mlx5_qp_ex) -> None:
    """Mirrors mlx5_send_wr_send_other()."""
    _common_wqe_init(qpx, IBV_WR_SEND, _transport(qpx))


def mlx5_send_wr_send_imm(qpx: mlx5_qp_ex, imm_data: int) -> None:
    """Mirrors mlx5_send_wr_send_imm(): imm_data (__be32) into the control segment."""
    _common_wqe_init(qpx, IBV_WR_SEND_WITH_IMM, _transport(qpx))
    _set_imm(qpx, imm_data)


def _rdma(qpx: mlx5_qp_ex, rkey: int, remote_addr: int, ib_op: int) -> None:
    """Mirrors _mlx5_send_wr_rdma(): the remote-address segment after the control one."""
    _common_wqe_init(qpx, ib_op, _transport(qpx) + set_raddr_seg(remote_addr, rkey))


def mlx5_send_wr_rdma_write(qpx: mlx5_qp_ex, rkey: int, remote_addr: int) -> None:
    _rdma(qpx, rkey, remote_addr, IBV_WR_RDMA_WRITE)


def mlx5_send_wr_rdma_write_imm(qpx: mlx5_qp_ex, rkey: int, remote_addr: int,
                                imm_data: int) -> None:
    _rdma(qpx, rkey, remote_addr, IBV_WR_RDMA_WRITE_WITH_IMM)
    _set_imm(qpx, imm_data)


def mlx5_send_wr_rdma_read(qpx: mlx5_qp_ex, rkey: int, remote_addr: int) -> None:
    _rdma(qpx, rkey, remote_addr, IBV_WR_RDMA_READ)


def _atomic(qpx: mlx5_qp_ex, rkey: int, remote_addr: int, compare_add: int, swap: int,
            ib_op: int) -> None:
    """Mirrors _mlx5_send_wr_atomic(): remote-address then atomic segment."""
    _common_wqe_init(qpx, ib_op, _transport(qpx) + set_raddr_seg(remote_addr, rkey)
                     + set_atomic_seg(ib_op, swap, compare_add))


def mlx5_send_wr_atomic_cmp_swp(qpx: mlx5_qp_ex, rkey: int, remote_addr: int, compare: int,
                                swap: int) -> None:
    _atomic(qpx, rkey, remote_addr, compare, swap, IBV_WR_ATOMIC_CMP_AND_SWP)


def mlx5_send_wr_atomic_fetch_add(qpx: mlx5_qp_ex, rkey: int, remote_addr: int,
                                  add: int) -> None:
    _atomic(qpx, rkey, remote_addr, add, 0, IBV_WR_ATOMIC_FETCH_AND_ADD)


def mlx5_send_wr_send_inv(qpx: mlx5_qp_ex, invalidate_rkey: int) -> None:
    """Mirrors mlx5_send_wr_send_inv(): a SEND whose ctrl immediate is the rkey the
    responder invalidates (htobe32)."""
    _common_wqe_init(qpx, IBV_WR_SEND_WITH_INV, _transport(qpx))
    _set_imm(qpx, invalidate_rkey)


def _umr(qpx: mlx5_qp_ex, ib_op: int, key: int, mw_type: int, rkey: int, bind_info: Any,
         wc_opcode: int) -> None:
    """The UMR WQE of a bind or a local invalidate (qp.py's set_bind_wr after the
    control segment, whose immediate is the key the UMR works on); the WQE is complete
    - no setter follows - and the next WQE gets the small initiator fence."""
    qp = qpx.qp_base
    try:
        seg = set_bind_wr(mw_type, rkey, bind_info, qp.qp_num)
    except OSError as e:
        _set_err(qpx, e.errno)
        return
    _common_wqe_init(qpx, ib_op, seg)
    if qpx.wqe is None:
        return
    _set_imm(qpx, key)
    qp.sq.wr_data[qpx.wqe_idx] = wc_opcode
    qp.fm_cache = MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE
    _common_wqe_finalize(qpx)


def mlx5_send_wr_bind_mw(qpx: mlx5_qp_ex, mw: Any, rkey: int, bind_info: Any) -> None:
    """Mirrors mlx5_send_wr_bind_mw(): mlx5_bind_mw's checks (EINVAL, EPERM - reported
    by wr_complete), then the bind's UMR WQE with `rkey` as the window's new key."""
    if bind_info.mr is None and (bind_info.addr or bind_info.length) or \
            bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED:
        _set_err(qpx, errno.EINVAL)
        return
    if bind_info.mr is not None and mw.pd is not bind_info.mr.pd:
        _set_err(qpx, errno.EPERM)
        return
    _umr(qpx, IBV_WR_BIND_MW, mw.rkey, mw.type, rkey, bind_info, IBV_WC_BIND_MW)


def mlx5_send_wr_local_inv(qpx: mlx5_qp_ex, invalidate_rkey: int) -> None:
    """Mirrors mlx5_send_wr_local_inv(): a UMR WQE freeing the type 2 window of
    invalidate_rkey (bound to this QP)."""
    _umr(qpx, IBV_WR_LOCAL_INV, invalidate_rkey, IBV_MW_TYPE_2, 0, _no_bind,
         IBV_WC_LOCAL_INV)


# -- setters -----------------------------------------------------------------------------
def _finish(qpx: mlx5_qp_ex) -> None:
    """RC/UC: the data setter finishes the WQE; UD and XRC: the second of their two
    setters."""
    if qpx.qp_base.qp_type not in (IBV_QPT_UD, IBV_QPT_XRC_SEND, IBV_QPT_DRIVER) or \
            qpx.cur_setters_cnt == WQE_REQ_SETTERS_UD_XRC_DC - 1:
        _common_wqe_finalize(qpx)
    else:
        qpx.cur_setters_cnt += 1


def _add(qpx: mlx5_qp_ex, seg: bytes) -> None:
    if qpx.wqe is not None:
        qpx.wqe += seg
        qpx.cur_size += len(seg) // 16


def mlx5_send_wr_set_sge(qpx: mlx5_qp_ex, lkey: int, addr: int, length: int) -> None:
    """Mirrors _mlx5_send_wr_set_sge(): one data segment (none for length 0)."""
    if u32(length):
        _add(qpx, struct.pack(">IIQ", u32(length), u32(lkey), u64(addr)))
    _finish(qpx)


def mlx5_send_wr_set_sge_list(qpx: mlx5_qp_ex, num_sge: int, sg_list: list) -> None:
    """Mirrors _mlx5_send_wr_set_sge_list(): ENOMEM beyond the queue's max_gs."""
    if num_sge > qpx.qp_base.sq.max_gs:
        _set_err(qpx, errno.ENOMEM)
        return
    for sge in sg_list[:num_sge]:
        if u32(sge.length):
            _add(qpx, struct.pack(">IIQ", u32(sge.length), u32(sge.lkey), u64(sge.addr)))
    _finish(qpx)


def _inline(qpx: mlx5_qp_ex, pieces: list[tuple[int, int]]) -> None:
    """Mirrors _mlx5_send_wr_set_inline_data(_list): ENOMEM once the total passes
    max_inline_data; the bytes are read from the caller's memory into one inline
    segment."""
    qp = qpx.qp_base
    total, data = 0, []
    for addr, length in pieces:
        total += length
        if total > qp.max_inline_data:
            _set_err(qpx, errno.ENOMEM)
            return
        data.append(qp.context.proc.load(addr, length) if length else b"")
    qpx.inl_wqe = True
    if total:
        seg = struct.pack(">I", total | MLX5_INLINE_SEG) + b"".join(data)
        _add(qpx, seg + bytes(-len(seg) % 16))


def mlx5_send_wr_set_inline_data(qpx: mlx5_qp_ex, addr: int, length: int) -> None:
    _inline(qpx, [(addr, length)])
    _finish(qpx)


def mlx5_send_wr_set_inline_data_list(qpx: mlx5_qp_ex, num_buf: int, buf_list: list) -> None:
    _inline(qpx, [(b.addr, b.length) for b in buf_list[:num_buf]])
    _finish(qpx)


def mlx5_send_wr_set_ud_addr(qpx: mlx5_qp_ex, ah: Any, remote_qpn: int,
                             remote_qkey: int) -> None:
    """Mirrors mlx5_send_wr_set_ud_addr(): the AH's address vector with the remote
    QPN and Q_Key into the datagram segment (_set_datagram_seg)."""
    if qpx.wqe is not None:
        qpx.wqe[16:16 + DATAGRAM_SEG] = set_datagram_seg(_UdWr(ah, remote_qpn, remote_qkey))
    _finish(qpx)


def mlx5_send_wr_set_xrc_srqn(qpx: mlx5_qp_ex, remote_srqn: int) -> None:
    """Mirrors mlx5_send_wr_set_xrc_srqn(): the target SRQ into the XRC segment."""
    if qpx.wqe is not None:
        struct.pack_into(">I", qpx.wqe, 16, u32(remote_srqn))
    _finish(qpx)


def mlx5_send_wr_set_dc_addr(qpx: mlx5_qp_ex, ah: Any, remote_dctn: int,
                             remote_dc_key: int) -> None:
    """Mirrors mlx5_send_wr_set_dc_addr(): the AH's address vector into the datagram
    segment, with the DCT number (and the extended-AV bit) and the 64-bit DC key."""
    if qpx.wqe is not None:
        seg = bytearray(set_datagram_seg(_UdWr(ah, remote_dctn, 0)))
        struct.pack_into(">Q", seg, 0, u64(remote_dc_key))
        qpx.wqe[16:16 + DATAGRAM_SEG] = seg
    _finish(qpx)


def mlx5_send_wr_set_dc_addr_stream(qpx: mlx5_qp_ex, ah: Any, remote_dctn: int,
                                    remote_dc_key: int, stream_id: int) -> None:
    """Mirrors mlx5_send_wr_set_dc_addr_stream(): the stream id into the control
    segment's dci_stream_channel_id (bytes 8-9), then mlx5_send_wr_set_dc_addr."""
    if qpx.wqe is not None:
        struct.pack_into(">H", qpx.wqe, 8, stream_id & 0xFFFF)
    mlx5_send_wr_set_dc_addr(qpx, ah, remote_dctn, remote_dc_key)


def mlx5_wr_raw_wqe(qpx: mlx5_qp_ex, wqe: bytes) -> None:
    """Mirrors mlx5_wr_raw_wqe(): the caller's WQE (its ctrl segment's ds 16-byte
    units) copied into the send queue as it is, but for the WQE index, which becomes
    the queue's; its completion reads as IBV_WC_DRIVER2 (wr_data).  A full queue is
    ENOMEM at wr_complete.
    # EMU: the WQE comes as bytes, not as a pointer into the process's memory."""
    qp = qpx.qp_base
    qpx.wqe = None
    if mlx5_wq_overflow(qp.sq, qpx.nreq):               # raw_wqe_init
        _set_err(qpx, errno.ENOMEM)
        return
    idx = qp.sq.cur_post & (qp.sq.wqe_cnt - 1)
    qp.sq.wrid[idx] = u64(qpx.wr_id)
    qp.sq.wqe_head[idx] = qp.sq.head + qpx.nreq
    qp.sq.wr_data[idx] = IBV_WC_DRIVER2
    qp.fm_cache = 0
    ds = wqe[7] & 0x3F
    buf = bytearray(wqe[:ds * 16])
    buf += bytes(ds * 16 - len(buf))
    word = struct.unpack_from(">I", buf, 0)[0] & 0xFF0000FF
    struct.pack_into(">I", buf, 0, word | (qp.sq.cur_post & 0xFFFF) << 8)
    _store_ring(qp, idx, bytes(buf) + bytes(-len(buf) % MLX5_SEND_WQE_BB))
    qpx.cur_ctrl = bytes(buf[:16])
    qpx.cur_size = ds
    qpx.nreq += 1
    qp.sq.cur_post += -(-ds // 4)                       # __wqe_finalize


@attrs.define
class _UdWr:
    """The wr.ud fields set_datagram_seg reads."""

    ah: Any
    remote_qpn: int
    remote_qkey: int


# -- creation ----------------------------------------------------------------------------
_RC_BUILDERS = {"wr_send": mlx5_send_wr_send, "wr_send_imm": mlx5_send_wr_send_imm,
                "wr_send_inv": mlx5_send_wr_send_inv, "wr_rdma_write": mlx5_send_wr_rdma_write,
                "wr_rdma_write_imm": mlx5_send_wr_rdma_write_imm,
                "wr_rdma_read": mlx5_send_wr_rdma_read,
                "wr_atomic_cmp_swp": mlx5_send_wr_atomic_cmp_swp,
                "wr_atomic_fetch_add": mlx5_send_wr_atomic_fetch_add,
                "wr_bind_mw": mlx5_send_wr_bind_mw, "wr_local_inv": mlx5_send_wr_local_inv}
_UC_BUILDERS = {k: _RC_BUILDERS[k] for k in ("wr_send", "wr_send_imm", "wr_send_inv",
                                              "wr_rdma_write", "wr_rdma_write_imm",
                                              "wr_bind_mw", "wr_local_inv")}
_UD_BUILDERS = {k: _RC_BUILDERS[k] for k in ("wr_send", "wr_send_imm")}
_SETTERS = {"wr_set_sge": mlx5_send_wr_set_sge, "wr_set_sge_list": mlx5_send_wr_set_sge_list,
            "wr_set_inline_data": mlx5_send_wr_set_inline_data,
            "wr_set_inline_data_list": mlx5_send_wr_set_inline_data_list}
_BY_TYPE = {IBV_QPT_RC: (MLX5_SUPPORTED_SEND_OPS_FLAGS_RC, _RC_BUILDERS),
            IBV_QPT_UC: (MLX5_SUPPORTED_SEND_OPS_FLAGS_UC, _UC_BUILDERS),
            IBV_QPT_UD: (MLX5_SUPPORTED_SEND_OPS_FLAGS_UD,
                         {**_UD_BUILDERS, "wr_set_ud_addr": mlx5_send_wr_set_ud_addr}),
            IBV_QPT_DRIVER: (MLX5_SUPPORTED_SEND_OPS_FLAGS_RC,         # ..._DCI: a DCI's
                             {**_RC_BUILDERS, "wr_set_dc_addr": mlx5_send_wr_set_dc_addr,
                              "wr_set_dc_addr_stream": mlx5_send_wr_set_dc_addr_stream}),
            IBV_QPT_XRC_SEND: (MLX5_SUPPORTED_SEND_OPS_FLAGS_XRC,
                               {**{k: v for k, v in _RC_BUILDERS.items() if k != "wr_send_inv"},
                                "wr_set_xrc_srqn": mlx5_send_wr_set_xrc_srqn})}


def mlx5_qp_fill_wr_pfns(qp: Any, send_ops_flags: int, mlx5_attr: Any = None) -> int:
    """Mirrors mlx5_qp_fill_wr_pfns(): 0 with qp.qp_ex's ops filled for the QP's
    type, or EOPNOTSUPP - atomics asked of a device without them, an op outside
    the type's supported set, dv send ops (mlx5_attr's, with
    MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS) libmlx5 does not know or the type does
    not take (an IBV_QPT_DRIVER QP is a DCI: the RC ops, raw WQE and memcpy, and the
    DC address setters), a type libmlx5 has no builders for here (EMU: raw packet
    QPs are not modelled here; the dv ops' builders - MR interleaved / list, mkey
    configure, raw WQE, memcpy - are not filled in)."""
    if not qp.atomics_enabled and send_ops_flags & (IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                                                    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD):
        return errno.EOPNOTSUPP
    mlx5_ops = mlx5_attr.send_ops_flags if mlx5_attr is not None and \
        mlx5_attr.comp_mask & MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS else 0
    if mlx5_ops & ~MLX5DV_QP_EX_ALL:
        return errno.EOPNOTSUPP
    by_type = _BY_TYPE.get(qp.qp_type)
    if qp.qp_type == IBV_QPT_DRIVER:
        if mlx5_attr is None or not mlx5_attr.comp_mask & MLX5DV_QP_INIT_ATTR_MASK_DC or \
                mlx5_attr.dc_init_attr.dc_type != MLX5DV_DCTYPE_DCI:
            return errno.EOPNOTSUPP
        if mlx5_ops & ~(MLX5DV_QP_EX_WITH_RAW_WQE | MLX5DV_QP_EX_WITH_MEMCPY):
            return errno.EOPNOTSUPP
    elif qp.qp_type != IBV_QPT_RC and mlx5_ops & ~MLX5DV_QP_EX_WITH_RAW_WQE:
        return errno.EOPNOTSUPP
    if by_type is None or send_ops_flags & ~by_type[0]:
        return errno.EOPNOTSUPP
    qpx = mlx5_qp_ex(qp)
    qpx.ops.update(wr_start=mlx5_send_wr_start, wr_complete=mlx5_send_wr_complete,
                   wr_abort=mlx5_send_wr_abort, **by_type[1], **_SETTERS)
    if mlx5_ops:
        qpx.ops["wr_raw_wqe"] = mlx5_wr_raw_wqe
    qp.qp_ex = qpx
    return 0


def set_qp_operational_state(qp: Any, state: int) -> None:
    """Mirrors the wr_complete part of set_qp_operational_state(): after RESET the
    batch fails with EINVAL (mlx5_qp_fill_wr_complete_error) until RTS
    (mlx5_qp_fill_wr_complete_real)."""
    qpx = qp.qp_ex
    if qpx is None:
        return
    if state == IBV_QPS_RESET:
        qpx.complete_error = True
    elif state == IBV_QPS_RTS:
        qpx.complete_error = False


"""Mirrors rdma-core providers/mlx5/qp.c: posting work requests and ringing the doorbell.

Posting a send is three steps, all in user space (mlx5_post_send, post_send_db):
  1. write the WQE into the SQ ring, in 64-byte basic blocks: a control
     segment (opcode, WQE counter, QPN, size in 16-byte units, completion
     flag, immediate), a remote-address segment for RDMA (RC/UC) or the
     datagram segment of a UD QP (set_datagram_seg: the AH's address vector,
     remote QPN and Q_Key), then data segments
     (lkey, address, length) or one inline segment carrying the bytes;
  2. store the new WQE counter in the doorbell record (big-endian, in host
     memory the HCA reads by DMA);
  3. ring the doorbell: one 64-bit write of the control segment's first 8
     bytes to the QP's BlueFlame register, or - for a single small WQE - a
     BlueFlame copy of the whole WQE there, so the HCA need not fetch it.
     Either way the register's offset then toggles between its two halves.
Posting a receive writes data segments into the RQ ring and updates the
doorbell record only: the HCA reads receive WQEs when a message arrives.

Immediate errors are rdma-core's: ENOMEM for a full queue, for too many
SGEs and - through qp_state_max_gs being -1 - for a QP whose state does not
allow posting (the send queue needs RTS, the receive queue INIT or later);
EINVAL for an unknown opcode, EINVAL for too many receive SGEs; ENOMEM for
inline data beyond max_inline_data.  bad_wr names the first WR not posted.

A memory-window bind (ibv_bind_mw, IBV_WR_BIND_MW) or a local invalidate
(IBV_WR_LOCAL_INV) is a UMR WQE (set_bind_wr: the umr ctrl, mkey context and KLM
segments, the window's key in the control segment's immediate); SEND_WITH_INV
carries the rkey to invalidate there.

# EMU: the per-queue and per-register pthread spinlocks are not modelled (a
# thread can be preempted only at the MMIO write); no signature or fence
# operations.  The ibv_wr_* interface is in qp_ex.py.
# EMU: a RAW_PACKET QP's send WQE gets no Ethernet segment (set_eth_seg's inline L2
# headers): the device model has no raw packet data path to read one.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

from kernel_model import trace
from kernel_model.trace import traced, tracepoint
from userspace.libibverbs.cint import s32, u32, u64
from userspace.providers.mlx5.ah import set_datagram_seg

# enum ibv_wr_opcode -> the mlx5 WQE opcode (mlx5_ib_opcode[])
IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND = 0, 1, 2
IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ = 3, 4
IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD = 5, 6
MLX5_OPCODE_RDMA_WRITE, MLX5_OPCODE_RDMA_WRITE_IMM, MLX5_OPCODE_SEND = 0x08, 0x09, 0x0A
MLX5_OPCODE_SEND_IMM, MLX5_OPCODE_RDMA_READ = 0x0B, 0x10
MLX5_OPCODE_ATOMIC_CS, MLX5_OPCODE_ATOMIC_FA = 0x11, 0x12
MLX5_IB_OPCODE = {IBV_WR_RDMA_WRITE: MLX5_OPCODE_RDMA_WRITE,
                  IBV_WR_RDMA_WRITE_WITH_IMM: MLX5_OPCODE_RDMA_WRITE_IMM,
                  IBV_WR_SEND: MLX5_OPCODE_SEND, IBV_WR_SEND_WITH_IMM: MLX5_OPCODE_SEND_IMM,
                  IBV_WR_RDMA_READ: MLX5_OPCODE_RDMA_READ,
                  IBV_WR_ATOMIC_CMP_AND_SWP: MLX5_OPCODE_ATOMIC_CS,
                  IBV_WR_ATOMIC_FETCH_AND_ADD: MLX5_OPCODE_ATOMIC_FA}
_ATOMIC_WR = (IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD)
MLX5_ATOMIC_SIZE = 8
# enum ibv_send_flags
IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE = 1, 2, 4, 8
MLX5_WQE_CTRL_CQ_UPDATE, MLX5_WQE_CTRL_SOLICITED, MLX5_WQE_CTRL_FENCE = 2 << 2, 1 << 1, 4 << 5
MLX5_INLINE_SEG = 0x80000000
MLX5_INVALID_LKEY = 0x100
MLX5_SEND_WQE_BB = 64
MLX5_RCV_DBR, MLX5_SND_DBR = 0, 1
IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND = 2, 3, 4, 9
_OP_NAME = {MLX5_OPCODE_RDMA_WRITE: "RDMA_WRITE", MLX5_OPCODE_RDMA_WRITE_IMM: "RDMA_WRITE_IMM",
            MLX5_OPCODE_SEND: "SEND", MLX5_OPCODE_SEND_IMM: "SEND_IMM",
            MLX5_OPCODE_RDMA_READ: "RDMA_READ", MLX5_OPCODE_ATOMIC_CS: "ATOMIC_CS",
            MLX5_OPCODE_ATOMIC_FA: "ATOMIC_FA"}

# EMU: rdma-core has no tracepoints; these mark the three steps of a post
# (WQE written, doorbell record stored, doorbell rung) so a trace shows them
trace_mlx5_wqe = tracepoint("mlx5_wqe", "qpn idx opcode ds signaled", layer="userspace")
trace_mlx5_dbrec = tracepoint("mlx5_dbrec", "qpn queue counter", layer="userspace")
trace_mlx5_doorbell = tracepoint("mlx5_doorbell", "qpn how reg nbytes", layer="userspace")


def mlx5_init_qp_indices(qp: Any) -> None:
    """Mirrors mlx5_init_qp_indices(): both queues back to empty (after RESET)."""
    qp.sq.head = qp.sq.tail = qp.sq.cur_post = 0
    qp.rq.head = qp.rq.tail = 0


def mlx5_get_send_wqe(qp: Any, n: int) -> int:
    """The user address of send basic block n (sq_start + n * 64; a RAW_PACKET QP's
    sq_start is its own SQ buffer, sq_buf)."""
    sq_start = qp.sq_buf if getattr(qp, "sq_buf", 0) else qp.buf + qp.sq.offset
    return sq_start + (n << 6)


def mlx5_wq_overflow(wq: Any, nreq: int) -> bool:
    """Mirrors mlx5_wq_overflow(): would nreq more WRs exceed max_post?"""
    return wq.head - wq.tail + nreq >= wq.max_post


def _store_ring(qp: Any, idx: int, wqe: bytes) -> None:
    """Store a WQE at SQ block idx, wrapping at the end of the ring (qend)."""
    proc = qp.context.proc
    room = (qp.sq.wqe_cnt - idx) * MLX5_SEND_WQE_BB
    proc.store(mlx5_get_send_wqe(qp, idx), wqe[:room])
    if len(wqe) > room:
        proc.store(mlx5_get_send_wqe(qp, 0), wqe[room:])


def _data_segs(qp: Any, wr: Any) -> tuple[bytes, bool]:
    """The data part of a WQE: one inline segment, or a data segment per
    non-empty SGE.

    Inline: as set_data_inl_seg, each SGE's length is added to the running
    total (an int) and checked against max_inline_data before a byte of it is
    copied - ENOMEM at once for a 2 GiB SGE, not after reading it.  EMU: an
    SGE of 2 GiB or more is a negative int there and would pass the check into
    a memcpy of the wrapped length (a crash); here it is ENOMEM too.
    """
    proc = qp.context.proc
    if wr.send_flags & IBV_SEND_INLINE and wr.sg_list:
        inl, pieces = 0, []
        for sge in wr.sg_list:
            length = s32(u32(sge.length))
            inl = s32(inl + length)
            if inl > qp.max_inline_data or length < 0:
                raise OSError(errno.ENOMEM, "mlx5_post_send: inline data beyond max_inline_data")
            pieces.append(proc.load(u64(sge.addr), length))
        data = b"".join(pieces)
        if not data:
            return b"", True
        seg = struct.pack(">I", len(data) | MLX5_INLINE_SEG) + data
        return seg + bytes(-len(seg) % 16), True
    return b"".join(_data_seg(sge) for sge in wr.sg_list if u32(sge.length)), False


def _data_seg(sge: Any) -> bytes:
    """Mirrors set_data_ptr_seg(): struct ibv_sge's u32 length and lkey, u64 addr."""
    return struct.pack(">IIQ", u32(sge.length), u32(sge.lkey), u64(sge.addr))


def set_raddr_seg(remote_addr: int, rkey: int) -> bytes:
    """Mirrors set_raddr_seg(): struct mlx5_wqe_raddr_seg (raddr, rkey, reserved)."""
    return struct.pack(">QII", u64(remote_addr), u32(rkey), 0)


def set_atomic_seg(opcode: int, swap: int, compare_add: int) -> bytes:
    """Mirrors _set_atomic_seg(): struct mlx5_wqe_atomic_seg, big-endian swap_add then
    compare - CMP_AND_SWP carries swap and compare, FETCH_AND_ADD the addend alone."""
    if opcode == IBV_WR_ATOMIC_CMP_AND_SWP:
        return struct.pack(">QQ", u64(swap), u64(compare_add))
    return struct.pack(">QQ", u64(compare_add), 0)


def set_data_ptr_seg_atomic(sge: Any) -> bytes:
    """Mirrors set_data_ptr_seg_atomic(): the SGE's lkey and address, 8 bytes."""
    return struct.pack(">IIQ", MLX5_ATOMIC_SIZE, u32(sge.lkey), u64(sge.addr))


# -- memory windows: the UMR WQE of a bind or a local invalidate (qp.c set_bind_wr) --------
IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV = 7, 8, 9
IBV_WC_BIND_MW, IBV_WC_LOCAL_INV = 5, 6
IBV_MW_TYPE_1, IBV_MW_TYPE_2 = 1, 2
MLX5_OPCODE_SEND_INVAL, MLX5_OPCODE_UMR = 0x01, 0x25
MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE = 1 << 5
# struct mlx5_wqe_umr_ctrl_seg flags and mkey_mask bits
MLX5_WQE_UMR_CTRL_FLAG_INLINE, MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE = 1 << 7, 1 << 5
MLX5_WQE_UMR_CTRL_FLAG_TRNSLATION_OFFSET, MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN = 1 << 4, 1 << 3
MLX5_WQE_UMR_CTRL_MKEY_MASK_LEN, MLX5_WQE_UMR_CTRL_MKEY_MASK_START_ADDR = 1 << 0, 1 << 6
MLX5_WQE_UMR_CTRL_MKEY_MASK_MKEY, MLX5_WQE_UMR_CTRL_MKEY_MASK_QPN = 1 << 13, 1 << 14
MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_LOCAL_WRITE = 1 << 18
MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_READ = 1 << 19
MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_WRITE = 1 << 20
MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_ATOMIC = 1 << 21
MLX5_WQE_UMR_CTRL_MKEY_MASK_FREE = 1 << 29
# struct mlx5_wqe_mkey_context_seg free and access_flags
MLX5_WQE_MKEY_CONTEXT_FREE = 1 << 6
MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_ATOMIC = 1 << 6
MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_WRITE = 1 << 5
MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_READ = 1 << 4
IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_ATOMIC = 2, 4, 8
IBV_ACCESS_ZERO_BASED = 32


def get_klm_octo(nentries: int) -> int:
    """Mirrors get_klm_octo(): KLM entries, rounded up to 4, in 16-byte octowords."""
    return (nentries + 3) // 4 * 4 // 2


def set_umr_control_seg(mw_type: int, bind_info: Any) -> bytes:
    """Mirrors set_umr_control_seg(): struct mlx5_wqe_umr_ctrl_seg (48 bytes) - inline,
    which mkey fields the UMR writes; a type 2 bind checks the window is free, a type 2
    invalidate that it is bound to this QP."""
    flags = MLX5_WQE_UMR_CTRL_FLAG_TRNSLATION_OFFSET | MLX5_WQE_UMR_CTRL_FLAG_INLINE
    mask = MLX5_WQE_UMR_CTRL_MKEY_MASK_FREE | MLX5_WQE_UMR_CTRL_MKEY_MASK_MKEY
    if mw_type == IBV_MW_TYPE_2:
        mask |= MLX5_WQE_UMR_CTRL_MKEY_MASK_QPN
    if bind_info.length:
        klm_octowords = get_klm_octo(1)
        if mw_type == IBV_MW_TYPE_2:
            flags |= MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE
        mask |= (MLX5_WQE_UMR_CTRL_MKEY_MASK_LEN | MLX5_WQE_UMR_CTRL_MKEY_MASK_START_ADDR
                 | MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_LOCAL_WRITE
                 | MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_READ
                 | MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_WRITE
                 | MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_ATOMIC)
    else:
        klm_octowords = get_klm_octo(0)
        if mw_type == IBV_MW_TYPE_2:
            flags |= MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN
    return struct.pack(">B3sHHQ32s", flags, b"", klm_octowords, 0, mask, b"")


def set_umr_mkey_seg(mw_type: int, rkey: int, bind_info: Any, qpn: int) -> bytes:
    """Mirrors set_umr_mkey_seg(): struct mlx5_wqe_mkey_context_seg (64 bytes) - the new
    key's tag, the QP a type 2 window binds to, and for a bind the access (local read
    is the kernel's), start and length; a zero length frees the window."""
    qpn_mkey = (rkey & 0xFF) | (0xFFFFFF00 if mw_type == IBV_MW_TYPE_1 or not bind_info.length
                                else qpn << 8)
    free = access = start = length = 0
    if bind_info.length:
        acc = bind_info.mw_access_flags
        access = ((MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_READ
                   if acc & IBV_ACCESS_REMOTE_READ else 0)
                  | (MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_WRITE
                     if acc & IBV_ACCESS_REMOTE_WRITE else 0)
                  | (MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_ATOMIC
                     if acc & IBV_ACCESS_REMOTE_ATOMIC else 0))
        start = 0 if acc & IBV_ACCESS_ZERO_BASED else bind_info.addr
        length = bind_info.length
    else:
        free = MLX5_WQE_MKEY_CONTEXT_FREE
    return struct.pack(">BBBBIIIQQI16sI3sBI", free, 0, access, 0, u32(qpn_mkey), 0, 0,
                       u64(start), u64(length), 0, b"", 0, b"", 0, 0)


def set_umr_data_seg(bind_info: Any) -> bytes:
    """Mirrors set_umr_data_seg(): one KLM (byte count, the MR's lkey, address) in a
    64-byte segment."""
    klm = struct.pack(">IIQ", u32(bind_info.length), u32(bind_info.mr.lkey),
                      u64(bind_info.addr))
    return klm + bytes(64 - len(klm))


def set_bind_wr(mw_type: int, rkey: int, bind_info: Any, qpn: int) -> bytes:
    """Mirrors set_bind_wr(): the UMR segments of a bind (or, with no length, an
    invalidate); EOPNOTSUPP beyond 2 GiB (a KLM's limit)."""
    if bind_info.length > 1 << 31:
        raise OSError(errno.EOPNOTSUPP, "set_bind_wr: a KLM covers at most 2 GiB")
    seg = set_umr_control_seg(mw_type, bind_info) + \
        set_umr_mkey_seg(mw_type, rkey, bind_info, qpn)
    if bind_info.length:
        seg += set_umr_data_seg(bind_info)
    return seg


MLX5_IB_OPCODE.update({IBV_WR_LOCAL_INV: MLX5_OPCODE_UMR, IBV_WR_BIND_MW: MLX5_OPCODE_UMR,
                       IBV_WR_SEND_WITH_INV: MLX5_OPCODE_SEND_INVAL})
_OP_NAME.update({MLX5_OPCODE_UMR: "UMR", MLX5_OPCODE_SEND_INVAL: "SEND_INVAL"})
_UMR_WR = (IBV_WR_BIND_MW, IBV_WR_LOCAL_INV)


class _no_bind:
    """The all-zero struct ibv_mw_bind_info of a local invalidate."""

    mr, addr, length, mw_access_flags = None, 0, 0, 0


@traced
def mlx5_post_send(qp: Any, wr: Any, bad_wr: list | None = None) -> int:
    """Mirrors _mlx5_post_send(): build a WQE per WR, then post_send_db once."""
    nreq, inl, size, ctrl = 0, False, 0, b""
    err = 0
    next_fence = qp.fm_cache
    while wr is not None:
        num_sge = len(wr.sg_list)
        if wr.opcode not in MLX5_IB_OPCODE:
            err = errno.EINVAL
        elif mlx5_wq_overflow(qp.sq, nreq):
            err = errno.ENOMEM
        elif num_sge > qp.sq.qp_state_max_gs:
            err = errno.ENOMEM
        if err:
            break
        fence = MLX5_WQE_CTRL_FENCE if wr.send_flags & IBV_SEND_FENCE else next_fence
        next_fence = 0
        idx = qp.sq.cur_post & (qp.sq.wqe_cnt - 1)
        body = b""
        umr_key = 0
        xrc = b""
        if qp.qp_type == IBV_QPT_XRC_SEND and wr.opcode not in _UMR_WR:
            # struct mlx5_wqe_xrc_seg: the target SRQ, then as an RC QP's WQE
            xrc = struct.pack(">I", u32(wr.remote_srqn)) + bytes(12)
        if wr.opcode in _UMR_WR and qp.qp_type in (IBV_QPT_RC, IBV_QPT_UC):
            try:
                if wr.opcode == IBV_WR_BIND_MW:
                    if wr.bind_mw is None or wr.bind_mw.mw is None:
                        # EMU: C dereferences the missing window; here it is EINVAL
                        raise OSError(errno.EINVAL, "mlx5_post_send: BIND_MW without a window")
                    mw = wr.bind_mw.mw
                    umr_key = mw.rkey
                    body = set_bind_wr(mw.type, wr.bind_mw.rkey, wr.bind_mw.bind_info,
                                       qp.qp_num)
                    qp.sq.wr_data[idx] = IBV_WC_BIND_MW
                else:
                    umr_key = wr.invalidate_rkey
                    body = set_bind_wr(IBV_MW_TYPE_2, 0, _no_bind, qp.qp_num)
                    qp.sq.wr_data[idx] = IBV_WC_LOCAL_INV
            except OSError as e:
                err = e.errno
                break
            next_fence = MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE
        elif wr.opcode in (IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ) and \
                qp.qp_type in (IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_XRC_SEND):
            body = set_raddr_seg(wr.remote_addr, wr.rkey)
        elif wr.opcode in _ATOMIC_WR and qp.qp_type in (IBV_QPT_RC, IBV_QPT_XRC_SEND):
            if not qp.atomics_enabled:
                err = errno.EOPNOTSUPP
                break
            body = set_raddr_seg(wr.remote_addr, wr.rkey) + \
                set_atomic_seg(wr.opcode, wr.swap, wr.compare_add)
        elif qp.qp_type == IBV_QPT_UD:
            if wr.ah is None:  # EMU: C dereferences the NULL AH; here it is EINVAL
                err = errno.EINVAL
                break
            body = set_datagram_seg(wr)
        try:
            if wr.opcode in _ATOMIC_WR and not wr.send_flags & IBV_SEND_INLINE:
                data, inline = b"".join(set_data_ptr_seg_atomic(sge) for sge in wr.sg_list
                                        if u32(sge.length)), False
            else:
                data, inline = _data_segs(qp, wr)
        except OSError as e:
            err = e.errno
            break
        inl = inl or inline
        body = xrc + body + data
        size = 1 + len(body) // 16
        opcode = MLX5_IB_OPCODE[wr.opcode]
        imm = u32(wr.imm_data) if wr.opcode in (IBV_WR_SEND_WITH_IMM,
                                           IBV_WR_RDMA_WRITE_WITH_IMM) else 0
        if wr.opcode in _UMR_WR:
            imm = u32(umr_key)                   # ctrl->imm: the key the UMR works on
        elif wr.opcode == IBV_WR_SEND_WITH_INV:
            imm = u32(wr.invalidate_rkey)        # send_ieth(): htobe32(invalidate_rkey)
        fm_ce_se = qp.sq_signal_bits | fence | \
            (MLX5_WQE_CTRL_CQ_UPDATE if wr.send_flags & IBV_SEND_SIGNALED else 0) | \
            (MLX5_WQE_CTRL_SOLICITED if wr.send_flags & IBV_SEND_SOLICITED else 0)
        ctrl = struct.pack(">IIBHBI", (qp.sq.cur_post & 0xFFFF) << 8 | opcode,
                           qp.qp_num << 8 | size, 0, 0, fm_ce_se, imm)
        wqe = ctrl + body
        _store_ring(qp, idx, wqe + bytes(-len(wqe) % MLX5_SEND_WQE_BB))
        if trace.enabled:
            trace_mlx5_wqe(hex(qp.qp_num), qp.sq.cur_post & 0xFFFF, _OP_NAME[opcode], size,
                           bool(fm_ce_se & MLX5_WQE_CTRL_CQ_UPDATE))
        qp.sq.wrid[idx] = u64(wr.wr_id)
        qp.sq.wqe_head[idx] = qp.sq.head + nreq
        qp.sq.cur_post += -(-size * 16 // MLX5_SEND_WQE_BB)
        nreq += 1
        wr = wr.next
    qp.fm_cache = next_fence
    post_send_db(qp, qp.bf, nreq, inl, size, ctrl)
    if err and bad_wr is not None:
        bad_wr.append(wr)
    return err


@traced
def post_send_db(qp: Any, bf: Any, nreq: int, inl: bool, size: int, ctrl: bytes) -> None:
    """Mirrors post_send_db(): doorbell record, then BlueFlame copy or 64-bit
    doorbell to bf->reg + bf->offset, then toggle the offset (see the module
    docstring)."""
    if not nreq:
        return
    qp.sq.head += nreq
    proc = qp.context.proc
    # udma_to_device_barrier(): the WQEs are in memory before the record says so
    proc.store(qp.db + 4 * MLX5_SND_DBR, struct.pack(">I", qp.sq.cur_post & 0xFFFF))
    if trace.enabled:
        trace_mlx5_dbrec(hex(qp.qp_num), "send", qp.sq.cur_post & 0xFFFF)
    ctx = qp.context
    if not ctx.shut_up_bf and nreq == 1 and bf.uuarn and (inl or ctx.prefer_bf) and \
            1 < size <= bf.buf_size // 16:
        nbytes = -(-size * 16 // 64) * 64
        if trace.enabled:
            trace_mlx5_doorbell(hex(qp.qp_num), "blueflame", hex(bf.reg + bf.offset), nbytes)
        mlx5_bf_copy(qp, bf, nbytes)
    else:
        if trace.enabled:
            trace_mlx5_doorbell(hex(qp.qp_num), "db", hex(bf.reg + bf.offset), 8)
        proc.store(bf.reg + bf.offset, ctrl[:8])     # mmio_write64_be
    # mmio_flush_writes(); then the next post uses the register's other half
    bf.offset ^= bf.buf_size


def mlx5_bf_copy(qp: Any, bf: Any, nbytes: int) -> None:
    """Mirrors mlx5_bf_copy(): the WQE from the SQ ring to the register in
    64-byte chunks (mmio_memcpy_x64), wrapping at the end of the ring."""
    proc = qp.context.proc
    idx = (qp.sq.cur_post - -(-nbytes // MLX5_SEND_WQE_BB)) & (qp.sq.wqe_cnt - 1)
    dst = bf.reg + bf.offset
    for _ in range(nbytes // 64):
        proc.store(dst, proc.load(mlx5_get_send_wqe(qp, idx), 64))
        dst += 64
        idx = (idx + 1) & (qp.sq.wqe_cnt - 1)


@traced
def mlx5_post_recv(qp: Any, wr: Any, bad_wr: list | None = None) -> int:
    """Mirrors mlx5_post_recv(): a receive WQE per WR (data segments, ended by
    an invalid-lkey segment when short), then the doorbell record."""
    proc = qp.context.proc
    rq = qp.rq
    nreq, err = 0, 0
    ind = rq.head & (rq.wqe_cnt - 1)
    while wr is not None:
        if mlx5_wq_overflow(rq, nreq):
            err = errno.ENOMEM
            break
        if len(wr.sg_list) > rq.qp_state_max_gs:
            err = errno.EINVAL
            break
        segs = [_data_seg(sge) for sge in wr.sg_list if u32(sge.length)]
        if len(segs) < rq.max_gs:
            segs.append(struct.pack(">IIQ", 0, MLX5_INVALID_LKEY, 0))
        proc.store(qp.buf + rq.offset + (ind << rq.wqe_shift), b"".join(segs))
        rq.wrid[ind] = u64(wr.wr_id)
        ind = (ind + 1) & (rq.wqe_cnt - 1)
        nreq += 1
        wr = wr.next
    if nreq:
        rq.head += nreq
        proc.store(qp.db + 4 * MLX5_RCV_DBR, struct.pack(">I", rq.head & 0xFFFF))
        if trace.enabled:
            trace_mlx5_dbrec(hex(qp.qp_num), "recv", rq.head & 0xFFFF)
    if err and bad_wr is not None:
        bad_wr.append(wr)
    return err

"""Mirrors rdma-core providers/mlx5/qp.c: posting work requests and ringing the doorbell.

Posting a send is three steps, all in user space (mlx5_post_send, post_send_db):
  1. write the WQE into the SQ ring, in 64-byte basic blocks: a control
     segment (opcode, WQE counter, QPN, size in 16-byte units, completion
     flag, immediate), a remote-address segment for RDMA, then data segments
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

# EMU: the per-queue and per-register pthread spinlocks are not modelled (a
# thread can be preempted only at the MMIO write); no signature, fence,
# atomics, memory windows or the ibv_wr_* (post_send_ex) interface.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

from kernel_model import trace
from kernel_model.trace import traced, tracepoint
from userspace.libibverbs.cint import s32, u32, u64

# enum ibv_wr_opcode -> the mlx5 WQE opcode (mlx5_ib_opcode[])
IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND = 0, 1, 2
IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ = 3, 4
MLX5_OPCODE_RDMA_WRITE, MLX5_OPCODE_RDMA_WRITE_IMM, MLX5_OPCODE_SEND = 0x08, 0x09, 0x0A
MLX5_OPCODE_SEND_IMM, MLX5_OPCODE_RDMA_READ = 0x0B, 0x10
MLX5_IB_OPCODE = {IBV_WR_RDMA_WRITE: MLX5_OPCODE_RDMA_WRITE,
                  IBV_WR_RDMA_WRITE_WITH_IMM: MLX5_OPCODE_RDMA_WRITE_IMM,
                  IBV_WR_SEND: MLX5_OPCODE_SEND, IBV_WR_SEND_WITH_IMM: MLX5_OPCODE_SEND_IMM,
                  IBV_WR_RDMA_READ: MLX5_OPCODE_RDMA_READ}
# enum ibv_send_flags
IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE = 1, 2, 4, 8
MLX5_WQE_CTRL_CQ_UPDATE, MLX5_WQE_CTRL_SOLICITED, MLX5_WQE_CTRL_FENCE = 2 << 2, 1 << 1, 4 << 5
MLX5_INLINE_SEG = 0x80000000
MLX5_INVALID_LKEY = 0x100
MLX5_SEND_WQE_BB = 64
MLX5_RCV_DBR, MLX5_SND_DBR = 0, 1
IBV_QPT_RC, IBV_QPT_UC = 2, 3
_OP_NAME = {MLX5_OPCODE_RDMA_WRITE: "RDMA_WRITE", MLX5_OPCODE_RDMA_WRITE_IMM: "RDMA_WRITE_IMM",
            MLX5_OPCODE_SEND: "SEND", MLX5_OPCODE_SEND_IMM: "SEND_IMM",
            MLX5_OPCODE_RDMA_READ: "RDMA_READ"}

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
    """The user address of send basic block n (sq_start + n * 64)."""
    return qp.buf + qp.sq.offset + (n << 6)


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
        if wr.opcode in (IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ) and \
                qp.qp_type in (IBV_QPT_RC, IBV_QPT_UC):
            body = struct.pack(">QII", u64(wr.remote_addr), u32(wr.rkey), 0)  # set_raddr_seg
        try:
            data, inline = _data_segs(qp, wr)
        except OSError as e:
            err = e.errno
            break
        inl = inl or inline
        body += data
        size = 1 + len(body) // 16
        opcode = MLX5_IB_OPCODE[wr.opcode]
        imm = u32(wr.imm_data) if wr.opcode in (IBV_WR_SEND_WITH_IMM,
                                           IBV_WR_RDMA_WRITE_WITH_IMM) else 0
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

"""Mirrors rdma-core providers/mlx5/cq.c: polling completions and cleaning a CQ.

A CQ is a ring of 64-byte CQEs in the process's memory that the HCA writes
by DMA.  Software owns a CQE when its owner bit equals the parity of the
pass the consumer index is on (ci & ncqe) and its opcode is not INVALID; the
HCA flips the expected parity each time it wraps.  After polling, the
consumer index goes to the CQ's doorbell record (big-endian, 24 bits), which
is how the HCA knows room was made.
"""

from __future__ import annotations

import struct
from typing import Any

from kernel_model import trace
from kernel_model.trace import traced, tracepoint
from userspace.providers.mlx5.srq import mlx5_free_srq_wqe, mlx5_srq

MLX5_CQE_INVALID = 0xF
MLX5_CQE_OWNER_MASK = 1
MLX5_CQ_SET_CI = 0
CQE_SRQN_UIDX = 32        # struct mlx5_cqe64: srqn_uidx (be32)
CQE_SOP_DROP_QPN = 56     # sop_drop_qpn (be32)
CQE_OP_OWN = 63


def _cqe_addr(cq: Any, n: int) -> int:
    return cq.buf + (n & cq.cqe) * cq.cqe_sz


def _sw_owned(cq: Any, raw: bytes, n: int) -> bool:
    """The ownership test: opcode not INVALID and owner bit == the pass parity."""
    op_own = raw[CQE_OP_OWN]
    return (op_own >> 4) != MLX5_CQE_INVALID and \
        (op_own & MLX5_CQE_OWNER_MASK) == (1 if n & (cq.cqe + 1) else 0)


def cqe_rsn(cq: Any, raw: bytes) -> int:
    """The resource a CQE names: the user index (cqe_version 1) or the QPN."""
    if cq.context.cqe_version:
        return struct.unpack_from(">I", raw, CQE_SRQN_UIDX)[0] & 0xFFFFFF
    return struct.unpack_from(">I", raw, CQE_SOP_DROP_QPN)[0] & 0xFFFFFF


def update_cons_index(cq: Any) -> None:
    """Mirrors update_cons_index(): dbrec[SET_CI] = ci (24 bits, big-endian)."""
    cq.context.proc.store(cq.dbrec + 4 * MLX5_CQ_SET_CI,
                          struct.pack(">I", cq.cons_index & 0xFFFFFF))


@traced
def mlx5_cq_clean(cq: Any, rsn: int, srq: Any = None) -> None:
    """Mirrors __mlx5_cq_clean(): drop the CQEs of one QP (user index or QPN)
    that software has not polled yet, sliding the later ones down; a receive
    completion from the QP's SRQ gives its WQE back to the SRQ.

    Called when the QP goes to RESET or is destroyed, so a stale completion
    never reaches the next user of the QP number.
    """
    if cq is None:
        return
    proc = cq.context.proc
    prod = cq.cons_index
    while prod - cq.cons_index <= cq.cqe and \
            _sw_owned(cq, proc.load(_cqe_addr(cq, prod), cq.cqe_sz), prod):
        prod += 1
    nfreed = 0
    while prod > cq.cons_index:
        prod -= 1
        raw = proc.load(_cqe_addr(cq, prod), cq.cqe_sz)
        if cqe_rsn(cq, raw) == rsn:
            if srq is not None and raw[CQE_OP_OWN] >> 4 not in (MLX5_CQE_REQ, MLX5_CQE_REQ_ERR):
                mlx5_free_srq_wqe(srq, struct.unpack_from(">H", raw, 60)[0])
            nfreed += 1
        elif nfreed:
            dest = _cqe_addr(cq, prod + nfreed)
            owner = proc.load(dest + CQE_OP_OWN, 1)[0] & MLX5_CQE_OWNER_MASK
            proc.store(dest, raw[:CQE_OP_OWN] + bytes([(raw[CQE_OP_OWN] & ~1) | owner]))
    if nfreed:
        cq.cons_index += nfreed
        update_cons_index(cq)


# CQE opcodes (op_own >> 4) and error syndromes -> enum ibv_wc_status
MLX5_CQE_REQ, MLX5_CQE_RESP_WR_IMM, MLX5_CQE_RESP_SEND, MLX5_CQE_RESP_SEND_IMM = 0, 1, 2, 3
MLX5_CQE_REQ_ERR, MLX5_CQE_RESP_ERR = 13, 14
IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_PROT_ERR = 0, 1, 2, 4
IBV_WC_WR_FLUSH_ERR, IBV_WC_MW_BIND_ERR, IBV_WC_BAD_RESP_ERR, IBV_WC_LOC_ACCESS_ERR = 5, 6, 7, 8
IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_OP_ERR = 9, 10, 11
IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_REM_ABORT_ERR = 12, 13, 16
IBV_WC_GENERAL_ERR = 21
SYNDROME_TO_STATUS = {0x01: IBV_WC_LOC_LEN_ERR, 0x02: IBV_WC_LOC_QP_OP_ERR,
                      0x04: IBV_WC_LOC_PROT_ERR, 0x05: IBV_WC_WR_FLUSH_ERR,
                      0x06: IBV_WC_MW_BIND_ERR, 0x10: IBV_WC_BAD_RESP_ERR,
                      0x11: IBV_WC_LOC_ACCESS_ERR, 0x12: IBV_WC_REM_INV_REQ_ERR,
                      0x13: IBV_WC_REM_ACCESS_ERR, 0x14: IBV_WC_REM_OP_ERR,
                      0x15: IBV_WC_RETRY_EXC_ERR, 0x16: IBV_WC_RNR_RETRY_EXC_ERR,
                      0x22: IBV_WC_REM_ABORT_ERR}
# enum ibv_wc_opcode and flags
IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ = 0, 1, 2
IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM = 128, 129
IBV_WC_DRIVER2 = 136            # a raw WQE's completion (mlx5dv_wr_raw_wqe)
IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_WITH_INV = 1 << 0, 1 << 1, 1 << 3
MLX5_OPCODE_UMR, MLX5_CQE_RESP_SEND_INV = 0x25, 4
IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD = 3, 4
REQ_OPCODE_TO_WC = {0x08: IBV_WC_RDMA_WRITE, 0x09: IBV_WC_RDMA_WRITE, 0x0A: IBV_WC_SEND,
                    0x0B: IBV_WC_SEND, 0x01: IBV_WC_SEND, 0x10: IBV_WC_RDMA_READ,
                    0x11: IBV_WC_COMP_SWAP, 0x12: IBV_WC_FETCH_ADD}


# EMU: rdma-core has no tracepoints; this marks each CQE taken (by its owner bit)
trace_mlx5_cqe = tracepoint("mlx5_cqe", "qpn wqe_counter cqe_opcode status wr_id",
                            layer="userspace")


def _find_qp(cq: Any, rsn: int) -> Any:
    """mlx5_find_uidx() / mlx5_find_qp(): the QP a CQE names."""
    table = cq.context.uidx_table
    if cq.context.cqe_version:
        return table.get(rsn)
    return next((qp for qp in table.values() if qp.qp_num == rsn), None)


def _null_wrid(cq: Any, wq: Any, idx: int) -> None:
    """A CQE naming a queue the QP does not have (wqe_cnt 0: an XRC target's, a CQE the
    process forged in its own ring): C reads wq->wrid[idx] through a NULL wrid - the
    process's own SIGSEGV, which this load of that address raises (found by peermem
    fuzz: a zeroed CQE after MADV_DONTNEED of the ring named an XRC target QP)."""
    if not wq.wqe_cnt:
        cq.context.proc.load(8 * (idx & 0xFFFF), 8)


def _parse_cqe(cq: Any, raw: bytes, wc: Any) -> bool:
    """Mirrors mlx5_parse_cqe(): fill one work completion; False on a CQE
    naming no known QP (CQ_POLL_ERR)."""
    opcode = raw[CQE_OP_OWN] >> 4
    qp = _find_qp(cq, cqe_rsn(cq, raw))
    if qp is None:
        return False
    is_xsrq = isinstance(qp, mlx5_srq)      # MLX5_RSC_TYPE_XSRQ: an XRC SRQ's receive
    wc.qp_num = struct.unpack_from(">I", raw, CQE_SOP_DROP_QPN)[0] & 0xFFFFFF if is_xsrq \
        else qp.qp_num
    wc.wc_flags = 0
    wqe_ctr = struct.unpack_from(">H", raw, 60)[0]
    if opcode in (MLX5_CQE_REQ, MLX5_CQE_REQ_ERR) and is_xsrq:
        # EMU: a requester CQE naming an XRC SRQ (only a ring the process scribbled on
        # has one): libmlx5 would read the SRQ's memory as a QP's; here the poll fails
        # as for an unknown QP (CQ_POLL_ERR)
        return False
    if opcode in (MLX5_CQE_REQ, MLX5_CQE_REQ_ERR):
        wq = qp.sq
        idx = wqe_ctr & (wq.wqe_cnt - 1)
        _null_wrid(cq, wq, idx)
        wc.wr_id = wq.wrid[idx]
        wq.tail = wq.wqe_head[idx] + 1
    elif is_xsrq or qp.srq is not None:   # handle_responder: the SRQ's WQE, back on its list
        srq = qp if is_xsrq else qp.srq
        wc.wr_id = srq.wrid[wqe_ctr & (srq.max - 1)]
        mlx5_free_srq_wqe(srq, wqe_ctr & (srq.max - 1))
    else:
        wq = qp.rq
        _null_wrid(cq, wq, wq.tail & (wq.wqe_cnt - 1))
        wc.wr_id = wq.wrid[wq.tail & (wq.wqe_cnt - 1)]
        wq.tail += 1
    if opcode in (MLX5_CQE_REQ_ERR, MLX5_CQE_RESP_ERR):
        wc.status = SYNDROME_TO_STATUS.get(raw[55], IBV_WC_GENERAL_ERR)
        wc.vendor_err = raw[54]
        wc.opcode = 0
        wc.byte_len = 0
        return True
    wc.status = IBV_WC_SUCCESS
    wc.vendor_err = 0
    byte_cnt = struct.unpack_from(">I", raw, 44)[0]
    if opcode == MLX5_CQE_REQ:
        sop = struct.unpack_from(">I", raw, CQE_SOP_DROP_QPN)[0] >> 24
        wc.opcode = REQ_OPCODE_TO_WC.get(sop, IBV_WC_SEND)
        if sop == MLX5_OPCODE_UMR:       # handle_good_req: BIND_MW or LOCAL_INV, as posted
            wc.opcode = wq.wr_data[idx]
        if wq.wr_data[idx] == IBV_WC_DRIVER2:     # handle_good_req: a raw WQE
            wc.opcode = IBV_WC_DRIVER2
        wc.byte_len = byte_cnt if wc.opcode == IBV_WC_RDMA_READ else 0
        if wc.opcode in (IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD):
            wc.byte_len = 8          # handle_good_req: an atomic returns 8 bytes
        if sop in (0x09, 0x0B):  # handle_good_req: WRITE_IMM / SEND_IMM carry the flag
            wc.wc_flags |= IBV_WC_WITH_IMM
        return True
    wc.byte_len = byte_cnt
    flags_rqpn = struct.unpack_from(">I", raw, 24)[0]
    wc.src_qp = flags_rqpn & 0xFFFFFF
    wc.sl = flags_rqpn >> 24 & 0xF
    if flags_rqpn >> 28 & 3:        # handle_responder: the message came with a GRH
        wc.wc_flags |= IBV_WC_GRH
    if opcode == MLX5_CQE_RESP_WR_IMM:
        wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM
    else:
        wc.opcode = IBV_WC_RECV
    if opcode in (MLX5_CQE_RESP_WR_IMM, MLX5_CQE_RESP_SEND_IMM):
        wc.wc_flags |= IBV_WC_WITH_IMM
        wc.imm_data = struct.unpack_from(">I", raw, 36)[0]
    elif opcode == MLX5_CQE_RESP_SEND_INV:
        # handle_responder: the rkey the SEND invalidated (wc.invalidated_rkey, the union)
        wc.wc_flags |= IBV_WC_WITH_INV
        wc.imm_data = struct.unpack_from(">I", raw, 36)[0]
    return True


@traced
def mlx5_poll_cq(cq: Any, num_entries: int, wc_factory: Any) -> list:
    """Mirrors mlx5_poll_cq() / poll_cq(): take up to num_entries CQEs that
    software owns, in order, then publish the consumer index.

    # EMU: an empty poll yields the CPU (sched_yield) so the HCA's task can
    # run; on a real machine the HCA runs in parallel with the poller.
    """
    proc = cq.context.proc
    out = []
    while len(out) < num_entries:
        raw = proc.load(_cqe_addr(cq, cq.cons_index) + cq.cqe_sz - 64, 64)
        if not _sw_owned(cq, raw, cq.cons_index):
            break
        cq.cons_index += 1
        wc = wc_factory()
        if not _parse_cqe(cq, raw, wc):
            update_cons_index(cq)
            raise OSError(22, "mlx5_poll_cq: CQE for an unknown QP")
        out.append(wc)
        if trace.enabled:
            trace_mlx5_cqe(hex(wc.qp_num), struct.unpack_from(">H", raw, 60)[0],
                           raw[CQE_OP_OWN] >> 4, wc.status, wc.wr_id)
    if out:
        update_cons_index(cq)
    else:
        proc.sched_yield()
    return out

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

from kernel_model.trace import traced

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
def mlx5_cq_clean(cq: Any, rsn: int) -> None:
    """Mirrors __mlx5_cq_clean(): drop the CQEs of one QP (user index or QPN)
    that software has not polled yet, sliding the later ones down.

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
            nfreed += 1
        elif nfreed:
            dest = _cqe_addr(cq, prod + nfreed)
            owner = proc.load(dest + CQE_OP_OWN, 1)[0] & MLX5_CQE_OWNER_MASK
            proc.store(dest, raw[:CQE_OP_OWN] + bytes([(raw[CQE_OP_OWN] & ~1) | owner]))
    if nfreed:
        cq.cons_index += nfreed
        update_cons_index(cq)

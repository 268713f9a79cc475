"""Mirrors the rest of rdma-core providers/mlx5/cq.c (and verbs.c's mlx5_resize_cq):
the extended-CQ poll API, arming a CQ for a completion event, and resizing.

Extended poll (mlx5_cq_fill_pfns installs these on an ibv_cq_ex):
    start_poll   take the first CQE software owns (ENOENT: none, nothing held),
                 make it current: wr_id and status are filled at once, the rest
                 is read lazily from the CQE by the read_* functions
    next_poll    the next CQE (ENOENT: none); the consumer index advances
    end_poll     the consumer index to the doorbell record
The CQEs are the same ones mlx5_poll_cq reads (cq.py); a read_* reads the
current CQE's bytes (struct mlx5_cqe64) as the C accessors do.

Arming (mlx5_arm_cq): the arm doorbell record (dbrec[MLX5_CQ_ARM_DB]) gets
arm_sn, the command (solicited or not) and the consumer index, and the same
word plus the CQN go to the UAR's CQ doorbell (offset 0x20), a 64-bit store.
The HCA then raises one completion event for the next CQE; ibv_get_cq_event's
hook (mlx5_cq_event) counts arm_sn up.

Resize (mlx5_resize_cq): a new ring of the rounded size, RESIZE_CQ with its
address; the device writes a RESIZE CQE at its producer index in the old ring
and continues in the new one, so the CQEs not yet polled are copied from the
old ring up to that CQE (mlx5_cq_resize_copy_cqes), and the consumer index
skips it.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import mlx5_ib_resize_cq
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_types import (
    IBV_WC_EX_WITH_BYTE_LEN,
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
    IBV_WC_EX_WITH_CVLAN,
    IBV_WC_EX_WITH_DLID_PATH_BITS,
    IBV_WC_EX_WITH_FLOW_TAG,
    IBV_WC_EX_WITH_IMM,
    IBV_WC_EX_WITH_QP_NUM,
    IBV_WC_EX_WITH_SL,
    IBV_WC_EX_WITH_SLID,
    IBV_WC_EX_WITH_SRC_QP,
    IBV_WC_EX_WITH_TM_INFO,
)
from userspace.providers.mlx5.buf import (
    MLX5DV_RES_TYPE_CQ,
    mlx5_alloc_prefered_buf,
    mlx5_free_actual_buf,
)
from userspace.providers.mlx5.clock import (
    _mlx5dv_get_clock_info,
    mlx5dv_clock_info,
    mlx5dv_ts_to_ns,
)
from userspace.providers.mlx5.cq import (
    CQE_OP_OWN,
    IBV_WC_DRIVER2,
    IBV_WC_GRH,
    IBV_WC_RECV,
    IBV_WC_RECV_RDMA_WITH_IMM,
    IBV_WC_WITH_IMM,
    MLX5_CQE_OWNER_MASK,
    MLX5_CQE_REQ,
    MLX5_CQE_RESP_SEND_IMM,
    MLX5_CQE_RESP_WR_IMM,
    REQ_OPCODE_TO_WC,
    _cqe_addr,
    _parse_cqe,
    _sw_owned,
    update_cons_index,
)
from userspace.providers.mlx5.wqsize import roundup_pow_of_two

MLX5_CQ_ARM_DB = 1
MLX5_CQ_FLAGS_RAW_WQE = 1 << 7
MLX5_CQ_DOORBELL = 0x20
MLX5_CQ_DB_REQ_NOT_SOL = 1 << 24
MLX5_CQ_DB_REQ_NOT = 0 << 24
MLX5_CQE_RESIZE_CQ = 5
MLX5_CQE_RESP_SEND_INV = 4
IBV_WC_WITH_INV = 1 << 3
# struct mlx5_cqe64 offsets the readers use
CQE_ML_PATH, CQE_SLID, CQE_FLAGS_RQPN, CQE_VLAN_INFO = 17, 22, 24, 30
CQE_IMM, CQE_BYTE_CNT, CQE_TIMESTAMP, CQE_SOP_DROP_QPN = 36, 44, 48, 56


class _WcScratch:
    """The few ibv_wc fields mlx5_parse_lazy_cqe fills (wr_id, status) - the rest of
    _parse_cqe's output is dropped; the readers go to the CQE."""

    wr_id = status = vendor_err = opcode = byte_len = qp_num = src_qp = sl = 0
    wc_flags = imm_data = 0


# -- the extended poll API -------------------------------------------------------------------
def _next_cqe(cq: Any) -> int:
    """mlx5_get_next_cqe() + mlx5_parse_lazy_cqe(): take the CQE at the consumer index
    if software owns it and make it current (0), or ENOENT."""
    proc = cq.context.proc
    raw = proc.load(_cqe_addr(cq, cq.cons_index) + cq.cqe_sz - 64, 64)
    if not _sw_owned(cq, raw, cq.cons_index):
        return errno.ENOENT
    cq.cons_index += 1
    wc = _WcScratch()
    if not _parse_cqe(cq, raw, wc):
        return errno.EINVAL           # CQ_POLL_ERR: a CQE naming no QP of this context
    cq.cur_cqe = raw
    # mlx5_parse_lazy_cqe: a raw WQE's completion reads as IBV_WC_DRIVER2
    cq.flags &= ~MLX5_CQ_FLAGS_RAW_WQE
    if raw[CQE_OP_OWN] >> 4 == MLX5_CQE_REQ and wc.opcode == IBV_WC_DRIVER2:
        cq.flags |= MLX5_CQ_FLAGS_RAW_WQE
    cq.wr_id, cq.status = wc.wr_id, wc.status
    cq.cur_vendor_err = wc.vendor_err
    return 0


@traced
def mlx5_start_poll(cq: Any, attr: Any) -> int:
    """Mirrors mlx5_start_poll(): EINVAL for a comp_mask; the first CQE, or ENOENT
    (nothing taken, the poll over).

    # EMU: an empty poll yields the CPU (sched_yield) so the HCA's task can run."""
    if attr.comp_mask:
        return errno.EINVAL
    ret = _next_cqe(cq)
    if ret == errno.ENOENT:
        cq.context.proc.sched_yield()
    elif ret:
        update_cons_index(cq)
    return ret


@traced
def mlx5_start_poll_clock_update(cq: Any, attr: Any) -> int:
    """Mirrors mlx5_start_poll()'s clock_update variant (a CQ with the wall-clock
    timestamp): after taking a CQE, _mlx5dv_get_clock_info() into cq.last_clock_info,
    its errno the poll's."""
    ret = mlx5_start_poll(cq, attr)
    if not ret:
        cq.last_clock_info = mlx5dv_clock_info()
        ret = _mlx5dv_get_clock_info(cq.context, cq.last_clock_info)
    return ret


@traced
def mlx5_next_poll(cq: Any) -> int:
    """Mirrors mlx5_next_poll(): the next CQE, or ENOENT."""
    return _next_cqe(cq)


@traced
def mlx5_end_poll(cq: Any) -> None:
    """Mirrors mlx5_end_poll(): the consumer index to the doorbell record.  The last
    CQE stays current (C's cq->cqe64 is not reset: a reader after the poll sees it)."""
    update_cons_index(cq)


def _be32(raw: bytes, off: int) -> int:
    return struct.unpack_from(">I", raw, off)[0]


def mlx5_cq_read_wc_opcode(cq: Any) -> int:
    """Mirrors mlx5_cq_read_wc_opcode(): from the CQE opcode (and, for a requester
    CQE, the WQE opcode in sop_drop_qpn)."""
    raw = cq.cur_cqe
    op = raw[CQE_OP_OWN] >> 4
    if op == MLX5_CQE_REQ:
        if cq.flags & MLX5_CQ_FLAGS_RAW_WQE:
            return IBV_WC_DRIVER2
        return REQ_OPCODE_TO_WC.get(_be32(raw, CQE_SOP_DROP_QPN) >> 24, 0)
    if op == MLX5_CQE_RESP_WR_IMM:
        return IBV_WC_RECV_RDMA_WITH_IMM
    return IBV_WC_RECV


def mlx5_cq_read_wc_vendor_err(cq: Any) -> int:
    return cq.cur_vendor_err


def mlx5_cq_read_wc_byte_len(cq: Any) -> int:
    return _be32(cq.cur_cqe, CQE_BYTE_CNT)


def mlx5_cq_read_wc_imm_data(cq: Any) -> int:
    """Mirrors mlx5_cq_read_wc_imm_data(): imm_inval_pkey, as the poll path reads it."""
    return _be32(cq.cur_cqe, CQE_IMM)


def mlx5_cq_read_wc_qp_num(cq: Any) -> int:
    return _be32(cq.cur_cqe, CQE_SOP_DROP_QPN) & 0xFFFFFF


def mlx5_cq_read_wc_src_qp(cq: Any) -> int:
    return _be32(cq.cur_cqe, CQE_FLAGS_RQPN) & 0xFFFFFF


def mlx5_cq_read_wc_flags(cq: Any) -> int:
    """Mirrors mlx5_cq_read_wc_flags(): immediate / invalidate by the CQE opcode, GRH
    when the L3 header type says the message came with one."""
    raw = cq.cur_cqe
    op = raw[CQE_OP_OWN] >> 4
    flags = 0
    if op in (MLX5_CQE_RESP_WR_IMM, MLX5_CQE_RESP_SEND_IMM):
        flags |= IBV_WC_WITH_IMM
    elif op == MLX5_CQE_RESP_SEND_INV:
        flags |= IBV_WC_WITH_INV
    if op != MLX5_CQE_REQ and _be32(raw, CQE_FLAGS_RQPN) >> 28 & 3:
        flags |= IBV_WC_GRH
    return flags


def mlx5_cq_read_wc_slid(cq: Any) -> int:
    return struct.unpack_from(">H", cq.cur_cqe, CQE_SLID)[0]


def mlx5_cq_read_wc_sl(cq: Any) -> int:
    return _be32(cq.cur_cqe, CQE_FLAGS_RQPN) >> 24 & 0xF


def mlx5_cq_read_wc_dlid_path_bits(cq: Any) -> int:
    return cq.cur_cqe[CQE_ML_PATH] & 0x7F


def mlx5_cq_read_wc_completion_ts(cq: Any) -> int:
    """Mirrors mlx5_cq_read_wc_completion_ts(): the CQE's timestamp (device clock)."""
    return struct.unpack_from(">Q", cq.cur_cqe, CQE_TIMESTAMP)[0]


def mlx5_cq_read_wc_completion_wallclock_ns(cq: Any) -> int:
    """Mirrors mlx5_cq_read_wc_completion_wallclock_ns(): the CQE's timestamp in
    nanoseconds, by the clock info the poll read (mlx5dv_ts_to_ns)."""
    return mlx5dv_ts_to_ns(cq.last_clock_info, mlx5_cq_read_wc_completion_ts(cq))


def mlx5_cq_read_wc_cvlan(cq: Any) -> int:
    return struct.unpack_from(">H", cq.cur_cqe, CQE_VLAN_INFO)[0]


def mlx5_cq_read_flow_tag(cq: Any) -> int:
    return _be32(cq.cur_cqe, CQE_SOP_DROP_QPN) & 0xFFFFFF


def mlx5_cq_read_wc_tm_info(cq: Any) -> tuple[int, int]:
    """(tag, priv) of a tag-matching CQE.  # EMU: no tag matching: (0, 0)."""
    return 0, 0


_READERS = ((IBV_WC_EX_WITH_BYTE_LEN, "read_byte_len", mlx5_cq_read_wc_byte_len),
            (IBV_WC_EX_WITH_IMM, "read_imm_data", mlx5_cq_read_wc_imm_data),
            (IBV_WC_EX_WITH_QP_NUM, "read_qp_num", mlx5_cq_read_wc_qp_num),
            (IBV_WC_EX_WITH_SRC_QP, "read_src_qp", mlx5_cq_read_wc_src_qp),
            (IBV_WC_EX_WITH_SLID, "read_slid", mlx5_cq_read_wc_slid),
            (IBV_WC_EX_WITH_SL, "read_sl", mlx5_cq_read_wc_sl),
            (IBV_WC_EX_WITH_DLID_PATH_BITS, "read_dlid_path_bits",
             mlx5_cq_read_wc_dlid_path_bits),
            (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, "read_completion_ts",
             mlx5_cq_read_wc_completion_ts),
            (IBV_WC_EX_WITH_CVLAN, "read_cvlan", mlx5_cq_read_wc_cvlan),
            (IBV_WC_EX_WITH_FLOW_TAG, "read_flow_tag", mlx5_cq_read_flow_tag),
            (IBV_WC_EX_WITH_TM_INFO, "read_tm_info", mlx5_cq_read_wc_tm_info))


def mlx5_cq_fill_pfns(cq: Any, attr: Any, mctx: Any) -> int:
    """Mirrors mlx5_cq_fill_pfns(): the poll calls and the readers wc_flags asks for;
    EOPNOTSUPP for the wall-clock timestamp without the clock-info page.  A wall-clock
    CQ polls with the clock-update start_poll."""
    cq.start_poll, cq.next_poll, cq.end_poll = mlx5_start_poll, mlx5_next_poll, mlx5_end_poll
    if attr.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK:
        cq.start_poll = mlx5_start_poll_clock_update
    cq.read_opcode, cq.read_vendor_err = mlx5_cq_read_wc_opcode, mlx5_cq_read_wc_vendor_err
    cq.read_wc_flags = mlx5_cq_read_wc_flags
    for bit, name, fn in _READERS:
        if attr.wc_flags & bit:
            setattr(cq, name, fn)
    if attr.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK:
        if not mctx.clock_info_page:
            return errno.EOPNOTSUPP
        cq.read_completion_wallclock_ns = mlx5_cq_read_wc_completion_wallclock_ns
    return 0


# -- events ------------------------------------------------------------------------------------
@traced
def mlx5_arm_cq(cq: Any, solicited: int) -> int:
    """Mirrors mlx5_arm_cq(): the arm word (arm_sn, command, consumer index) to the
    arm doorbell record, then that word and the CQN as one 64-bit store to the
    context's CQ UAR (offset 0x20)."""
    mctx = cq.context
    sn = cq.arm_sn & 3
    ci = cq.cons_index & 0xFFFFFF
    cmd = MLX5_CQ_DB_REQ_NOT_SOL if solicited else MLX5_CQ_DB_REQ_NOT
    word = sn << 28 | cmd | ci
    mctx.proc.store(cq.dbrec + 4 * MLX5_CQ_ARM_DB, struct.pack(">I", word))
    mctx.proc.store(mctx.cq_uar_reg + MLX5_CQ_DOORBELL, struct.pack(">II", word, cq.cqn))
    return 0


def mlx5_cq_event(cq: Any) -> None:
    """Mirrors mlx5_cq_event(): an event was read for the CQ: arm_sn + 1."""
    cq.arm_sn += 1


# -- resize ------------------------------------------------------------------------------------
def mlx5_cq_resize_copy_cqes(cq: Any, new_buf: int, new_ncqe: int) -> None:
    """Mirrors mlx5_cq_resize_copy_cqes(): the CQEs from the consumer index up to the
    RESIZE CQE move to the new ring one slot later (each with the new ring's owner
    bit for its index), and the consumer index moves one on - the slot the RESIZE
    CQE took, so the device's next CQE (after it) follows the copies.  A ring without
    one (the device wrote none) is left as it is, as rdma-core only complains."""
    proc = cq.context.proc
    i = cq.cons_index
    for _ in range(cq.cqe + 1):
        raw = proc.load(_cqe_addr(cq, i), cq.cqe_sz)
        op_own = raw[-1]
        if op_own >> 4 == MLX5_CQE_RESIZE_CQ:
            cq.cons_index += 1           # the copies sit one slot later: skip one
            return
        j = i + 1
        owner = 1 if j & new_ncqe else 0
        proc.store(new_buf + (j & (new_ncqe - 1)) * cq.cqe_sz,
                   raw[:-1] + bytes([(op_own & ~MLX5_CQE_OWNER_MASK) | owner]))
        i += 1
    # no RESIZE CQE in a whole ring: rdma-core prints "resize CQ failed to get resize
    # CQE" and leaves the consumer index; so does this


@traced
def mlx5_resize_cq(cq: Any, cqe: int, alloc_buf: Any) -> None:
    """Mirrors mlx5_resize_cq(): EINVAL for a negative or oversized count; the same
    rounded size is a no-op; else a new ring (alloc_buf makes it, every CQE
    hardware-owned), RESIZE_CQ, the unpolled CQEs copied over, the old ring freed."""
    mctx = cq.context
    if cqe < 0 or cqe * 64 > 0x7FFFFFFF:
        raise VerbsError(errno.EINVAL, "mlx5_resize_cq")
    ncqe = roundup_pow_of_two(cqe + 1)                     # align_queue_size()
    if ncqe == cq.cqe + 1:
        return
    size = ncqe * cq.cqe_sz
    # mlx5_alloc_cq_buf(): a CQ made on a parent domain asks its allocators again
    buf, buf_type = mlx5_alloc_prefered_buf(mctx, cq.parent_domain, size, MLX5DV_RES_TYPE_CQ)
    try:
        alloc_buf(mctx.proc, buf, ncqe, cq.cqe_sz)
        c.ibv_cmd_resize_cq(cq, ncqe - 1, mlx5_ib_resize_cq(buf_addr=buf, cqe_size=cq.cqe_sz))
    except BaseException:
        mlx5_free_actual_buf(mctx, cq.parent_domain, buf, size, buf_type, MLX5DV_RES_TYPE_CQ)
        raise
    mlx5_cq_resize_copy_cqes(cq, buf, ncqe)
    mlx5_free_actual_buf(mctx, cq.parent_domain, cq.buf, cq.buf_size, cq.buf_type,
                         MLX5DV_RES_TYPE_CQ)
    cq.buf, cq.buf_size, cq.buf_type, cq.cqe = buf, size, buf_type, ncqe - 1

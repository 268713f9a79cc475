"""The ConnectX's data path: the engine that executes work requests (device model).

What the silicon does after software rings a doorbell, as a scheduler task
of its own ("mlx5_hca <pci name>"), so a trace shows the HCA's steps on their
own track and the race explorer can interleave them with the CPU's.

    doorbell (UAR write) -> hca_doorbell: note the QP (a BlueFlame write
        carries the WQE itself) and wake the engine
    hca_sq_process: read the doorbell record's send counter (DMA), and for
        each new WQE: hca_wqe_fetch (DMA through the QP's PAS, or the
        BlueFlame copy), hca_execute
    hca_execute: local keys -> DMA pieces (hca_mkey_translate through the
        mkey's MTT), gather the payload (hca_dma_gather), transmit a frame
        on the fabric (fabric.route) to the responder HCA's engine
    UD: the WQE's datagram segment (the AH's address vector, remote QPN,
        Q_Key) addresses the frame (hca_ud_address); the receiving QP checks
        the destination GID and the Q_Key and scatters the 40-byte GRH, then
        the payload, into its next receive WQE (hca_ud_responder)
    hca_rx: the responder checks the QP, the remote key and its access and
        bounds, moves the bytes (hca_dma_scatter), consumes a receive WQE
        for SEND / WRITE with immediate, and answers ACK, NAK or the READ
        response; the requester completes the WQE on the answer
    atomics (RC): compare-and-swap / fetch-and-add on one aligned 8-byte
        word of the responder's memory (hca_atomic); the original 8 bytes
        come back like a READ response into the requester's data segment
    hca_cqe_write: a 64-byte CQE by DMA into the CQ ring, owner bit = the
        pass parity; CQ_UPDATE unset = no CQE for a successful WQE

Errors are completions, as on the real device: a bad lkey, a range outside
the MR or missing local access is a local protection error; a bad rkey, a
range outside the remote MR or missing remote access is NAKed as a remote
access error; an operation the responder QP does not allow is a remote
invalid request; a SEND longer than the receive buffer is a local length
error at the responder and a remote invalid request at the requester; a
SEND with no receive posted is RNR-NAKed and retried (rnr_retry, 7 =
forever); a frame nobody answers (peer QP destroyed, reset, wrong MAC) ends
in transport retry exceeded - as does a request whose PSN is not the one the
responder expects next (a QP aimed at another connection's QPN), which the
responder drops without touching its QP.  The QP then moves to ERR and every other
outstanding WQE of both its queues completes with "work request flushed".
No byte outside a memory key's range is ever read or written: every access
is translated through an mkey or the QP's own PAS first.

Memory windows: a UMR WQE (opcode 0x25) binds a window's KLM mkey to a range
of an MR, or frees it (rebinding to nothing, LOCAL_INV) - a local operation,
completed in order with the WQEs before it; a refused bind is a memory window
bind error (0x06).  Access through a window's rkey goes through its KLM to the
MR's own translation; a type 2 window answers only the QP it is bound to, and a
SEND with Invalidate frees the responder's window (hca_remote_invalidate).

Whatever a process writes - its rings, its doorbell record, its UAR page -
at worst errs its own QP; the engine task serves every other QP on.  A WQE
the device cannot parse completes with a local QP operation error (0x02):
ds 0, an RDMA opcode without its remote address segment, a WQE running past
the doorbell record's counter, a record more WQEBBs ahead than the send
queue holds, an unknown opcode.  A length it cannot honour is a local length
error (0x01): inline data overrunning the WQE, a message beyond 2^log_max_msg.
Every loop over a ring is bounded by the ring's size (a flush completes at
most one ring's worth).  A UAR store of any width is taken: a BlueFlame copy
is assembled from contiguous stores and a torn one dropped (hca_doorbell).
An exception that still escapes a step is a model bug: a kernel WARN.

Bulk data moves with c_ext's dma_copy between the DMA pieces (after the
IOMMU) and a frame's payload; pieces outside RAM (a peer device's BAR) go
through the machine's physical-address decoder instead.

# EMU: one message per frame (no MTU segmentation, PSNs advance by one per
# message), responses in order, no timers: retries are counted, not timed
# (an unanswered frame fails at once after its retry budget; rnr_retry 7
# retries until a receive is posted or 10000 tries pass).  UD sends are one
# datagram each, checked only against the QP's log_msg_max (4096 bytes, the
# MTU mlx5_ib gives a UD QP), not the port's MTU; a datagram nobody takes is dropped
# unseen (hca_ud_responder).  No fence, no limit by the rd_atomic depths
# (max_rd_atomic / max_dest_rd_atomic) on outstanding READs and atomics,
# signature or scatter-to-CQE; a CQ overrun is counted in hca.async_events
# and the CQE dropped (unless the CQ ignores overruns, cqc.oi).

Completion events: a CQ doorbell (UAR offset 0x20: arm_sn, the solicited bit
and the consumer index, then the CQN) arms a CQ of that UAR page; the next CQE
written to an armed CQ - or at once, when CQEs past the armed consumer index
are already there - writes one EQE (type COMP, the CQN) into the CQ's EQ and
raises the EQ's MSI-X vector; the CQ is disarmed until armed again.  A doorbell
naming a CQ of another UAR page is ignored (hca.async_events).  MODIFY_CQ
resize (cq_resize) writes a RESIZE CQE at the producer index of the old ring and
goes on in the new one.

Shared receive queues (mlx5_fw_srq.py): a QP whose QPC says rq_type SRQ
takes each receive from the SRQ named by srqn_rmpn_xrqn - "posted" is the
SRQ's doorbell record (one big-endian counter) ahead of the WQEs the SRQ
has given out.  The device follows the ring's linked list: it starts at
WQE 0 and goes next to the index the taken WQE's next segment names (masked
to the ring), the data segments come after that 16-byte segment, and the
CQE's wqe_counter is the WQE's index, which the library links back as free.
The buffers are checked against the SRQ's PD.  A QP entering ERR flushes
none of the SRQ's WQEs.  When a receive leaves fewer WQEs posted than the
armed watermark (srqc.lwm), the SRQ-limit event is raised once (recorded
in hca.async_events as ("srq_limit", srqn)) and the watermark returns to 0; an
SRQ_RQ_LIMIT EQE naming the SRQ goes to the EQ that takes that event (the
driver's async EQ), whose MSI-X vector is raised (hca_async_eqe).  A QP that takes
its receives from an SRQ and enters ERR (by MODIFY_QP or on its own) raises
SRQ_LAST_WQE for the QP (Last WQE Reached: it takes no more of the SRQ's WQEs); a
QP the HCA cannot run because its doorbell record cannot be read enters ERR with
WQ_CATAS_ERROR (catastrophic).
# EMU: the responder's affiliated errors (WQ_ACCESS_ERROR, WQ_INVAL_REQ_ERROR),
# path migration, COMM_EST, SQ_DRAINED and CQ_ERROR events are not raised.
XRC: an initiator QP (st XRC with a send queue) sends like an RC QP, its WQEs
carrying the target SRQ's number in an XRC segment after the control segment;
the frame names it (XRCETH).  The target QP (st XRC, no queues) takes the
request - in sequence, acknowledged as RC - into that SRQ if it is in the QP's
XRC domain (else a remote invalid request NAK and the target QP errs); keys
are checked against the SRQ's PD, and the receive completes on the SRQ's CQ
under its user index, naming the target QP.
DC (mlx5_fw_dct.py): a DCI (st DCI) sends like an RC QP - acknowledged, retried -
but names its peer in each WQE: a datagram segment right after the control one
carries the DCT's number and 64-bit DC access key (hca_dc_address).  The DCT
(hca_dct_responder) drops a request whose key is not its own (counted; the DCI
times out), checks its rre/rwe/rae and PD, and takes a SEND from its SRQ,
completing on its CQ under its user index with the DCI's number as the source.
# EMU: a counter more than a ring ahead of what was given out is taken as that
# many WQEs, each read from the ring where the list leads - whatever the
# process wrote errs its own QPs.
# EMU: frames carry no solicited-event bit, so a solicited-only arm fires on
# the next CQE like a plain one; the EQ's own arming and overrun are not
# modelled (every EQE interrupts; the kernel's handler consumes at once).
"""

from __future__ import annotations

import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from c_ext import U64Array
from kernel_model import trace
from kernel_model.errno import KernelBug
from kernel_model.hw.fabric import route
from kernel_model.hw.mlx5_fw_port import NULL_MKEY
from kernel_model.hw.mlx5_ifc import MLX5_ADDR_OF, MLX5_GET, MLX5_SET, MLX5_SET64
from kernel_model.interrupt import msix_raise
from kernel_model.iommu import IommuFault, dma_to_phys
from kernel_model.ioport import MachineCheck
from kernel_model.locking import init_waitqueue_head, wait_event, wake_up
from kernel_model.sched import SCHED, DeadlockError, ReplayDivergence, Task, touch_ram
from kernel_model.trace import traced, tracepoint

if TYPE_CHECKING:
    from kernel_model.hw.mlx5 import ConnectX, UarWrite
    from kernel_model.hw.mlx5_fw_ctx import Mlx5Cq, Mlx5Qp
    from kernel_model.hw.mlx5_fw_srq import Mlx5Srq

# QP states (qpc.state) and types (qpc.st)
QPS_RST, QPS_INIT, QPS_RTR, QPS_RTS, QPS_SQER, QPS_ERR, QPS_SQD = 0, 1, 2, 3, 4, 6, 7
ST_RC, ST_UC, ST_UD, ST_XRC = 0x0, 0x1, 0x2, 0x3
ST_DCI = 0x5                   # a DC initiator (its peers are DCTs)
DCT_ACTIVE = 0                 # dctc.state
EXTENDED_AV = 0x80000000       # mlx5_wqe_av.dqp_dct: MLX5_EXTENDED_UD_AV
MLX5_NON_ZERO_RQ = 0
MLX5_SRQ_RQ = 1
# WQE opcodes (mlx5 device.h / rdma-core mlx5dv.h)
OP_NOP, OP_RDMA_WRITE, OP_RDMA_WRITE_IMM = 0x00, 0x08, 0x09
OP_SEND, OP_SEND_IMM, OP_RDMA_READ = 0x0A, 0x0B, 0x10
OP_ATOMIC_CS, OP_ATOMIC_FA = 0x11, 0x12
OP_NAMES = {OP_NOP: "NOP", OP_RDMA_WRITE: "RDMA_WRITE", OP_RDMA_WRITE_IMM: "RDMA_WRITE_IMM",
            OP_SEND: "SEND", OP_SEND_IMM: "SEND_IMM", OP_RDMA_READ: "RDMA_READ",
            OP_ATOMIC_CS: "ATOMIC_CS", OP_ATOMIC_FA: "ATOMIC_FA"}
OP_ATOMICS = (OP_ATOMIC_CS, OP_ATOMIC_FA)
OP_SEND_INV, OP_UMR = 0x01, 0x25
OP_NAMES.update({OP_SEND_INV: "SEND_INV", OP_UMR: "UMR"})
# the UMR of a memory-window bind (rdma-core mlx5dv.h: struct mlx5_wqe_umr_ctrl_seg and
# struct mlx5_wqe_mkey_context_seg, 48 and 64 bytes, then 64 bytes of KLM)
UMR_CTRL_SEG, MKEY_SEG = 48, 64
UMR_CHECK_FREE, UMR_CHECK_QPN = 1 << 5, 1 << 3
UMR_MASK_LEN, UMR_MASK_START_ADDR, UMR_MASK_MKEY, UMR_MASK_QPN = 1 << 0, 1 << 6, 1 << 13, 1 << 14
UMR_MASK_ACCESS_REMOTE_READ, UMR_MASK_ACCESS_REMOTE_WRITE = 1 << 19, 1 << 20
UMR_MASK_ACCESS_ATOMIC = 1 << 21
MKEY_CTX_FREE = 1 << 6
MKEY_CTX_ATOMIC, MKEY_CTX_REMOTE_WRITE, MKEY_CTX_REMOTE_READ = 1 << 6, 1 << 5, 1 << 4
MKC_ACCESS_MODE_KLMS = 0x2
MKC_ACCESS_MODE_KSM = 0x3
MKC_ACCESS_MODE_MEMIC = 0x5
# a DMA piece in the device's own on-chip memory (MEMIC), not on the bus: the flag
# marks the address as a MEMIC offset, which never goes through the IOMMU
MEMIC_PIECE = 1 << 63
ATOMIC_SIZE = 8
WQE_CTRL_CQ_UPDATE = 2 << 2
INLINE_SEG = 0x80000000
INVALID_LKEY = 0x100
SEND_WQE_BB = 64
# CQE opcodes and error syndromes
CQE_REQ, CQE_RESP_WR_IMM, CQE_RESP_SEND, CQE_RESP_SEND_IMM = 0, 1, 2, 3
CQE_RESP_SEND_INV = 4
CQE_REQ_ERR, CQE_RESP_ERR = 13, 14
CQE_RESIZE_CQ = 5
#: the responder's CQE opcode for a request that consumed a receive WQE
_RESP_CQE_OPCODE = {OP_SEND: CQE_RESP_SEND, OP_SEND_IMM: CQE_RESP_SEND_IMM,
                    OP_RDMA_WRITE_IMM: CQE_RESP_WR_IMM, OP_SEND_INV: CQE_RESP_SEND_INV}
#: the QP (or DCT) context bit a remote request needs: rwe, rre or rae
_REMOTE_ENABLE = {OP_RDMA_WRITE: "rwe", OP_RDMA_WRITE_IMM: "rwe", OP_RDMA_READ: "rre",
                  OP_ATOMIC_CS: "rae", OP_ATOMIC_FA: "rae"}
EQE_TYPE_COMP, EQE_SIZE = 0x00, 64
# asynchronous events: the EQE type, and struct mlx5_eqe_qp_srq's type (QP or SRQ)
EQE_TYPE_SRQ_RQ_LIMIT = 0x14
EQE_TYPE_SRQ_LAST_WQE, EQE_TYPE_WQ_CATAS_ERROR = 0x13, 0x05
EQE_RSC_QP, EQE_RSC_SRQ = 0, 1
SYND_LOCAL_LENGTH, SYND_LOCAL_QP_OP, SYND_LOCAL_PROT, SYND_WR_FLUSH = 0x01, 0x02, 0x04, 0x05
SYND_REMOTE_INVAL_REQ, SYND_REMOTE_ACCESS, SYND_REMOTE_OP = 0x12, 0x13, 0x14
SYND_TRANSPORT_RETRY_EXC, SYND_RNR_RETRY_EXC = 0x15, 0x16
SYND_MW_BIND = 0x06
SYND_NAMES = {SYND_LOCAL_LENGTH: "local length", SYND_LOCAL_QP_OP: "local QP operation",
              SYND_LOCAL_PROT: "local protection", SYND_WR_FLUSH: "work request flushed",
              SYND_REMOTE_INVAL_REQ: "remote invalid request",
              SYND_REMOTE_ACCESS: "remote access", SYND_REMOTE_OP: "remote operation",
              SYND_TRANSPORT_RETRY_EXC: "transport retry exceeded",
              SYND_RNR_RETRY_EXC: "RNR retry exceeded", SYND_MW_BIND: "memory window bind"}
RNR_FOREVER_CAP = 10000
# UD: the datagram segment (struct mlx5_wqe_datagram_seg = the 48-byte mlx5_wqe_av), the
# GRH the receiver scatters first, the CQE's L3 header type (flags_rqpn bits 24-25)
DATAGRAM_SEG = 48
GRH_SIZE = 40
CQE_L3_GRH, CQE_L3_IPV6, CQE_L3_IPV4 = 0, 1, 2
ROCE_V2 = 2                    # roce_addr_layout.roce_version
ROCE_L3_IPV4 = 0               # roce_addr_layout.roce_l3_type
IPPROTO_UDP, IB_NEXT_HDR_BTH = 0x11, 0x1B
BTH, DETH, UDP_HDR, ICRC, IPV4_HDR = 12, 8, 8, 4, 20

# a frame handed from one port to another (or looped back): who to whom, what
# the doorbell record's counter as the engine read it, and where each WQE came from
trace_hca_dbrec = tracepoint("hca_dbrec", "qpn send_counter", layer="hw")
trace_hca_quiesced = tracepoint("hca_quiesced", "kind num", layer="hw")
trace_hca_wqe = tracepoint("hca_wqe", "qpn counter source", layer="hw")
trace_roce_frame = tracepoint("roce_frame", "src dst kind op src_qpn dest_qpn wqe payload",
                              layer="hw")


def _port_name(hca: ConnectX) -> str:
    return f"{hca.machine.name}/{hca.name}"
MAX_PIECES = 1 << 16
# up to this many pieces a DMA is slice copies (no zeroed payload first, no index
# arrays); beyond, one ops.dma_copy
FEW_PIECES = 16


class WqeError(Exception):
    """A WQE failed: the syndrome its completion carries."""

    def __init__(self, syndrome: int, why: str):
        super().__init__(f"{SYND_NAMES.get(syndrome, hex(syndrome))}: {why}")
        self.syndrome = syndrome


class QpQuiesced(Exception):
    """MODIFY_QP to RESET, DESTROY_QP or DESTROY_CQ committed while an engine step was
    between two DMAs for that QP or CQ: the device touches none of its memory after
    the command (the real command returns once the queue is quiesced), so the step
    ends there (Mlx5Engine._quiesced)."""


class OdpFault(WqeError):
    """An access through a page-fault-enabled mkey (create_mkey pg_access) hit an MTT
    entry without the present bit it needs: the device raises a page fault (the
    syndrome is what the access becomes if the fault cannot be resolved)."""

    def __init__(self, syndrome: int, key: int, addr: int, length: int, write: bool):
        super().__init__(syndrome, f"page fault: key {key:#x} [{addr:#x}, +{length:#x}) "
                                   f"{'write' if write else 'read'}")
        self.key, self.addr, self.length, self.write = key, addr, length, write


# on-demand paging: the PAGE_FAULT event, its EQE (struct mlx5_eqe_page_fault, RDMA
# sub-type) and how often one WQE or one responder QP may fault before its access
# completes in error instead (# EMU: the device's own limit is a timer; the model
# counts, so a fault the driver never resolves cannot hang a QP)
EQE_TYPE_PAGE_FAULT, EQE_PF_SUBTYPE_RDMA = 0x0C, 1
PFAULT_REQUESTOR, PFAULT_WRITE, PFAULT_RDMA = 1 << 0, 1 << 1, 1 << 2
ODP_FAULT_CAP = 8


@attrs.define(eq=False, slots=True)
class Frame:
    """A RoCE frame on the fabric: one request or one response (see the EMU note)."""

    kind: str                 # "req", "ack", "nak", "rnr", "read_resp", "timeout"
    src: ConnectX             # the HCA that sent it (responses go back there)
    src_qpn: int
    dest_qpn: int
    dmac: int = 0
    opcode: int = 0           # the WQE opcode of a request
    wqe_index: int = 0        # the requester's WQE counter, echoed in responses
    raddr: int = 0
    rkey: int = 0
    length: int = 0
    imm: int = 0              # immediate data, as the WQE carried it (big-endian)
    psn: int = 0              # a request's packet sequence number (BTH PSN)
    payload: bytearray | None = None
    syndrome: int = 0
    why: str = ""
    qkey: int = 0             # a UD datagram's Q_Key (DETH)
    grh: bytes | None = None  # a UD datagram's 40-byte GRH / IPv4 header, as received
    l3: int = 0               # its CQE L3 header type (CQE_L3_GRH, _IPV6, _IPV4)
    swap_add: int = 0         # an atomic's operands (AtomicETH): swap or addend, compare
    compare: int = 0
    xrc_srqn: int = 0         # an XRC request's target SRQ (XRCETH)
    st: int = -1              # the requester's transport (the BTH opcode's high bits; -1: any)
    dct: bool = False         # a DC request: dest_qpn is a DCT, dc_key its access key (DCETH)
    dc_key: int = 0

    def __repr__(self) -> str:
        op = OP_NAMES.get(self.opcode, hex(self.opcode))
        return (f"{self.kind} {op} qpn {self.src_qpn:#x}->{self.dest_qpn:#x} "
                f"len {self.length}" + (f" {self.why}" if self.why else ""))


@attrs.define(eq=False, slots=True)
class Sent:
    """An RC WQE the requester transmitted and awaits the answer for."""

    wqe_index: int
    opcode: int
    signaled: bool
    length: int
    frame: Frame
    local: list[tuple[int, int, int]]   # READ: (lkey, addr, len) destinations
    rnr_tries: int = 0
    error: int = 0                      # a local error, reported when its turn comes
    why: str = ""


@attrs.define(eq=False, slots=True)
class QpHw:
    """The engine's per-QP state (what the device keeps beside the QPC)."""

    sq_ci: int = 0                      # WQE basic blocks consumed (hw_sq_wqebb_counter)
    rq_ci: int = 0                      # receive WQEs consumed (hw_rq_counter)
    sq_psn: int | None = None           # the next request's PSN (from next_send_psn)
    rq_psn: int | None = None           # the PSN the responder expects (next_rcv_psn)
    outstanding: deque = attrs.Factory(deque)
    stalled: bool = False               # a failed WQE waits for earlier answers
    pf_token: int | None = None         # the send queue waits for this page fault
    pf_wqe: int | None = None           # the WQE counter that faulted, and how often
    pf_tries: int = 0
    pf_error: bool = False              # its fault was resumed with an error
    rq_pf_tries: int = 0                # responder faults in a row (not yet resolved)
    rq_pf_error: bool = False           # the responder's last fault resumed with an error
    # SQ slot -> (WQE counter, BlueFlame copy): at most one copy per slot
    bf: dict[int, tuple[int, bytes]] = attrs.Factory(dict)


def _be32(b: bytes, off: int) -> int:
    return struct.unpack_from(">I", b, off)[0]


#: the big-endian segments hca_execute reads whole: the ctrl segment's first word
#: and its imm word (struct mlx5_wqe_ctrl_seg), a remote address segment (raddr,
#: rkey: struct mlx5_wqe_raddr_seg), a data segment (byte_count, lkey, addr:
#: struct mlx5_wqe_data_seg)
_CTRL = struct.Struct(">I8xI")
_RADDR = struct.Struct(">QI")
_DSEG = struct.Struct(">IIQ")


def _be64(b: bytes, off: int) -> int:
    return struct.unpack_from(">Q", b, off)[0]


def _wqe_bbs(wqe: bytes) -> int:
    """The WQEBBs a WQE occupies by its ctrl segment's ds (at least one)."""
    return max(1, -(-(wqe[7] & 0x3F) // 4))


def _wqe_check(wqe: bytes, pending: int, nbb: int) -> None:
    """A WQE the device refuses to parse: a local QP operation error."""
    if pending > nbb:
        raise WqeError(SYND_LOCAL_QP_OP, f"doorbell record {pending} WQEBBs ahead, the send "
                                         f"queue holds {nbb}")
    if not wqe[7] & 0x3F:
        raise WqeError(SYND_LOCAL_QP_OP, "WQE with ds 0")
    if _wqe_bbs(wqe) > pending:
        raise WqeError(SYND_LOCAL_QP_OP, f"WQE of {_wqe_bbs(wqe)} WQEBBs runs past the "
                                         f"doorbell record ({pending} posted)")


class Mlx5Engine:
    """The data path of one ConnectX.  See the module docstring."""

    def __init__(self, hca: ConnectX):
        self.hca = hca
        self.machine = hca.machine
        self.dev = hca.pdev.dev
        self.ops = hca.machine.ops
        self.work: deque[int] = deque()          # QPs whose send queue has news
        self.rx: deque[Frame] = deque()
        self.retry: deque[tuple[int, Sent]] = deque()
        self.qps: dict[int, QpHw] = {}
        self.cq_pi: dict[int, int] = {}
        self.srq_hw: dict[int, list[int]] = {}   # SRQN -> [next WQE index, WQEs given out]
        self.cq_armed: dict[int, int] = {}        # CQN -> the consumer index it was armed at
        self.eq_pi: dict[int, int] = {}
        self.task: Task | None = None
        self.stopping = False
        self.stats = {"wqes": 0, "bytes": 0, "cqes": 0, "frames_tx": 0, "frames_rx": 0,
                      "ud_dropped": 0, "qkey_violations": 0, "dc_key_violations": 0}
        self.async_events = hca.async_events
        self._pieces = (U64Array(1024, zero=False), U64Array(1024, zero=False))
        # scratch piece arrays (translation, copy destination, copy source),
        # grown on demand: the engine is one task and finishes with each
        # before its next scheduling point, so one set serves every WQE
        self._scr = [(U64Array(64, zero=False), U64Array(64, zero=False)) for _ in range(3)]
        self._bf_chunks: dict[tuple, bytearray] = {}
        # mkeys a step has translated and may still DMA through, until the step ends
        self.mkey_busy: dict[int, int] = {}
        self._held: list[int] = []
        self.draining: set[int] = set()          # mkeys a revoke waits on
        self.pf_tokens: dict[int, tuple[int, bool]] = {}   # token -> (QPN, requester)
        self.pf_next_token = 1
        self.drain_wq = init_waitqueue_head(f"mlx5 dma drain {hca.name}")
        hca.doorbell_hooks.append(self.hca_doorbell)
        self.machine.shutdown_hooks.append(lambda m: self.stop())

    def __repr__(self) -> str:
        return f"mlx5 engine {self.hca.name}"

    # -- the task ------------------------------------------------------------------
    def kick(self) -> None:
        """Make sure the engine runs: start its task, or wake it if it sleeps."""
        if self.stopping:
            return
        if self.task is None or self.task.done:
            # stored before the task can run: a kick from the engine itself or from
            # whoever runs at the spawn's point must find it (two engine tasks, one
            # blocked forever, deadlocked the machine's shutdown)
            self.task = SCHED.new_task(self._run, name=f"mlx5_hca {self.hca.name}")
            self.task.machine = self.machine
            SCHED.point("wake_up_new_task")
        elif self.task.state == "blocked":
            SCHED.wake(self.task)

    def stop(self) -> None:
        """Power off (machine shutdown, function reset): the task ends."""
        self.stopping = True
        if self.task is not None and self.task.state == "blocked":
            SCHED.wake(self.task)

    def _run(self) -> None:
        while not self.stopping:
            if self.rx:
                self._step(self.hca_rx, self.rx.popleft())
            elif self.work:
                self._step(self.hca_sq_process, self.work.popleft())
            elif self.retry:
                SCHED.yield_("hca_rnr_retry")  # let the responder's CPU post a receive
                if self.retry and not self.rx and not self.work:
                    self._retransmit(*self.retry.popleft())
            else:
                SCHED.block(self)
        self.task = None

    def _step(self, fn: Callable, arg: object) -> None:
        """One step of the engine.  Whatever a process wrote ends in a
        completion or an async event before it gets here; an exception that
        does is a bug of this model: reported as a kernel WARN (the leak check
        fails on it) while the engine keeps serving every other QP."""
        try:
            fn(arg)
        except QpQuiesced:
            pass                          # its QP was reset or destroyed meanwhile
        except (KernelBug, DeadlockError, ReplayDivergence):
            raise
        except Exception as e:  # noqa: BLE001 - reported, see above
            self.machine.report_bug("mlx5 engine", f"{fn.__name__}({arg!r}) raised {e!r}")
        finally:
            self._release_held()

    def _release_held(self) -> None:
        """A step is over: its DMA is done; wake anyone draining those mkeys."""
        if not self._held:
            return
        idle = False
        for index in self._held:
            self.mkey_busy[index] -= 1
            if not self.mkey_busy[index]:
                del self.mkey_busy[index]
                idle = idle or index in self.draining
        self._held.clear()
        if idle:
            wake_up(self.drain_wq)

    def mkey_revoked(self, index: int) -> None:
        """An mkey was just revoked (its context says free): wait until no DMA that
        passed its checks before is still moving bytes.
        # EMU: with none in flight the device answers at once - this is the device's
        # wait, not the kernel's, so no scheduling point (wait_event's) comes first;
        # a DMA step after it finds the context free, as it would a moment later"""
        if index not in self.mkey_busy:
            return
        self.draining.add(index)
        try:
            wait_event(self.drain_wq, lambda: index not in self.mkey_busy)
        finally:
            self.draining.discard(index)

    def _queue(self, qpn: int) -> None:
        if qpn not in self.work:
            self.work.append(qpn)
        self.kick()

    # -- doorbells and state changes ------------------------------------------------
    @traced
    def hca_doorbell(self, hca: ConnectX, rec: UarWrite) -> None:
        """A write to a UAR page: a send doorbell (8 bytes of the control
        segment) or a BlueFlame copy (the WQE itself, in 64-byte chunks)."""
        if rec.kind == "cq_db":
            self.hca_cq_arm(rec)
            return
        if rec.kind not in ("db", "bf"):
            return
        key = (rec.uar, rec.bfreg, rec.buf)
        if rec.kind == "db":
            self._bf_chunks.pop(key, None)
            self._ring(_be32(rec.data, 4) >> 8, rec.uar)
            return
        buf = self._bf_assemble(key, rec)
        if buf is None:
            return                                # incomplete, torn or overrun: nothing yet
        word = _be32(buf, 4)
        qpn, ds = word >> 8, word & 0x3F
        if not ds or len(buf) < ds * 16:
            self._ring(qpn, rec.uar)              # no usable copy: the ctrl dword rings
            return
        if not self._owns(qpn, rec.uar):
            return
        qp = self.hca.fw.qps[qpn]
        if qp.state in (QPS_RTS, QPS_SQD):
            counter = _be32(buf, 0) >> 8 & 0xFFFF
            slot = counter & ((1 << self._c(qp)["log_sq_size"]) - 1)
            self._qphw(qpn).bf[slot] = (counter, bytes(buf[:ds * 16]))
        elif qp.state != QPS_ERR:
            # the send queue is not running: the copy is not kept, so it can
            # never stand in for a WQE posted later with the same counter
            self.async_events.append(("bf_qp_not_ready", qpn, rec.uar))
            return
        self._queue(qpn)      # (in ERR: the doorbell makes the WQE flush)

    def _ring(self, qpn: int, uar: int) -> None:
        if self._owns(qpn, uar):
            self._queue(qpn)

    def _bf_assemble(self, key: tuple, rec: UarWrite) -> bytearray | None:
        """Collect a BlueFlame copy from stores of any width: a store at the
        buffer's start begins one, each next store must continue where the
        last ended; the copy is whole once it holds the 64-byte chunks its
        ctrl segment's ds asks for.

        # EMU: a store that neither starts the buffer nor continues the copy
        # in progress (a torn write-combining burst) drops the copy, as does
        # one running past the buffer; the part never rings.  The doorbell
        # record was written first, so the process's next doorbell has the
        # device fetch the WQE from the ring instead.
        """
        half = self.hca.fw.bar_layout().bf_reg_size // 2
        at = (rec.offset - 0x800) % half
        have = self._bf_chunks.get(key)
        if at == 0:
            have = self._bf_chunks[key] = bytearray(rec.data)
        elif have is not None and len(have) == at:
            have += rec.data
        else:
            self._bf_chunks.pop(key, None)
            return None
        if at + len(rec.data) > half:
            del self._bf_chunks[key]
            self.async_events.append(("bf_overrun", rec.uar, rec.offset, len(rec.data)))
            return None
        if len(have) < 8 or len(have) < min(max(1, -(-(have[7] & 0x3F) // 4)) * 64, half):
            return None                               # more chunks to come
        del self._bf_chunks[key]
        return have

    def _owns(self, qpn: int, uar: int) -> bool:
        """The device acts only on a doorbell for a QP bound to that UAR page."""
        qp = self.hca.fw.qps.get(qpn)
        if qp is None or self._c(qp)["uar_page"] != uar:
            self.async_events.append(("bad_doorbell", qpn, uar))
            return False
        return True

    def qp_state_changed(self, qp: Mlx5Qp, old: int, new: int) -> None:
        """MODIFY_QP ran: RESET forgets the queues, ERR flushes them, RTS runs what was
        posted before it (_posted)."""
        qp.hw_cache = None                # the command may have changed any field
        if new == QPS_RST:
            self.qps.pop(qp.num, None)
            self.retry = deque(r for r in self.retry if r[0] != qp.num)
        elif new == QPS_ERR or (new == QPS_RTS and self._posted(qp)):
            self._queue(qp.num)
        if new == QPS_ERR and old != QPS_ERR:
            self.hca_last_wqe_reached(qp)

    def _posted(self, qp: Mlx5Qp) -> bool:
        """Entering RTS: did the process post send WQEs the queue has not run (its
        doorbell record's send counter ahead of the device's)?  Only then does the
        engine get work - the WQEs posted before RTS run now.
        # EMU: the command reads the record itself, within MODIFY_QP; an engine step
        # that would only find the counters equal is left out (it made the engine a
        # task runnable through every race after a connect, for nothing)"""
        try:
            raw = self._read_now(self._c(qp)["dbr_addr"], 8)
        except (WqeError, MachineCheck):
            return True                   # the engine's own read reports the fault
        hw = self.qps.get(qp.num)
        return bool((_be32(raw, 4) - (hw.sq_ci if hw is not None else 0)) & 0xFFFF)

    def object_destroyed(self, kind: str, num: int) -> None:
        """DESTROY_QP / DESTROY_CQ / DEALLOC_UAR: forget the engine's state for that
        number - for a UAR page, any BlueFlame copy half-written into it, so the page's
        next owner never continues the last one's WQE."""
        if kind == "qp":
            self.qps.pop(num, None)
            self.retry = deque(r for r in self.retry if r[0] != num)
        elif kind == "srq":
            self.srq_hw.pop(num, None)
        elif kind == "cq":
            self.cq_pi.pop(num, None)
            self.cq_armed.pop(num, None)
        elif kind == "eq":
            self.eq_pi.pop(num, None)
        elif kind == "uar":
            per = self.hca.fw.uars_per_page
            for key in [k for k in self._bf_chunks if k[0] - k[0] % per == num]:
                del self._bf_chunks[key]

    def reset(self) -> None:
        """Function reset: every queue and CQ is gone."""
        self.qps.clear()
        self.srq_hw.clear()
        self.cq_pi.clear()
        self.cq_armed.clear()
        self.eq_pi.clear()
        self.retry.clear()
        self.work.clear()
        self.rx.clear()

    def _qphw(self, qpn: int) -> QpHw:
        hw = self.qps.get(qpn)
        if hw is None:
            hw = self.qps[qpn] = QpHw()
        return hw

    # -- DMA -----------------------------------------------------------------------
    def _phys(self, dma: int, n: int, write: bool) -> list[tuple[int, int]]:
        try:
            return dma_to_phys(self.dev, dma, n, write)
        except IommuFault as e:
            self.hca.device_errors.append(f"DMA fault: {e}")
            raise WqeError(SYND_LOCAL_PROT, str(e)) from None

    def dma_read(self, dma: int, n: int, of: tuple = ()) -> bytes:
        """A small DMA read (doorbell record, WQE, context): through the IOMMU.  `of`:
        the QPs and CQs it reads for (_quiesced)."""
        SCHED.point("dma_read")
        if of:
            self._quiesced(of)
        return self._read_now(dma, n)

    def _read_now(self, dma: int, n: int) -> bytes:
        return b"".join(self.machine.phys_read(p, k) for p, k in self._phys(dma, n, False))

    def dma_write(self, dma: int, data: bytes, of: tuple = ()) -> None:
        SCHED.point("dma_write")
        if of:
            self._quiesced(of)
        off = 0
        for p, k in self._phys(dma, len(data), True):
            self.machine.phys_write(p, data[off:off + k])
            off += k

    def _quiesced(self, objs: tuple) -> None:
        """QpQuiesced if one of the QPs was reset or destroyed, or one of the CQs or
        SRQs destroyed, since the step began: the step that found work for them ends at
        this DMA, which would read or write memory the process may have unpinned
        and freed by then (found by the race explorer: a flush overtaken by exit
        read the freed doorbell record's poison as a send counter)."""
        fw = self.hca.fw
        for o in objs:
            kind = o.kind
            if kind == "QP":
                gone = fw.qps.get(o.num) is not o or o.state == QPS_RST
            elif kind == "CQ":
                gone = fw.cqs.get(o.num) is not o
            elif kind == "SRQ":
                gone = fw.srqs.get(o.num) is not o
            else:
                continue
            if gone:
                if trace.enabled:
                    trace_hca_quiesced(o.kind, hex(o.num))
                raise QpQuiesced(f"{o.kind} {o.num:#x}")

    def _to_phys(self, pieces: list[tuple[int, int]], write: bool) -> list[tuple[int, int]]:
        if not self.machine.iommu.translating:
            return pieces                 # the bus address is the physical one
        out: list[tuple[int, int]] = []
        for dma, n in pieces:
            out += [(dma, n)] if dma & MEMIC_PIECE else self._phys(dma, n, write)
        return out

    def _in_ram(self, phys: list[tuple[int, int]]) -> bool:
        size = self.machine.ram_size
        for p, n in phys:
            if p + n > size:
                return False
        return True

    @traced
    def hca_dma_gather(self, pieces: list[tuple[int, int]], length: int) -> bytearray:
        """DMA-read the pieces into one payload (c_ext dma_copy for RAM)."""
        SCHED.point("dma_read")
        m = self.machine
        phys = self._to_phys(pieces, False)
        mem = m.mem
        if len(phys) == 1 and phys[0][0] + phys[0][1] <= m.ram_size:
            # (the common case, taken first: one piece of RAM)
            p, n = phys[0]
            if SCHED.fp_step is not None:
                touch_ram(mem, p, n, False)
            out = bytearray(mem.ram[p:p + n])
        elif self._in_ram(phys):
            for p, n in phys:
                touch_ram(mem, p, n, False)
            if len(phys) <= FEW_PIECES:   # the payload is a copy of the pieces,
                ram = mem.ram             # not zeroes copied over (a 1 MiB memset)
                out = bytearray().join([ram[p:p + n] for p, n in phys])
            else:
                out = bytearray(length)
                self._copy(out, [(0, length)], mem, phys)
        else:
            out = bytearray(length)
            off = 0
            for p, n in phys:
                if p & MEMIC_PIECE:
                    at = p & ~MEMIC_PIECE
                    out[off:off + n] = self.hca.fw.memic_data[at:at + n]
                    off += n
                    continue
                try:
                    out[off:off + n] = self.machine.phys_read(p, n)
                except MachineCheck as e:   # the target answered with an error
                    raise WqeError(SYND_LOCAL_PROT, f"DMA read failed: {e}") from None
                off += n
        self.stats["bytes"] += length
        return out

    @traced
    def hca_dma_scatter(self, pieces: list[tuple[int, int]], payload: bytes | bytearray) -> None:
        """DMA-write a payload over the pieces."""
        SCHED.point("dma_write")
        m = self.machine
        phys = self._to_phys(pieces, True)
        mem = m.mem
        if len(phys) == 1 and phys[0][0] + phys[0][1] <= m.ram_size and \
                phys[0][1] == len(payload):
            # (the common case, taken first: one piece of RAM, the payload's size)
            p, n = phys[0]
            if SCHED.fp_step is not None:
                touch_ram(mem, p, n, True)
            mem.ram[p:p + n] = payload
        elif self._in_ram(phys):
            for p, n in phys:
                touch_ram(mem, p, n, True)
            if len(phys) <= FEW_PIECES and sum(n for _, n in phys) == len(payload):
                ram, src, off = mem.ram, memoryview(payload), 0
                for p, n in phys:
                    ram[p:p + n] = src[off:off + n]
                    off += n
            else:
                self._copy(mem, phys, payload, [(0, len(payload))])
        else:
            off = 0
            for p, n in phys:
                if p & MEMIC_PIECE:
                    at = p & ~MEMIC_PIECE
                    self.hca.fw.memic_data[at:at + n] = payload[off:off + n]
                    off += n
                    continue
                try:
                    self.machine.phys_write(p, bytes(payload[off:off + n]))
                except MachineCheck as e:   # a posted write nobody takes: lost
                    self.machine.report_bug("mlx5 engine", f"DMA write dropped: {e}")
                off += n
        self.stats["bytes"] += len(payload)

    def _copy(self, dst, dpieces: list[tuple[int, int]], src, spieces: list[tuple[int, int]]
              ) -> None:
        da, dl = self._array(dpieces, 0)
        sa, sl = self._array(spieces, 1)
        self.ops.dma_copy(dst, da, dl, len(dpieces), src, sa, sl, len(spieces))

    def _scratch(self, slot: int, n: int) -> tuple[U64Array, U64Array]:
        have = self._scr[slot]
        if have[0].n < n:
            cap = max(n, min(2 * have[0].n, MAX_PIECES))
            have = self._scr[slot] = (U64Array(cap, zero=False), U64Array(cap, zero=False))
        return have

    def _array(self, pieces: list[tuple[int, int]], which: int) -> tuple[U64Array, U64Array]:
        a, b = self._scratch(1 + which, len(pieces))
        for i, (x, y) in enumerate(pieces):
            a.view[i] = x
            b.view[i] = y
        return a, b

    # -- queues in host memory, through a context's PAS -------------------------------
    def _pas_pieces(self, obj: Mlx5Qp | Mlx5Cq, off: int, n: int) -> list[tuple[int, int]]:
        c = self._c(obj)
        a, b = self._pieces
        k = self.ops.mtt_pieces(obj.pas, len(obj.pas), c["pg_bit"], c["base"] + off, n, a, b)
        if k < 0:
            raise WqeError(SYND_LOCAL_QP_OP, f"queue offset {off:#x} outside its PAS")
        return [(a.view[i], b.view[i]) for i in range(k)]

    def _read_queue(self, obj: Mlx5Qp | Mlx5Cq, off: int, n: int) -> bytes:
        return b"".join(self.dma_read(a, k, (obj,)) for a, k in self._pas_pieces(obj, off, n))

    def _dbrec(self, qp: Mlx5Qp) -> tuple[int, int]:
        """The doorbell record: (receive counter, send counter), big-endian words."""
        raw = self.dma_read(self._c(qp)["dbr_addr"], 8, (qp,))
        return _be32(raw, 0), _be32(raw, 4)

    def _c(self, obj: Mlx5Qp | Mlx5Cq) -> dict:
        """The context fields the engine reads, snapshotted once per object (a
        device caches contexts too); a QP's is dropped at every MODIFY_QP.
        # EMU: anything else that rewrites a context must drop obj.hw_cache."""
        c = getattr(obj, "hw_cache", None)
        if c is not None:
            return c
        ctx = obj.ctx
        pg_bit = 12 + ctx["log_page_size"]
        c = {"pg_bit": pg_bit, "base": ctx["page_offset"] * ((1 << pg_bit) // 64),
             "dbr_addr": ctx["dbr_addr"]}
        if obj.kind == "QP":
            for f in ("uar_page", "pd", "st", "remote_qpn", "rwe", "rre", "rae", "rnr_retry",
                      "q_key",
                      "no_sq", "cqn_snd", "cqn_rcv", "user_index", "log_sq_size",
                      "log_rq_size", "log_rq_stride", "next_send_psn", "next_rcv_psn",
                      "rq_type", "srqn_rmpn_xrqn", "xrcd", "log_msg_max"):
                c[f] = ctx[f]
            path = MLX5_ADDR_OF("qpc", ctx, "primary_address_path")
            c["rmac"] = path["rmac_47_32"] << 32 | path["rmac_31_0"]
            c["rq_bytes"] = (1 << ctx["log_rq_size"]) << (ctx["log_rq_stride"] + 4) \
                if ctx["rq_type"] == MLX5_NON_ZERO_RQ else 0
        elif obj.kind == "SRQ":
            for f in ("log_srq_size", "log_rq_stride", "pd", "xrcd", "cqn", "user_index"):
                c[f] = ctx[f]
        else:
            c["log_cq_size"] = ctx["log_cq_size"]
            c["cqe_size"] = 64 << min(ctx["cqe_sz"], 1)
        obj.hw_cache = c
        return c

    @traced
    def hca_wqe_fetch(self, qp: Mlx5Qp, counter: int) -> bytes:
        """The WQE at a send-queue counter: its BlueFlame copy if it came with
        the doorbell, else a DMA read through the QP's PAS (wrapping at the
        end) of ds * 16 bytes - at least the 16-byte control segment, at most
        63 * 16."""
        hw = self._qphw(qp.num)
        c = self._c(qp)
        nbb = 1 << c["log_sq_size"]
        idx = counter & (nbb - 1)
        bf = hw.bf.pop(idx, None)
        if bf is not None and bf[0] != counter & 0xFFFF:
            bf = None                     # a copy for another pass over this slot
        if trace.enabled:
            trace_hca_wqe(hex(qp.num), counter & 0xFFFF, "dma" if bf is None else "blueflame")
        if bf is not None:
            return bf[1]
        sq = c["rq_bytes"]
        ctrl = self._read_queue(qp, sq + idx * SEND_WQE_BB, 16)
        size = max(16, (ctrl[7] & 0x3F) * 16)
        out = bytearray()
        while len(out) < size:
            chunk = min(SEND_WQE_BB, size - len(out))
            out += self._read_queue(qp, sq + idx * SEND_WQE_BB, chunk)
            idx = (idx + 1) & (nbb - 1)
        return bytes(out)

    # -- memory keys ------------------------------------------------------------------
    @traced
    def hca_mkey_translate(self, key: int, pd: int, addr: int, length: int, access: str,
                           remote: bool) -> list[tuple[int, int]]:
        """A key + range -> DMA pieces, after the mkey checks the device makes:
        the key exists with this variant and is not free, belongs to the QP's
        PD, grants `access` (lr, lw, rr, rw, ra) and covers [addr, addr + length).

        # EMU: the mkey context is snapshotted on first use (mk.hw_cache), as
        # the device caches mkeys; whatever changes or revokes an mkey in
        # place must drop that snapshot (DESTROY_MKEY removes the object).
        """
        synd = SYND_REMOTE_ACCESS if remote else SYND_LOCAL_PROT
        if length == 0:
            return []
        mk = self.hca.fw.mkeys.get(key >> 8)
        k = getattr(mk, "hw_cache", None) if mk is not None else None
        if mk is not None and k is None:
            m = mk.mkc
            k = mk.hw_cache = {
                "variant": m["mkey_7_0"], "free": m["free"], "pd": m["pd"],
                "lr": m["lr"], "lw": m["lw"], "rr": m["rr"], "rw": m["rw"], "ra": m["a"],
                "start": m["start_addr"], "len": m["len"], "length64": m["length64"],
                "mode": m["access_mode_4_2"] << 2 | m["access_mode_1_0"],
                "pg_bit": m["log_page_size"]}
        if k is None or k["variant"] != key & 0xFF or k["free"]:
            raise WqeError(synd, f"key {key:#x} not valid")
        if k["pd"] != pd:
            raise WqeError(synd, f"key {key:#x} is in PD {k['pd']:#x}, the QP in {pd:#x}")
        if not k[access]:
            raise WqeError(synd, f"key {key:#x} lacks {access} access")
        start = k["start"]
        if k["mode"] == MKC_ACCESS_MODE_MEMIC:
            return self._memic_translate(k, key, addr, length, synd)
        if not k["length64"] and (addr < start or addr + length > start + k["len"]):
            raise WqeError(synd, f"[{addr:#x}, +{length:#x}) outside key {key:#x} "
                                 f"[{start:#x}, +{k['len']:#x})")
        mode = k["mode"]
        if mode == 0:            # PA: the address is the bus address
            return [(addr, length)]
        if mode == MKC_ACCESS_MODE_KLMS:       # a memory window
            return self._mw_translate(mk, k, key, pd, addr, length, access, remote)
        if mode == MKC_ACCESS_MODE_KSM:        # an implicit ODP MR's parent
            return self._ksm_translate(mk, k, key, pd, addr, length, access, remote, synd)
        if mode != 1:
            raise WqeError(synd, f"key {key:#x}: access mode {mode} not modelled")
        pg_bit = k["pg_bit"]
        off = (start & ((1 << pg_bit) - 1)) + (addr - start)
        n = mk.pas.n
        if getattr(mk, "pf_absent", None):
            self._mtt_present(mk, key, pg_bit, off, addr, length, access, synd)
        # (at most n pieces whatever the room; MAX_PIECES caps a huge MTT's)
        a, b = self._scratch(0, min(n, MAX_PIECES) or 1)
        k = self.ops.mtt_pieces(mk.pas, n, pg_bit, off, length, a, b)
        if k < 0:
            raise WqeError(synd, f"key {key:#x}: range beyond its translation table")
        index = key >> 8
        busy = self.mkey_busy
        busy[index] = busy.get(index, 0) + 1
        self._held.append(index)
        av, bv = a.view, b.view
        if k == 1:                        # (most ranges: no comprehension's frame)
            return [(av[0], bv[0])]
        return [(av[i], bv[i]) for i in range(k)]

    @staticmethod
    def _mtt_present(mk: object, key: int, pg_bit: int, off: int, addr: int, length: int,
                     access: str, synd: int) -> None:
        """A page-fault-enabled mkey with entries not present: every entry the range
        uses must carry the present bit the access needs (MTT read bit 0, write bit 1),
        else the device raises a page fault (OdpFault)."""
        write = access in ("lw", "rw", "ra")
        need = 2 if write else 1
        first, last = off >> pg_bit, (off + length - 1) >> pg_bit
        view = mk.pas.view
        for i in range(first, min(last + 1, len(mk.pas))):
            if not int(view[i]).to_bytes(8, sys.byteorder)[7] & need:
                raise OdpFault(synd, key, addr, length, write)

    def _ksm_translate(self, mk: object, k: dict, key: int, pd: int, addr: int, length: int,
                       access: str, remote: bool, synd: int) -> list[tuple[int, int]]:
        """Access through a KSM mkey (implicit ODP's parent): each 2^log_page_size slice
        of the range through its KSM entry (reserved, key, address: 16 bytes) - the
        entry's key translates [address + offset in the slice, ...), with its own
        checks.  An entry on the null mkey, or a child whose entries are not present,
        is a page fault on this key (for the whole range) when the mkey was created
        with pg_access, else an access error; a range beyond the entries is one."""
        shift = k["pg_bit"]
        size = 1 << shift
        off = addr - k["start"]
        if off < 0 or off + length > (mk.pas.n // 2) << shift:
            raise WqeError(synd, f"[{addr:#x}, +{length:#x}) beyond KSM key {key:#x}")
        write = access in ("lw", "rw", "ra")
        pieces: list[tuple[int, int]] = []
        view = mk.pas.view
        left = length
        while left:
            i = off >> shift
            n = min(left, size - (off & (size - 1)))
            _r, sub, va = struct.unpack(">IIQ", view[2 * i:2 * i + 2].tobytes())
            if sub == NULL_MKEY:
                if getattr(mk, "pg_access", None):
                    raise OdpFault(synd, key, addr, length, write)
                raise WqeError(synd, f"KSM key {key:#x}: slice {i} on the null mkey")
            try:
                pieces += self.hca_mkey_translate(sub, pd, va + (off & (size - 1)), n,
                                                  access, remote)
            except OdpFault:
                raise OdpFault(synd, key, addr, length, write) from None
            off += n
            left -= n
        return pieces

    # -- on-demand paging: page faults and their resume ---------------------------------
    def hca_requester_fault(self, qp: Mlx5Qp, hw: QpHw, counter: int, e: OdpFault) -> bool:
        """A send WQE's local access faulted: raise the page fault and hold the send
        queue at this WQE until PAGE_FAULT_RESUME (True).  False - the WQE completes
        in error - when its previous fault was resumed with an error, it faulted
        ODP_FAULT_CAP times, or no EQ takes page-fault events."""
        if hw.pf_wqe != counter:
            hw.pf_wqe, hw.pf_tries, hw.pf_error = counter, 0, False
        hw.pf_tries += 1
        if hw.pf_error or hw.pf_tries > ODP_FAULT_CAP:
            hw.pf_wqe = None
            return False
        token = self.hca_page_fault(qp.num, e, True)
        if token is None:
            return False
        hw.pf_token, hw.sq_ci = token, counter
        return True

    def hca_responder_fault(self, qp: Mlx5Qp, hw: QpHw, e: OdpFault) -> bool:
        """An incoming request's access faulted: raise the page fault and RNR-NAK the
        request (True; the requester retries it, by then - normally - resolved).
        False - a remote access error - as for the requester's limits above."""
        hw.rq_pf_tries += 1
        if hw.rq_pf_error or hw.rq_pf_tries > ODP_FAULT_CAP:
            hw.rq_pf_error, hw.rq_pf_tries = False, 0
            return False
        return self.hca_page_fault(qp.num, e, False) is not None

    @traced
    def hca_page_fault(self, qpn: int, e: OdpFault, requester: bool) -> int | None:
        """A PAGE_FAULT EQE (RDMA sub-type: the key, address, length, the fault type and
        a token) into the EQ that takes page-fault events, then its MSI-X vector.  The
        token names the fault in PAGE_FAULT_RESUME.  None if no such EQ exists.

        # EMU: a requester's fault on its own data segments is reported as an RDMA
        # fault on the lkey too (the device's WQE sub-type, which the driver resolves
        # by reading the WQE from the send queue, is not modelled)."""
        eq = next((q for q in self.hca.fw.eqs.values()
                   if getattr(q, "event_bitmask", 0) >> EQE_TYPE_PAGE_FAULT & 1), None)
        if eq is None:
            return None
        token = self.pf_next_token
        self.pf_next_token = token % 0xFFFFFF + 1
        self.pf_tokens[token] = (qpn, requester)
        pftype = PFAULT_RDMA | (PFAULT_WRITE if e.write else 0) | \
            (PFAULT_REQUESTOR if requester else 0)
        eqe = bytearray(EQE_SIZE)
        eqe[1], eqe[3] = EQE_TYPE_PAGE_FAULT, EQE_PF_SUBTYPE_RDMA
        struct.pack_into(">IIHHIQI", eqe, 0x20, 0, e.key, 0, min(e.length, 0xFFFF), e.length,
                         e.addr, pftype << 24 | token)
        if not self._eqe_write(eq, eqe):
            del self.pf_tokens[token]
            return None
        return token

    @traced
    def hca_async_eqe(self, event_type: int, rsc_type: int, number: int) -> bool:
        """An asynchronous event about a QP or SRQ: an EQE of `event_type` whose data
        (struct mlx5_eqe_qp_srq) names the resource's type and number, into the EQ
        created to take that event type, then its MSI-X vector.  False when no EQ
        takes it (the event is lost, as on a device nobody asked for it)."""
        eq = next((q for q in self.hca.fw.eqs.values()
                   if getattr(q, "event_bitmask", 0) >> event_type & 1), None)
        if eq is None:
            return False
        eqe = bytearray(EQE_SIZE)
        eqe[1] = event_type
        eqe[0x34] = rsc_type
        struct.pack_into(">I", eqe, 0x38, number & 0xFFFFFF)
        return self._eqe_write(eq, eqe)

    def _eqe_write(self, eq: object, eqe: bytearray) -> bool:
        """One EQE into the EQ at its producer index (owner bit = the pass), then the
        EQ's MSI-X vector; False if the EQE could not be written."""
        eqc = eq.ctx
        log = eqc["log_eq_size"]
        pi = self.eq_pi.get(eq.num, 0)
        page = 1 << (12 + eqc["log_page_size"])
        off = eqc["page_offset"] * (page // 64) + (pi & ((1 << log) - 1)) * EQE_SIZE
        eqe[63] = pi >> log & 1
        try:
            base = int.from_bytes(int(eq.pas.view[off // page]).to_bytes(8, "little"), "big")
            self.dma_write(base + off % page, bytes(eqe))
        except WqeError as err:
            self.hca.device_errors.append(f"EQ {eq.num:#x}: EQE write failed: {err}")
            return False
        self.eq_pi[eq.num] = pi + 1
        msix_raise(self.hca.pdev, eqc["intr"])
        return True

    def page_fault_resume(self, token: int, error: bool) -> bool:
        """PAGE_FAULT_RESUME: the fault named by token is resolved (or not: error); a
        waiting send queue runs again (its WQE retried, or completed in error).  False
        for a token no fault is waiting with."""
        got = self.pf_tokens.pop(token, None)
        if got is None:
            return False
        qpn, requester = got
        hw = self.qps.get(qpn)
        if hw is None:
            return True
        if requester:
            if hw.pf_token == token:
                hw.pf_token = None
                hw.pf_error = error
                self._queue(qpn)
        elif error:
            hw.rq_pf_error = True
        return True

    def _memic_translate(self, k: dict, key: int, addr: int, length: int,
                         synd: int) -> list[tuple[int, int]]:
        """An mkey of access mode MEMIC (a device-memory MR): zero-based - the
        address a WQE or a remote peer names is an offset into [0, len) - over
        the on-chip memory from start_addr (BAR-relative).  The piece is the MEMIC
        offset, flagged MEMIC_PIECE: the DMA engine reads and writes the SRAM
        itself, no bus transaction and no IOMMU."""
        if addr < 0 or addr + length > k["len"]:
            raise WqeError(synd, f"[{addr:#x}, +{length:#x}) outside MEMIC key {key:#x} "
                                 f"[0, +{k['len']:#x})")
        bar = self.hca.fw.bar_layout()
        base, size = bar.memic_start, bar.memic_size
        at = k["start"] + addr - base
        if not size or at < 0 or at + length > size:
            raise WqeError(synd, f"MEMIC key {key:#x}: {k['start']:#x} outside the MEMIC")
        return [(MEMIC_PIECE | at, length)]

    def _sges(self, qp: Mlx5Qp, sges: list[tuple[int, int, int]], access: str,
              pd: int | None = None) -> list[tuple[int, int]]:
        if pd is None:
            pd = self._c(qp)["pd"]
        if len(sges) == 1:                # (a fresh list already)
            lkey, addr, n = sges[0]
            return self.hca_mkey_translate(lkey, pd, addr, n, access, False)
        out: list[tuple[int, int]] = []
        for lkey, addr, n in sges:
            out += self.hca_mkey_translate(lkey, pd, addr, n, access, False)
        return out

    # -- memory windows: the UMR of a bind or a local invalidate, and access through one --
    @traced
    def hca_umr(self, qp: Mlx5Qp, wqe: bytes) -> None:
        """A UMR WQE as libmlx5's set_bind_wr writes it for a memory window (the umr
        ctrl segment, the mkey context segment, one KLM when it binds a range): the
        window's mkey - named by the ctrl segment's immediate - is checked and then
        rewritten as the mkey mask says (free, key tag, bound QP, access, range).

        A memory window bind error (MW_BIND_ERR) when the key is not a window of the
        QP's PD, a CHECK_FREE bind finds it bound, a CHECK_QPN invalidate finds it
        bound to another QP (or not bound), or the KLM's MR is not a valid key of the
        window's PD covering the range (remote write or atomic also need its local
        write).  Nothing changes on an error.

        # EMU: the UMR finds the window by the key's index alone (the tag is what the
        # UMR writes); which check the device makes first, and that every failure is
        # MW_BIND_ERR, are the model's choices.
        """
        if len(wqe) < 16 + UMR_CTRL_SEG + MKEY_SEG:
            raise WqeError(SYND_LOCAL_QP_OP, f"UMR WQE of {len(wqe)} bytes")
        key = _be32(wqe, 12)
        flags, klm_octo = wqe[16], struct.unpack_from(">H", wqe, 20)[0]
        mask = _be64(wqe, 24)
        seg = 16 + UMR_CTRL_SEG
        free, access = bool(wqe[seg] & MKEY_CTX_FREE), wqe[seg + 2]
        qpn_mkey = _be32(wqe, seg + 4)
        start, length = _be64(wqe, seg + 16), _be64(wqe, seg + 24)
        mk = self.hca.fw.mkeys.get(key >> 8)
        m = mk.mkc if mk is not None else None
        if m is None or not m["umr_en"] or \
                m["access_mode_4_2"] << 2 | m["access_mode_1_0"] != MKC_ACCESS_MODE_KLMS:
            raise WqeError(SYND_MW_BIND, f"key {key:#x} is not a memory window")
        if m["pd"] != self._c(qp)["pd"]:
            raise WqeError(SYND_MW_BIND, f"window {key:#x} is in PD {m['pd']:#x}, the QP "
                                         f"in {self._c(qp)['pd']:#x}")
        if flags & UMR_CHECK_FREE and not m["free"]:
            raise WqeError(SYND_MW_BIND, f"window {key:#x} is already bound")
        if flags & UMR_CHECK_QPN and (m["free"] or m["qpn"] != qp.num):
            raise WqeError(SYND_MW_BIND, f"window {key:#x} is not bound to QP {qp.num:#x}")
        klm = None
        if not free and klm_octo:
            if len(wqe) < seg + MKEY_SEG + 16:
                raise WqeError(SYND_LOCAL_QP_OP, "UMR WQE without its KLM")
            count, mr_key = _be32(wqe, seg + MKEY_SEG), _be32(wqe, seg + MKEY_SEG + 4)
            addr = _be64(wqe, seg + MKEY_SEG + 8)
            mr = self.hca.fw.mkeys.get(mr_key >> 8)
            r = mr.mkc if mr is not None else None
            if r is None or r["mkey_7_0"] != mr_key & 0xFF or r["free"] or \
                    r["access_mode_4_2"] << 2 | r["access_mode_1_0"] == MKC_ACCESS_MODE_KLMS:
                raise WqeError(SYND_MW_BIND, f"KLM key {mr_key:#x} is not a memory region")
            if r["pd"] != m["pd"]:
                raise WqeError(SYND_MW_BIND, f"MR {mr_key:#x} is in another PD than window "
                                             f"{key:#x}")
            if not r["length64"] and (addr < r["start_addr"] or
                                      addr + count > r["start_addr"] + r["len"]):
                raise WqeError(SYND_MW_BIND, f"[{addr:#x}, +{count:#x}) outside MR "
                                             f"{mr_key:#x}")
            if access & (MKEY_CTX_REMOTE_WRITE | MKEY_CTX_ATOMIC) and not r["lw"]:
                raise WqeError(SYND_MW_BIND, f"remote write through MR {mr_key:#x} without "
                                             "its local write")
            klm = (mr_key, addr, count)
        MLX5_SET("mkc", m, "free", int(free))
        if mask & UMR_MASK_MKEY:
            MLX5_SET("mkc", m, "mkey_7_0", qpn_mkey & 0xFF)
        if mask & UMR_MASK_QPN:
            MLX5_SET("mkc", m, "qpn", qpn_mkey >> 8)
        if mask & UMR_MASK_START_ADDR:
            MLX5_SET64("mkc", m, "start_addr", start)
        if mask & UMR_MASK_LEN:
            MLX5_SET64("mkc", m, "len", length)
        if mask & UMR_MASK_ACCESS_REMOTE_READ:
            MLX5_SET("mkc", m, "rr", int(bool(access & MKEY_CTX_REMOTE_READ)))
        if mask & UMR_MASK_ACCESS_REMOTE_WRITE:
            MLX5_SET("mkc", m, "rw", int(bool(access & MKEY_CTX_REMOTE_WRITE)))
        if mask & UMR_MASK_ACCESS_ATOMIC:
            MLX5_SET("mkc", m, "a", int(bool(access & MKEY_CTX_ATOMIC)))
        mk.klm = klm
        mk.hw_cache = None

    def _mw_qp_check(self, rkey: int, qpn: int) -> None:
        """A type 2 window serves only the QP it is bound to (the responder's check
        before the key's translation): remote access error otherwise."""
        mk = self.hca.fw.mkeys.get(rkey >> 8)
        if mk is None:
            return
        k = getattr(mk, "hw_cache", None)         # the snapshot, when a DMA made one
        mode = k["mode"] if k is not None else \
            mk.mkc["access_mode_4_2"] << 2 | mk.mkc["access_mode_1_0"]
        if mode != MKC_ACCESS_MODE_KLMS:
            return
        bound = mk.mkc["qpn"]
        if bound != 0xFFFFFF and bound != qpn:
            raise WqeError(SYND_REMOTE_ACCESS, f"window {rkey:#x} is bound to QP {bound:#x}, "
                                               f"not {qpn:#x}")

    def _mw_translate(self, mk: object, k: dict, key: int, pd: int, addr: int, length: int,
                      access: str, remote: bool) -> list[tuple[int, int]]:
        """Access through a bound window (a KLM mkey): the range through the KLM's MR,
        which must grant the local right behind the remote one (write: local write;
        read: local read)."""
        synd = SYND_REMOTE_ACCESS if remote else SYND_LOCAL_PROT
        klm = getattr(mk, "klm", None)
        if klm is None:
            raise WqeError(synd, f"window {key:#x} has no binding")
        mr_key, base, count = klm
        off = addr - k["start"]
        if off + length > count:
            raise WqeError(synd, f"[{addr:#x}, +{length:#x}) beyond window {key:#x}")
        mr_access = "lw" if access in ("rw", "a", "lw") else "lr"
        return self.hca_mkey_translate(mr_key, pd, base + off, length, mr_access, remote)

    @traced
    def hca_remote_invalidate(self, qp: Mlx5Qp, rkey: int) -> None:
        """A SEND with Invalidate's rkey, at the responder: a type 2 window (remote
        invalidation enabled) of the QP's PD, bound to this QP with this key, becomes
        free.  Otherwise a remote operation error (# EMU: the syndrome is the model's
        choice)."""
        mk = self.hca.fw.mkeys.get(rkey >> 8)
        m = mk.mkc if mk is not None else None
        if m is None or not m["en_rinval"] or m["free"] or m["mkey_7_0"] != rkey & 0xFF \
                or m["pd"] != self._c(qp)["pd"] or m["qpn"] != qp.num:
            raise WqeError(SYND_REMOTE_OP, f"rkey {rkey:#x} is not a type 2 window bound to "
                                           f"QP {qp.num:#x}")
        MLX5_SET("mkc", m, "free", 1)
        mk.hw_cache = None

    # -- the requester ----------------------------------------------------------------
    @traced
    def hca_sq_process(self, qpn: int) -> None:
        """Execute the QP's new send WQEs (from the hardware counter up to the
        doorbell record's), or flush both queues if the QP is in ERR."""
        qp = self.hca.fw.qps.get(qpn)
        if qp is None:
            return
        if qp.state == QPS_ERR:
            self.hca_flush(qp)
            return
        if qp.state not in (QPS_RTS, QPS_SQD):
            return                        # RESET/INIT/RTR: the send queue does not run
        hw = self._qphw(qpn)
        if hw.stalled or hw.pf_token is not None:
            return                        # (a page fault: until its resume)
        try:
            _rcv, snd = self._dbrec(qp)
        except WqeError as e:
            self.hca_qp_error(qp, f"doorbell record: {e}", catastrophic=True)
            return
        if trace.enabled:
            trace_hca_dbrec(hex(qpn), snd & 0xFFFF)
        nbb = 1 << self._c(qp)["log_sq_size"]
        # each pass consumes at least one posted WQEBB and a record more than
        # the ring ahead is an error: at most one ring's worth of passes
        while qp.state == QPS_RTS and (snd - hw.sq_ci) & 0xFFFF:
            pending = (snd - hw.sq_ci) & 0xFFFF
            counter, wqe = hw.sq_ci, b""
            self.stats["wqes"] += 1
            try:
                wqe = self.hca_wqe_fetch(qp, counter)
                hw.sq_ci += min(_wqe_bbs(wqe), pending)
                _wqe_check(wqe, pending, nbb)
                self.hca_execute(qp, hw, wqe)
            except OdpFault as e:
                if self.hca_requester_fault(qp, hw, counter, e):
                    return                # the WQE runs again after the resume
                hw.sq_ci += hw.sq_ci == counter
                hw.outstanding.append(Sent(counter, wqe[3], True, 0, None, [],
                                           error=e.syndrome, why=str(e)))
                hw.stalled = True
                self._retire_errors(qp, hw)
                return
            except WqeError as e:
                # completions stay in order: the error waits for the answers
                # to the WQEs before it, then the QP goes to ERR
                hw.sq_ci += hw.sq_ci == counter         # (the ring could not be read)
                op = wqe[3] if wqe else 0
                hw.outstanding.append(Sent(counter, op, True, 0, None, [], error=e.syndrome,
                                           why=str(e)))
                hw.stalled = True
                self._retire_errors(qp, hw)
                return
            if qpn not in self.hca.fw.qps:
                return

    @traced
    def hca_execute(self, qp: Mlx5Qp, hw: QpHw, wqe: bytes) -> None:
        """One send WQE: parse its segments, gather local data, transmit."""
        qpc = self._c(qp)
        word, imm = _CTRL.unpack_from(wqe)
        opcode, counter = word & 0xFF, word >> 8 & 0xFFFF
        signaled = bool(wqe[11] & WQE_CTRL_CQ_UPDATE)
        st = qpc["st"]
        if st == ST_UD:
            if opcode not in (OP_NOP, OP_SEND, OP_SEND_IMM):
                raise WqeError(SYND_LOCAL_QP_OP, f"opcode {opcode:#x} on a UD QP")
        elif st not in (ST_RC, ST_UC, ST_XRC, ST_DCI) or opcode not in OP_NAMES or \
                (st == ST_UC and (opcode in (OP_RDMA_READ, OP_SEND_INV) or opcode in OP_ATOMICS)):
            raise WqeError(SYND_LOCAL_QP_OP, f"opcode {opcode:#x} on QP type {st:#x}")
        if opcode == OP_NOP:
            if signaled:
                self.hca_cqe_write(qp, "req", wqe_index=counter, opcode=opcode)
            return
        if opcode == OP_UMR:                  # a local operation: done here, in order
            self.hca_umr(qp, wqe)
            if hw.outstanding:
                hw.outstanding.append(Sent(counter, opcode, signaled, 0, None, []))
            elif signaled:
                self.hca_cqe_write(qp, "req", wqe_index=counter, opcode=opcode)
            return
        off = 16
        raddr = rkey = swap_add = compare = xrc_srqn = 0
        dc_av = b""
        if st == ST_DCI:                      # struct mlx5_wqe_datagram_seg: the DCT's AV
            if len(wqe) < off + DATAGRAM_SEG:
                raise WqeError(SYND_LOCAL_QP_OP, f"DCI WQE of {len(wqe)} bytes has no "
                                                 "datagram segment")
            dc_av, off = wqe[off:off + DATAGRAM_SEG], off + DATAGRAM_SEG
        if st == ST_XRC:                      # struct mlx5_wqe_xrc_seg: the target SRQ
            if len(wqe) < off + 16:
                raise WqeError(SYND_LOCAL_QP_OP, f"XRC WQE of {len(wqe)} bytes has no XRC "
                                                 "segment")
            xrc_srqn, off = _be32(wqe, off) & 0xFFFFFF, off + 16
        if opcode in (OP_RDMA_WRITE, OP_RDMA_WRITE_IMM, OP_RDMA_READ) or opcode in OP_ATOMICS:
            if len(wqe) < off + 16:
                raise WqeError(SYND_LOCAL_QP_OP, f"{OP_NAMES[opcode]} WQE of {len(wqe)} "
                                                 "bytes has no remote address segment")
            raddr, rkey = _RADDR.unpack_from(wqe, off)
            off += 16
        if opcode in OP_ATOMICS:              # struct mlx5_wqe_atomic_seg
            if len(wqe) < off + 16:
                raise WqeError(SYND_LOCAL_QP_OP, f"{OP_NAMES[opcode]} WQE of {len(wqe)} "
                                                 "bytes has no atomic segment")
            swap_add, compare = _be64(wqe, off), _be64(wqe, off + 8)
            off += 16
        av = b""
        if st == ST_UD:
            if len(wqe) < off + DATAGRAM_SEG:
                raise WqeError(SYND_LOCAL_QP_OP, f"UD WQE of {len(wqe)} bytes has no "
                                                 "datagram segment")
            av, off = wqe[off:off + DATAGRAM_SEG], off + DATAGRAM_SEG
        sges, inline = [], None
        size = len(wqe)
        while off + 16 <= size:
            word, lkey, addr = _DSEG.unpack_from(wqe, off)
            if word & INLINE_SEG:
                n = word & ~INLINE_SEG
                if off + 4 + n > size:
                    raise WqeError(SYND_LOCAL_LENGTH, f"{n} bytes of inline data overrun the "
                                                      f"{size}-byte WQE")
                inline = bytearray(wqe[off + 4:off + 4 + n])
                break
            # EMU: a byte_count of 0 is an empty piece (rdma-core never posts one;
            # how the device reads it is not modelled)
            if lkey == INVALID_LKEY and word == 0:
                break
            sges.append((lkey, addr, word))
            off += 16
        length = len(inline) if inline is not None else sum(n for _, _, n in sges)
        if opcode in OP_ATOMICS:
            sges = self._atomic_sges(opcode, inline, sges, length)
            length = ATOMIC_SIZE
        # the QP's own message limit (qpc.log_msg_max: a UD QP's is 12, its 4096-byte
        # MTU - found by peermem fuzz: a UD WQE of 1 MiB reached the GRH's 16-bit length)
        log_max = qpc.get("log_max")
        if log_max is None:               # the cap is fixed from INIT_HCA on
            log_max = qpc["log_max"] = min(qpc["log_msg_max"] or 64,
                                           self.hca.fw.cap("log_max_msg"))
        if length > 1 << log_max:
            raise WqeError(SYND_LOCAL_LENGTH, f"message of {length} bytes, the QP's "
                                              f"maximum is {1 << log_max}")
        if hw.sq_psn is None:
            hw.sq_psn = qpc["next_send_psn"]
        frame = Frame("req", self.hca, qp.num, qpc["remote_qpn"], dmac=qpc["rmac"],
                      opcode=opcode, wqe_index=counter, raddr=raddr, rkey=rkey,
                      length=length, imm=imm, psn=hw.sq_psn, swap_add=swap_add,
                      compare=compare, xrc_srqn=xrc_srqn, st=st)
        if av:
            self.hca_ud_address(qpc, av, frame)
        if dc_av:
            self.hca_dc_address(dc_av, frame)
        if opcode == OP_RDMA_READ or opcode in OP_ATOMICS:
            self._sges(qp, sges, "lw")        # checked now, written when the answer comes
        elif inline is not None:
            frame.payload = inline
        else:
            frame.payload = self.hca_dma_gather(self._sges(qp, sges, "lr"), length)
        hw.sq_psn = (hw.sq_psn + 1) & 0xFFFFFF
        if st in (ST_RC, ST_XRC, ST_DCI):
            hw.outstanding.append(Sent(counter, opcode, signaled, length, frame, sges))
        self.fabric_transmit(frame)
        if st in (ST_UC, ST_UD) and signaled:
            self.hca_cqe_write(qp, "req", wqe_index=counter, opcode=opcode)

    @staticmethod
    def _atomic_sges(opcode: int, inline: bytearray | None, sges: list[tuple[int, int, int]],
                     length: int) -> list[tuple[int, int, int]]:
        """Where an atomic's original 8 bytes land: the first 8 bytes of its data
        segments.  No inline data (there is nothing to write it to).

        # EMU: data segments holding fewer than 8 bytes are a local length error;
        # bytes beyond the first 8 are left alone (rdma-core's post_send always
        # writes one 8-byte segment; what the device makes of others is not modelled).
        """
        if inline is not None or length < ATOMIC_SIZE:
            raise WqeError(SYND_LOCAL_LENGTH, f"{OP_NAMES[opcode]} needs an 8-byte local "
                                              f"buffer, the WQE has {length} bytes"
                                              + (" inline" if inline is not None else ""))
        out, left = [], ATOMIC_SIZE
        for lkey, addr, n in sges:
            if left <= 0:
                break
            out.append((lkey, addr, min(n, left)))
            left -= out[-1][2]
        return out

    @traced
    def hca_ud_address(self, qpc: dict, av: bytes, frame: Frame) -> None:
        """A UD send's addressing from its datagram segment (struct mlx5_wqe_av):
        the destination QPN and MAC, the Q_Key (one with the high bit set means
        the QP's own, as the IB spec has it) and the GRH the receiver will see -
        an IPv6 header for RoCE v1 (next header BTH) and v2 (next header UDP), an
        IPv4 header in the last 20 bytes for RoCE v2 over IPv4 - built from the
        AV's GID index (the port's RoCE address table), flow label, traffic
        class, hop limit and destination GID.  A GID index with no address is a
        local QP operation error.

        # EMU: the header lengths are those of one-packet messages; the UDP source
        # port, the IPv4 checksum and the link-layer header are not carried.
        """
        qkey = _be32(av, 0)
        frame.kind = "ud"
        frame.qkey = qpc["q_key"] if qkey & 0x80000000 else qkey
        frame.dest_qpn = _be32(av, 8) & 0xFFFFFF
        frame.dmac = int.from_bytes(av[20:26], "big")
        tclass, hop_limit, gid_fl = av[26], av[27], _be32(av, 28)
        dgid = bytes(av[32:48])
        index = gid_fl >> 20 & 0xFF
        addr = self.hca.fw.roce_addresses.get(index)
        if addr is None:
            raise WqeError(SYND_LOCAL_QP_OP, f"UD AV source GID index {index} has no address")
        sgid = bytes(MLX5_ADDR_OF("roce_addr_layout", addr, "source_l3_address"))
        v2 = MLX5_GET("roce_addr_layout", addr, "roce_version") == ROCE_V2
        body = BTH + DETH + (4 if frame.opcode == OP_SEND_IMM else 0) + frame.length + ICRC
        if v2 and MLX5_GET("roce_addr_layout", addr, "roce_l3_type") == ROCE_L3_IPV4:
            frame.l3 = CQE_L3_IPV4
            ip = struct.pack(">BBHHHBBH4s4s", 0x45, tclass, IPV4_HDR + UDP_HDR + body, 0,
                             0x4000, hop_limit, IPPROTO_UDP, 0, sgid[12:], dgid[12:])
            frame.grh = bytes(GRH_SIZE - IPV4_HDR) + ip
            return
        frame.l3 = CQE_L3_IPV6 if v2 else CQE_L3_GRH
        frame.grh = struct.pack(">IHBB16s16s", 6 << 28 | tclass << 20 | gid_fl & 0xFFFFF,
                                body + (UDP_HDR if v2 else 0),
                                IPPROTO_UDP if v2 else IB_NEXT_HDR_BTH, hop_limit, sgid, dgid)

    @traced
    def hca_dc_address(self, av: bytes, frame: Frame) -> None:
        """A DCI send's addressing from its datagram segment (struct mlx5_wqe_av as
        mlx5dv_wr_set_dc_addr writes it): the DCT number (dqp_dct, with the
        extended-AV bit), the DC access key in the key field, the destination MAC.
        A DCT number without the extended-AV bit is a local QP operation error.

        # EMU: the GRH fields are not carried - a DC request is addressed to the
        # HCA owning the MAC, as an RC request is.
        """
        word = _be32(av, 8)
        if not word & EXTENDED_AV:
            raise WqeError(SYND_LOCAL_QP_OP, "DCI WQE without an extended address vector")
        frame.dct = True
        frame.dest_qpn = word & 0xFFFFFF
        frame.dc_key = _be64(av, 0)
        frame.dmac = int.from_bytes(av[20:26], "big")

    @traced
    def fabric_transmit(self, frame: Frame) -> None:
        """Put a frame on the wire: the fabric delivers it to the HCA owning
        its destination MAC (this one for loopback), or drops it."""
        self.stats["frames_tx"] += 1
        dst = route(self.hca, frame.dmac)
        if dst is None:
            if frame.kind == "req":       # nobody answers: the retry timer expires
                self._deliver(self, Frame("timeout", self.hca, frame.dest_qpn, frame.src_qpn,
                                          wqe_index=frame.wqe_index,
                                          why=f"no port with MAC {frame.dmac:012x}"))
            return
        self._deliver(engine_of(dst), frame)

    def _deliver(self, eng: Mlx5Engine, frame: Frame) -> None:
        if trace.enabled:
            trace_roce_frame(_port_name(frame.src), _port_name(eng.hca), frame.kind,
                             OP_NAMES.get(frame.opcode, hex(frame.opcode)), hex(frame.src_qpn),
                             hex(frame.dest_qpn), frame.wqe_index,
                             len(frame.payload) if frame.payload is not None else 0)
        eng.rx.append(frame)
        eng.kick()

    def _retransmit(self, qpn: int, sent: Sent) -> None:
        """The RNR timer expired for `sent` (the oldest outstanding WQE): go back N -
        send it again and, behind it in order, every request sent after it, which the
        responder dropped as out of sequence once it NAKed this one's PSN (found by
        peermem fuzz: only the NAKed one was resent, and the WQEs behind it waited
        forever)."""
        qp = self.hca.fw.qps.get(qpn)
        hw = self.qps.get(qpn)
        if qp is None or hw is None or qp.state != QPS_RTS or not hw.outstanding or \
                hw.outstanding[0] is not sent:
            return
        for s in list(hw.outstanding):
            if s.frame is not None:
                self.fabric_transmit(s.frame)

    # -- the wire's other end ------------------------------------------------------------
    @traced
    def hca_rx(self, frame: Frame) -> None:
        """A frame arrived: a request for one of our QPs (responder) or the
        answer to one of our requests (requester)."""
        self.stats["frames_rx"] += 1
        if frame.kind == "req" and frame.dct:
            self.hca_dct_responder(frame)
        elif frame.kind == "req":
            self.hca_responder(frame)
        elif frame.kind == "ud":
            self.hca_ud_responder(frame)
        else:
            self.hca_requester_answer(frame)

    def _answer(self, req: Frame, kind: str, **kw) -> None:
        ans = Frame(kind, self.hca, req.dest_qpn, req.src_qpn, dmac=req.src.fw.vport.mac,
                    opcode=req.opcode, wqe_index=req.wqe_index, **kw)
        self.stats["frames_tx"] += 1
        dst = route(self.hca, ans.dmac)
        if dst is not None:
            self._deliver(engine_of(dst), ans)

    @traced
    def hca_responder(self, frame: Frame) -> None:
        """Execute an incoming request on the destination QP."""
        qp = self.hca.fw.qps.get(frame.dest_qpn)
        st = self._c(qp)["st"] if qp is not None else None
        if qp is None or qp.state not in (QPS_RTR, QPS_RTS, QPS_SQD) or \
                st not in (ST_RC, ST_UC, ST_XRC):
            # dropped: a reliable requester times out (also one aimed at a QP of another
            # transport, a UD QP - found by peermem fuzz: it waited forever)
            if qp is None or st in (ST_RC, ST_XRC) or frame.st in (ST_RC, ST_XRC):
                why = "no such QP" if qp is None else "QP not ready to receive"
                self._answer(frame, "timeout", why=f"QP {frame.dest_qpn:#x}: {why}")
            return
        if frame.st not in (-1, st):
            # a request of another transport than this QP's (an RC requester aimed at a
            # UC QP - found by peermem fuzz: the RC requester waited for an answer
            # forever): opcodes the QP's transport has not are dropped, so a reliable
            # requester times out
            if frame.st in (ST_RC, ST_XRC):
                self._answer(frame, "timeout", why=f"QP {qp.num:#x}: a request of "
                                                   f"another transport")
            return
        qpc = self._c(qp)
        hw = self._qphw(qp.num)
        if hw.rq_psn is None:
            hw.rq_psn = qpc["next_rcv_psn"]
        if frame.psn != hw.rq_psn:
            # EMU: a request out of sequence is dropped and its requester times out;
            # the device NAKs a PSN ahead with a sequence error and re-acknowledges a
            # duplicate.  Either way the responder QP is untouched: another process that
            # aims its QP at this QPN without the connection's PSN cannot disturb it.
            if st in (ST_RC, ST_XRC):
                self._answer(frame, "timeout", why=f"QP {qp.num:#x}: PSN {frame.psn:#x}, "
                                                   f"expected {hw.rq_psn:#x}")
            return
        op = frame.opcode
        rel = st in (ST_RC, ST_XRC)
        xsrq = None
        try:
            if st == ST_XRC:          # the XRCETH's SRQ must be in the target QP's domain
                xsrq = self.hca.fw.srqs.get(frame.xrc_srqn)
                if xsrq is None or not self._c(xsrq)["xrcd"] or \
                        self._c(xsrq)["xrcd"] != qpc["xrcd"]:
                    raise WqeError(SYND_REMOTE_INVAL_REQ, f"XRC SRQ {frame.xrc_srqn:#x} is "
                                                          f"not in QP {qp.num:#x}'s domain")
            pd = self._c(xsrq)["pd"] if xsrq is not None else qpc["pd"]
            need = _REMOTE_ENABLE.get(op)
            if need is not None and not qpc[need]:
                raise WqeError(SYND_REMOTE_INVAL_REQ, f"QP {qp.num:#x} does not allow "
                                                      f"{OP_NAMES[op]}")
            if op in OP_ATOMICS:
                hw.rq_psn = (hw.rq_psn + 1) & 0xFFFFFF
                old = self.hca_atomic(frame, pd)
                hw.rq_pf_tries = 0                      # taken: its faults are over
                self._answer(frame, "read_resp", payload=old, length=ATOMIC_SIZE)
                return
            if op in (OP_RDMA_WRITE, OP_RDMA_WRITE_IMM, OP_RDMA_READ):
                self._mw_qp_check(frame.rkey, qp.num)
                pieces = self.hca_mkey_translate(frame.rkey, pd, frame.raddr,
                                                 frame.length,
                                                 "rr" if op == OP_RDMA_READ else "rw", True)
            if op in (OP_SEND, OP_SEND_IMM, OP_RDMA_WRITE_IMM, OP_SEND_INV):
                posted = self._srq_pending(xsrq) > 0 if xsrq is not None else \
                    self._rq_posted(qp, hw)
                if not posted:
                    if rel:              # not taken: the retry carries the same PSN
                        self._answer(frame, "rnr", why=f"QP {qp.num:#x}: no receive posted")
                    return
            hw.rq_psn = (hw.rq_psn + 1) & 0xFFFFFF
            if op == OP_RDMA_READ:
                data = self.hca_dma_gather(pieces, frame.length)
                hw.rq_pf_tries = 0
                self._answer(frame, "read_resp", payload=data, length=frame.length)
                return
            if op in (OP_RDMA_WRITE, OP_RDMA_WRITE_IMM):
                self.hca_dma_scatter(pieces, frame.payload)
            if op == OP_SEND_INV:
                self.hca_remote_invalidate(qp, frame.imm)
            if op in (OP_SEND, OP_SEND_IMM, OP_RDMA_WRITE_IMM, OP_SEND_INV):
                self.hca_recv_complete(qp, hw, frame, xsrq)
        except OdpFault as e:
            if rel and self.hca_responder_fault(qp, hw, e):
                hw.rq_psn = frame.psn                   # not taken: RNR NAK, retried
                self._answer(frame, "rnr", why=f"QP {qp.num:#x}: {e}")
                return
            hw.rq_psn = (frame.psn + 1) & 0xFFFFFF
            if rel:
                self._answer(frame, "nak", syndrome=SYND_REMOTE_ACCESS, why=str(e))
                self.hca_qp_error(qp, f"responder: {e}")
            return
        except WqeError as e:
            hw.rq_psn = (frame.psn + 1) & 0xFFFFFF      # taken, and answered with an error
            if rel:
                self._answer(frame, "nak", syndrome=e.syndrome, why=str(e))
                self.hca_qp_error(qp, f"responder: {e}")
            return
        hw.rq_pf_tries = 0
        if rel:
            self._answer(frame, "ack")

    @traced
    def hca_dct_responder(self, frame: Frame) -> None:
        """A DC request for one of our DCTs.  Dropped (the requester times out) when
        the DCT does not exist or is not ACTIVE, or when the request's DC access
        key is not the DCT's (counted in dctc.dc_access_key_violation_count).
        Otherwise executed as an RC responder does, on the DCT's PD and access
        bits: a SEND takes the next WQE of the DCT's SRQ (RNR NAK when none is
        posted) and completes on the DCT's CQ under its user index, naming the DCI.

        # EMU: no PSN check (every DC request is its own connection; DC's
        # connect/disconnect handshake is not modelled); SEND with Invalidate to a
        # DCT is a remote invalid request.
        """
        dct = self.hca.fw.dcts.get(frame.dest_qpn)
        if dct is None or dct.state != DCT_ACTIVE:
            self._answer(frame, "timeout", why=f"DCT {frame.dest_qpn:#x}: "
                                               + ("no such DCT" if dct is None else "drained"))
            return
        d = dct.dctc
        if frame.dc_key != d["dc_access_key"]:
            MLX5_SET("dctc", d, "dc_access_key_violation_count",
                     d["dc_access_key_violation_count"] + 1 & 0xFFFFFFFF)
            self.stats["dc_key_violations"] += 1
            self._answer(frame, "timeout", why=f"DCT {dct.num:#x}: DC access key violation")
            return
        op, pd = frame.opcode, d["pd"]
        try:
            need = _REMOTE_ENABLE.get(op)
            if need is not None and not d[need] or op == OP_SEND_INV:
                raise WqeError(SYND_REMOTE_INVAL_REQ, f"DCT {dct.num:#x} does not allow "
                                                      f"{OP_NAMES.get(op, hex(op))}")
            if op in OP_ATOMICS:
                self._answer(frame, "read_resp", payload=self.hca_atomic(frame, pd),
                             length=ATOMIC_SIZE)
                return
            if op in (OP_RDMA_WRITE, OP_RDMA_WRITE_IMM, OP_RDMA_READ):
                self._mw_qp_check(frame.rkey, dct.num)
                pieces = self.hca_mkey_translate(frame.rkey, pd, frame.raddr, frame.length,
                                                 "rr" if op == OP_RDMA_READ else "rw", True)
            srq = None
            if op in (OP_SEND, OP_SEND_IMM, OP_RDMA_WRITE_IMM):
                srq = self.hca.fw.srqs.get(d["srqn_xrqn"])
                if srq is None or not self._srq_pending(srq):
                    self._answer(frame, "rnr", why=f"DCT {dct.num:#x}: no receive posted")
                    return
            if op == OP_RDMA_READ:
                self._answer(frame, "read_resp", payload=self.hca_dma_gather(pieces, frame.length),
                             length=frame.length)
                return
            if op in (OP_RDMA_WRITE, OP_RDMA_WRITE_IMM):
                self.hca_dma_scatter(pieces, frame.payload)
            if srq is not None:
                self.hca_dct_recv(dct, srq, frame)
        except WqeError as e:              # (a page fault too: no ODP on DC here)
            syndrome = SYND_REMOTE_ACCESS if isinstance(e, OdpFault) else e.syndrome
            self._answer(frame, "nak", syndrome=syndrome, why=str(e))
            return
        self._answer(frame, "ack")

    @traced
    def hca_dct_recv(self, dct: object, srq: Mlx5Srq, frame: Frame) -> None:
        """A DCT's receive: the SRQ's next WQE takes the payload (checked against
        the DCT's PD), then a responder CQE on the DCT's CQ, under its user index,
        naming the sending DCI.  A receive too short is a local length error (the
        requester sees a remote invalid request)."""
        d = dct.dctc
        idx, raw = self.hca_srq_take(srq)
        sges = []
        if frame.opcode != OP_RDMA_WRITE_IMM:
            for off in range(16, len(raw), 16):
                n, lkey, addr = _be32(raw, off), _be32(raw, off + 4), _be64(raw, off + 8)
                if lkey == INVALID_LKEY and n == 0:
                    break
                sges.append((lkey, addr, n))
        length = frame.length
        try:
            if frame.opcode != OP_RDMA_WRITE_IMM:
                if length > sum(n for _, _, n in sges):
                    raise WqeError(SYND_LOCAL_LENGTH, f"SEND of {length} bytes, receive "
                                                      f"buffer {sum(n for _, _, n in sges)}")
                pieces, left = [], length
                for p in self._sges(None, sges, "lw", d["pd"]):
                    if left <= 0:
                        break
                    pieces.append((p[0], min(p[1], left)))
                    left -= pieces[-1][1]
                if length:
                    self.hca_dma_scatter(pieces, frame.payload)
        except WqeError as e:
            self._write_cqe(dct, d["cqn"], d["user_index"], "resp_err", idx, 0, e.syndrome,
                            0, 0, 0)
            peer = SYND_REMOTE_INVAL_REQ if e.syndrome == SYND_LOCAL_LENGTH else SYND_REMOTE_OP
            raise WqeError(peer, str(e)) from None
        kind = _RESP_CQE_OPCODE[frame.opcode]      # (never SEND_INV: refused above)
        self._write_cqe(dct, d["cqn"], d["user_index"], "resp", idx, kind, 0, length,
                        frame.imm, frame.src_qpn)

    @traced
    def hca_atomic(self, frame: Frame, pd: int) -> bytearray:
        """Execute an atomic on the responder's memory: the target is one naturally
        aligned 8-byte word (else an invalid request, as the IB spec has it) in a key
        granting remote atomic access (else a remote access error).  It is read,
        compared-and-swapped or added to, and written back as a big-endian value, in
        one engine step - no other work request of this HCA runs in between
        (IBV_ATOMIC_HCA).  Returns the original 8 bytes, as they travel back.

        # EMU: the target is big-endian (the device's default; mlx5_core does not
        # set the host-endianness requester mode here), and the CPU is not
        # excluded between the read and the write (atomic_cap is HCA, not GLOB).
        """
        if frame.raddr % ATOMIC_SIZE:
            raise WqeError(SYND_REMOTE_INVAL_REQ, f"{OP_NAMES[frame.opcode]} at "
                                                  f"{frame.raddr:#x}: not 8-byte aligned")
        pieces = self.hca_mkey_translate(frame.rkey, pd, frame.raddr, ATOMIC_SIZE, "ra", True)
        old = self.hca_dma_gather(pieces, ATOMIC_SIZE)
        value = _be64(old, 0)
        if frame.opcode == OP_ATOMIC_CS:
            new = frame.swap_add if value == frame.compare else value
        else:
            new = (value + frame.swap_add) & 0xFFFFFFFFFFFFFFFF
        if new != value:
            self.hca_dma_scatter(pieces, struct.pack(">Q", new))
        return old

    def _gid_ours(self, grh: bytes, l3: int) -> bool:
        """Is a datagram's destination address one of the port's RoCE addresses?"""
        dgid = bytes(10) + b"\xff\xff" + grh[36:40] if l3 == CQE_L3_IPV4 else grh[24:40]
        return any(bytes(MLX5_ADDR_OF("roce_addr_layout", a, "source_l3_address")) == dgid
                   for a in self.hca.fw.roce_addresses.values())

    @traced
    def hca_ud_responder(self, frame: Frame) -> None:
        """A UD datagram arrived.  It is silently dropped - no answer, nothing
        completes - when its destination GID is not the port's, the QP does not
        exist, is no UD QP ready to receive (RTR, RTS, SQD), its Q_Key is not
        the QP's (counted as a Q_Key violation) or no receive is posted - or
        when the receive buffer's ODP pages are not present: then a page fault is
        raised too and the receive WQE kept for a later datagram.
        Otherwise the next receive WQE takes the GRH then the payload."""
        qp = self.hca.fw.qps.get(frame.dest_qpn)
        grh = frame.grh or bytes(GRH_SIZE)
        if qp is None or qp.state not in (QPS_RTR, QPS_RTS, QPS_SQD) or \
                self._c(qp)["st"] != ST_UD or not self._gid_ours(grh, frame.l3):
            self.stats["ud_dropped"] += 1
            return
        qpc = self._c(qp)
        if frame.qkey != qpc["q_key"]:
            self.stats["qkey_violations"] += 1
            return
        hw = self._qphw(qp.num)
        try:
            posted = self._rq_posted(qp, hw)
        except WqeError as e:
            self.hca_qp_error(qp, f"doorbell record: {e}", catastrophic=True)
            return
        if not posted:
            self.stats["ud_dropped"] += 1
            return
        try:
            self.hca_recv_complete(qp, hw, frame)
        except OdpFault as e:
            # no RNR for a datagram: the fault is raised (its receive WQE stays
            # posted) and this datagram dropped; later ones land once resolved
            self.hca_page_fault(qp.num, e, False)
            self.stats["ud_dropped"] += 1
        except WqeError as e:
            self.hca_qp_error(qp, f"UD receive: {e}")

    def _srq_of(self, qp: Mlx5Qp) -> Mlx5Srq | None:
        """The SRQ a QP takes its receives from (None: its own receive queue).  The
        firmware keeps it alive while the QP exists."""
        qpc = self._c(qp)
        if qpc["rq_type"] != MLX5_SRQ_RQ:
            return None
        return self.hca.fw.srqs.get(qpc["srqn_rmpn_xrqn"])

    def _srq_pending(self, srq: Mlx5Srq) -> int:
        """WQEs posted to an SRQ and not yet given out (its doorbell record's counter)."""
        hw = self.srq_hw.setdefault(srq.num, [0, 0])
        return (_be32(self.dma_read(self._c(srq)["dbr_addr"], 4), 0) - hw[1]) & 0xFFFF

    def _rq_posted(self, qp: Mlx5Qp, hw: QpHw) -> bool:
        """Is a receive WQE waiting for the QP - in its receive queue or its SRQ?"""
        srq = self._srq_of(qp)
        if srq is not None:
            return self._srq_pending(srq) > 0
        rcv, _snd = self._dbrec(qp)
        return (hw.rq_ci & 0xFFFF) != (rcv & 0xFFFF)

    @traced
    def hca_srq_take(self, srq: Mlx5Srq) -> tuple[int, bytes]:
        """Give out the SRQ's next WQE: (its index, its bytes).  The next one is the
        index its next segment names; a receive leaving fewer posted than the armed
        watermark raises the SRQ-limit event and disarms it."""
        c = self._c(srq)
        hw = self.srq_hw.setdefault(srq.num, [0, 0])
        size = 1 << c["log_srq_size"]
        stride = 1 << (c["log_rq_stride"] + 4)
        idx = hw[0] & (size - 1)
        raw = self._read_queue(srq, idx * stride, stride)
        hw[0] = struct.unpack_from(">H", raw, 2)[0] & (size - 1)
        hw[1] += 1
        lwm = srq.srqc["lwm"]
        if lwm and self._srq_pending(srq) < lwm:
            MLX5_SET("srqc", srq.srqc, "lwm", 0)
            self.async_events.append(("srq_limit", srq.num))
            self.hca_async_eqe(EQE_TYPE_SRQ_RQ_LIMIT, EQE_RSC_SRQ, srq.num)
        return idx, raw

    @traced
    def hca_recv_complete(self, qp: Mlx5Qp, hw: QpHw, frame: Frame,
                          xsrq: Mlx5Srq | None = None) -> None:
        """Consume the next receive WQE: scatter a SEND's payload into its
        data segments, then a responder CQE."""
        qpc = self._c(qp)
        srq = xsrq if xsrq is not None else self._srq_of(qp)
        # an XRC SRQ's receive completes on its CQ, under its user index
        def cqe(qp: Mlx5Qp, kind: str, **kw: int) -> None:
            if xsrq is None:
                self.hca_cqe_write(qp, kind, **kw)
            else:
                self.hca_xrc_cqe_write(qp, xsrq, kind, **kw)
        if srq is None:
            stride = 1 << (qpc["log_rq_stride"] + 4)
            idx = hw.rq_ci & ((1 << qpc["log_rq_size"]) - 1)
            raw = self._read_queue(qp, idx * stride, stride)
            hw.rq_ci += 1
            first, pd = 0, qpc["pd"]
        else:                         # after the WQE's next segment; the SRQ's PD
            srq_was = list(self.srq_hw.get(srq.num, [0, 0]))
            idx, raw = self.hca_srq_take(srq)
            stride, first, pd = len(raw), 16, self._c(srq)["pd"]
        op = frame.opcode
        length, payload, flags = frame.length, frame.payload, 0
        if frame.kind == "ud":        # the GRH first, then the message
            length += GRH_SIZE
            payload = bytearray(frame.grh or bytes(GRH_SIZE)) + (payload or b"")
            flags = 1 << 28 | frame.l3 << 24          # flags_rqpn: GRH, L3 header type
        if op != OP_RDMA_WRITE_IMM:
            sges = []
            for off in range(first, stride, 16):
                n, lkey, addr = _be32(raw, off), _be32(raw, off + 4), _be64(raw, off + 8)
                if lkey == INVALID_LKEY and n == 0:
                    break
                sges.append((lkey, addr, n))
            room = sum(n for _, _, n in sges)
            try:
                if length > room:
                    raise WqeError(SYND_LOCAL_LENGTH, f"SEND of {length} bytes, receive "
                                                      f"buffer {room}")
                pieces, left = [], length
                for p in self._sges(qp, sges, "lw", pd):
                    if left <= 0:
                        break
                    pieces.append((p[0], min(p[1], left)))
                    left -= pieces[-1][1]
            except OdpFault:
                # the receive WQE is not consumed: the retry takes it again
                if srq is None:
                    hw.rq_ci -= 1
                else:
                    self.srq_hw[srq.num] = srq_was
                raise
            except WqeError as e:
                cqe(qp, "resp_err", wqe_index=idx, syndrome=e.syndrome)
                peer = SYND_REMOTE_INVAL_REQ if e.syndrome == SYND_LOCAL_LENGTH \
                    else SYND_REMOTE_OP
                raise WqeError(peer, str(e)) from None
            if length:
                self.hca_dma_scatter(pieces, payload)
        kind = _RESP_CQE_OPCODE[op]
        cqe(qp, "resp", wqe_index=idx, opcode=kind, byte_cnt=length, imm=frame.imm,
            src_qpn=frame.src_qpn | flags)

    @traced
    def hca_requester_answer(self, frame: Frame) -> None:
        """An ACK, NAK, RNR NAK, READ response or (EMU) retry timeout for the
        oldest outstanding WQE of the QP."""
        qp = self.hca.fw.qps.get(frame.dest_qpn)
        hw = self.qps.get(frame.dest_qpn)
        if qp is None or hw is None or qp.state != QPS_RTS or not hw.outstanding:
            return                                    # stale: the QP was reset or flushed
        sent = hw.outstanding[0]
        if sent.wqe_index != frame.wqe_index:
            return
        kind = frame.kind
        if kind == "rnr":
            sent.rnr_tries += 1
            budget = self._c(qp)["rnr_retry"]
            if budget == 7 and sent.rnr_tries < RNR_FOREVER_CAP or sent.rnr_tries <= budget:
                self.retry.append((qp.num, sent))
                return
            kind, frame.syndrome = "nak", SYND_RNR_RETRY_EXC
        if kind == "timeout":
            kind, frame.syndrome = "nak", SYND_TRANSPORT_RETRY_EXC
        hw.outstanding.popleft()
        if kind == "nak":
            self.hca_cqe_write(qp, "req_err", wqe_index=sent.wqe_index, opcode=sent.opcode,
                               syndrome=frame.syndrome)
            self.hca_qp_error(qp, SYND_NAMES.get(frame.syndrome, "") + " " + frame.why)
            return
        if kind == "read_resp":
            try:
                self.hca_dma_scatter(self._sges(qp, sent.local, "lw"), frame.payload)
            except WqeError as e:
                self.hca_cqe_write(qp, "req_err", wqe_index=sent.wqe_index,
                                   opcode=sent.opcode, syndrome=e.syndrome)
                self.hca_qp_error(qp, str(e))
                return
        if sent.signaled:
            self.hca_cqe_write(qp, "req", wqe_index=sent.wqe_index, opcode=sent.opcode,
                               byte_cnt=sent.length)
        self._retire_errors(qp, hw)

    def _retire_errors(self, qp: Mlx5Qp, hw: QpHw) -> None:
        """A local error whose turn has come: its CQE, then the QP to ERR.  Local
        operations (a UMR) done while earlier WQEs were unanswered complete now."""
        while hw.outstanding and hw.outstanding[0].frame is None and \
                not hw.outstanding[0].error:
            sent = hw.outstanding.popleft()
            if sent.signaled:
                self.hca_cqe_write(qp, "req", wqe_index=sent.wqe_index, opcode=sent.opcode)
        if hw.outstanding and hw.outstanding[0].error:
            sent = hw.outstanding.popleft()
            hw.stalled = False
            self.hca_cqe_write(qp, "req_err", wqe_index=sent.wqe_index, opcode=sent.opcode,
                               syndrome=sent.error)
            self.hca_qp_error(qp, sent.why)

    # -- errors -------------------------------------------------------------------------
    @traced
    def hca_qp_error(self, qp: Mlx5Qp, why: str, catastrophic: bool = False) -> None:
        """The QP enters ERR on its own (as after a completion error) - for a
        catastrophic error with a WQ_CATAS_ERROR event - then its outstanding work
        is flushed."""
        if qp.state == QPS_ERR:
            return
        MLX5_SET("qpc", qp.qpc, "state", QPS_ERR)
        self.async_events.append(("qp_error", qp.num, why))
        if catastrophic:
            self.hca_async_eqe(EQE_TYPE_WQ_CATAS_ERROR, EQE_RSC_QP, qp.num)
        self.hca_last_wqe_reached(qp)
        self.hca_flush(qp)

    def hca_last_wqe_reached(self, qp: Mlx5Qp) -> None:
        """A QP gone to ERR: if it takes its receives from an SRQ, the SRQ_LAST_WQE
        event for it."""
        if self._srq_of(qp) is not None:
            self.hca_async_eqe(EQE_TYPE_SRQ_LAST_WQE, EQE_RSC_QP, qp.num)

    @traced
    def hca_flush(self, qp: Mlx5Qp) -> None:
        """ERR: every WQE the QP still holds completes with "work request
        flushed" - sent and unanswered, posted and not executed, and every
        posted receive - whether or not it asked for a completion."""
        hw = self._qphw(qp.num)
        while hw.outstanding:
            sent = hw.outstanding.popleft()
            self.hca_cqe_write(qp, "req_err", wqe_index=sent.wqe_index, opcode=sent.opcode,
                               syndrome=SYND_WR_FLUSH)
        qpc = self._c(qp)
        if qpc["no_sq"] and not qpc["rq_bytes"]:
            return                        # an XRC target: no queue of its own
        try:
            rcv, snd = self._dbrec(qp)
        except WqeError as e:
            self.async_events.append(("dbrec_fault", qp.num, str(e)))
            return
        # EMU: a counter more than a ring ahead flushes one ring's worth; the
        # rest was never a WQE.  Each loop is bounded by its ring's size.
        if not qpc["no_sq"]:
            pending, budget = (snd - hw.sq_ci) & 0xFFFF, 1 << qpc["log_sq_size"]
            while pending and budget:
                counter = hw.sq_ci
                try:
                    ctrl = self.hca_wqe_fetch(qp, counter)
                except WqeError:
                    ctrl = bytes(16)
                step = min(_wqe_bbs(ctrl), pending)
                hw.sq_ci, pending, budget = hw.sq_ci + step, pending - step, budget - 1
                self.hca_cqe_write(qp, "req_err", wqe_index=counter, opcode=ctrl[3],
                                   syndrome=SYND_WR_FLUSH)
            hw.sq_ci += pending
        if qpc["rq_bytes"]:
            pending = (rcv - hw.rq_ci) & 0xFFFF
            for _ in range(min(pending, 1 << qpc["log_rq_size"])):
                idx = hw.rq_ci & ((1 << qpc["log_rq_size"]) - 1)
                hw.rq_ci += 1
                pending -= 1
                self.hca_cqe_write(qp, "resp_err", wqe_index=idx, syndrome=SYND_WR_FLUSH)
            hw.rq_ci += pending

    # -- completions ----------------------------------------------------------------------
    @traced
    def hca_cqe_write(self, qp: Mlx5Qp, kind: str, *, wqe_index: int = 0, opcode: int = 0,
                      syndrome: int = 0, byte_cnt: int = 0, imm: int = 0,
                      src_qpn: int = 0) -> None:
        """Write one CQE (struct mlx5_cqe64, cqe_version 1) to the QP's send
        or receive CQ, with the owner bit of the CQ's current pass."""
        qpc = self._c(qp)
        cqn = qpc["cqn_snd"] if kind in ("req", "req_err") else qpc["cqn_rcv"]
        self._write_cqe(qp, cqn, qpc["user_index"], kind, wqe_index, opcode, syndrome,
                        byte_cnt, imm, src_qpn)

    @traced
    def hca_xrc_cqe_write(self, qp: Mlx5Qp, srq: Mlx5Srq, kind: str, *, wqe_index: int = 0,
                          opcode: int = 0, syndrome: int = 0, byte_cnt: int = 0, imm: int = 0,
                          src_qpn: int = 0) -> None:
        """A receive through an XRC SRQ: the CQE goes to the SRQ's CQ, under the SRQ's
        user index, naming the target QP."""
        c = self._c(srq)
        self._write_cqe(qp, c["cqn"], c["user_index"], kind, wqe_index, opcode, syndrome,
                        byte_cnt, imm, src_qpn)

    def _write_cqe(self, qp: Mlx5Qp, cqn: int, user_index: int, kind: str, wqe_index: int,
                   opcode: int, syndrome: int, byte_cnt: int, imm: int, src_qpn: int) -> None:
        """The CQE itself (hca_cqe_write, hca_xrc_cqe_write)."""
        cq = self.hca.fw.cqs.get(cqn)
        if cq is None:
            return
        cqc = self._c(cq)
        log = cqc["log_cq_size"]
        pi = self.cq_pi.get(cqn, 0)
        try:
            ci = _be32(self.dma_read(cqc["dbr_addr"], 4, (qp, cq)), 0) & 0xFFFFFF
            at = (pi & ((1 << log) - 1)) * cqc["cqe_size"] + (cqc["cqe_size"] - 64)
            pieces = self._pas_pieces(cq, at, 64)
        except WqeError as e:             # the CQ's memory is not reachable: a CQ error
            self.async_events.append(("cq_error", cqn, str(e)))
            return
        if (pi - ci) & 0xFFFFFF >= 1 << log and not cq.cqc["oi"]:
            self.async_events.append(("cq_overrun", cqn, qp.num))
            return
        cqe = bytearray(64)
        op = {"req": CQE_REQ, "resp": opcode, "req_err": CQE_REQ_ERR,
              "resp_err": CQE_RESP_ERR}[kind]
        struct.pack_into(">I", cqe, 32, user_index & 0xFFFFFF)
        if kind in ("req_err", "resp_err"):
            cqe[55] = syndrome
            struct.pack_into(">I", cqe, 56, (opcode & 0xFF) << 24 | qp.num)
        else:
            struct.pack_into(">I", cqe, 24, src_qpn & 0xFFFFFFFF)
            struct.pack_into(">I", cqe, 36, imm)
            struct.pack_into(">I", cqe, 44, byte_cnt)
            struct.pack_into(">Q", cqe, 48, self.hca.internal_timer())  # timestamp
            sop = (opcode & 0xFF) << 24 if kind == "req" else 0
            struct.pack_into(">I", cqe, 56, sop | qp.num)
        struct.pack_into(">H", cqe, 60, wqe_index & 0xFFFF)
        cqe[63] = op << 4 | (pi >> log & 1)
        try:
            for dma, n in pieces:
                self.dma_write(dma, bytes(cqe[:n]), (qp, cq))
                cqe = cqe[n:]
        except WqeError as e:
            self.async_events.append(("cq_error", cqn, str(e)))
            return
        self.cq_pi[cqn] = pi + 1
        self.stats["cqes"] += 1
        if cqn in self.cq_armed:
            del self.cq_armed[cqn]
            self.hca_comp_event(cq)

    # -- completion events and resize ------------------------------------------------------
    @traced
    def hca_cq_arm(self, rec: UarWrite) -> None:
        """A CQ doorbell: arm the CQ it names if it belongs to that UAR page; CQEs
        already past the armed consumer index raise the event at once."""
        word0, cqn = _be32(rec.data, 0), _be32(rec.data, 4) & 0xFFFFFF
        cq = self.hca.fw.cqs.get(cqn)
        if cq is None or cq.cqc["uar_page"] != rec.uar:
            self.async_events.append(("bad_cq_doorbell", cqn, rec.uar))
            return
        ci = word0 & 0xFFFFFF
        if (self.cq_pi.get(cqn, 0) - ci) & 0xFFFFFF:
            self.cq_armed.pop(cqn, None)
            self.hca_comp_event(cq)
        else:
            self.cq_armed[cqn] = ci

    @traced
    def hca_comp_event(self, cq: Mlx5Cq) -> None:
        """One completion EQE for the CQ into its EQ (owner bit = the EQ's pass), then
        the EQ's MSI-X vector."""
        eq = self.hca.fw.eqs.get(cq.cqc["c_eqn_or_apu_element"])
        if eq is None:
            return
        eqc = eq.ctx
        log = eqc["log_eq_size"]
        pi = self.eq_pi.get(eq.num, 0)
        page = 1 << (12 + eqc["log_page_size"])
        off = eqc["page_offset"] * (page // 64) + (pi & ((1 << log) - 1)) * EQE_SIZE
        eqe = bytearray(EQE_SIZE)
        eqe[1] = EQE_TYPE_COMP
        struct.pack_into(">I", eqe, 56, cq.num & 0xFFFFFF)
        eqe[63] = pi >> log & 1
        try:
            base = int.from_bytes(int(eq.pas.view[off // page]).to_bytes(8, "little"), "big")
            self.dma_write(base + off % page, bytes(eqe))
        except WqeError as e:
            self.hca.device_errors.append(f"EQ {eq.num:#x}: EQE write failed: {e}")
            return
        self.eq_pi[eq.num] = pi + 1
        msix_raise(self.hca.pdev, eqc["intr"])

    def cq_resize(self, cq: Mlx5Cq, log_size: int, log_page: int, page_offset: int,
                  pas: U64Array) -> bool:
        """MODIFY_CQ resize: False if the CQEs not yet consumed (by the doorbell
        record) and the RESIZE CQE do not fit in 2^log_size; else the RESIZE CQE
        goes to the old ring at the producer index and the CQ continues in the new
        ring after it."""
        cqn = cq.num
        cqc = self._c(cq)
        pi = self.cq_pi.get(cqn, 0)
        try:
            ci = _be32(self.dma_read(cqc["dbr_addr"], 4), 0) & 0xFFFFFF
        except WqeError:
            return False
        if ((pi - ci) & 0xFFFFFF) + 1 > 1 << log_size:
            return False
        log = cqc["log_cq_size"]
        cqe = bytearray(64)
        struct.pack_into(">H", cqe, 60, pi & 0xFFFF)
        cqe[63] = CQE_RESIZE_CQ << 4 | (pi >> log & 1)
        try:
            at = (pi & ((1 << log) - 1)) * cqc["cqe_size"] + (cqc["cqe_size"] - 64)
            for dma, n in self._pas_pieces(cq, at, 64):
                self.dma_write(dma, bytes(cqe[:n]))
                cqe = cqe[n:]
        except WqeError as e:
            self.async_events.append(("cq_error", cqn, str(e)))
        MLX5_SET("cqc", cq.cqc, "log_cq_size", log_size)
        MLX5_SET("cqc", cq.cqc, "log_page_size", log_page)
        MLX5_SET("cqc", cq.cqc, "page_offset", page_offset)
        cq.pas = pas
        cq.hw_cache = None
        self.cq_pi[cqn] = pi + 1
        return True


def engine_of(hca: ConnectX) -> Mlx5Engine:
    """The HCA's data-path engine."""
    return hca.engine

"""pyverbs.cq: completion queues (ibv_create_cq, ibv_poll_cq) and their work completions.

CQ.poll(n) returns (npolled, [WC]) as pyverbs does.  CQEX is the extended CQ
(start_poll/poll_next/end_poll and the read_*() of the current completion);
CompChannel the completion channel a CQ created on it raises events on after
req_notify(), which get_cq_event() waits for and ack_events() acknowledges (a CQ
acknowledges what is left when it closes, as pyverbs' does).
"""

from __future__ import annotations

import errno
from typing import Any

import userspace.pyverbs.enums as e
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_cq as vcq
from userspace.libibverbs import verbs_types as vt
from userspace.pyverbs.base import (
    PyverbsCM,
    PyverbsObject,
    PyverbsRDMAErrno,
    call,
    destroy,
    set_errno,
    verb,
)
from userspace.pyverbs.device import Context
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError


class WC(PyverbsObject):
    """Mirrors pyverbs' WC (struct ibv_wc)."""

    FIELDS = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "qp_num", "src_qp",
              "imm_data", "wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits")

    def __init__(self, wr_id: int = 0, status: int = 0, opcode: int = 0, vendor_err: int = 0,
                 byte_len: int = 0, qp_num: int = 0, src_qp: int = 0, imm_data: int = 0,
                 wc_flags: int = 0, pkey_index: int = 0, slid: int = 0, sl: int = 0,
                 dlid_path_bits: int = 0) -> None:
        super().__init__()
        self.wr_id, self.status, self.opcode, self.vendor_err = wr_id, status, opcode, vendor_err
        self.byte_len, self.qp_num, self.src_qp, self.imm_data = byte_len, qp_num, src_qp, \
            imm_data
        self.wc_flags, self.pkey_index, self.slid, self.sl = wc_flags, pkey_index, slid, sl
        self.dlid_path_bits = dlid_path_bits

    @classmethod
    def from_c(cls, wc: v.ibv_wc) -> WC:
        return cls(**{f: getattr(wc, f) for f in cls.FIELDS})

    def __str__(self) -> str:
        return (f"WC: wr_id {self.wr_id}, status {cqe_status_to_str(self.status)}, "
                f"opcode {cqe_opcode_to_str(self.opcode)}, byte_len {self.byte_len}, "
                f"qp_num {self.qp_num}")


class CQ(PyverbsCM):
    """Mirrors pyverbs' CQ (ibv_create_cq): on a Context (and its CompChannel, if
    any), closed before them."""

    def __init__(self, context: Context, cqe: int, cq_context: Any = None,
                 channel: CompChannel | None = None, comp_vector: int = 0) -> None:
        super().__init__()
        self.context = context
        # pyverbs passes both to C ints: a float (max_cqe / 2) is truncated, as Cython's
        # conversion through __int__ does
        self.cq = call("Failed to create CQ", v.ibv_create_cq, context.ctx, int(cqe),
                       cq_context, channel.cc if channel is not None else None,
                       int(comp_vector))
        self._created()
        context.add_ref(self)
        if channel is not None:
            channel.add_ref(self)
        self.comp_channel = channel
        self.num_events = 0

    @property
    def cqe(self) -> int:
        return self.cq.cqe

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        """ibv_poll_cq(): (number polled, their WCs); a negative count is an error."""
        self._check_open("CQ.poll")
        wcs = v.ibv_poll_cq(self.cq, num_entries)
        return len(wcs), [WC.from_c(w) for w in wcs]

    def resize(self, cqe: int) -> None:
        """ibv_resize_cq(): at least cqe entries (EINVAL when the CQEs not yet polled
        would not fit)."""
        self._check_open("CQ.resize")
        destroy("Failed to resize CQ", vcq.ibv_resize_cq, self.cq, int(cqe))

    def req_notify(self, solicited_only: bool = False) -> None:
        """ibv_req_notify_cq(): the next completion raises an event on the channel."""
        self._check_open("CQ.req_notify")
        rc = vcq.ibv_req_notify_cq(self.cq, int(solicited_only))
        if rc:
            raise PyverbsRDMAError(f"Request notify CQ returned {rc}", rc)

    def ack_events(self, num_events: int) -> None:
        """ibv_ack_cq_events(): acknowledge events get_cq_event returned."""
        vcq.ibv_ack_cq_events(self.cq, num_events)
        self.num_events -= num_events

    def _free(self) -> None:
        self.logger.debug("Closing CQ")
        if self.num_events:
            self.ack_events(self.num_events)
        destroy("Failed to close CQ", v.ibv_destroy_cq, self.cq)
        self.comp_channel = None

    def __str__(self) -> str:
        return f"CQ\nHandle: {self.cq.handle}\nCQEs: {self.cqe}"


class CompChannel(PyverbsCM):
    """Mirrors pyverbs' CompChannel (ibv_create_comp_channel): its CQs close first."""

    def __init__(self, context: Context) -> None:
        super().__init__()
        self.cc = call("Failed to create a completion channel",
                       vcq.ibv_create_comp_channel, context.ctx)
        self._created()
        self.context = context
        context.add_ref(self)
        self.logger.debug("Created a Completion Channel")

    def get_cq_event(self, expected_cq: CQ | CQEX) -> None:
        """ibv_get_cq_event(): wait for the next event; it must be expected_cq's."""
        self._check_open("CompChannel.get_cq_event")
        try:
            cq, _ctx = vcq.ibv_get_cq_event(self.cc)
        except OSError as ex:
            set_errno(ex.errno or 0)
            raise PyverbsRDMAErrno("Failed to get CQ event") from None
        if cq is not expected_cq.cq:
            raise PyverbsRDMAErrno("Received event on an unexpected CQ")
        expected_cq.num_events += 1

    def _free(self) -> None:
        self.logger.debug("Closing completion channel")
        destroy("Failed to destroy a completion channel", vcq.ibv_destroy_comp_channel,
                self.cc)


class CqInitAttrEx(PyverbsObject):
    """Mirrors pyverbs' CqInitAttrEx (struct ibv_cq_init_attr_ex)."""

    def __init__(self, cqe: int = 100, channel: Any = None, comp_vector: int = 0,
                 wc_flags: int = 0, comp_mask: int = 0, flags: int = 0,
                 parent_domain: Any = None) -> None:
        super().__init__()
        self.cqe, self.comp_channel, self.comp_vector = cqe, channel, comp_vector
        self.wc_flags, self.comp_mask, self.flags = wc_flags, comp_mask, flags
        self.parent_domain, self.cq_context = parent_domain, None

    def to_c(self) -> vt.ibv_cq_init_attr_ex:
        ch = self.comp_channel
        return vt.ibv_cq_init_attr_ex(
            cqe=int(self.cqe), cq_context=self.cq_context, channel=ch.cc if ch else None,
            comp_vector=int(self.comp_vector), wc_flags=int(self.wc_flags),
            comp_mask=int(self.comp_mask), flags=int(self.flags),
            parent_domain=self.parent_domain.pd if self.parent_domain is not None else None)


class PollCqAttr(PyverbsObject):
    """Mirrors pyverbs' PollCqAttr (struct ibv_poll_cq_attr)."""

    def __init__(self) -> None:
        super().__init__()
        self.comp_mask = 0


class CQEX(PyverbsCM):
    """Mirrors pyverbs' CQEX (ibv_create_cq_ex): the extended poll API.

    start_poll / poll_next return 0 or ENOENT (2: empty) and raise on any other
    errno; status and wr_id are the current completion's, the read_*() the rest."""

    def __init__(self, context: Context, init_attr: CqInitAttrEx) -> None:
        super().__init__()
        self.context = context
        self.cq = call("Failed to create extended CQ", vcq.ibv_create_cq_ex, context.ctx,
                       init_attr.to_c())
        self._created()
        context.add_ref(self)
        if init_attr.parent_domain is not None:   # closed before its parent domain
            init_attr.parent_domain.add_ref(self)
        ch = init_attr.comp_channel
        if ch is not None:
            ch.add_ref(self)
        self.comp_channel = ch
        self.num_events = 0

    def start_poll(self, attr: PollCqAttr) -> int:
        self._check_open("CQEX.start_poll")
        ret = vcq.ibv_start_poll(self.cq, vt.ibv_poll_cq_attr(comp_mask=attr.comp_mask))
        if ret not in (0, errno.ENOENT):
            raise PyverbsRDMAError("Failed to poll CQ", ret)
        return ret

    def poll_next(self) -> int:
        self._check_open("CQEX.poll_next")
        ret = vcq.ibv_next_poll(self.cq)
        if ret not in (0, errno.ENOENT):
            raise PyverbsRDMAError("Failed to poll CQ", ret)
        return ret

    def end_poll(self) -> None:
        self._check_open("CQEX.end_poll")
        vcq.ibv_end_poll(self.cq)

    def _read(self, what: str) -> Any:
        with verb(f"Failed to read {what}"):
            return vcq.ibv_wc_read(self.cq, what)

    def read_opcode(self) -> int:
        return self._read("opcode")

    def read_vendor_err(self) -> int:
        return self._read("vendor_err")

    def read_byte_len(self) -> int:
        return self._read("byte_len")

    def read_imm_data(self) -> int:
        return self._read("imm_data")

    def read_qp_num(self) -> int:
        return self._read("qp_num")

    def read_src_qp(self) -> int:
        return self._read("src_qp")

    def read_wc_flags(self) -> int:
        return self._read("wc_flags")

    def read_slid(self) -> int:
        return self._read("slid")

    def read_sl(self) -> int:
        return self._read("sl")

    def read_dlid_path_bits(self) -> int:
        return self._read("dlid_path_bits")

    def read_timestamp(self) -> int:
        return self._read("completion_ts")

    def read_cvlan(self) -> int:
        return self._read("cvlan")

    def read_flow_tag(self) -> int:
        return self._read("flow_tag")

    def read_tm_info(self) -> WcTmInfo:
        tag, priv = self._read("tm_info")
        info = WcTmInfo()
        info.tag, info.priv = tag, priv
        return info

    def read_completion_wallclock_ns(self) -> int:
        return self._read("completion_wallclock_ns")

    @property
    def status(self) -> int:
        return self.cq.status

    @property
    def wr_id(self) -> int:
        return self.cq.wr_id

    @wr_id.setter
    def wr_id(self, val: int) -> None:
        self.cq.wr_id = val

    def _free(self) -> None:
        self.logger.debug("Closing CQEx")
        if self.num_events:
            vcq.ibv_ack_cq_events(self.cq, self.num_events)
            self.num_events = 0
        destroy("Failed to destroy CQEX", v.ibv_destroy_cq, self.cq)

    def __str__(self) -> str:
        return f"Extended CQ:\nHandle: {self.cq.handle}\nCQEs: {self.cq.cqe}"


class WcTmInfo(PyverbsObject):
    """Mirrors pyverbs' WcTmInfo (tag matching completion info)."""

    def __init__(self) -> None:
        super().__init__()
        self.tag, self.priv = 0, 0


def cqe_status_to_str(status: int) -> str:
    return v.ibv_wc_status_str(status)


def cqe_opcode_to_str(opcode: int) -> str:
    return {e.IBV_WC_SEND: "Send", e.IBV_WC_RDMA_WRITE: "RDMA write",
            e.IBV_WC_RDMA_READ: "RDMA read", e.IBV_WC_COMP_SWAP: "Compare swap",
            e.IBV_WC_FETCH_ADD: "Fetch add", e.IBV_WC_BIND_MW: "Bind MW",
            e.IBV_WC_RECV: "Receive",
            e.IBV_WC_RECV_RDMA_WITH_IMM: "Receive RDMA with immediate"}.get(opcode, "Unknown")


def flags_to_str(flags: int, dictionary: dict[int, str]) -> str:
    return " ".join(n for bit, n in dictionary.items() if flags & bit)


def cqe_flags_to_str(flags: int) -> str:
    return flags_to_str(flags, {e.IBV_WC_GRH: "GRH", e.IBV_WC_WITH_IMM: "With immediate",
                                e.IBV_WC_IP_CSUM_OK: "IP csum OK",
                                e.IBV_WC_WITH_INV: "With invalidate"})


def create_wc_flags_to_str(flags: int) -> str:
    return f"{flags:#x}"

"""pyverbs.cq: completion queues (ibv_create_cq, ibv_poll_cq) and their work completions.

CQ.poll(n) returns (npolled, [WC]) as pyverbs does.  The extended CQ (CQEX, its
start_poll/poll_next/end_poll reader), completion channels and resize are not in the
emulated stack yet: they fail with EOPNOTSUPP.
"""

from __future__ import annotations

from typing import Any

import userspace.pyverbs.enums as e
from userspace.libibverbs import verbs as v
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy, unsupported
from userspace.pyverbs.device import Context


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
    """Mirrors pyverbs' CQ (ibv_create_cq): on a Context, closed before it."""

    def __init__(self, context: Context, cqe: int, cq_context: Any = None,
                 channel: Any = None, comp_vector: int = 0) -> None:
        super().__init__()
        if channel is not None:
            raise unsupported("Failed to create CQ with a completion channel")
        self.context = context
        self.cq = call("Failed to create CQ", v.ibv_create_cq, context.ctx, cqe, cq_context,
                       None, comp_vector)
        self._created()
        context.add_ref(self)
        self.comp_channel = None

    @property
    def cqe(self) -> int:
        return self.cq.cqe

    def poll(self, num_entries: int = 1) -> tuple[int, list[WC]]:
        """ibv_poll_cq(): (number polled, their WCs); a negative count is an error."""
        self._check_open("CQ.poll")
        wcs = v.ibv_poll_cq(self.cq, num_entries)
        return len(wcs), [WC.from_c(w) for w in wcs]

    def resize(self, cqe: int) -> None:
        raise unsupported("Failed to resize CQ")

    def req_notify(self, solicited_only: bool = False) -> None:
        raise unsupported("Request notify CQ returned")

    def ack_events(self, num_events: int) -> None:
        raise unsupported("Failed to ack CQ events")

    def _free(self) -> None:
        self.logger.debug("Closing CQ")
        destroy("Failed to close CQ", v.ibv_destroy_cq, self.cq)

    def __str__(self) -> str:
        return f"CQ\nHandle: {self.cq.handle}\nCQEs: {self.cqe}"


class CompChannel(PyverbsCM):
    """Mirrors pyverbs' CompChannel (ibv_create_comp_channel): not emulated yet."""

    def __init__(self, context: Context) -> None:
        super().__init__()
        raise unsupported("Failed to create a completion channel")

    def get_cq_event(self, expected_cq: CQ) -> None:
        raise unsupported("Failed to get CQ event")


class CqInitAttrEx(PyverbsObject):
    """Mirrors pyverbs' CqInitAttrEx (struct ibv_cq_init_attr_ex)."""

    def __init__(self, cqe: int = 100, channel: Any = None, comp_vector: int = 0,
                 wc_flags: int = 0, comp_mask: int = 0, flags: int = 0,
                 parent_domain: Any = None) -> None:
        super().__init__()
        self.cqe, self.comp_channel, self.comp_vector = cqe, channel, comp_vector
        self.wc_flags, self.comp_mask, self.flags = wc_flags, comp_mask, flags
        self.parent_domain, self.cq_context = parent_domain, None


class PollCqAttr(PyverbsObject):
    """Mirrors pyverbs' PollCqAttr (struct ibv_poll_cq_attr)."""

    def __init__(self) -> None:
        super().__init__()
        self.comp_mask = 0


class CQEX(PyverbsCM):
    """Mirrors pyverbs' CQEX (ibv_create_cq_ex): not emulated yet."""

    def __init__(self, context: Context, init_attr: CqInitAttrEx) -> None:
        super().__init__()
        raise unsupported("Failed to create extended CQ")


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

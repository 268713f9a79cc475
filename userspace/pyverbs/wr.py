"""pyverbs.wr: scatter/gather elements and work requests (ibv_sge, ibv_send_wr,
ibv_recv_wr), built into the library's structs when posted."""

from __future__ import annotations

from typing import Any

import userspace.pyverbs.enums as e
from userspace.libibverbs import verbs as v
from userspace.pyverbs.base import PyverbsCM, inc_rkey  # noqa: F401 - pyverbs re-exports it
from userspace.pyverbs.host import current_process
from userspace.pyverbs.pyverbs_error import PyverbsUserError


class SGE(PyverbsCM):
    """Mirrors pyverbs' SGE (struct ibv_sge); read() loads from its memory."""

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        super().__init__()
        self.addr, self.length, self.lkey = addr, length, lkey

    def read(self, length: int, offset: int) -> bytes:
        return current_process().load(self.addr + offset, length)

    def to_c(self) -> v.ibv_sge:
        return v.ibv_sge(self.addr, self.length, self.lkey)

    def __str__(self) -> str:
        return f"SGE: addr {self.addr:#x}, length {self.length}, lkey {self.lkey:#x}"


def _sges(sg: list[SGE] | None, num_sge: int) -> list[SGE]:
    sg = list(sg or [])
    if num_sge > len(sg) and sg:
        raise PyverbsUserError(f"Expected {num_sge} SGEs, got {len(sg)}")
    return sg[:num_sge] if num_sge else sg


class RecvWR(PyverbsCM):
    """Mirrors pyverbs' RecvWR (struct ibv_recv_wr)."""

    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg: list[SGE] | None = None,
                 next_wr: RecvWR | None = None) -> None:
        super().__init__()
        self.wr_id, self.next_wr = wr_id, next_wr
        self.sg_list = _sges(sg, num_sge)

    @property
    def num_sge(self) -> int:
        return len(self.sg_list)

    def to_c(self) -> v.ibv_recv_wr:
        return v.ibv_recv_wr(self.wr_id, self.next_wr.to_c() if self.next_wr else None,
                             [s.to_c() for s in self.sg_list])


class SendWR(PyverbsCM):
    """Mirrors pyverbs' SendWR (struct ibv_send_wr)."""

    def __init__(self, wr_id: int = 0, opcode: int = e.IBV_WR_SEND, num_sge: int = 0,
                 imm_data: int = 0, sg: list[SGE] | None = None,
                 send_flags: int = e.IBV_SEND_SIGNALED,
                 next_wr: SendWR | None = None) -> None:
        super().__init__()
        self.wr_id, self.opcode, self.imm_data = wr_id, opcode, imm_data
        self.send_flags, self.next_wr = send_flags, next_wr
        self.sg_list = _sges(sg, num_sge)
        self.rkey = self.remote_addr = 0
        self.compare_add = self.swap = 0
        self.ud: tuple[Any, int, int] | None = None

    @property
    def num_sge(self) -> int:
        return len(self.sg_list)

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey, self.remote_addr = rkey, addr

    def set_wr_ud(self, ah: Any, rqpn: int, rqkey: int) -> None:
        self.ud = (ah, rqpn, rqkey)

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        self.rkey, self.remote_addr = rkey, addr
        self.compare_add, self.swap = compare_add, swap

    def set_bind_wr(self, mw: Any, bind_info: Any) -> None:
        """wr.bind_mw: the window, its next key (ibv_inc_rkey of its current one - what
        `rkey` reads from now on) and the binding."""
        self.bind = (mw, bind_info)
        self.rkey = v.ibv_inc_rkey(mw.rkey)

    def set_qp_type_xrc(self, remote_srqn: int) -> None:
        self.remote_srqn = remote_srqn

    def to_c(self) -> v.ibv_send_wr:
        wr = v.ibv_send_wr(self.wr_id, self.next_wr.to_c() if self.next_wr else None,
                           [s.to_c() for s in self.sg_list], self.opcode, self.send_flags,
                           self.imm_data, self.remote_addr, self.rkey,
                           compare_add=self.compare_add, swap=self.swap)
        if self.ud is not None:  # wr.ud: the AH's C object, remote QPN and Q_Key
            ah, wr.remote_qpn, wr.remote_qkey = self.ud
            wr.ah = ah.ah if ah is not None else None
        wr.remote_srqn = getattr(self, "remote_srqn", 0)   # qp_type.xrc
        bind = getattr(self, "bind", None)
        if bind is not None:     # wr.bind_mw
            mw, info = bind
            wr.bind_mw = v.ibv_bind_mw_wr(mw.mw, self.rkey, info.to_c())
        return wr


def send_flags_to_str(flags: int) -> str:
    names = {e.IBV_SEND_FENCE: "IBV_SEND_FENCE", e.IBV_SEND_SIGNALED: "IBV_SEND_SIGNALED",
             e.IBV_SEND_SOLICITED: "IBV_SEND_SOLICITED", e.IBV_SEND_INLINE: "IBV_SEND_INLINE",
             e.IBV_SEND_IP_CSUM: "IBV_SEND_IP_CSUM"}
    return " ".join(n for bit, n in names.items() if flags & bit)

"""pyverbs.qp: queue pairs (ibv_create_qp, ibv_modify_qp, ibv_query_qp, posting).

QP(pd, QPInitAttr, QPAttr) creates the QP and, given the QPAttr, moves it on as
pyverbs does: an RC/UC QP to INIT (its remote side is not known yet), a UD QP all the
way to RTS.  to_init/to_rtr/to_rts name, for each QP type, the attributes the IB
spec's state table requires for that transition (the masks ibv_rc_pingpong uses),
and each starts from whatever state the QP is in.  The extended creation on a
Context (QPInitAttrEx, ibv_create_qp_ex) and the new post-send API (QPEx) are not
in the emulated stack yet and fail with EOPNOTSUPP.
"""

from __future__ import annotations

from typing import Any

import userspace.pyverbs.enums as e
from userspace.libibverbs import verbs as v
from userspace.pyverbs.addr import AHAttr
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy, set_errno, unsupported
from userspace.pyverbs.device import Context
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.utils import qp_state_to_str, qp_type_to_str
from userspace.pyverbs.wr import RecvWR, SendWR


class QPCap(PyverbsObject):
    """Mirrors pyverbs' QPCap (struct ibv_qp_cap)."""

    def __init__(self, max_send_wr: int = 1, max_recv_wr: int = 10, max_send_sge: int = 1,
                 max_recv_sge: int = 1, max_inline_data: int = 0) -> None:
        super().__init__()
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr
        self.max_send_sge, self.max_recv_sge = max_send_sge, max_recv_sge
        self.max_inline_data = max_inline_data

    def to_c(self) -> v.ibv_qp_cap:
        return v.ibv_qp_cap(self.max_send_wr, self.max_recv_wr, self.max_send_sge,
                            self.max_recv_sge, self.max_inline_data)

    @classmethod
    def from_c(cls, cap: v.ibv_qp_cap) -> QPCap:
        return cls(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge,
                   cap.max_inline_data)

    def __str__(self) -> str:
        return (f"max send wrs: {self.max_send_wr}, max recv wrs: {self.max_recv_wr}, "
                f"max send sges: {self.max_send_sge}, max recv sges: {self.max_recv_sge}, "
                f"max inline data: {self.max_inline_data}")


class QPInitAttr(PyverbsObject):
    """Mirrors pyverbs' QPInitAttr (struct ibv_qp_init_attr); scq/rcq are CQs."""

    def __init__(self, qp_type: int = e.IBV_QPT_UD, qp_context: Any = None, scq: Any = None,
                 rcq: Any = None, srq: Any = None, cap: QPCap | None = None,
                 sq_sig_all: int = 1) -> None:
        super().__init__()
        self.qp_type, self.qp_context, self.srq = qp_type, qp_context, srq
        self.send_cq, self.recv_cq = scq, rcq
        self.cap = cap if cap is not None else QPCap()
        self.sq_sig_all = sq_sig_all

    def __getattr__(self, name: str) -> Any:
        if name.startswith("max_"):
            return getattr(self.cap, name)
        raise AttributeError(name)

    def to_c(self) -> v.ibv_qp_init_attr:
        return v.ibv_qp_init_attr(self.send_cq.cq if self.send_cq else None,
                                  self.recv_cq.cq if self.recv_cq else None, None,
                                  self.cap.to_c(), self.qp_type, self.sq_sig_all)

    def __str__(self) -> str:
        return f"QP type: {qp_type_to_str(self.qp_type)}\nSQ sig. all: {self.sq_sig_all}\n" \
            f"{self.cap}"


class QPInitAttrEx(QPInitAttr):
    """Mirrors pyverbs' QPInitAttrEx (struct ibv_qp_init_attr_ex)."""

    def __init__(self, qp_type: int = e.IBV_QPT_UD, qp_context: Any = None, scq: Any = None,
                 rcq: Any = None, srq: Any = None, cap: QPCap | None = None,
                 sq_sig_all: int = 0, comp_mask: int = 0, pd: PD | None = None,
                 xrcd: Any = None, create_flags: int = 0, max_tso_header: int = 0,
                 source_qpn: int = 0, hash_conf: Any = None, ind_table: Any = None,
                 send_ops_flags: int = 0) -> None:
        super().__init__(qp_type, qp_context, scq, rcq, srq, cap, sq_sig_all)
        self.comp_mask, self.pd, self.xrcd, self.create_flags = comp_mask, pd, xrcd, create_flags
        self.max_tso_header, self.source_qpn = max_tso_header, source_qpn
        self.hash_conf, self.ind_table, self.send_ops_flags = hash_conf, ind_table, \
            send_ops_flags


_QP_ATTR_FIELDS = ("qp_state", "cur_qp_state", "path_mtu", "path_mig_state", "qkey", "rq_psn",
                   "sq_psn", "dest_qp_num", "qp_access_flags", "pkey_index", "alt_pkey_index",
                   "en_sqd_async_notify", "sq_draining", "max_rd_atomic", "max_dest_rd_atomic",
                   "min_rnr_timer", "port_num", "timeout", "retry_cnt", "rnr_retry",
                   "alt_port_num", "alt_timeout", "rate_limit")


class QPAttr(PyverbsObject):
    """Mirrors pyverbs' QPAttr (struct ibv_qp_attr)."""

    def __init__(self, qp_state: int = e.IBV_QPS_INIT, cur_qp_state: int = e.IBV_QPS_RESET,
                 port_num: int = 1, path_mtu: int = e.IBV_MTU_1024) -> None:
        super().__init__()
        c = v.ibv_qp_attr()
        for f in _QP_ATTR_FIELDS:
            setattr(self, f, getattr(c, f))
        self.qp_state, self.cur_qp_state = qp_state, cur_qp_state
        self.port_num, self.path_mtu = port_num, path_mtu
        self.cap = QPCap(0, 0, 0, 0, 0)
        self.ah_attr = AHAttr(port_num=port_num)
        self.alt_ah_attr = AHAttr(port_num=port_num)

    def to_c(self) -> v.ibv_qp_attr:
        c = v.ibv_qp_attr()
        for f in _QP_ATTR_FIELDS:
            setattr(c, f, getattr(self, f))
        c.cap = self.cap.to_c()
        c.ah_attr, c.alt_ah_attr = self.ah_attr.to_c(), self.alt_ah_attr.to_c()
        return c

    @classmethod
    def from_c(cls, c: v.ibv_qp_attr) -> QPAttr:
        out = cls()
        for f in _QP_ATTR_FIELDS:
            setattr(out, f, getattr(c, f))
        out.cap = QPCap.from_c(c.cap)
        out.ah_attr, out.alt_ah_attr = AHAttr.from_c(c.ah_attr), AHAttr.from_c(c.alt_ah_attr)
        return out

    def __str__(self) -> str:
        return f"QP state: {qp_state_to_str(self.qp_state)}\nPort num: {self.port_num}"


# The attributes each transition requires, by QP type (the IB spec's state table).
_INIT = {e.IBV_QPT_RC: e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS,
         e.IBV_QPT_UC: e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS,
         e.IBV_QPT_UD: e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY,
         e.IBV_QPT_RAW_PACKET: e.IBV_QP_PORT}
_RTR = {e.IBV_QPT_RC: e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
        | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER,
        e.IBV_QPT_UC: e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN,
        e.IBV_QPT_UD: 0, e.IBV_QPT_RAW_PACKET: 0}
_RTS = {e.IBV_QPT_RC: e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
        | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC,
        e.IBV_QPT_UC: e.IBV_QP_SQ_PSN, e.IBV_QPT_UD: e.IBV_QP_SQ_PSN, e.IBV_QPT_RAW_PACKET: 0}
for _t in (e.IBV_QPT_XRC_SEND, e.IBV_QPT_XRC_RECV):
    _INIT[_t], _RTR[_t], _RTS[_t] = _INIT[e.IBV_QPT_RC], _RTR[e.IBV_QPT_RC], _RTS[e.IBV_QPT_RC]


class QP(PyverbsCM):
    """Mirrors pyverbs' QP: created on a PD (QPInitAttr) or a Context (QPInitAttrEx)."""

    def __init__(self, creator: PD | Context, init_attr: QPInitAttr,
                 qp_attr: QPAttr | None = None) -> None:
        super().__init__()
        if isinstance(creator, Context) or isinstance(init_attr, QPInitAttrEx):
            pd = getattr(init_attr, "pd", None) if isinstance(creator, Context) else creator
            if pd is None or init_attr.qp_type not in _INIT or init_attr.comp_mask & ~(
                    e.IBV_QP_INIT_ATTR_PD):
                raise unsupported("Failed to create QP")
            creator = pd
        assert isinstance(creator, PD)
        self.pd = creator
        self.init_attr = init_attr
        c_attr = init_attr.to_c()
        self.qp = call("Failed to create QP", v.ibv_create_qp, creator.pd, c_attr)
        self._created()
        init_attr.cap = QPCap.from_c(c_attr.cap)  # ibv_create_qp updates the caps
        creator.add_ref(self)
        for cq in (init_attr.send_cq, init_attr.recv_cq):
            if cq is not None:
                cq.add_ref(self)
        if qp_attr is not None:
            if self.qp_type in (e.IBV_QPT_UD, e.IBV_QPT_RAW_PACKET):
                self.to_rts(qp_attr)
            else:
                self.to_init(qp_attr)

    @property
    def qp_num(self) -> int:
        return self.qp.qp_num

    @property
    def qp_type(self) -> int:
        return self.qp.qp_type

    @property
    def qp_state(self) -> int:
        return self.qp.state

    def modify(self, qp_attr: QPAttr, comp_mask: int) -> None:
        """ibv_modify_qp() with the attributes comp_mask names."""
        self._check_open("QP.modify")
        rc = v.ibv_modify_qp(self.qp, qp_attr.to_c(), comp_mask)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to modify QP", rc)

    def _move(self, qp_attr: QPAttr, state: int, masks: dict[int, int]) -> None:
        if self.qp_type not in masks:
            raise PyverbsUserError(f"QP type {qp_type_to_str(self.qp_type)} is not supported")
        qp_attr.qp_state = state
        self.modify(qp_attr, e.IBV_QP_STATE | masks[self.qp_type])

    def to_init(self, qp_attr: QPAttr) -> None:
        """RESET -> INIT."""
        if self.qp_state != e.IBV_QPS_RESET:
            raise PyverbsUserError(f"Cannot modify QP to INIT from state "
                                   f"{qp_state_to_str(self.qp_state)}")
        self._move(qp_attr, e.IBV_QPS_INIT, _INIT)

    def to_rtr(self, qp_attr: QPAttr) -> None:
        """(RESET ->) INIT -> RTR."""
        if self.qp_state == e.IBV_QPS_RESET:
            self.to_init(qp_attr)
        self._move(qp_attr, e.IBV_QPS_RTR, _RTR)

    def to_rts(self, qp_attr: QPAttr) -> None:
        """(RESET -> INIT ->) RTR -> RTS."""
        if self.qp_state in (e.IBV_QPS_RESET, e.IBV_QPS_INIT):
            self.to_rtr(qp_attr)
        self._move(qp_attr, e.IBV_QPS_RTS, _RTS)

    def query(self, attr_mask: int) -> tuple[QPAttr, QPInitAttr]:
        """ibv_query_qp(): (attributes, creation attributes)."""
        self._check_open("QP.query")
        attr, init = call("Failed to query QP", v.ibv_query_qp, self.qp, attr_mask)
        out = QPInitAttr(qp_type=self.qp_type, scq=self.init_attr.send_cq,
                         rcq=self.init_attr.recv_cq, srq=self.init_attr.srq,
                         cap=QPCap.from_c(init.cap), sq_sig_all=init.sq_sig_all)
        return QPAttr.from_c(attr), out

    def post_send(self, wr: SendWR, bad_wr: SendWR | None = None) -> None:
        """ibv_post_send(); PyverbsRDMAError('Failed to post send') with the errno."""
        self._check_open("QP.post_send")
        if wr.ud is not None:
            raise unsupported("Failed to post send")
        rc = v.ibv_post_send(self.qp, wr.to_c(), [])
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to post send", rc)

    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:
        """ibv_post_recv(); PyverbsRDMAError('Failed to post recv') with the errno."""
        self._check_open("QP.post_recv")
        rc = v.ibv_post_recv(self.qp, wr.to_c(), [])
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to post recv", rc)

    def _free(self) -> None:
        self.logger.debug("Closing QP")
        destroy("Failed to destroy QP", v.ibv_destroy_qp, self.qp)

    def __str__(self) -> str:
        return (f"QP\nQP type: {qp_type_to_str(self.qp_type)}\nQP num: {self.qp_num}\n"
                f"QP state: {qp_state_to_str(self.qp_state)}")


class QPEx(QP):
    """Mirrors pyverbs' QPEx (ibv_create_qp_ex + the ibv_wr_* API): not emulated yet."""

    def __init__(self, creator: PD | Context, init_attr: QPInitAttr,
                 qp_attr: QPAttr | None = None) -> None:
        PyverbsCM.__init__(self)
        raise unsupported("Failed to create QP")


class ECE(PyverbsCM):
    """Mirrors pyverbs' ECE (enhanced connection establishment options)."""

    def __init__(self, vendor_id: int = 0, options: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.vendor_id, self.options, self.comp_mask = vendor_id, options, comp_mask


class DataBuffer(PyverbsCM):
    """Mirrors pyverbs' DataBuffer (an inline-data buffer for the ibv_wr_* API)."""

    def __init__(self, addr: int, length: int) -> None:
        super().__init__()
        self.addr, self.length = addr, length

"""pyverbs.qp: queue pairs (ibv_create_qp, ibv_modify_qp, ibv_query_qp, posting).

QP(pd, QPInitAttr, QPAttr) creates the QP and, given the QPAttr, moves it on as
pyverbs does: an RC/UC QP to INIT (its remote side is not known yet), a UD QP all the
way to RTS.  to_init/to_rtr/to_rts name, for each QP type, the attributes the IB
spec's state table requires for that transition (the masks ibv_rc_pingpong uses),
and each starts from whatever state the QP is in.  A QPInitAttrEx (on a Context, or
on a PD, which becomes its PD) goes through ibv_create_qp_ex; QPEx adds the new
post-send API (the ibv_wr_* calls) for a QP created with send_ops_flags.
"""

from __future__ import annotations

from typing import Any

import userspace.pyverbs.enums as e
from userspace.libibverbs import verbs as v
from userspace.pyverbs.addr import AHAttr
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy, set_errno
from userspace.pyverbs.device import Context
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.utils import qp_state_to_str, qp_type_to_str
from userspace.pyverbs.wr import SGE, RecvWR, SendWR


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

    # pyverbs' max_* properties read and write the inner ibv_qp_cap
    max_send_wr = property(lambda self: self.cap.max_send_wr,
                           lambda self, val: setattr(self.cap, "max_send_wr", val))
    max_recv_wr = property(lambda self: self.cap.max_recv_wr,
                           lambda self, val: setattr(self.cap, "max_recv_wr", val))
    max_send_sge = property(lambda self: self.cap.max_send_sge,
                            lambda self, val: setattr(self.cap, "max_send_sge", val))
    max_recv_sge = property(lambda self: self.cap.max_recv_sge,
                            lambda self, val: setattr(self.cap, "max_recv_sge", val))
    max_inline_data = property(lambda self: self.cap.max_inline_data,
                               lambda self, val: setattr(self.cap, "max_inline_data", val))

    def to_c(self) -> v.ibv_qp_init_attr:
        return v.ibv_qp_init_attr(self.send_cq.cq if self.send_cq else None,
                                  self.recv_cq.cq if self.recv_cq else None,
                                  self.srq.srq if self.srq is not None else None,
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

    def to_c_ex(self) -> v.ibv_qp_init_attr_ex:
        return v.ibv_qp_init_attr_ex(
            self.send_cq.cq if self.send_cq else None, self.recv_cq.cq if self.recv_cq else None,
            self.srq.srq if self.srq is not None else None, self.cap.to_c(), self.qp_type,
            self.sq_sig_all, comp_mask=self.comp_mask,
            pd=self.pd.pd if self.pd is not None else None,
            xrcd=self.xrcd.xrcd if self.xrcd is not None else None,
            create_flags=self.create_flags, max_tso_header=self.max_tso_header,
            source_qpn=self.source_qpn, send_ops_flags=self.send_ops_flags)


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
        if isinstance(init_attr, QPInitAttrEx):
            # ibv_create_qp_ex on the context; a PD creator is the attr's PD
            if isinstance(creator, PD):
                init_attr.pd = creator
                init_attr.comp_mask |= e.IBV_QP_INIT_ATTR_PD
                ctx = creator.ctx
            else:
                ctx = creator
            c_attr: v.ibv_qp_init_attr = init_attr.to_c_ex()
            self.qp = self._create_ex(ctx, c_attr)
            owner: PyverbsCM = init_attr.pd if init_attr.pd is not None else ctx
        elif isinstance(creator, PD):
            c_attr = init_attr.to_c()
            self.qp = call("Failed to create QP", v.ibv_create_qp, creator.pd, c_attr)
            owner = creator
        else:
            raise PyverbsUserError("A QP on a Context needs a QPInitAttrEx")
        self._created()
        self.pd = init_attr.pd if isinstance(init_attr, QPInitAttrEx) else creator
        self.init_attr = init_attr
        init_attr.cap = QPCap.from_c(c_attr.cap)  # ibv_create_qp updates the caps
        owner.add_ref(self)
        for parent in (init_attr.send_cq, init_attr.recv_cq, init_attr.srq,
                       getattr(init_attr, "xrcd", None)):
            if parent is not None:
                parent.add_ref(self)
        if qp_attr is not None:
            if self.qp_type in (e.IBV_QPT_UD, e.IBV_QPT_RAW_PACKET):
                self.to_rts(qp_attr)
            else:
                self.to_init(qp_attr)

    def _create_ex(self, ctx: Context, c_attr: v.ibv_qp_init_attr_ex) -> v.ibv_qp:
        """The create verb of a QPInitAttrEx QP (ibv_create_qp_ex; Mlx5QP's is
        mlx5dv_create_qp)."""
        return call("Failed to create QP", v.ibv_create_qp_ex, ctx.ctx, c_attr)

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

    def query_data_in_order(self, op: int, flags: int = 0) -> int:
        """ibv_query_qp_data_in_order(): 1 when the data of op arrives in order."""
        self._check_open("QP.query_data_in_order")
        return v.ibv_query_qp_data_in_order(self.qp, op, flags)

    def post_send(self, wr: SendWR, bad_wr: SendWR | None = None) -> None:
        """ibv_post_send(); PyverbsRDMAError('Failed to post send') with the errno."""
        self._check_open("QP.post_send")
        rc = v.ibv_post_send(self.qp, wr.to_c(), [])
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to post send", rc)

    def bind_mw(self, mw: Any, mw_bind: Any) -> None:
        """ibv_bind_mw() of a type 1 window; PyverbsRDMAError('Failed to Bind MW')."""
        self._check_open("QP.bind_mw")
        rc = v.ibv_bind_mw(self.qp, mw.mw, mw_bind.to_c())
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to Bind MW", rc)

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


def _htobe32(val: int) -> int:
    """htobe32() on the (little-endian) host: what pyverbs hands the C API as __be32."""
    return int.from_bytes((val & 0xFFFFFFFF).to_bytes(4, "big"), "little")


class QPEx(QP):
    """Mirrors pyverbs' QPEx: a QP created through ibv_create_qp_ex; with
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS its ibv_qp_ex (ibv_qp_to_qp_ex) carries the new
    post-send API - wr_start, one builder and its setters per WR, wr_complete."""

    def __init__(self, creator: PD | Context, init_attr: QPInitAttr,
                 qp_attr: QPAttr | None = None) -> None:
        self.qp_ex: v.ibv_qp_ex | None = None
        self._ind_table = getattr(init_attr, "ind_table", None)
        super().__init__(creator, init_attr, qp_attr)
        if self._ind_table is not None:
            self._ind_table.add_ref(self)
        if getattr(init_attr, "comp_mask", 0) & e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS:
            self.qp_ex = v.ibv_qp_to_qp_ex(self.qp)
            if self.qp_ex is None:
                raise PyverbsRDMAError("Failed to create extended QP", 0)
        else:
            self.logger.debug("qp_ex is not accessible since "
                              "IBV_QP_INIT_ATTR_SEND_OPS_FLAGS was not passed.")

    def _qpx(self) -> v.ibv_qp_ex:
        if self.qp_ex is None:  # pyverbs dereferences the NULL qp_ex
            raise PyverbsUserError("qp_ex is not accessible since "
                                   "IBV_QP_INIT_ATTR_SEND_OPS_FLAGS was not passed")
        return self.qp_ex

    def _wr(self, name: str, *args: Any) -> None:
        """One ibv_wr_* call (a builder or setter: errors surface at wr_complete)."""
        self._check_open(f"QPEx.{name}")
        call(f"Failed to {name}", getattr(v, f"ibv_{name}"), self._qpx(), *args)

    comp_mask = property(lambda self: self._qpx().comp_mask,
                         lambda self, val: setattr(self._qpx(), "comp_mask", val))
    wr_id = property(lambda self: self._qpx().wr_id,
                     lambda self, val: setattr(self._qpx(), "wr_id", val))
    wr_flags = property(lambda self: self._qpx().wr_flags,
                        lambda self, val: setattr(self._qpx(), "wr_flags", val))

    @property
    def ind_table(self) -> Any:
        return self._ind_table

    def wr_atomic_cmp_swp(self, rkey: int, remote_addr: int, compare: int, swap: int) -> None:
        self._wr("wr_atomic_cmp_swp", rkey, remote_addr, compare, swap)

    def wr_atomic_fetch_add(self, rkey: int, remote_addr: int, add: int) -> None:
        self._wr("wr_atomic_fetch_add", rkey, remote_addr, add)

    def wr_bind_mw(self, mw: Any, rkey: int, bind_info: Any) -> None:
        info = bind_info.to_c() if hasattr(bind_info, "to_c") else bind_info
        self._wr("wr_bind_mw", getattr(mw, "mw", mw), rkey, info)
        self.add_ref(mw)

    def wr_local_inv(self, invalidate_rkey: int) -> None:
        self._wr("wr_local_inv", invalidate_rkey)

    def wr_atomic_write(self, rkey: int, remote_addr: int, atomic_wr: bytes) -> None:
        self._wr("wr_atomic_write", rkey, remote_addr, atomic_wr)

    def wr_rdma_read(self, rkey: int, remote_addr: int) -> None:
        self._wr("wr_rdma_read", rkey, remote_addr)

    def wr_rdma_write(self, rkey: int, remote_addr: int) -> None:
        self._wr("wr_rdma_write", rkey, remote_addr)

    def wr_rdma_write_imm(self, rkey: int, remote_addr: int, data: int) -> None:
        self._wr("wr_rdma_write_imm", rkey, remote_addr, _htobe32(data))

    def wr_flush(self, rkey: int, remote_addr: int, length: int, ptype: int,
                 level: int) -> None:
        self._wr("wr_flush", rkey, remote_addr, length, ptype, level)

    def wr_send(self) -> None:
        self._wr("wr_send")

    def wr_send_imm(self, data: int) -> None:
        self._wr("wr_send_imm", _htobe32(data))

    def wr_send_inv(self, invalidate_rkey: int) -> None:
        self._wr("wr_send_inv", invalidate_rkey)

    def wr_send_tso(self, hdr: int, hdr_sz: int, mss: int) -> None:
        self._wr("wr_send_tso", hdr, hdr_sz, mss)

    def wr_set_ud_addr(self, ah: Any, remote_qpn: int, remote_rkey: int) -> None:
        self._wr("wr_set_ud_addr", ah.ah, remote_qpn, remote_rkey)

    def wr_set_xrc_srqn(self, remote_srqn: int) -> None:
        self._wr("wr_set_xrc_srqn", remote_srqn)

    def wr_set_inline_data(self, addr: int, length: int) -> None:
        self._wr("wr_set_inline_data", addr, length)

    def wr_set_inline_data_list(self, num_buf: int, buf_list: list[DataBuffer]) -> None:
        bufs = [v.ibv_data_buf(b.addr, b.length) for b in list(buf_list)[:num_buf]]
        self._wr("wr_set_inline_data_list", num_buf, bufs)

    def wr_set_sge(self, sge: SGE) -> None:
        self._wr("wr_set_sge", sge.lkey, sge.addr, sge.length)

    def wr_set_sge_list(self, num_sge: int, sg_list: list[SGE]) -> None:
        sges = [v.ibv_sge(s.addr, s.length, s.lkey) for s in list(sg_list)[:num_sge]]
        self._wr("wr_set_sge_list", num_sge, sges)

    def wr_start(self) -> None:
        self._wr("wr_start")

    def wr_complete(self) -> None:
        """ibv_wr_complete(); PyverbsRDMAError('ibv_wr_complete failed.') with the errno."""
        self._check_open("QPEx.wr_complete")
        rc = v.ibv_wr_complete(self._qpx())
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("ibv_wr_complete failed.", rc)

    def wr_abort(self) -> None:
        self._wr("wr_abort")


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

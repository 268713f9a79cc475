"""A pyverbs-style object face over libibverbs (rdma-core's pyverbs, in miniature).

    with Context(proc, name="mlx5_0") as ctx:
        with PD(ctx) as pd:
            mr = MR(pd, length=1 << 20, access=IBV_ACCESS_LOCAL_WRITE)
            cq = CQ(ctx, 16)
            qp = QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=QPCap(max_send_wr=64)))
    # leaving the with-blocks closed the QP, CQ, MR, PD and context, children first

One class per verbs object.  Each object registers with its parent, and a
parent's close() closes its children first (newest first) - so closing a
Context tears down everything made from it, as pyverbs does.  close() twice
is harmless.  Failures raise VerbsError (an OSError) carrying the errno.
"""

from __future__ import annotations

from typing import Any

from userspace.libc import MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE, check
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError

QPCap = v.ibv_qp_cap
SGE = v.ibv_sge
SendWR = v.ibv_send_wr
RecvWR = v.ibv_recv_wr
PyverbsRDMAError = VerbsError
QPAttr = v.ibv_qp_attr
AHAttr = v.ibv_ah_attr
GlobalRoute = v.ibv_global_route


class PyverbsObject:
    """Base: a parent/child tree; close() closes children first, once."""

    def __init__(self) -> None:
        self._children: list[PyverbsObject] = []
        self._parent: PyverbsObject | None = None
        self.closed = False

    def _adopt(self, child: PyverbsObject) -> None:
        child._parent = self
        self._children.append(child)

    def close(self) -> None:
        if self.closed:
            return
        for child in reversed(list(self._children)):
            child.close()
        self._destroy()
        self.closed = True
        if self._parent is not None and self in self._parent._children:
            self._parent._children.remove(self)

    def _destroy(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(ret: int, what: str) -> None:
    if ret:
        raise VerbsError(ret, what)


class Context(PyverbsObject):
    """An open device (ibv_open_device); `name` picks it, default the first."""

    def __init__(self, proc: Any, name: str | None = None):
        super().__init__()
        devs = v.ibv_get_device_list(proc)
        dev = next((d for d in devs if name is None or d.name == name), None)
        if dev is None:
            raise VerbsError(19, f"Context: no RDMA device {name or ''}".strip())
        self.proc = proc
        self.ctx = v.ibv_open_device(proc, dev)

    @property
    def name(self) -> str:
        return self.ctx.device.name

    def query_device(self):
        return v.ibv_query_device(self.ctx)

    def query_port(self, port_num: int = 1):
        return v.ibv_query_port(self.ctx, port_num)

    def query_gid(self, port_num: int = 1, index: int = 0) -> bytes:
        """ibv_query_gid(): the 16 raw bytes of the GID at index."""
        return v.ibv_query_gid(self.ctx, port_num, index)

    def _destroy(self) -> None:
        _check(v.ibv_close_device(self.ctx), "ibv_close_device")


class PD(PyverbsObject):
    def __init__(self, ctx: Context):
        super().__init__()
        self.ctx = ctx
        self.pd = v.ibv_alloc_pd(ctx.ctx)
        ctx._adopt(self)

    def _destroy(self) -> None:
        _check(v.ibv_dealloc_pd(self.pd), "ibv_dealloc_pd")


class MR(PyverbsObject):
    """A registered region; without `addr` it maps `length` bytes of its own."""

    def __init__(self, pd: PD, length: int, access: int, addr: int | None = None):
        super().__init__()
        proc = pd.ctx.proc
        self._owned = addr is None
        if addr is None:
            addr = check(proc.mmap(0, length, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS), "mmap")
        self.proc, self.buf, self.length = proc, addr, length
        try:
            self.mr = v.ibv_reg_mr(pd.pd, addr, length, access)
        except VerbsError:
            if self._owned:
                proc.munmap(addr, length)
            raise
        pd._adopt(self)

    @property
    def lkey(self) -> int:
        return self.mr.lkey

    @property
    def rkey(self) -> int:
        return self.mr.rkey

    def write(self, data: bytes, offset: int = 0) -> None:
        self.proc.store(self.buf + offset, data)

    def read(self, length: int, offset: int = 0) -> bytes:
        return self.proc.load(self.buf + offset, length)

    def _destroy(self) -> None:
        _check(v.ibv_dereg_mr(self.mr), "ibv_dereg_mr")
        if self._owned:
            self.proc.munmap(self.buf, self.length)


class CQ(PyverbsObject):
    def __init__(self, ctx: Context, cqe: int, comp_vector: int = 0):
        super().__init__()
        self.cq = v.ibv_create_cq(ctx.ctx, cqe, comp_vector=comp_vector)
        self.proc = ctx.proc
        ctx._adopt(self)

    def poll(self, num_entries: int = 1) -> list[v.ibv_wc]:
        """ibv_poll_cq(): the completions ready now (possibly none)."""
        return v.ibv_poll_cq(self.cq, num_entries)

    def poll_until(self, count: int, max_empty_polls: int = 100_000) -> list[v.ibv_wc]:
        """Poll until `count` completions arrived, as perftest's loops do.

        Each empty poll yields the CPU (to the HCA's task); ETIMEDOUT after
        max_empty_polls empty polls in a row, so a test never spins forever
        on a completion that will not come.
        """
        out: list[v.ibv_wc] = []
        empty = 0
        while len(out) < count:
            got = v.ibv_poll_cq(self.cq, count - len(out))
            empty = 0 if got else empty + 1
            if empty > max_empty_polls:
                raise VerbsError(110, f"CQ.poll_until: {len(out)} of {count} completions")
            out += got
        return out

    def _destroy(self) -> None:
        _check(v.ibv_destroy_cq(self.cq), "ibv_destroy_cq")


class QPInitAttr(v.ibv_qp_init_attr):
    """ibv_qp_init_attr taking pyverbs CQ objects (scq/rcq)."""

    def __init__(self, scq: CQ | None = None, rcq: CQ | None = None,
                 qp_type: int = v.IBV_QPT_RC, cap: v.ibv_qp_cap | None = None,
                 sq_sig_all: int = 0):
        super().__init__(send_cq=scq.cq if scq else None, recv_cq=rcq.cq if rcq else None,
                         cap=cap or v.ibv_qp_cap(1, 1, 1, 1, 0), qp_type=qp_type,
                         sq_sig_all=sq_sig_all)
        self.pyverbs_cqs = [c for c in (scq, rcq) if c is not None]


#: the access an RC QP is connected with by default (perftest's write/read tests)
RC_ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


class QP(PyverbsObject):
    """A QP; it is closed before its PD and CQs (it is their child)."""

    def __init__(self, pd: PD, attr: QPInitAttr):
        super().__init__()
        self.qp = v.ibv_create_qp(pd.pd, attr)
        self.cap = attr.cap
        pd._adopt(self)
        for cq in getattr(attr, "pyverbs_cqs", ()):
            if self not in cq._children:
                cq._children.append(self)

    @property
    def qp_num(self) -> int:
        return self.qp.qp_num

    def post_send(self, wr: v.ibv_send_wr) -> None:
        """ibv_post_send(); VerbsError carrying the errno (bad_wr in .bad_wr)."""
        bad: list = []
        ret = v.ibv_post_send(self.qp, wr, bad)
        if ret:
            err = VerbsError(ret, "ibv_post_send")
            err.bad_wr = bad[0] if bad else None
            raise err

    def post_recv(self, wr: v.ibv_recv_wr) -> None:
        """ibv_post_recv(); VerbsError carrying the errno (bad_wr in .bad_wr)."""
        bad: list = []
        ret = v.ibv_post_recv(self.qp, wr, bad)
        if ret:
            err = VerbsError(ret, "ibv_post_recv")
            err.bad_wr = bad[0] if bad else None
            raise err

    def modify(self, attr: v.ibv_qp_attr, attr_mask: int) -> None:
        """ibv_modify_qp(): the attributes attr_mask names; VerbsError on failure."""
        _check(v.ibv_modify_qp(self.qp, attr, attr_mask), "ibv_modify_qp")

    def query(self, attr_mask: int) -> tuple[v.ibv_qp_attr, v.ibv_qp_init_attr]:
        """ibv_query_qp(): (attributes, creation attributes)."""
        return v.ibv_query_qp(self.qp, attr_mask)

    def to_rts(self, remote_gid: bytes, remote_qpn: int, *, sgid_index: int = 0,
               port_num: int = 1, sq_psn: int = 0, rq_psn: int = 0,
               path_mtu: int = v.IBV_MTU_1024, access: int = RC_ACCESS, timeout: int = 14,
               retry_cnt: int = 7, rnr_retry: int = 7, max_rd_atomic: int = 1,
               max_dest_rd_atomic: int = 1, min_rnr_timer: int = 12, hop_limit: int = 1,
               qkey: int = 0x11111111) -> None:
        """RESET -> INIT -> RTR -> RTS with the attributes each step requires for
        this QP's type, as perftest and pyverbs' tests connect a QP: the remote
        side is (remote_gid, remote_qpn) - on one machine, the port's own GID."""
        t = self.qp.qp_type
        init = v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT
        init |= v.IBV_QP_QKEY if t == v.IBV_QPT_UD else v.IBV_QP_ACCESS_FLAGS
        self.modify(QPAttr(qp_state=v.IBV_QPS_INIT, pkey_index=0, port_num=port_num,
                           qp_access_flags=access, qkey=qkey), init)
        rtr = v.IBV_QP_STATE
        if t != v.IBV_QPT_UD:
            rtr |= v.IBV_QP_AV | v.IBV_QP_PATH_MTU | v.IBV_QP_DEST_QPN | v.IBV_QP_RQ_PSN
        if t == v.IBV_QPT_RC:
            rtr |= v.IBV_QP_MAX_DEST_RD_ATOMIC | v.IBV_QP_MIN_RNR_TIMER
        gr = GlobalRoute(dgid=remote_gid, sgid_index=sgid_index, hop_limit=hop_limit)
        self.modify(QPAttr(qp_state=v.IBV_QPS_RTR, path_mtu=path_mtu, dest_qp_num=remote_qpn,
                           rq_psn=rq_psn, max_dest_rd_atomic=max_dest_rd_atomic,
                           min_rnr_timer=min_rnr_timer,
                           ah_attr=AHAttr(grh=gr, is_global=1, port_num=port_num)), rtr)
        rts = v.IBV_QP_STATE | v.IBV_QP_SQ_PSN
        if t == v.IBV_QPT_RC:
            rts |= v.IBV_QP_TIMEOUT | v.IBV_QP_RETRY_CNT | v.IBV_QP_RNR_RETRY | \
                v.IBV_QP_MAX_QP_RD_ATOMIC
        self.modify(QPAttr(qp_state=v.IBV_QPS_RTS, sq_psn=sq_psn, timeout=timeout,
                           retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                           max_rd_atomic=max_rd_atomic), rts)

    def _destroy(self) -> None:
        _check(v.ibv_destroy_qp(self.qp), "ibv_destroy_qp")

"""userspace/pyverbs Mlx5QP with Dynamically Connected QPs, end to end: mlx5dv_create_qp
(userspace/providers/mlx5/dc.py) -> CREATE_QP (a DCI: drivers/mlx5_ib/qp.py; a DCT:
drivers/mlx5_ib/qp_dc.py's create_dct, then CREATE_DCT at RTR through the extended
MODIFY_QP) -> the firmware's DCT (kernel_model/hw/mlx5_fw_dct.py) -> the engine's DC
path (a DCI WQE's datagram segment names the DCT and its key; the DCT checks the key
and takes SENDs from its SRQ).  Then every errno libmlx5, the kernel and the
firmware answer on the way."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator

import pytest

import userspace.pyverbs.enums as e
import userspace.pyverbs.providers.mlx5.mlx5_enums as dve
from userspace.pyverbs import host
from userspace.pyverbs.addr import AH, AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.providers.mlx5.mlx5dv import (
    Mlx5Context,
    Mlx5DCIStreamInitAttr,
    Mlx5DVContextAttr,
    Mlx5DVDCInitAttr,
    Mlx5DVQPInitAttr,
    Mlx5QP,
)
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QPAttr, QPCap, QPInitAttrEx
from userspace.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from userspace.pyverbs.wr import SGE, RecvWR

DCT_KEY = 0xBADC0DE
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
DCI_OPS = (e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_WRITE | e.IBV_QP_EX_WITH_RDMA_READ
           | e.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
DC = dve.MLX5DV_QP_INIT_ATTR_MASK_DC


def fw():
    return host.host().machine.hcas[0].fw


def kmsg() -> str:
    """The kernel's message for the process's last failed system call."""
    return str(host.current_process().task.last_error)


def raises_errno(err: int, match: str | None = None):
    return _ErrnoCheck(err, match)


class _ErrnoCheck:
    def __init__(self, err: int, match: str | None) -> None:
        self.err, self.cm = err, pytest.raises(PyverbsRDMAError, match=match)

    def __enter__(self):
        self.info = self.cm.__enter__()
        return self.info

    def __exit__(self, *exc):
        handled = self.cm.__exit__(*exc)
        assert self.info.value.error_code == self.err, self.info.value
        return handled


class Res:
    """One context's DC resources: PD, CQ, SRQ, an 8 KiB MR."""

    def __init__(self) -> None:
        self.ctx = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64)
        self.srq = SRQ(self.pd, SrqInitAttr(SrqAttr(max_wr=16, max_sge=1)))
        self.mr = MR(self.pd, 8192, ACCESS)
        self.gid = self.ctx.query_gid(1, 0)

    def init_attr(self, ops: int = 0, **kw) -> QPInitAttrEx:
        mask = e.IBV_QP_INIT_ATTR_PD | (e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS if ops else 0)
        kw.setdefault("srq", self.srq)
        return QPInitAttrEx(qp_type=e.IBV_QPT_DRIVER, pd=self.pd, scq=self.cq, rcq=self.cq,
                            cap=kw.pop("cap", QPCap(16, 0, 1, 0)), send_ops_flags=ops,
                            comp_mask=mask, sq_sig_all=1, **kw)

    def qp_attr(self) -> QPAttr:
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = ACCESS
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 12
        attr.max_rd_atomic = 1
        attr.path_mtu = e.IBV_MTU_1024
        attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=self.gid, sgid_index=0), is_global=1,
                              port_num=1)
        return attr

    def dci(self, ops: int = DCI_OPS) -> Mlx5QP:
        qp = Mlx5QP(self.ctx, self.init_attr(ops),
                    Mlx5DVQPInitAttr(comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr()))
        qp.to_rts(self.qp_attr())
        return qp

    def dct(self, key: int = DCT_KEY, rtr: bool = True) -> Mlx5QP:
        qp = Mlx5QP(self.ctx, self.init_attr(),
                    Mlx5DVQPInitAttr(comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr(
                        dve.MLX5DV_DCTYPE_DCT, key)))
        if rtr:
            qp.to_rtr(self.qp_attr())
        return qp

    def ah(self) -> AH:
        return AH(self.pd, attr=AHAttr(gr=GlobalRoute(dgid=self.gid, sgid_index=0),
                                       is_global=1, port_num=1))


@pytest.fixture
def res() -> Iterator[Res]:
    r = Res()
    yield r
    r.ctx.close()


def poll(cq: CQ, n: int = 1) -> list:
    got: list = []
    for _ in range(10000):
        got += cq.poll(n - len(got))[1]
        if len(got) == n:
            return got
    raise AssertionError(f"{len(got)} of {n} completions")


def post(dci: Mlx5QP, op: str, ah: AH, dctn: int, key: int, sge: SGE, *args) -> None:
    dci.wr_start()
    dci.wr_id, dci.wr_flags = 0x77, e.IBV_SEND_SIGNALED
    getattr(dci, op)(*args)
    dci.wr_set_dc_addr(ah, dctn, key)
    dci.wr_set_sge(sge)
    dci.wr_complete()


# -- the happy paths ---------------------------------------------------------------------
def test_a_dct_gets_its_number_at_rtr_from_create_dct(res):
    dct = res.dct(rtr=False)
    assert dct.qp_num == 0 and not fw().dcts          # no firmware object before RTR
    dct.to_rtr(res.qp_attr())
    assert dct.qp_num in fw().dcts and dct.qp_num not in fw().qps
    dctc = fw().dcts[dct.qp_num].dctc
    assert (dctc["dc_access_key"], dctc["srqn_xrqn"], dctc["rwe"], dctc["rre"], dctc["rae"],
            dctc["port"], dctc["mtu"]) == (DCT_KEY, res.srq.get_srq_num(), 1, 1, 1, 1,
                                           e.IBV_MTU_1024)
    attr, _init = dct.query(e.IBV_QP_STATE | e.IBV_QP_ACCESS_FLAGS | e.IBV_QP_PORT)
    assert (attr.qp_state, attr.port_num, attr.qp_access_flags) == \
        (e.IBV_QPS_RTR, 1, e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
         | e.IBV_ACCESS_REMOTE_ATOMIC)
    dctn = dct.qp_num
    log = len(fw().cmd_log)
    dct.close()
    assert [c[0] for c in fw().cmd_log[log:]] == ["DRAIN_DCT", "DESTROY_DCT"]
    assert dctn not in fw().dcts


def test_a_dci_sends_into_the_dcts_srq(res):
    dci, dct, ah = res.dci(), res.dct(), res.ah()
    assert fw().qps[dci.qp_num].qpc["st"] == 0x5          # MLX5_QPC_ST_DCI
    res.mr.write(b"hello, DCT", 10)
    res.srq.post_recv(RecvWR(wr_id=5, sg=[SGE(res.mr.buf + 4096, 64, res.mr.lkey)],
                             num_sge=1))
    post(dci, "wr_send", ah, dct.qp_num, DCT_KEY, SGE(res.mr.buf, 10, res.mr.lkey))
    wcs = poll(res.cq, 2)
    req = next(w for w in wcs if w.opcode == e.IBV_WC_SEND)
    resp = next(w for w in wcs if w.opcode == e.IBV_WC_RECV)
    assert (req.wr_id, req.status, req.qp_num) == (0x77, e.IBV_WC_SUCCESS, dci.qp_num)
    assert (resp.wr_id, resp.status, resp.byte_len, resp.src_qp, resp.qp_num) == \
        (5, e.IBV_WC_SUCCESS, 10, dci.qp_num, dct.qp_num)
    assert res.mr.read(10, 4096) == b"hello, DCT"


def test_rdma_write_read_and_atomics_through_a_dct(res):
    dci, dct, ah = res.dci(), res.dct(), res.ah()
    res.mr.write(b"W" * 32, 32)
    post(dci, "wr_rdma_write", ah, dct.qp_num, DCT_KEY, SGE(res.mr.buf, 32, res.mr.lkey),
         res.mr.rkey, res.mr.buf + 2048)
    assert poll(res.cq)[0].status == e.IBV_WC_SUCCESS
    assert res.mr.read(32, 2048) == b"W" * 32
    res.mr.write(b"R" * 16, 16, 3072)
    post(dci, "wr_rdma_read", ah, dct.qp_num, DCT_KEY, SGE(res.mr.buf + 512, 16, res.mr.lkey),
         res.mr.rkey, res.mr.buf + 3072)
    assert poll(res.cq)[0].opcode == e.IBV_WC_RDMA_READ
    assert res.mr.read(16, 512) == b"R" * 16
    res.mr.write(struct.pack(">Q", 40), 8, 6144)
    post(dci, "wr_atomic_fetch_add", ah, dct.qp_num, DCT_KEY,
         SGE(res.mr.buf + 1024, 8, res.mr.lkey), res.mr.rkey, res.mr.buf + 6144, 2)
    assert poll(res.cq)[0].opcode == e.IBV_WC_FETCH_ADD
    assert struct.unpack(">Q", res.mr.read(8, 6144))[0] == 42
    assert struct.unpack(">Q", res.mr.read(8, 1024))[0] == 40


def test_a_wrong_dc_key_is_dropped_and_counted_the_dci_errs(res):
    dci, dct, ah = res.dci(), res.dct(), res.ah()
    res.srq.post_recv(RecvWR(wr_id=5, sg=[SGE(res.mr.buf + 4096, 64, res.mr.lkey)],
                             num_sge=1))
    post(dci, "wr_send", ah, dct.qp_num, DCT_KEY + 1, SGE(res.mr.buf, 8, res.mr.lkey))
    wc = poll(res.cq)[0]
    assert (wc.wr_id, wc.status) == (0x77, e.IBV_WC_RETRY_EXC_ERR)
    assert fw().dcts[dct.qp_num].dctc["dc_access_key_violation_count"] == 1
    assert fw().qps[dci.qp_num].state == 6                # ERR
    assert res.cq.poll(1)[0] == 0                          # the receive was not taken


def test_a_dct_without_write_access_answers_remote_invalid_request(res):
    dci, ah = res.dci(), res.ah()
    dct = res.dct(rtr=False)
    attr = res.qp_attr()
    attr.qp_access_flags = e.IBV_ACCESS_REMOTE_READ
    dct.to_rtr(attr)
    post(dci, "wr_rdma_write", ah, dct.qp_num, DCT_KEY, SGE(res.mr.buf, 8, res.mr.lkey),
         res.mr.rkey, res.mr.buf + 2048)
    assert poll(res.cq)[0].status == e.IBV_WC_REM_INV_REQ_ERR


def test_a_send_to_no_dct_times_out(res):
    dci, ah = res.dci(), res.ah()
    post(dci, "wr_send", ah, 0xFFFF0, DCT_KEY, SGE(res.mr.buf, 8, res.mr.lkey))
    assert poll(res.cq)[0].status == e.IBV_WC_RETRY_EXC_ERR


def test_mlx5dv_create_flags_libmlx5_takes_on_an_rc_qp(res):
    attr = QPInitAttrEx(qp_type=e.IBV_QPT_RC, pd=res.pd, scq=res.cq, rcq=res.cq,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD)
    for flags in (dve.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE,
                  dve.MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE):
        qp = Mlx5QP(res.ctx, attr, Mlx5DVQPInitAttr(
            comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS, create_flags=flags))
        assert qp.qp_num in fw().qps
        qp.close()


# -- libmlx5's checks ----------------------------------------------------------------------
@pytest.mark.parametrize(("qp_type", "dv", "err"), [
    (e.IBV_QPT_RC, Mlx5DVQPInitAttr(comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr()),
     errno.EINVAL),                                       # DC on a QP of another type
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(), errno.EINVAL),   # a driver QP without DC
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr(7)),
     errno.EINVAL),                                       # no such DC type
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(comp_mask=1 << 9), errno.EINVAL),
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS, create_flags=1 << 12,
        dc_init_attr=Mlx5DVDCInitAttr()), errno.EINVAL),  # an unknown create flag
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        create_flags=dve.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
        | dve.MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE,
        dc_init_attr=Mlx5DVDCInitAttr()), errno.EINVAL),  # disable and allow
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        create_flags=dve.MLX5DV_QP_CREATE_OOO_DP, dc_init_attr=Mlx5DVDCInitAttr()),
     errno.EOPNOTSUPP),
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS,
        dc_init_attr=Mlx5DVDCInitAttr(dci_streams=Mlx5DCIStreamInitAttr(1, 1))),
     errno.EINVAL),                                       # beyond dci_streams_caps (0)
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
        send_ops_flags=dve.MLX5DV_QP_EX_WITH_MR_LIST, dc_init_attr=Mlx5DVDCInitAttr()),
     errno.EOPNOTSUPP),                                   # a dv op a DCI has not
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
        send_ops_flags=dve.MLX5DV_QP_EX_WITH_MEMCPY, dc_init_attr=Mlx5DVDCInitAttr()),
     errno.EOPNOTSUPP),                                   # no DMA MMO caps
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
        dc_init_attr=Mlx5DVDCInitAttr(dve.MLX5DV_DCTYPE_DCT)), errno.EINVAL),  # on a DCT
    (e.IBV_QPT_DRIVER, Mlx5DVQPInitAttr(
        comp_mask=DC | dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
        create_flags=dve.MLX5DV_QP_CREATE_TUNNEL_OFFLOADS,
        dc_init_attr=Mlx5DVDCInitAttr(dve.MLX5DV_DCTYPE_DCT)), errno.EINVAL),  # DCT flags
])
def test_libmlx5_refuses_what_it_does(res, qp_type, dv, err):
    attr = res.init_attr()
    attr.qp_type = qp_type
    before = sorted(fw().qps)
    with raises_errno(err, "Failed to create MLX5 QP."):
        Mlx5QP(res.ctx, attr, dv)
    assert sorted(fw().qps) == before and not fw().dcts


def test_send_ops_on_a_dct_are_einval(res):
    with raises_errno(errno.EINVAL, "Failed to create MLX5 QP."):
        Mlx5QP(res.ctx, res.init_attr(e.IBV_QP_EX_WITH_SEND), Mlx5DVQPInitAttr(
            comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr(dve.MLX5DV_DCTYPE_DCT)))


# -- the kernel's ------------------------------------------------------------------------
def test_a_dct_needs_an_srq_and_a_dci_has_no_receive_queue(res):
    with raises_errno(errno.EINVAL, "Failed to create MLX5 QP."):
        Mlx5QP(res.ctx, res.init_attr(srq=None), Mlx5DVQPInitAttr(
            comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr(dve.MLX5DV_DCTYPE_DCT)))
    assert "check_qp_attr" in kmsg() and "a DCT needs an SRQ" in kmsg()
    with raises_errno(errno.EINVAL, "Failed to create MLX5 QP."):
        Mlx5QP(res.ctx, res.init_attr(DCI_OPS, srq=None, cap=QPCap(16, 4, 1, 1)),
               Mlx5DVQPInitAttr(comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr()))
    assert "a DCI has no receive queue" in kmsg()
    assert not fw().qps and not fw().dcts


def test_a_dct_takes_only_its_two_transitions(res):
    dct = res.dct(rtr=False)
    attr = res.qp_attr()
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # RESET -> RTR
        attr.qp_state = e.IBV_QPS_RTR
        dct.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PATH_MTU | e.IBV_QP_MIN_RNR_TIMER)
    assert "mlx5_ib_modify_dct: invalid transition" in kmsg()
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # INIT without the port
        attr.qp_state = e.IBV_QPS_INIT
        dct.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_ACCESS_FLAGS)
    assert "mlx5_ib_modify_dct: attr_mask" in kmsg()
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # port 2 of 1
        attr.port_num = 2
        dct.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_ACCESS_FLAGS
                   | e.IBV_QP_PORT)
    attr.port_num = 1
    dct.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_ACCESS_FLAGS
               | e.IBV_QP_PORT)
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # RTR with a DEST_QPN too
        attr.qp_state = e.IBV_QPS_RTR
        dct.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU
                   | e.IBV_QP_MIN_RNR_TIMER | e.IBV_QP_DEST_QPN)
    assert "mlx5_ib_modify_dct: attr_mask" in kmsg()
    with raises_errno(errno.EINVAL, "Failed to query QP"):        # not in RTR yet
        dct.query(e.IBV_QP_STATE)
    assert "mlx5_ib_dct_query_qp: the DCT is not in RTR" in kmsg()
    assert not fw().dcts
    dct.to_rtr(attr)
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # RTR -> RTS: none
        attr.qp_state = e.IBV_QPS_RTS
        dct.modify(attr, e.IBV_QP_STATE)
    assert "mlx5_ib_modify_dct: invalid transition" in kmsg()
    with raises_errno(errno.EINVAL, "Failed to query QP"):        # no SQ PSN on a DCT
        dct.query(e.IBV_QP_SQ_PSN)
    assert "mlx5_ib_dct_query_qp: attr_mask" in kmsg()


def test_a_dci_moves_with_the_dci_attributes_only(res):
    qp = Mlx5QP(res.ctx, res.init_attr(DCI_OPS),
                Mlx5DVQPInitAttr(comp_mask=DC, dc_init_attr=Mlx5DVDCInitAttr()))
    attr = res.qp_attr()
    attr.qp_state = e.IBV_QPS_INIT
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # an RC's INIT mask
        qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                  | e.IBV_QP_ACCESS_FLAGS)
    assert "invalid DCI transition" in kmsg()
    qp.to_init(attr)
    attr.dest_qp_num = 5
    with raises_errno(errno.EINVAL, "Failed to modify QP"):       # a DCI has no peer QP
        attr.qp_state = e.IBV_QPS_RTR
        qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN)
    qp.to_rts(attr)
    assert fw().qps[qp.qp_num].state == 3


def test_the_dc_ops_are_a_dcis_only(res):
    dct, ah = res.dct(), res.ah()
    rc = Mlx5QP(res.ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RC, pd=res.pd, scq=res.cq, rcq=res.cq,
                                      send_ops_flags=e.IBV_QP_EX_WITH_SEND,
                                      comp_mask=e.IBV_QP_INIT_ATTR_PD
                                      | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS), None)
    rc.wr_start()
    rc.wr_send()
    with raises_errno(errno.EOPNOTSUPP, "Failed to wr_set_dc_addr"):
        rc.wr_set_dc_addr(ah, dct.qp_num, DCT_KEY)
    rc.wr_abort()

"""userspace/pyverbs QPEx and atomics: a QP created with send_ops_flags posts through
the wr_* methods (wr_id / wr_flags properties, builders, setters, wr_complete /
wr_abort), SendWR.set_wr_atomic reaches the library, and what libmlx5 refuses
(send ops the QP type lacks) is pyverbs' EOPNOTSUPP."""

from __future__ import annotations

import errno
import struct

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QP, DataBuffer, QPAttr, QPCap, QPEx, QPInitAttrEx
from userspace.pyverbs.wr import SGE, SendWR

ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
RC_OPS = (e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_SEND_WITH_IMM | e.IBV_QP_EX_WITH_RDMA_WRITE
          | e.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | e.IBV_QP_EX_WITH_RDMA_READ
          | e.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | e.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)


def qpex(ctx, pd, cq, ops: int = RC_OPS, qp_type: int = e.IBV_QPT_RC,
         cls: type = QPEx) -> QP:
    qia = QPInitAttrEx(qp_type=qp_type, scq=cq, rcq=cq, pd=pd, send_ops_flags=ops,
                       cap=QPCap(16, 16, 2, 2, 64),
                       comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = ACCESS
    return cls(ctx, qia, attr)


def connect(qp: QP, peer: QP, gid) -> None:
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = ACCESS
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = peer.qp_num, 0, 0
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 12
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1)
    qp.to_rts(attr)


@pytest.fixture
def pair():
    """Two connected RC QPEx on one context (loopback), a CQ each, one MR."""
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cqa, cqb = CQ(ctx, 64), CQ(ctx, 64)
    mr = MR(pd, 8192, ACCESS)
    a, b = qpex(ctx, pd, cqa), qpex(ctx, pd, cqb)
    gid = ctx.query_gid(1, 0)
    connect(a, b, gid)
    connect(b, a, gid)
    yield a, b, cqa, cqb, mr
    ctx.close()


def poll(cq: CQ, n: int = 1) -> list:
    got: list = []
    for _ in range(10000):
        got += cq.poll(n - len(got))[1]
        if len(got) == n:
            return got
    raise AssertionError(f"{len(got)} of {n} completions")


def word(mr: MR, offset: int) -> int:
    return struct.unpack(">Q", mr.read(8, offset))[0]


def test_wr_id_and_flags_reach_the_completion(pair):
    a, _b, cqa, _cqb, mr = pair
    mr.write(b"x" * 16, 16)
    a.wr_start()
    a.wr_id, a.wr_flags = 0xABC, e.IBV_SEND_SIGNALED
    assert (a.wr_id, a.wr_flags, a.comp_mask) == (0xABC, e.IBV_SEND_SIGNALED, 0)
    a.wr_rdma_write(mr.rkey, mr.buf + 4096)
    a.wr_set_sge(SGE(mr.buf, 16, mr.lkey))
    a.wr_complete()
    wc = poll(cqa)[0]
    assert (wc.wr_id, wc.status, wc.opcode) == (0xABC, e.IBV_WC_SUCCESS, e.IBV_WC_RDMA_WRITE)
    assert mr.read(16, 4096) == b"x" * 16


def test_sends_with_immediate_and_inline_lists(pair):
    a, b, cqa, cqb, mr = pair
    mr.write(b"abcdefgh", 8, 8)
    from userspace.pyverbs.wr import RecvWR
    b.post_recv(RecvWR(sg=[SGE(mr.buf + 1024, 64, mr.lkey)], num_sge=1))
    a.wr_start()
    a.wr_flags = e.IBV_SEND_SIGNALED
    a.wr_send_imm(0x01020304)
    a.wr_set_inline_data_list(2, [DataBuffer(mr.buf + 8, 3), DataBuffer(mr.buf + 12, 4)])
    a.wr_complete()
    assert poll(cqa)[0].opcode == e.IBV_WC_SEND
    wc = poll(cqb)[0]
    assert (wc.opcode, wc.byte_len, wc.wc_flags & e.IBV_WC_WITH_IMM) == \
        (e.IBV_WC_RECV, 7, e.IBV_WC_WITH_IMM)
    assert struct.pack(">I", wc.imm_data) == bytes(reversed(bytes([1, 2, 3, 4])))
    assert mr.read(7, 1024) == b"abcefgh"


def test_atomics_through_the_wr_api(pair):
    a, _b, cqa, _cqb, mr = pair
    mr.write(struct.pack(">QQ", 100, 7), 16, 4096)
    a.wr_start()
    a.wr_flags = e.IBV_SEND_SIGNALED
    a.wr_id = 1
    a.wr_atomic_fetch_add(mr.rkey, mr.buf + 4096, 5)
    a.wr_set_sge(SGE(mr.buf, 8, mr.lkey))
    a.wr_id = 2
    a.wr_atomic_cmp_swp(mr.rkey, mr.buf + 4104, 7, 9)
    a.wr_set_sge_list(1, [SGE(mr.buf + 8, 8, mr.lkey)])
    a.wr_complete()
    wcs = poll(cqa, 2)
    assert [(wc.wr_id, wc.opcode, wc.byte_len) for wc in wcs] == [
        (1, e.IBV_WC_FETCH_ADD, 8), (2, e.IBV_WC_COMP_SWAP, 8)]
    assert (word(mr, 4096), word(mr, 4104)) == (105, 9)
    assert (word(mr, 0), word(mr, 8)) == (100, 7)


def test_rdma_read_and_write_imm(pair):
    a, b, cqa, cqb, mr = pair
    mr.write(b"R" * 32, 32, 2048)
    from userspace.pyverbs.wr import RecvWR
    b.post_recv(RecvWR())
    a.wr_start()
    a.wr_flags = e.IBV_SEND_SIGNALED
    a.wr_rdma_read(mr.rkey, mr.buf + 2048)
    a.wr_set_sge(SGE(mr.buf + 3072, 32, mr.lkey))
    a.wr_rdma_write_imm(mr.rkey, mr.buf + 6000, 0x55)
    a.wr_set_inline_data(mr.buf + 2048, 4)
    a.wr_complete()
    assert [wc.opcode for wc in poll(cqa, 2)] == [e.IBV_WC_RDMA_READ, e.IBV_WC_RDMA_WRITE]
    assert mr.read(32, 3072) == b"R" * 32 and mr.read(4, 6000) == b"RRRR"
    assert poll(cqb)[0].opcode == e.IBV_WC_RECV_RDMA_WITH_IMM


def test_wr_abort_and_a_failed_batch(pair):
    a, _b, cqa, _cqb, mr = pair
    a.wr_start()
    a.wr_flags = e.IBV_SEND_SIGNALED
    a.wr_rdma_write(mr.rkey, mr.buf)
    a.wr_set_sge(SGE(mr.buf, 8, mr.lkey))
    a.wr_abort()
    a.wr_start()
    a.wr_send()
    a.wr_set_sge_list(3, [SGE(mr.buf, 1, mr.lkey)] * 3)        # more than max_send_sge
    with pytest.raises(PyverbsRDMAError) as ei:
        a.wr_complete()
    assert ei.value.error_code == errno.ENOMEM
    assert cqa.poll(4)[0] == 0


def test_wr_complete_after_reset_is_einval(pair):
    a, *_ = pair
    a.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)
    a.wr_start()
    a.wr_send()
    with pytest.raises(PyverbsRDMAError) as ei:
        a.wr_complete()
    assert ei.value.error_code == errno.EINVAL


def test_set_wr_atomic_reaches_the_library(pair):
    a, _b, cqa, _cqb, mr = pair
    mr.write(struct.pack(">Q", 0x10), 8, 512)
    wr = SendWR(opcode=e.IBV_WR_ATOMIC_CMP_AND_SWP, num_sge=1, sg=[SGE(mr.buf, 8, mr.lkey)])
    wr.set_wr_atomic(rkey=mr.rkey, addr=mr.buf + 512, compare_add=0x10, swap=0x20)
    a.post_send(wr)                                 # SendWR is signaled by default
    wc = poll(cqa)[0]
    assert (wc.status, wc.opcode, wc.byte_len) == (e.IBV_WC_SUCCESS, e.IBV_WC_COMP_SWAP, 8)
    assert word(mr, 512) == 0x20 and word(mr, 0) == 0x10


@pytest.mark.parametrize("qp_type,ops", [(e.IBV_QPT_UD, e.IBV_QP_EX_WITH_RDMA_WRITE),
                                         (e.IBV_QPT_RC, e.IBV_QP_EX_WITH_ATOMIC_WRITE),
                                         (e.IBV_QPT_UC, e.IBV_QP_EX_WITH_RDMA_READ)])
def test_send_ops_the_qp_type_lacks_are_eopnotsupp(qp_type, ops):
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    with pytest.raises(PyverbsRDMAError) as ei:
        qpex(ctx, pd, cq, ops, qp_type)
    assert ei.value.error_code == errno.EOPNOTSUPP
    ctx.close()


def test_a_qpex_without_send_ops_has_no_wr_api():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    qp = QPEx(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd,
                                comp_mask=e.IBV_QP_INIT_ATTR_PD))
    assert qp.qp_ex is None
    with pytest.raises(PyverbsUserError):
        qp.wr_start()
    ctx.close()


def test_a_builder_the_qp_type_lacks_is_eopnotsupp(pair):
    a, *_ = pair
    a.wr_start()
    with pytest.raises(PyverbsRDMAError) as ei:
        a.wr_set_xrc_srqn(5)
    assert ei.value.error_code == errno.EOPNOTSUPP
    a.wr_abort()

"""Atomics and the new post-send API (ibv_wr_*) end to end: libibverbs -> libmlx5 -> the HCA.

Two processes bring RC QPs to RTS against each other (over one machine's
loopback and across two machines on a Fabric).  Atomics posted with
ibv_post_send (IBV_WR_ATOMIC_CMP_AND_SWP / _FETCH_AND_ADD) change one 8-byte
big-endian word of the responder's memory and bring its original 8 bytes back
into the requester's buffer; the responder refuses an rkey without
REMOTE_ATOMIC (REM_ACCESS_ERR), a QP without it and an address not 8-byte
aligned (REM_INV_REQ_ERR).  A QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
posts every opcode through wr_start / builder / setters / wr_complete, and the
bytes move as they do through ibv_post_send.
"""

from __future__ import annotations

import errno
import struct

import attrs
import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.fabric import Fabric
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, PyverbsObject, QPInitAttr
from userspace.providers.mlx5 import qp_ex as mx

BUF = 8192
ATOMIC_ACCESS = (v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
                 | v.IBV_ACCESS_REMOTE_READ | v.IBV_ACCESS_REMOTE_ATOMIC)
SIG = v.IBV_SEND_SIGNALED
CAP = v.ibv_qp_cap(max_send_wr=16, max_recv_wr=16, max_send_sge=4, max_recv_sge=4,
                   max_inline_data=64)
ALL_RC_OPS = (mx.IBV_QP_EX_WITH_SEND | mx.IBV_QP_EX_WITH_SEND_WITH_IMM
              | mx.IBV_QP_EX_WITH_RDMA_WRITE | mx.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
              | mx.IBV_QP_EX_WITH_RDMA_READ | mx.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
              | mx.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)


class ExQP(QP):
    """A QP made by ibv_create_qp_ex with send_ops_flags (the wrapper's QP otherwise)."""

    def __init__(self, pd: PD, cq: CQ, qp_type: int, send_ops_flags: int):
        PyverbsObject.__init__(self)
        attr = v.ibv_qp_init_attr_ex(
            cq.cq, cq.cq, None, attrs.evolve(CAP), qp_type, 0,
            comp_mask=v.IBV_QP_INIT_ATTR_PD | v.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, pd=pd.pd,
            send_ops_flags=send_ops_flags)
        self.qp = v.ibv_create_qp_ex(pd.ctx.ctx, attr)
        self.cap = attr.cap
        pd._adopt(self)
        cq._children.append(self)


@attrs.define(eq=False)
class End:
    p: object
    ctx: Context
    pd: PD
    cq: CQ
    mr: MR
    qp: QP

    @property
    def qpx(self) -> v.ibv_qp_ex:
        return v.ibv_qp_to_qp_ex(self.qp.qp)

    def word(self, offset: int = 0) -> int:
        return struct.unpack(">Q", self.mr.read(8, offset))[0]

    def set_word(self, value: int, offset: int = 0) -> None:
        self.mr.write(struct.pack(">Q", value), offset)


def _end(p, *, mr_access: int, ops: int | None) -> End:
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, BUF, mr_access)
    qp = QP(pd, QPInitAttr(cq, cq, cap=attrs.evolve(CAP))) if ops is None \
        else ExQP(pd, cq, v.IBV_QPT_RC, ops)
    return End(p, ctx, pd, cq, mr, qp)


def make_pair(kind: str, *, a_mr: int = ATOMIC_ACCESS, b_mr: int = ATOMIC_ACCESS,
              b_qp_access: int = ATOMIC_ACCESS, ops: int | None = None) -> tuple[End, End]:
    """Requester a, responder b, connected RC QPs (b's QP with b_qp_access)."""
    if kind == "loopback":
        m = rdma_host(ram_size=128 << 20)
        machines = [m, m]
    else:
        fabric = Fabric()
        machines = [rdma_host(ram_size=128 << 20, name=n, fabric=fabric)
                    for n in ("host-a", "host-b")]
    for m in dict.fromkeys(machines):
        m.load_module("mlx5_ib")
    a = _end(machines[0].spawn("requester"), mr_access=a_mr, ops=ops)
    b = _end(machines[1].spawn("responder"), mr_access=b_mr, ops=ops)
    ga, gb = a.ctx.query_gid(1, 0), b.ctx.query_gid(1, 0)
    b.qp.to_rts(ga, a.qp.qp_num, sq_psn=0x222, rq_psn=0x111, access=b_qp_access)
    a.qp.to_rts(gb, b.qp.qp_num, sq_psn=0x111, rq_psn=0x222, access=ATOMIC_ACCESS)
    return a, b


@pytest.fixture(params=["loopback", "fabric"])
def kind(request) -> str:
    return request.param


def atomic_wr(a: End, b: End, wr_id: int, opcode: int, *, compare_add: int = 0, swap: int = 0,
              roffset: int = 0, loffset: int = 0, rkey: int | None = None) -> v.ibv_send_wr:
    return v.ibv_send_wr(wr_id=wr_id, sg_list=[v.ibv_sge(a.mr.buf + loffset, 8, a.mr.lkey)],
                         opcode=opcode, send_flags=SIG, remote_addr=b.mr.buf + roffset,
                         rkey=b.mr.rkey if rkey is None else rkey, compare_add=compare_add,
                         swap=swap)


def fields(wc: v.ibv_wc) -> tuple:
    return (wc.wr_id, v.ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len)


# -- atomics through ibv_post_send ------------------------------------------------------------
def test_fetch_and_add_adds_and_returns_the_original(kind):
    a, b = make_pair(kind)
    b.mr.write(b"\xee" * 64)
    b.set_word(0x0102030405060708, 16)
    a.mr.write(b"\xcc" * 64)
    a.qp.post_send(atomic_wr(a, b, 7, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=0x10,
                             roffset=16, loffset=8))
    assert [fields(wc) for wc in a.cq.poll_until(1)] == [
        (7, "SUCCESS", v.IBV_WC_FETCH_ADD, 8)]
    assert b.word(16) == 0x0102030405060718
    # the original value, big-endian as on the wire, in exactly the local 8 bytes
    assert a.mr.read(24) == b"\xcc" * 8 + bytes.fromhex("0102030405060708") + b"\xcc" * 8
    assert b.mr.read(16) == b"\xee" * 16 and b.mr.read(40, 24) == b"\xee" * 40


def test_fetch_and_add_wraps_at_64_bits(kind):
    a, b = make_pair(kind)
    b.set_word(0xFFFFFFFFFFFFFFFF)
    a.qp.post_send(atomic_wr(a, b, 1, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=2))
    assert fields(a.cq.poll_until(1)[0])[1] == "SUCCESS"
    assert b.word() == 1
    assert a.word() == 0xFFFFFFFFFFFFFFFF


def test_compare_and_swap_swaps_only_on_a_match(kind):
    a, b = make_pair(kind)
    b.set_word(0x1111)
    a.qp.post_send(atomic_wr(a, b, 1, v.IBV_WR_ATOMIC_CMP_AND_SWP, compare_add=0x2222,
                             swap=0x3333))
    assert [fields(wc) for wc in a.cq.poll_until(1)] == [
        (1, "SUCCESS", v.IBV_WC_COMP_SWAP, 8)]
    assert b.word() == 0x1111 and a.word() == 0x1111            # no match: unchanged
    a.qp.post_send(atomic_wr(a, b, 2, v.IBV_WR_ATOMIC_CMP_AND_SWP, compare_add=0x1111,
                             swap=0x3333, loffset=8))
    assert fields(a.cq.poll_until(1)[0]) == (2, "SUCCESS", v.IBV_WC_COMP_SWAP, 8)
    assert b.word() == 0x3333 and a.word(8) == 0x1111


def test_a_counter_of_many_atomics_is_exact(kind):
    a, b = make_pair(kind)
    b.set_word(0)
    for i in range(12):
        a.qp.post_send(atomic_wr(a, b, i, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=1,
                                 loffset=8 * i))
    wcs = a.cq.poll_until(12)
    assert [wc.wr_id for wc in wcs] == list(range(12))
    assert b.word() == 12
    assert [a.word(8 * i) for i in range(12)] == list(range(12))   # each saw the one before


@pytest.mark.parametrize("opcode", [v.IBV_WR_ATOMIC_FETCH_AND_ADD,
                                    v.IBV_WR_ATOMIC_CMP_AND_SWP])
def test_rkey_without_remote_atomic_is_rem_access_err(kind, opcode):
    a, b = make_pair(kind, b_mr=v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
    b.set_word(5)
    a.qp.post_send(atomic_wr(a, b, 3, opcode, compare_add=5, swap=9))
    assert fields(a.cq.poll_until(1)[0])[:2] == (3, "REM_ACCESS_ERR")
    assert b.word() == 5


def test_qp_without_remote_atomic_is_rem_inv_req_err(kind):
    a, b = make_pair(kind, b_qp_access=v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
    b.set_word(5)
    a.qp.post_send(atomic_wr(a, b, 4, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=1))
    assert fields(a.cq.poll_until(1)[0])[:2] == (4, "REM_INV_REQ_ERR")
    assert b.word() == 5


def test_misaligned_target_is_rem_inv_req_err(kind):
    a, b = make_pair(kind)
    b.mr.write(b"\x00" * 16)
    a.qp.post_send(atomic_wr(a, b, 5, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=1,
                             roffset=4))
    assert fields(a.cq.poll_until(1)[0])[:2] == (5, "REM_INV_REQ_ERR")
    assert b.mr.read(16) == b"\x00" * 16


def test_atomic_range_outside_the_rkey_is_rem_access_err(kind):
    a, b = make_pair(kind)
    a.qp.post_send(atomic_wr(a, b, 6, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=1,
                             roffset=BUF))
    assert fields(a.cq.poll_until(1)[0])[:2] == (6, "REM_ACCESS_ERR")


def test_atomic_into_a_read_only_local_buffer_is_loc_prot_err(kind):
    a, b = make_pair(kind, a_mr=0)
    b.set_word(5)
    a.qp.post_send(atomic_wr(a, b, 8, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=1))
    assert fields(a.cq.poll_until(1)[0])[:2] == (8, "LOC_PROT_ERR")
    assert b.word() == 5                       # refused before anything was sent


def test_atomic_on_a_uc_qp_is_loc_qp_op_err():
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    p = m.spawn("uc")
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, BUF, ATOMIC_ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, qp_type=v.IBV_QPT_UC, cap=attrs.evolve(CAP)))
    qp.to_rts(ctx.query_gid(1, 0), qp.qp_num, access=ATOMIC_ACCESS)
    qp.post_send(v.ibv_send_wr(wr_id=9, sg_list=[v.ibv_sge(mr.buf, 8, mr.lkey)],
                               opcode=v.IBV_WR_ATOMIC_FETCH_AND_ADD, send_flags=SIG,
                               remote_addr=mr.buf, rkey=mr.rkey, compare_add=1))
    assert v.ibv_wc_status_str(cq.poll_until(1)[0].status) == "LOC_QP_OP_ERR"


def test_post_send_atomic_without_device_atomics_is_eopnotsupp():
    a, b = make_pair("loopback")
    a.qp.qp.atomics_enabled = False        # as on a device with atomic_cap IBV_ATOMIC_NONE
    with pytest.raises(VerbsError) as ex:
        a.qp.post_send(atomic_wr(a, b, 1, v.IBV_WR_ATOMIC_FETCH_AND_ADD))
    assert ex.value.errno == errno.EOPNOTSUPP


def test_the_device_reports_hca_atomics():
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib")
    ctx = Context(m.spawn("q"))
    assert ctx.query_device().atomic_cap == 1          # IBV_ATOMIC_HCA
    assert ctx.ctx.atomic_cap == 1                      # what libmlx5 keeps at open


# -- the new post-send API -------------------------------------------------------------------
def test_each_wr_opcode_moves_bytes(kind):
    a, b = make_pair(kind, ops=ALL_RC_OPS)
    qx = a.qpx
    src = bytes(range(256)) * 4
    a.mr.write(src)
    b.mr.write(b"\xee" * 2048)
    b.qp.post_recv(v.ibv_recv_wr(wr_id=100, sg_list=[v.ibv_sge(b.mr.buf + 4096, 256,
                                                                b.mr.lkey)]))
    b.qp.post_recv(v.ibv_recv_wr(wr_id=101, sg_list=[v.ibv_sge(b.mr.buf + 4608, 256,
                                                                b.mr.lkey)]))
    b.qp.post_recv(v.ibv_recv_wr(wr_id=102))
    b.set_word(40, 1024)
    b.set_word(0x77, 1032)
    rb, rk = b.mr.buf, b.mr.rkey
    v.ibv_wr_start(qx)
    qx.wr_flags = SIG
    qx.wr_id = 1
    v.ibv_wr_rdma_write(qx, rk, rb)                              # 100 bytes -> b[0:100]
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf, 100)
    qx.wr_id = 2
    v.ibv_wr_send(qx)                                            # -> recv 100
    v.ibv_wr_set_sge_list(qx, 2, [v.ibv_sge(a.mr.buf + 200, 10, a.mr.lkey),
                                  v.ibv_sge(a.mr.buf + 300, 20, a.mr.lkey)])
    qx.wr_id = 3
    v.ibv_wr_send_imm(qx, 0x12345678)                            # inline -> recv 101
    v.ibv_wr_set_inline_data(qx, a.mr.buf + 400, 30)
    qx.wr_id = 4
    v.ibv_wr_rdma_write_imm(qx, rk, rb + 512, 0xCAFE)            # inline list -> b[512:]
    v.ibv_wr_set_inline_data_list(qx, 2, [v.ibv_data_buf(a.mr.buf + 1, 3),
                                          v.ibv_data_buf(a.mr.buf + 9, 5)])
    qx.wr_id = 5
    v.ibv_wr_rdma_read(qx, rk, rb + 1024)                        # b[1024:1040] -> a[2048:]
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf + 2048, 16)
    qx.wr_id = 6
    v.ibv_wr_atomic_fetch_add(qx, rk, rb + 1024, 2)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf + 3000, 8)
    qx.wr_id = 7
    v.ibv_wr_atomic_cmp_swp(qx, rk, rb + 1032, 0x77, 0x88)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf + 3008, 8)
    assert v.ibv_wr_complete(qx) == 0
    wcs = a.cq.poll_until(7)
    assert [fields(wc) for wc in wcs] == [
        (1, "SUCCESS", v.IBV_WC_RDMA_WRITE, 0), (2, "SUCCESS", v.IBV_WC_SEND, 0),
        (3, "SUCCESS", v.IBV_WC_SEND, 0), (4, "SUCCESS", v.IBV_WC_RDMA_WRITE, 0),
        (5, "SUCCESS", v.IBV_WC_RDMA_READ, 16), (6, "SUCCESS", v.IBV_WC_FETCH_ADD, 8),
        (7, "SUCCESS", v.IBV_WC_COMP_SWAP, 8)]
    got = b.mr.read(BUF)
    assert got[:100] == src[:100] and got[100:512] == b"\xee" * 412
    assert got[512:520] == src[1:4] + src[9:14] and got[520] == 0xEE
    assert got[4096:4126] == src[200:210] + src[300:320]
    assert got[4608:4638] == src[400:430]
    rwcs = b.cq.poll_until(3)
    assert [(wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data) for wc in rwcs] == [
        (100, v.IBV_WC_RECV, 30, 0), (101, v.IBV_WC_RECV, 30, 0x12345678),
        (102, v.IBV_WC_RECV_RDMA_WITH_IMM, 8, 0xCAFE)]
    assert a.mr.read(16, 2048) == struct.pack(">QQ", 40, 0x77)
    assert b.word(1024) == 42 and a.word(3000) == 40
    assert b.word(1032) == 0x88 and a.word(3008) == 0x77


def test_wr_complete_reports_the_first_error_and_posts_nothing():
    a, b = make_pair("loopback", ops=ALL_RC_OPS)
    qx = a.qpx
    b.mr.write(b"\xee" * 64)
    v.ibv_wr_start(qx)
    qx.wr_flags = SIG
    v.ibv_wr_rdma_write(qx, b.mr.rkey, b.mr.buf)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf, 8)
    v.ibv_wr_rdma_write(qx, b.mr.rkey, b.mr.buf)
    v.ibv_wr_set_inline_data(qx, a.mr.buf, a.qp.qp.max_inline_data + 1)   # too much
    v.ibv_wr_send(qx)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf, 8)
    assert a.qp.qp.sq.cur_post == 3
    assert v.ibv_wr_complete(qx) == errno.ENOMEM
    assert a.qp.qp.sq.cur_post == 0                          # rolled back to before the batch
    assert a.cq.poll(4) == [] and b.mr.read(64) == b"\xee" * 64
    # the queue is intact: a batch after it goes out
    v.ibv_wr_start(qx)
    qx.wr_id = 9
    v.ibv_wr_rdma_write(qx, b.mr.rkey, b.mr.buf)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf + 64, 8)
    assert v.ibv_wr_complete(qx) == 0
    assert a.cq.poll_until(1)[0].wr_id == 9


def test_too_many_sges_is_enomem():
    a, b = make_pair("loopback", ops=ALL_RC_OPS)
    qx = a.qpx
    v.ibv_wr_start(qx)
    v.ibv_wr_send(qx)
    v.ibv_wr_set_sge_list(qx, 5, [v.ibv_sge(a.mr.buf, 1, a.mr.lkey)] * 5)   # > max_gs
    assert v.ibv_wr_complete(qx) == errno.ENOMEM


def test_wr_abort_posts_nothing():
    a, b = make_pair("loopback", ops=ALL_RC_OPS)
    qx = a.qpx
    b.mr.write(b"\xee" * 8)
    v.ibv_wr_start(qx)
    qx.wr_flags = SIG
    v.ibv_wr_rdma_write(qx, b.mr.rkey, b.mr.buf)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf, 8)
    v.ibv_wr_abort(qx)
    assert a.qp.qp.sq.cur_post == 0
    assert a.cq.poll(4) == [] and b.mr.read(8) == b"\xee" * 8


def test_a_full_send_queue_is_enomem():
    a, b = make_pair("loopback", ops=ALL_RC_OPS)
    qx = a.qpx
    v.ibv_wr_start(qx)
    for _ in range(a.qp.qp.sq.max_post + 1):
        v.ibv_wr_rdma_write(qx, b.mr.rkey, b.mr.buf)
        v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf, 8)
    assert v.ibv_wr_complete(qx) == errno.ENOMEM


def test_wr_complete_after_reset_is_einval_until_rts():
    a, b = make_pair("loopback", ops=ALL_RC_OPS)
    qx = a.qpx
    a.qp.modify(v.ibv_qp_attr(qp_state=v.IBV_QPS_RESET), v.IBV_QP_STATE)
    v.ibv_wr_start(qx)
    v.ibv_wr_send(qx)
    v.ibv_wr_set_sge(qx, a.mr.lkey, a.mr.buf, 8)
    assert v.ibv_wr_complete(qx) == errno.EINVAL
    assert a.qp.qp.sq.cur_post == 0
    a.qp.to_rts(b.ctx.query_gid(1, 0), b.qp.qp_num, sq_psn=0x333, rq_psn=0x222,
                access=ATOMIC_ACCESS)
    v.ibv_wr_start(qx)
    assert v.ibv_wr_complete(qx) == 0


@pytest.mark.parametrize("qp_type,ops", [
    (v.IBV_QPT_UD, mx.IBV_QP_EX_WITH_RDMA_WRITE),
    (v.IBV_QPT_UC, mx.IBV_QP_EX_WITH_RDMA_READ),
    (v.IBV_QPT_UC, mx.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD),
    (v.IBV_QPT_RC, mx.IBV_QP_EX_WITH_TSO),
    (v.IBV_QPT_RC, 1 << 12),                                # IBV_QP_EX_WITH_ATOMIC_WRITE
])
def test_send_ops_the_qp_type_lacks_are_eopnotsupp(qp_type, ops):
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib")
    ctx = Context(m.spawn("q"))
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    with pytest.raises(VerbsError) as ex:
        ExQP(pd, cq, qp_type, ops)
    assert ex.value.errno == errno.EOPNOTSUPP


def test_a_local_inv_of_no_window_fails_at_the_hca_and_rc_has_no_ud_setter():
    a, _b = make_pair("loopback", ops=ALL_RC_OPS | mx.IBV_QP_EX_WITH_BIND_MW)
    qx = a.qpx
    v.ibv_wr_start(qx)
    qx.wr_id, qx.wr_flags = 3, SIG
    v.ibv_wr_local_inv(qx, 0x1234)                            # posted: a UMR WQE
    assert v.ibv_wr_complete(qx) == 0
    assert [(wc.wr_id, v.ibv_wc_status_str(wc.status)) for wc in a.cq.poll_until(1)] == \
        [(3, "MW_BIND_ERR")]                                  # no window 0x1234
    with pytest.raises(VerbsError) as ex:                     # no such op for RC at all
        v.ibv_wr_set_ud_addr(qx, None, 1, 2)
    assert ex.value.errno == errno.EOPNOTSUPP


def test_a_qp_without_send_ops_has_no_qp_ex():
    a, _b = make_pair("loopback")
    assert v.ibv_qp_to_qp_ex(a.qp.qp) is None


# -- hostile atomic WQEs: an error completion on that QP only ---------------------------------
OP_ATOMIC_CS, OP_ATOMIC_FA = 0x11, 0x12


@pytest.mark.parametrize("opcode", [OP_ATOMIC_CS, OP_ATOMIC_FA], ids=["cs", "fa"])
@pytest.mark.parametrize("ds,tail,status,why", [
    (1, b"", "LOC_QP_OP_ERR", "no remote address segment"),
    (2, b"raddr", "LOC_QP_OP_ERR", "no atomic segment"),
    (3, b"atomic", "LOC_LEN_ERR", "needs an 8-byte local buffer"),
    (4, b"short", "LOC_LEN_ERR", "needs an 8-byte local buffer"),
    (4, b"inline", "LOC_LEN_ERR", "inline"),
], ids=["ctrl-only", "no-atomic-seg", "no-data", "4-byte-data", "inline"])
def test_malformed_atomic_wqes_err_only_their_qp(hostile, opcode, ds, tail, status, why):
    from tests.flows.test_hostile_rings import ctrl
    bad = hostile.bad
    bad.b.mr.write(struct.pack(">Q", 5))
    raddr = struct.pack(">QII", bad.b.mr.buf, bad.b.mr.rkey, 0)
    atomic = struct.pack(">QQ", 1, 5)
    body = {b"": b"", b"raddr": raddr, b"atomic": raddr + atomic,
            b"short": raddr + atomic + struct.pack(">IIQ", 4, bad.a.mr.lkey, bad.a.mr.buf),
            b"inline": raddr + atomic + struct.pack(">I", 0x80000000 | 8) + bytes(12)}[tail]
    bad.p.store(bad.slot(0), ctrl(0, opcode, bad.qpn, ds) + body)
    bad.dbrec(send=1)
    bad.doorbell(opcode=opcode, ds=ds)
    assert [v.ibv_wc_status_str(wc.status) for wc in bad.a.cq.poll_until(1)] == [status]
    reasons = [e[2] for e in hostile.hca.async_events if e[0] == "qp_error"]
    assert reasons and why in reasons[0]
    assert bad.b.mr.read(8) == struct.pack(">Q", 5)           # the target was never touched
    hostile.assert_others_unharmed()


@pytest.fixture
def hostile():
    from tests.flows.test_hostile_rings import Hca, _pair
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    hca = Hca(m, _pair(m, ("hostile", "hostile")), _pair(m, ("victim-a", "victim-b")))
    hca.settle()
    return hca

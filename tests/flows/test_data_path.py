"""The RDMA data path end to end: post a work request, the HCA moves the bytes, poll the CQE.

Two processes each open mlx5_0, register a buffer and bring an RC QP to RTS
against the other's; then the requester posts WRs through libibverbs ->
libmlx5 (WQE in the SQ ring, doorbell record, BlueFlame or 64-bit doorbell)
and the emulated ConnectX engine executes them (mkey translation, DMA,
frames on the fabric, the responder's checks, CQEs by DMA).  Every flow runs
over one machine's internal loopback and across two machines on a Fabric.

What is asserted is what an RDMA engineer checks on a real system: the bytes
that arrived (and the bytes next to them that must not change), every field
of every completion, the errno of each bad post, the completion status of
each failed operation and the QP state it leaves, the doorbell-vs-BlueFlame
rule of rdma-core's post_send_db, and the call order from ibv_post_send to
the CQE.  The suite's autouse fixture runs the leak check after each test.
"""

from __future__ import annotations

import errno
import struct

import attrs
import pytest

from kernel_model.emu.explore import explore_dfs, explore_dpor
from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.hw.fabric import Fabric
from kernel_model.trace import Tracer
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.providers.mlx5.verbs import read_dbrec
from userspace.tools.write_bw import Endpoint, connect

PAGE = 4096
BUF = 4 * PAGE
ALL_ACCESS = (v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
              | v.IBV_ACCESS_REMOTE_READ)
QPS_RESET, QPS_INIT, QPS_RTR, QPS_RTS, QPS_ERR = 0, 1, 2, 3, 6   # qpc.state
SIG = v.IBV_SEND_SIGNALED
LINKS = ["loopback", "fabric"]


# -- the two ends -----------------------------------------------------------------------
@attrs.define(eq=False)
class Side:
    """One process's end: its machine, process and verbs objects (ep)."""

    m: object
    p: object
    ep: Endpoint

    @property
    def qp(self):
        return self.ep.qp

    @property
    def mr(self):
        return self.ep.mr

    @property
    def cq(self):
        return self.ep.cq

    @property
    def hca(self):
        return self.m.hcas[0]

    def fw_state(self) -> int:
        """The QP's state as the firmware holds it (qpc.state)."""
        return self.hca.fw.qps[self.qp.qp_num].state

    def sge(self, offset: int = 0, length: int = 64, lkey: int | None = None) -> v.ibv_sge:
        return v.ibv_sge(self.mr.buf + offset, length, self.mr.lkey if lkey is None else lkey)

    def recv(self, wr_id: int, offset: int = 0, length: int = 64, *more: tuple) -> None:
        """Post one receive WR: (offset, length) and any more (offset, length) SGEs."""
        sges = [self.sge(offset, length)] + [self.sge(o, n) for o, n in more]
        self.qp.post_recv(v.ibv_recv_wr(wr_id=wr_id, sg_list=sges))


@attrs.define(eq=False)
class Link:
    """A requester (a) and a responder (b), connected RC QPs."""

    a: Side
    b: Side
    machines: list

    def write(self, wr_id: int, src: int, dst: int, length: int, flags: int = SIG,
              **kw) -> SendWR:
        return SendWR(wr_id=wr_id, sg_list=[self.a.sge(src, length)],
                      opcode=v.IBV_WR_RDMA_WRITE, send_flags=flags,
                      remote_addr=self.b.mr.buf + dst, rkey=self.b.mr.rkey, **kw)


def endpoint(p, *, mr_access: int = ALL_ACCESS, cqe: int = 64, cap: QPCap | None = None,
             sq_sig_all: int = 0, psn: int = 0) -> Endpoint:
    """Context, PD, one CQ for both queues, a BUF-byte MR and an RC QP in RESET."""
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, cqe)
    mr = MR(pd, BUF, mr_access)
    cap = cap or QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=4, max_recv_sge=4,
                       max_inline_data=64)
    qp = QP(pd, QPInitAttr(cq, cq, cap=cap, sq_sig_all=sq_sig_all))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn)


def make_link(kind: str, backend: str | None = None, *, connected: bool = True,
              a_kw: dict | None = None, b_kw: dict | None = None,
              environ: dict | None = None, a_rts: dict | None = None) -> Link:
    """Two processes: on one machine (loopback) or on two machines on a Fabric."""
    if kind == "loopback":
        m = rdma_host(ram_size=128 << 20, backend=backend)
        machines = [m, m]
    else:
        fabric = Fabric()
        machines = [rdma_host(ram_size=128 << 20, backend=backend, name=n, fabric=fabric)
                    for n in ("host-a", "host-b")]
    for m in dict.fromkeys(machines):
        m.load_module("mlx5_ib")
    pa = machines[0].spawn("requester", environ=environ)
    pb = machines[1].spawn("responder")
    a = Side(machines[0], pa, endpoint(pa, psn=0x111, **(a_kw or {})))
    b = Side(machines[1], pb, endpoint(pb, psn=0x222, **(b_kw or {})))
    link = Link(a, b, machines)
    if connected:
        connect_link(link, **(a_rts or {}))
    return link


def connect_link(link: Link, **a_rts) -> None:
    """Both QPs RESET -> INIT -> RTR -> RTS (QP.to_rts); a_rts: the requester's
    other to_rts attributes (rnr_retry, access ...)."""
    connect(link.b.ep, link.a.ep.dest())
    if not a_rts:
        connect(link.a.ep, link.b.ep.dest())
        return
    b = link.b.ep.dest()
    link.a.qp.to_rts(b["gid"], b["qpn"], sq_psn=link.a.ep.psn, rq_psn=b["psn"], **a_rts)


@pytest.fixture(params=LINKS)
def link(request) -> Link:
    return make_link(request.param)


@pytest.fixture(params=[(k, b) for b in ("c", "python") for k in LINKS],
                ids=lambda kb: "-".join(kb))
def any_link(request) -> Link:
    """A link on the C page loops and on their Python twins (dma_copy, mtt_pieces)."""
    link = make_link(request.param[0], backend=request.param[1])
    assert {m.ops.name for m in link.machines} == {request.param[1]}
    return link


def wc_fields(wc: v.ibv_wc) -> tuple:
    return (wc.wr_id, v.ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len, wc.qp_num)


def status(wcs) -> list[tuple[int, str]]:
    return [(wc.wr_id, v.ibv_wc_status_str(wc.status)) for wc in wcs]


def settle(side: Side, polls: int = 50) -> list:
    """Poll a CQ that should stay empty, giving the HCA plenty of turns; what came."""
    got = []
    for _ in range(polls):
        got += side.cq.poll(16)
    return got


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed * 31) & 0xFF for i in range(n))


# -- operations: bytes and completions -------------------------------------------------------
def test_rdma_write_moves_the_bytes_and_nothing_else(any_link):
    a, b = any_link.a, any_link.b
    b.mr.write(b"\xee" * BUF)
    a.mr.write(pattern(BUF))
    # 300 bytes from offset 100 of the source to offset 1000 of the target, crossing no page;
    # then 5000 bytes crossing a page boundary on both sides
    a.qp.post_send(any_link.write(1, 100, 1000, 300))
    a.qp.post_send(any_link.write(2, 4000, 6000, 5000))
    wcs = a.cq.poll_until(2)
    assert [wc_fields(wc) for wc in wcs] == [
        (1, "SUCCESS", v.IBV_WC_RDMA_WRITE, 0, a.qp.qp_num),
        (2, "SUCCESS", v.IBV_WC_RDMA_WRITE, 0, a.qp.qp_num)]
    got = b.mr.read(BUF)
    src = pattern(BUF)
    assert got[1000:1300] == src[100:400]
    assert got[6000:11000] == src[4000:9000]
    # every other byte of the target is untouched
    assert got[:1000] == b"\xee" * 1000
    assert got[1300:6000] == b"\xee" * 4700
    assert got[11000:] == b"\xee" * (BUF - 11000)
    assert settle(b) == []                 # a plain WRITE consumes no receive, makes no CQE


def test_write_with_immediate_consumes_a_receive(any_link):
    a, b = any_link.a, any_link.b
    b.recv(77, 0, 16)
    a.mr.write(pattern(256))
    wr = any_link.write(5, 0, 512, 256)
    wr.opcode, wr.imm_data = v.IBV_WR_RDMA_WRITE_WITH_IMM, 0x12345678
    a.qp.post_send(wr)
    (req,) = a.cq.poll_until(1)
    (resp,) = b.cq.poll_until(1)
    assert wc_fields(req) == (5, "SUCCESS", v.IBV_WC_RDMA_WRITE, 0, a.qp.qp_num)
    assert wc_fields(resp) == (77, "SUCCESS", v.IBV_WC_RECV_RDMA_WITH_IMM, 256, b.qp.qp_num)
    assert resp.imm_data == 0x12345678 and resp.wc_flags & v.IBV_WC_WITH_IMM
    assert resp.src_qp == a.qp.qp_num
    assert b.mr.read(256, 512) == pattern(256)
    assert b.mr.read(16) == bytes(16)      # the receive buffer itself is not written


@pytest.mark.parametrize("op", [v.IBV_WR_RDMA_WRITE_WITH_IMM, v.IBV_WR_SEND_WITH_IMM],
                         ids=["write_imm", "send_imm"])
def test_requester_completion_of_an_immediate_has_with_imm(op):
    link = make_link("loopback")
    a, b = link.a, link.b
    b.recv(1, 0, 64)
    wr = link.write(2, 0, 0, 8)
    wr.opcode, wr.imm_data = op, 7
    a.qp.post_send(wr)
    (req,) = a.cq.poll_until(1)
    assert req.status == v.IBV_WC_SUCCESS and b.cq.poll_until(1)[0].imm_data == 7
    assert req.wc_flags & v.IBV_WC_WITH_IMM


@pytest.mark.parametrize("imm", [False, True])
def test_send_lands_in_the_posted_receive(any_link, imm):
    a, b = any_link.a, any_link.b
    b.recv(9, 2048, 1024)
    a.mr.write(pattern(600, 3), 64)
    wr = SendWR(wr_id=4, sg_list=[a.sge(64, 600)], opcode=v.IBV_WR_SEND, send_flags=SIG)
    if imm:
        wr.opcode, wr.imm_data = v.IBV_WR_SEND_WITH_IMM, 0xCAFEF00D
    a.qp.post_send(wr)
    (req,) = a.cq.poll_until(1)
    (resp,) = b.cq.poll_until(1)
    assert wc_fields(req) == (4, "SUCCESS", v.IBV_WC_SEND, 0, a.qp.qp_num)
    assert wc_fields(resp) == (9, "SUCCESS", v.IBV_WC_RECV, 600, b.qp.qp_num)
    assert resp.src_qp == a.qp.qp_num
    assert bool(resp.wc_flags & v.IBV_WC_WITH_IMM) == imm
    if imm:
        assert resp.imm_data == 0xCAFEF00D
    got = b.mr.read(2048 + 1024)
    assert got[2048:2648] == pattern(600, 3)
    assert got[2648:] == bytes(424) and got[:2048] == bytes(2048)


def test_rdma_read_fetches_the_remote_bytes(any_link):
    a, b = any_link.a, any_link.b
    b.mr.write(pattern(BUF, 5))
    a.mr.write(b"\x55" * BUF)
    wr = SendWR(wr_id=8, sg_list=[a.sge(10, 3000)], opcode=v.IBV_WR_RDMA_READ,
                send_flags=SIG, remote_addr=b.mr.buf + 5000, rkey=b.mr.rkey)
    a.qp.post_send(wr)
    (wc,) = a.cq.poll_until(1)
    assert wc_fields(wc) == (8, "SUCCESS", v.IBV_WC_RDMA_READ, 3000, a.qp.qp_num)
    got = a.mr.read(BUF)
    assert got[10:3010] == pattern(BUF, 5)[5000:8000]
    assert got[:10] == b"\x55" * 10 and got[3010:] == b"\x55" * (BUF - 3010)
    assert settle(b) == []


def test_multiple_sges_gather_and_scatter(any_link):
    a, b = any_link.a, any_link.b
    a.mr.write(b"AAAA", 0)
    a.mr.write(b"BBBBBBBB", 4096)
    a.mr.write(b"CC", 9000)
    # the receive scatters over two SGEs: 5 bytes, then the rest
    b.recv(1, 100, 5, (8000, 100))
    sges = [a.sge(0, 4), a.sge(4096, 8), a.sge(9000, 2)]
    a.qp.post_send(SendWR(wr_id=2, sg_list=sges, opcode=v.IBV_WR_SEND, send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    (resp,) = b.cq.poll_until(1)
    assert (resp.wr_id, resp.byte_len) == (1, 14)
    assert b.mr.read(6, 100) == b"AAAAB\x00"
    assert b.mr.read(10, 8000) == b"BBBBBBBCC\x00"
    # and an RDMA WRITE gathering three SGEs into one remote range
    wr = any_link.write(3, 0, 2000, 4)
    wr.sg_list = sges
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(3, "SUCCESS")]
    assert b.mr.read(15, 2000) == b"AAAABBBBBBBBCC\x00"


def test_inline_send_carries_the_bytes_in_the_wqe(any_link):
    a, b = any_link.a, any_link.b
    assert a.qp.qp.max_inline_data >= 64
    b.recv(1, 0, 128)
    a.mr.write(b"inline-payload-0123456789abcdef!")
    # inline data needs no lkey: a bogus one is never looked at
    wr = SendWR(wr_id=6, sg_list=[a.sge(0, 32, lkey=0xDEAD00)], opcode=v.IBV_WR_SEND,
                send_flags=SIG | v.IBV_SEND_INLINE)
    a.qp.post_send(wr)
    a.mr.write(b"X" * 32)        # the bytes were copied at post time
    (req,) = a.cq.poll_until(1)
    (resp,) = b.cq.poll_until(1)
    assert wc_fields(req) == (6, "SUCCESS", v.IBV_WC_SEND, 0, a.qp.qp_num)
    assert (resp.wr_id, resp.byte_len) == (1, 32)
    assert b.mr.read(33) == b"inline-payload-0123456789abcdef!\x00"
    # an inline RDMA WRITE as well
    a.mr.write(b"0123456789")
    wr = any_link.write(7, 0, 300, 10, flags=SIG | v.IBV_SEND_INLINE)
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(7, "SUCCESS")]
    assert b.mr.read(12, 299) == b"\x000123456789\x00"


def test_zero_length_send(any_link):
    a, b = any_link.a, any_link.b
    b.mr.write(b"\x99" * 64)
    b.recv(3, 0, 64)
    a.qp.post_send(SendWR(wr_id=1, sg_list=[], opcode=v.IBV_WR_SEND, send_flags=SIG))
    (req,) = a.cq.poll_until(1)
    (resp,) = b.cq.poll_until(1)
    assert wc_fields(req) == (1, "SUCCESS", v.IBV_WC_SEND, 0, a.qp.qp_num)
    assert wc_fields(resp) == (3, "SUCCESS", v.IBV_WC_RECV, 0, b.qp.qp_num)
    assert b.mr.read(64) == b"\x99" * 64


# -- unsignalled WRs, sq_sig_all ---------------------------------------------------------------
def test_unsignalled_wrs_complete_silently_and_the_next_cqe_retires_them(link):
    a, b = link.a, link.b
    a.mr.write(pattern(64))
    sq = a.qp.qp.sq
    for i in range(3):
        a.qp.post_send(link.write(i, 0, 64 * i, 64, flags=0))
    # executed (the bytes arrived) but no completion
    assert settle(a) == []
    assert b.mr.read(192) == pattern(64) * 3
    assert (sq.head, sq.tail) == (3, 0)
    a.qp.post_send(link.write(3, 0, 192, 64))
    (wc,) = a.cq.poll_until(1)
    assert (wc.wr_id, wc.status) == (3, v.IBV_WC_SUCCESS)
    assert (sq.head, sq.tail) == (4, 4)     # the signalled CQE retired all four


def test_sq_sig_all_signals_every_wr():
    link = make_link("loopback", a_kw={"sq_sig_all": 1})
    a = link.a
    for i in range(4):
        a.qp.post_send(link.write(10 + i, 0, 0, 8, flags=0))
    assert status(a.cq.poll_until(4)) == [(10 + i, "SUCCESS") for i in range(4)]


# -- the CQ ring ---------------------------------------------------------------------------------
def test_cq_wraps_around_with_the_owner_bit(link):
    """A CQ of 8 entries (cqe 4 -> 8) takes 27 completions over four passes; the
    owner bit of each CQE is its pass parity, and the consumer index is published."""
    a = link.a
    cq = CQ(a.ep.ctx, 4)
    qp = QP(a.ep.pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=4, max_recv_wr=1,
                                                   max_send_sge=1, max_recv_sge=1)))
    # it takes over the requester's side of the connection: b expects a's PSN next
    connect(Endpoint(a.ep.ctx, a.ep.pd, cq, a.mr, qp, a.ep.gid, a.ep.psn), link.b.ep.dest())
    ring = cq.cq
    assert ring.cqe == 7
    done = 0
    for batch in (3, 4, 4, 4, 4, 4, 4):
        for i in range(batch):
            qp.post_send(SendWR(wr_id=done + i, sg_list=[a.sge(0, 8)],
                                opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                                remote_addr=link.b.mr.buf, rkey=link.b.mr.rkey))
        wcs = cq.poll_until(batch)
        assert [wc.wr_id for wc in wcs] == list(range(done, done + batch))
        assert all(wc.status == v.IBV_WC_SUCCESS for wc in wcs)
        done += batch
        assert ring.cons_index == done
        # the doorbell record's SET_CI word: the consumer index, big-endian
        assert struct.unpack(">I", a.p.load(ring.dbrec, 4))[0] == done
        last = done - 1
        op_own = a.p.load(ring.buf + (last & 7) * 64 + 63, 1)[0]
        assert op_own & 1 == (last >> 3) & 1
        assert op_own >> 4 == 0                   # MLX5_CQE_REQ
    assert done == 27 and done // 8 == 3


def test_cq_overrun_is_reported_and_the_cqe_dropped():
    link = make_link("loopback")
    a = link.a
    cq = CQ(a.ep.ctx, 1)          # 2 entries
    qp = QP(a.ep.pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=4, max_recv_wr=1,
                                                   max_send_sge=1, max_recv_sge=1)))
    # it takes over the requester's side of the connection: b expects a's PSN next
    connect(Endpoint(a.ep.ctx, a.ep.pd, cq, a.mr, qp, a.ep.gid, a.ep.psn), link.b.ep.dest())
    for i in range(3):
        qp.post_send(SendWR(wr_id=i, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_RDMA_WRITE,
                            send_flags=SIG, remote_addr=link.b.mr.buf, rkey=link.b.mr.rkey))
    got = cq.poll_until(2)
    got += [wc for _ in range(20) for wc in cq.poll(4)]
    assert [wc.wr_id for wc in got] == [0, 1]
    assert ("cq_overrun", cq.cq.cqn, qp.qp_num) in a.hca.async_events


# -- post_send's doorbell vs BlueFlame ------------------------------------------------------------
def _uar_writes(hca, since: int) -> list:
    return list(hca.uar_log)[since:]


def test_one_small_wr_goes_by_blueflame_two_by_doorbell():
    link = make_link("loopback")
    a = link.a
    qp, hca = a.qp.qp, a.hca
    bf = qp.bf
    assert bf.uuarn and bf.buf_size == 256 and bf.offset == 0
    offsets = []
    for i in range(3):
        mark = len(hca.uar_log)
        a.qp.post_send(link.write(i, 0, 0, 16))
        recs = _uar_writes(hca, mark)
        # ctrl + raddr + data segment = 3 x 16 bytes -> one 64-byte BlueFlame chunk
        assert [(r.kind, len(r.data)) for r in recs] == [("bf", 64)]
        assert recs[0].buf == i % 2                 # the two halves of the register
        offsets.append(bf.offset)
        assert read_dbrec(qp)[1] == qp.sq.cur_post == i + 1
    assert offsets == [256, 0, 256]
    assert status(a.cq.poll_until(3)) == [(i, "SUCCESS") for i in range(3)]
    # two WRs in one post: one 64-bit doorbell, the first WQE's control segment
    mark = len(hca.uar_log)
    second = link.write(4, 0, 8, 8)
    a.qp.post_send(link.write(3, 0, 0, 8, next=second))
    recs = _uar_writes(hca, mark)
    assert [(r.kind, len(r.data)) for r in recs] == [("db", 8)]
    # (rdma-core writes the control segment of the last WQE of the post)
    assert struct.unpack(">II", recs[0].data) == (4 << 8 | 0x08, qp.qp_num << 8 | 3)
    assert bf.offset == 0                          # toggled once for the post
    assert read_dbrec(qp)[1] == qp.sq.cur_post == 5
    assert status(a.cq.poll_until(2)) == [(3, "SUCCESS"), (4, "SUCCESS")]


def test_a_wqe_too_big_for_blueflame_rings_the_doorbell():
    """A WQE of more than bf->buf_size / 16 = 16 units (256 bytes) is not copied."""
    link = make_link("loopback", a_kw={"cap": QPCap(max_send_wr=8, max_recv_wr=1,
                                                    max_send_sge=16, max_recv_sge=1)})
    a = link.a
    mark = len(a.hca.uar_log)
    wr = link.write(1, 0, 0, 0)
    wr.sg_list = [a.sge(16 * i, 16) for i in range(15)]   # 2 + 15 = 17 units
    a.qp.post_send(wr)
    assert [r.kind for r in _uar_writes(a.hca, mark)] == ["db"]
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert link.b.mr.read(240) == a.mr.read(240)


def test_mlx5_shut_up_bf_never_uses_blueflame():
    link = make_link("loopback", environ={"MLX5_SHUT_UP_BF": "1"})
    a = link.a
    qp = a.qp.qp
    mark = len(a.hca.uar_log)
    for i in range(3):
        a.qp.post_send(link.write(i, 0, 0, 8, flags=SIG | v.IBV_SEND_INLINE))
        assert read_dbrec(qp)[1] == qp.sq.cur_post
    recs = _uar_writes(a.hca, mark)
    assert [r.kind for r in recs] == ["db"] * 3
    assert status(a.cq.poll_until(3)) == [(i, "SUCCESS") for i in range(3)]


@pytest.mark.parametrize("shut_up_bf", [False, True], ids=["blueflame", "doorbell"])
def test_wqes_wrap_around_the_send_ring(shut_up_bf):
    """Two-block WQEs (7 x 16 bytes: 5 data segments) after one one-block WQE: one of
    them straddles the end of the ring - stored in two pieces by the library, and
    copied (BlueFlame, wrapping) or fetched (DMA, wrapping) whole by the HCA."""
    link = make_link("loopback", environ={"MLX5_SHUT_UP_BF": "1"} if shut_up_bf else None,
                     a_kw={"cap": QPCap(max_send_wr=8, max_recv_wr=1, max_send_sge=5,
                                        max_recv_sge=1)})
    a, b = link.a, link.b
    sq = a.qp.qp.sq
    a.mr.write(pattern(BUF, 6))
    a.qp.post_send(link.write(0, 0, 0, 8))
    wrapped = False
    for i in range(1, sq.wqe_cnt // 2 + 2):
        start = sq.cur_post & (sq.wqe_cnt - 1)
        wrapped |= start == sq.wqe_cnt - 1
        wr = link.write(i, 0, 100 * i, 0)
        wr.sg_list = [a.sge(300 * i + 10 * k, 10) for k in range(5)]
        a.qp.post_send(wr)
        assert status(a.cq.poll_until(1 if i > 1 else 2))[-1] == (i, "SUCCESS")
        want = b"".join(pattern(BUF, 6)[300 * i + 10 * k:300 * i + 10 * k + 10]
                        for k in range(5))
        assert b.mr.read(50, 100 * i) == want, i
    assert wrapped
    kinds = {r.kind for r in a.hca.uar_log}
    assert ("bf" in kinds) != shut_up_bf


def test_receive_ring_wraps(link):
    a, b = link.a, link.b
    rq = b.qp.qp.rq
    n = 2 * rq.wqe_cnt + 3
    for i in range(n):
        b.recv(1000 + i, 16 * i, 16)
        a.mr.write(i.to_bytes(2, "big") * 8, 16 * i)
        a.qp.post_send(SendWR(wr_id=i, sg_list=[a.sge(16 * i, 16)], opcode=v.IBV_WR_SEND,
                              send_flags=SIG))
        assert status(a.cq.poll_until(1)) == [(i, "SUCCESS")]
        (wc,) = b.cq.poll_until(1)
        assert (wc.wr_id, wc.status, wc.byte_len) == (1000 + i, v.IBV_WC_SUCCESS, 16)
    assert b.mr.read(16 * n) == a.mr.read(16 * n)
    assert (rq.head, rq.tail) == (n, n)
    assert read_dbrec(b.qp.qp)[0] == n


# -- bad posts: the errno, bad_wr, and what still executes ---------------------------------------
def _post_send_errno(side: Side, wr) -> tuple[int, object]:
    with pytest.raises(VerbsError) as e:
        side.qp.post_send(wr)
    return e.value.errno, e.value.bad_wr


def _post_recv_errno(side: Side, wr) -> tuple[int, object]:
    with pytest.raises(VerbsError) as e:
        side.qp.post_recv(wr)
    return e.value.errno, e.value.bad_wr


def test_posting_before_rts_fails_by_state():
    link = make_link("loopback", connected=False)
    a, b = link.a, link.b
    wr = SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND, send_flags=SIG)
    rwr = v.ibv_recv_wr(wr_id=2, sg_list=[a.sge(0, 8)])
    # RESET: neither queue may be posted to
    assert a.fw_state() == QPS_RESET
    assert _post_send_errno(a, wr) == (errno.ENOMEM, wr)
    assert _post_recv_errno(a, rwr) == (errno.EINVAL, rwr)
    # INIT and RTR: receives yes, sends no
    modify_state(a, v.IBV_QPS_INIT)
    assert a.fw_state() == QPS_INIT
    assert _post_send_errno(a, wr) == (errno.ENOMEM, wr)
    a.qp.post_recv(rwr)
    assert a.qp.qp.rq.head == 1
    assert a.qp.qp.sq.head == 0 and read_dbrec(a.qp.qp) == (1, 0)
    connect_link(link)
    assert a.fw_state() == b.fw_state() == QPS_RTS
    b.recv(1, 0, 8)
    a.mr.write(b"12345678")
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert status(b.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(8) == b"12345678"


def test_rtr_refuses_sends():
    link = make_link("loopback", connected=False)
    a, b = link.a, link.b
    modify_state(a, v.IBV_QPS_INIT)
    to_rtr(a, b)
    assert a.fw_state() == QPS_RTR
    wr = SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND, send_flags=SIG)
    assert _post_send_errno(a, wr) == (errno.ENOMEM, wr)
    a.recv(5, 0, 8)


def test_a_wqe_posted_before_rts_runs_when_the_qp_enters_it():
    """MODIFY_QP to RTS runs what the doorbell record shows posted (the command reads
    the record: Mlx5Engine._posted); a move to RTS with nothing posted gives the
    engine no work.  libmlx5 refuses a send before RTS, so the process passes its
    own library's state check here, as any process may (the state is its memory)."""
    link = make_link("loopback", connected=False)
    a, b = link.a, link.b
    engine = a.hca.engine
    connect(b.ep, a.ep.dest())
    assert b.fw_state() == QPS_RTS
    assert engine.task is None and not engine.work       # nothing posted: no step
    modify_state(a, v.IBV_QPS_INIT)
    to_rtr(a, b)
    a.qp.qp.sq.qp_state_max_gs = 4
    a.mr.write(b"early!!!")
    a.qp.post_send(link.write(1, 0, 0, 8))
    assert read_dbrec(a.qp.qp) == (0, 1)
    assert settle(a) == [] and b.mr.read(8) == bytes(8)  # RTR: the doorbell is not run
    modify(a, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTS, sq_psn=a.ep.psn, timeout=14,
                            retry_cnt=7, rnr_retry=7, max_rd_atomic=1),
           v.IBV_QP_STATE | v.IBV_QP_SQ_PSN | v.IBV_QP_TIMEOUT | v.IBV_QP_RETRY_CNT
           | v.IBV_QP_RNR_RETRY | v.IBV_QP_MAX_QP_RD_ATOMIC)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(8) == b"early!!!"


def test_one_engine_task_whatever_runs_at_its_spawn():
    """The engine stores its task before the task can run (SCHED.new_task, then the
    wake_up_new_task point).  It stored it after spawn's point: a schedule that ran
    the new engine there saw no task on its own loopback kick, started a second
    engine, and the machine's shutdown waited forever for the one left blocked."""
    def program() -> None:
        link = make_link("loopback")
        link.a.mr.write(b"12345678")
        link.a.qp.post_send(link.write(1, 0, 0, 8))
        assert status(link.a.cq.poll_until(1)) == [(1, "SUCCESS")]
        assert link.b.mr.read(8) == b"12345678"
    runs = list(explore_dfs(program, bound=1))
    assert len(runs) > 1
    assert [(r.failure.check, r.schedule) for r in runs if r.failure] == []


def test_the_engine_reads_nothing_of_a_qp_destroyed_under_its_flush(monkeypatch):
    """A flush (ERR) that a process's exit overtakes between two of the QP's DMAs
    ends at the next one (QpQuiesced): the device touches none of a QP's memory
    after DESTROY_QP.  It went on: it read the freed doorbell record's poison as a
    send counter and fetched a ring's worth of 'WQEs' from freed pages."""
    from kernel_model.hw import mlx5_engine

    quiesced, freed_reads = [], []
    real_read = mlx5_engine.Mlx5Engine._read_now

    class Counted(mlx5_engine.QpQuiesced):
        def __init__(self, *a: object) -> None:
            quiesced.append(a)
            super().__init__(*a)

    def read_now(self, dma: int, n: int) -> bytes:
        for phys, _ in self._phys(dma, n, False):
            if self.machine.zone.owner_of(phys >> self.machine.page_shift) is None:
                freed_reads.append(phys)
        return real_read(self, dma, n)
    monkeypatch.setattr(mlx5_engine, "QpQuiesced", Counted)
    monkeypatch.setattr(mlx5_engine.Mlx5Engine, "_read_now", read_now)

    def program() -> None:
        link = make_link("loopback")
        link.b.recv(100, 0, 8)
        modify_state(link.b, v.IBV_QPS_ERR)
        link.b.p.exit(0)
        link.a.p.exit(0)
    runs = list(explore_dpor(program, bound=2))
    assert [(r.failure.check, r.schedule) for r in runs if r.failure] == []
    assert quiesced and freed_reads == []


def test_more_wrs_than_the_queue_holds(link):
    a, b = link.a, link.b
    max_post = a.qp.qp.sq.max_post
    a.mr.write(pattern(8 * (max_post + 1)))
    wrs = [link.write(i, 8 * i, 8 * i, 8) for i in range(max_post + 2)]
    for w, nxt in zip(wrs, wrs[1:], strict=False):
        w.next = nxt
    err, bad = _post_send_errno(a, wrs[0])
    assert err == errno.ENOMEM and bad is wrs[max_post]
    wcs = a.cq.poll_until(max_post)
    assert status(wcs) == [(i, "SUCCESS") for i in range(max_post)]
    assert b.mr.read(8 * max_post) == pattern(8 * (max_post + 1))[:8 * max_post]
    assert b.mr.read(8, 8 * max_post) == bytes(8)    # the refused WR never ran
    # the receive queue: the same rule, ENOMEM
    rmax = b.qp.qp.rq.max_post
    rwrs = [v.ibv_recv_wr(wr_id=i, sg_list=[b.sge(0, 8)]) for i in range(rmax + 1)]
    for w, nxt in zip(rwrs, rwrs[1:], strict=False):
        w.next = nxt
    err, bad = _post_recv_errno(b, rwrs[0])
    assert err == errno.ENOMEM and bad is rwrs[rmax]
    assert b.qp.qp.rq.head == rmax


def test_too_many_sges(link):
    a, b = link.a, link.b
    n = a.qp.qp.sq.max_gs
    assert n >= 4                                      # at least what was asked for
    ok = SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND, send_flags=SIG)
    wr = SendWR(wr_id=2, sg_list=[a.sge(8 * i, 8) for i in range(n + 1)],
                opcode=v.IBV_WR_SEND, send_flags=SIG)
    ok.next = wr
    b.recv(1, 0, 64)
    err, bad = _post_send_errno(a, ok)
    assert err == errno.ENOMEM and bad is wr
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]   # the first WR was posted
    rn = b.qp.qp.rq.max_gs
    rwr = v.ibv_recv_wr(wr_id=3, sg_list=[b.sge(8 * i, 8) for i in range(rn + 1)])
    assert _post_recv_errno(b, rwr) == (errno.EINVAL, rwr)


def test_unknown_opcode_is_einval(link):
    a = link.a
    wr = SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=99, send_flags=SIG)
    head, cur = a.qp.qp.sq.head, a.qp.qp.sq.cur_post
    assert _post_send_errno(a, wr) == (errno.EINVAL, wr)
    assert (a.qp.qp.sq.head, a.qp.qp.sq.cur_post) == (head, cur)
    assert read_dbrec(a.qp.qp)[1] == cur


def test_inline_beyond_max_inline_data_is_enomem(link):
    a = link.a
    limit = a.qp.qp.max_inline_data
    wr = SendWR(wr_id=1, sg_list=[a.sge(0, limit + 1)], opcode=v.IBV_WR_SEND,
                send_flags=SIG | v.IBV_SEND_INLINE)
    assert _post_send_errno(a, wr) == (errno.ENOMEM, wr)
    assert a.qp.qp.sq.head == 0
    assert settle(a) == []


# -- failed operations: completion status, QP state, flush ---------------------------------------
def test_bad_lkey_is_a_local_protection_error(link):
    a, b = link.a, link.b
    b.mr.write(b"\xaa" * 64)
    a.qp.post_send(link.write(1, 0, 0, 64))          # fine
    bad = link.write(2, 0, 0, 64, flags=0)          # an error completes even unsignalled
    bad.sg_list = [a.sge(0, 64, lkey=a.mr.lkey ^ 0x100)]
    after = link.write(3, 0, 0, 64, flags=0)          # unsignalled: flushed all the same
    bad.next = after
    a.qp.post_send(bad)
    wcs = a.cq.poll_until(3)
    assert status(wcs) == [(1, "SUCCESS"), (2, "LOC_PROT_ERR"), (3, "WR_FLUSH_ERR")]
    assert a.fw_state() == QPS_ERR
    assert b.fw_state() == QPS_RTS                   # the responder never heard of it
    assert any(e[0] == "qp_error" and e[1] == a.qp.qp_num for e in a.hca.async_events)


def test_bad_rkey_is_a_remote_access_error_and_errs_the_responder(link):
    a, b = link.a, link.b
    b.recv(50, 0, 8)
    b.recv(51, 8, 8)
    b.mr.write(b"\xbb" * 64)
    wr = link.write(1, 0, 0, 64)
    wr.rkey ^= 0x100
    wr.next = link.write(2, 0, 0, 64)
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(2)) == [(1, "REM_ACCESS_ERR"), (2, "WR_FLUSH_ERR")]
    assert a.fw_state() == QPS_ERR
    assert status(b.cq.poll_until(2)) == [(50, "WR_FLUSH_ERR"), (51, "WR_FLUSH_ERR")]
    assert b.fw_state() == QPS_ERR
    assert b.mr.read(64) == b"\xbb" * 64


@pytest.mark.parametrize("where", ["local", "remote"])
def test_range_beyond_the_mr(link, where):
    a, b = link.a, link.b
    b.mr.write(b"\xcc" * BUF)
    if where == "local":
        wr = link.write(1, BUF - 32, 0, 64)        # the source runs 32 bytes past the MR
        want = "LOC_PROT_ERR"
    else:
        wr = link.write(1, 0, BUF - 32, 64)        # the target runs 32 bytes past the MR
        want = "REM_ACCESS_ERR"
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(1, want)]
    assert a.fw_state() == QPS_ERR
    assert b.mr.read(BUF) == b"\xcc" * BUF          # not even the in-range part was written
    assert b.fw_state() == (QPS_ERR if where == "remote" else QPS_RTS)


def test_remote_write_needs_remote_write_on_the_mr():
    link = make_link("loopback", b_kw={"mr_access": v.IBV_ACCESS_LOCAL_WRITE
                                       | v.IBV_ACCESS_REMOTE_READ})
    a, b = link.a, link.b
    a.qp.post_send(link.write(1, 0, 0, 8))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]
    assert b.fw_state() == QPS_ERR
    assert b.mr.read(8) == bytes(8)


def test_rdma_read_needs_local_write_on_the_destination():
    link = make_link("loopback", a_kw={"mr_access": v.IBV_ACCESS_REMOTE_READ})
    a, b = link.a, link.b
    b.mr.write(b"remote!!")
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_RDMA_READ,
                          send_flags=SIG, remote_addr=b.mr.buf, rkey=b.mr.rkey))
    assert status(a.cq.poll_until(1)) == [(1, "LOC_PROT_ERR")]
    assert a.fw_state() == QPS_ERR
    assert a.mr.read(8) == bytes(8)


def test_rdma_read_needs_remote_read_on_the_mr():
    link = make_link("fabric", b_kw={"mr_access": v.IBV_ACCESS_LOCAL_WRITE
                                     | v.IBV_ACCESS_REMOTE_WRITE})
    a, b = link.a, link.b
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_RDMA_READ,
                          send_flags=SIG, remote_addr=b.mr.buf, rkey=b.mr.rkey))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]
    assert b.fw_state() == QPS_ERR


@pytest.mark.parametrize("op", ["write", "read"])
def test_qp_without_the_remote_access_answers_invalid_request(link, op):
    a, b = link.a, link.b
    # RTS -> RTS: the responder QP keeps only the other remote access
    keep = v.IBV_ACCESS_REMOTE_READ if op == "write" else v.IBV_ACCESS_REMOTE_WRITE
    modify(b, v.ibv_qp_attr(qp_access_flags=keep), v.IBV_QP_ACCESS_FLAGS)
    assert b.qp.query(v.IBV_QP_ACCESS_FLAGS)[0].qp_access_flags == keep
    b.mr.write(b"\x11" * 8)
    if op == "write":
        a.qp.post_send(link.write(1, 0, 0, 8))
    else:
        a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_RDMA_READ,
                              send_flags=SIG, remote_addr=b.mr.buf, rkey=b.mr.rkey))
    assert status(a.cq.poll_until(1)) == [(1, "REM_INV_REQ_ERR")]
    assert b.fw_state() == QPS_ERR and a.fw_state() == QPS_ERR
    assert b.mr.read(8) == b"\x11" * 8 and a.mr.read(8) == bytes(8)


def test_receive_with_a_bad_lkey_is_a_remote_operation_error(link):
    a, b = link.a, link.b
    b.qp.post_recv(v.ibv_recv_wr(wr_id=30, sg_list=[b.sge(0, 64, lkey=b.mr.lkey ^ 0x100)]))
    b.recv(31, 64, 64)
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(1, "REM_OP_ERR")]
    assert status(b.cq.poll_until(2)) == [(30, "LOC_PROT_ERR"), (31, "WR_FLUSH_ERR")]
    assert a.fw_state() == b.fw_state() == QPS_ERR


def test_send_longer_than_the_receive_is_a_length_error(link):
    a, b = link.a, link.b
    b.recv(20, 0, 16)
    b.recv(21, 16, 16)
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 17)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(1, "REM_INV_REQ_ERR")]
    assert status(b.cq.poll_until(2)) == [(20, "LOC_LEN_ERR"), (21, "WR_FLUSH_ERR")]
    assert a.fw_state() == b.fw_state() == QPS_ERR
    assert b.mr.read(32) == bytes(32)


@pytest.mark.parametrize("kind", LINKS)
def test_send_without_a_receive_exhausts_rnr_retry(kind):
    link = make_link(kind, a_rts={"rnr_retry": 2})
    a, b = link.a, link.b
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(1, "RNR_RETRY_EXC_ERR")]
    assert a.fw_state() == QPS_ERR
    assert b.fw_state() == QPS_RTS          # an RNR NAK does not hurt the responder
    assert settle(b) == []


def test_rnr_retry_7_waits_for_the_receive(link):
    a, b = link.a, link.b
    assert a.qp.query(v.IBV_QP_RNR_RETRY)[0].rnr_retry == 7     # to_rts's default
    a.mr.write(b"patience")
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG))
    assert settle(a) == []                  # RNR NAKs, retried
    b.recv(2, 0, 8)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert status(b.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert b.mr.read(8) == b"patience"


def test_peer_qp_destroyed_is_transport_retry_exceeded(link):
    a, b = link.a, link.b
    b.qp.close()
    chain = [link.write(i, 0, 0, 8, flags=SIG if i != 1 else 0) for i in range(3)]
    chain[0].next, chain[1].next = chain[1], chain[2]
    a.qp.post_send(chain[0])
    # the error first, then every other outstanding WR flushed, in order
    assert status(a.cq.poll_until(3)) == [(0, "RETRY_EXC_ERR"), (1, "WR_FLUSH_ERR"),
                                          (2, "WR_FLUSH_ERR")]
    assert a.fw_state() == QPS_ERR
    assert b.mr.read(8) == bytes(8)
    # a QP in ERR still takes posts; they complete flushed
    a.qp.post_send(link.write(9, 0, 0, 8, flags=0))
    assert status(a.cq.poll_until(1)) == [(9, "WR_FLUSH_ERR")]


def test_modify_to_err_flushes_then_reset_and_rts_work_again(link):
    a, b = link.a, link.b
    # the responder: three receives posted, then ERR: all three flushed, in order
    for i in range(3):
        b.recv(100 + i, 8 * i, 8)
    modify_state(b, v.IBV_QPS_ERR)
    assert b.fw_state() == QPS_ERR
    assert status(b.cq.poll_until(3)) == [(100 + i, "WR_FLUSH_ERR") for i in range(3)]
    # back to RTS; the requester: a SEND stuck in RNR retries (rnr_retry 7, no
    # receive posted) and an unsignalled WRITE behind it, then ERR: both flushed
    modify_state(b, v.IBV_QPS_RESET)
    connect(b.ep, a.ep.dest())
    a.qp.post_send(SendWR(wr_id=1, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG, next=link.write(2, 0, 0, 8, flags=0)))
    assert settle(a) == []
    modify_state(a, v.IBV_QPS_ERR)
    assert status(a.cq.poll_until(2)) == [(1, "WR_FLUSH_ERR"), (2, "WR_FLUSH_ERR")]
    assert b.mr.read(8) == bytes(8)
    # ERR again, leaving the flush CQE unpolled; RESET drops it (mlx5_cq_clean)
    b.recv(200, 0, 8)
    modify_state(b, v.IBV_QPS_ERR)
    cqn, ring = b.cq.cq.cqn, b.cq.cq
    for _ in range(10):
        b.p.sched_yield()
    assert b.hca.engine.cq_pi[cqn] == ring.cons_index + 1      # written, not polled
    modify_state(b, v.IBV_QPS_RESET)
    modify_state(a, v.IBV_QPS_RESET)
    assert b.hca.engine.cq_pi[cqn] == ring.cons_index          # cleaned away
    assert a.fw_state() == b.fw_state() == QPS_RESET
    assert (b.qp.qp.rq.head, b.qp.qp.rq.tail) == (0, 0)
    assert (a.qp.qp.sq.head, a.qp.qp.sq.tail, a.qp.qp.sq.cur_post) == (0, 0, 0)
    assert read_dbrec(a.qp.qp) == read_dbrec(b.qp.qp) == (0, 0)
    connect_link(link)
    b.recv(300, 0, 8)
    a.mr.write(b"again!!!")
    a.qp.post_send(SendWR(wr_id=3, sg_list=[a.sge(0, 8)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(3, "SUCCESS")]
    assert status(b.cq.poll_until(1)) == [(300, "SUCCESS")]   # not the stale flush of 200
    assert b.mr.read(8) == b"again!!!"
    assert settle(a) == [] and settle(b) == []


def test_failed_out_of_range_write_leaves_the_target_alone(link):
    """A WRITE whose remote range starts inside the MR and ends outside: nothing
    is written, not even the part inside; earlier good writes stay."""
    a, b = link.a, link.b
    b.mr.write(pattern(BUF, 2))
    a.mr.write(b"\x01" * BUF)
    a.qp.post_send(link.write(1, 0, 100, 50))
    a.qp.post_send(link.write(2, 0, 200, BUF))
    assert status(a.cq.poll_until(2)) == [(1, "SUCCESS"), (2, "REM_ACCESS_ERR")]
    want = bytearray(pattern(BUF, 2))
    want[100:150] = b"\x01" * 50
    assert b.mr.read(BUF) == bytes(want)


def test_nothing_around_an_mr_is_touched(any_link):
    """An MR over part of a mapping: a WRITE that fills it exactly leaves the bytes
    on either side alone; one that runs a byte past its end writes nothing at all."""
    a, b = any_link.a, any_link.b
    base = b.p.mmap(0, 3 * PAGE)
    assert base > 0
    b.p.store(base, b"\xee" * 3 * PAGE)
    start, length = base + PAGE + 16, 1000
    mr = MR(b.ep.pd, length, ALL_ACCESS, addr=start)
    a.mr.write(pattern(length, 8))
    wr = any_link.write(1, 0, 0, length)
    wr.remote_addr, wr.rkey = start, mr.rkey
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    want = bytearray(b"\xee" * 3 * PAGE)
    want[PAGE + 16:PAGE + 16 + length] = pattern(length, 8)
    assert b.p.load(base, 3 * PAGE) == bytes(want)
    # READ back exactly the MR, and one byte more (refused)
    a.qp.post_send(SendWR(wr_id=2, sg_list=[a.sge(8192, length)], opcode=v.IBV_WR_RDMA_READ,
                          send_flags=SIG, remote_addr=start, rkey=mr.rkey))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert a.mr.read(length, 8192) == pattern(length, 8)
    a.mr.write(b"\x01" * 20)
    wr = any_link.write(3, 0, 0, 20)
    wr.remote_addr, wr.rkey = start + length - 19, mr.rkey
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(3, "REM_ACCESS_ERR")]
    assert b.p.load(base, 3 * PAGE) == bytes(want)
    assert b.fw_state() == QPS_ERR
    mr.close()
    assert b.p.munmap(base, 3 * PAGE) == 0


# -- the call flow -------------------------------------------------------------------------------
def test_rdma_write_call_flow_and_tasks():
    link = make_link("fabric")
    a = link.a
    a.mr.write(b"trace me")
    def client() -> list:
        a.qp.post_send(link.write(1, 0, 0, 8))
        return a.cq.poll_until(1)

    with Tracer() as t:
        (wc,) = a.p.run(client)             # the program runs as the process's thread
    assert (wc.wr_id, wc.status) == (1, v.IBV_WC_SUCCESS)
    calls = assert_call_flow(t.trace, [
        "ibv_post_send", "mlx5_post_send", "post_send_db", "hca_doorbell", "hca_sq_process",
        "hca_execute", "hca_mkey_translate", "hca_dma_gather", "fabric_transmit", "hca_rx",
        "hca_responder", "hca_dma_scatter", "hca_requester_answer", "hca_cqe_write"])
    track = {c.func: c.track for c in calls}
    name = t.trace.tracks
    # the CPU's part on the requester's track (the doorbell is its MMIO write)
    for f in ("ibv_post_send", "mlx5_post_send", "post_send_db", "hca_doorbell"):
        assert name[track[f]] == "host-a:requester-1", (f, name[track[f]])
    # host-a's engine executes, transmits and completes; host-b's engine responds
    req = {track[f] for f in ("hca_sq_process", "hca_execute", "hca_mkey_translate",
                              "hca_dma_gather", "fabric_transmit", "hca_requester_answer",
                              "hca_cqe_write")}
    resp = {track[f] for f in ("hca_rx", "hca_responder", "hca_dma_scatter")}
    assert len(req) == len(resp) == 1 and req != resp
    # each machine's HCA is 0000:01:00.0: the track names say which machine
    assert link.a.hca.name == link.b.hca.name
    assert name[req.pop()] == f"host-a:mlx5_hca {link.a.hca.name}"
    assert name[resp.pop()] == f"host-b:mlx5_hca {link.b.hca.name}"
    assert link.b.mr.read(8) == b"trace me"
    # the steps as tracepoints, in order: WQE, doorbell record, doorbell (one
    # small WQE: BlueFlame), the engine reading the record and taking the
    # BlueFlame copy, the request crossing to host-b, the ACK back, the CQE
    pts = [(p.name, p.fields) for p in t.trace.points() if p.name.startswith(
        ("mlx5_", "hca_", "roce_"))]
    qpn_a, qpn_b = hex(a.qp.qp_num), hex(link.b.qp.qp_num)
    # (the move to RTS found nothing posted: no engine step before the WQE's)
    assert [n for n, _ in pts] == ["mlx5_wqe", "mlx5_dbrec", "mlx5_doorbell", "hca_dbrec",
                                   "hca_wqe", "roce_frame", "roce_frame", "mlx5_cqe"]
    f = [fields for _, fields in pts]
    assert f[0] == {"qpn": qpn_a, "idx": 0, "opcode": "RDMA_WRITE", "ds": 3, "signaled": True}
    assert f[1] == {"qpn": qpn_a, "queue": "send", "counter": 1}
    assert (f[2]["how"], f[2]["nbytes"]) == ("blueflame", 64)
    assert f[3] == {"qpn": qpn_a, "send_counter": 1}
    assert f[4] == {"qpn": qpn_a, "counter": 0, "source": "blueflame"}
    assert [(x["src"].split("/")[0], x["dst"].split("/")[0], x["kind"], x["payload"])
            for x in f[5:7]] == [("host-a", "host-b", "req", 8), ("host-b", "host-a", "ack", 0)]
    assert (f[5]["src_qpn"], f[5]["dest_qpn"]) == (qpn_a, qpn_b)
    assert (f[7]["qpn"], f[7]["wqe_counter"], f[7]["status"], f[7]["wr_id"]) == (qpn_a, 0, 0, 1)


# -- QP modify helpers (libibverbs' ibv_modify_qp) -----------------------------------------------
def modify(side: Side, attr, mask: int) -> None:
    ret = v.ibv_modify_qp(side.qp.qp, attr, mask)
    assert ret == 0, errno.errorcode.get(ret, ret)


def modify_state(side: Side, state: int) -> None:
    if state == v.IBV_QPS_INIT:
        modify(side, v.ibv_qp_attr(qp_state=state, port_num=1, pkey_index=0,
                                   qp_access_flags=ALL_ACCESS & ~v.IBV_ACCESS_LOCAL_WRITE),
               v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT | v.IBV_QP_ACCESS_FLAGS)
    else:
        modify(side, v.ibv_qp_attr(qp_state=state), v.IBV_QP_STATE)


def to_rtr(side: Side, peer: Side) -> None:
    """INIT -> RTR against the peer (what QP.to_rts does in its second step)."""
    gr = v.ibv_global_route(dgid=peer.ep.gid, sgid_index=0, hop_limit=1)
    modify(side, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTR, path_mtu=v.IBV_MTU_1024,
                               dest_qp_num=peer.qp.qp_num, rq_psn=0, max_dest_rd_atomic=1,
                               min_rnr_timer=12,
                               ah_attr=v.ibv_ah_attr(grh=gr, is_global=1, port_num=1)),
           v.IBV_QP_STATE | v.IBV_QP_AV | v.IBV_QP_PATH_MTU | v.IBV_QP_DEST_QPN
           | v.IBV_QP_RQ_PSN | v.IBV_QP_MAX_DEST_RD_ATOMIC | v.IBV_QP_MIN_RNR_TIMER)

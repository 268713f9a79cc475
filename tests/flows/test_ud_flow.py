"""UD end to end: address handles and datagrams through libibverbs -> libmlx5 -> the HCA.

Two processes each bring a UD QP to RTS with a Q_Key; the sender creates an AH for
the receiver's GID (libmlx5 builds the address vector, the kernel resolves the
destination MAC), posts SENDs addressed by (AH, remote QPN, Q_Key), and the
engine delivers each as one datagram: the receiver's next receive WQE takes the
40-byte GRH, then the payload.  Over one machine's loopback and across two
machines on a Fabric.

Asserted: the bytes that arrived and the bytes after them, the GRH (IPv6 header
of RoCE v1 / v2: version, traffic class, flow label, next header, hop limit, both
GIDs), every completion field (byte_len = payload + 40, IBV_WC_GRH, src_qp,
immediate data), and the datagrams the receiver must never see: a wrong Q_Key,
a QPN nobody has, a QP not ready.  A receive too small for GRH + payload is a
local length error.
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
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPInitAttr

QKEY = 0x11111111
GRH = 40
SIG = v.IBV_SEND_SIGNALED


@attrs.define(eq=False)
class UdSide:
    m: object
    p: object
    ctx: Context
    pd: PD
    cq: CQ
    mr: MR
    qp: QP

    def recv(self, wr_id: int, length: int = 512, offset: int = 0) -> None:
        self.qp.post_recv(v.ibv_recv_wr(wr_id=wr_id, sg_list=[
            v.ibv_sge(self.mr.buf + offset, length, self.mr.lkey)]))

    def ah(self, gid: bytes, sgid_index: int = 0, **grh) -> v.ibv_ah:
        attr = v.ibv_ah_attr(grh=v.ibv_global_route(dgid=gid, sgid_index=sgid_index, **grh),
                             is_global=1, port_num=1)
        return v.ibv_create_ah(self.pd.pd, attr)

    def send(self, wr_id: int, ah, rqpn: int, qkey: int = QKEY, length: int = 64,
             offset: int = 2048, opcode: int = v.IBV_WR_SEND, imm: int = 0) -> None:
        self.qp.post_send(v.ibv_send_wr(
            wr_id=wr_id, sg_list=[v.ibv_sge(self.mr.buf + offset, length, self.mr.lkey)],
            opcode=opcode, send_flags=SIG, imm_data=imm, ah=ah, remote_qpn=rqpn,
            remote_qkey=qkey))

    def settle(self, polls: int = 50) -> list:
        got = []
        for _ in range(polls):
            got += self.cq.poll(16)
        return got


def ud_side(m, name: str, qkey: int = QKEY, rts: bool = True) -> UdSide:
    p = m.spawn(name)
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, 8192, v.IBV_ACCESS_LOCAL_WRITE)
    qp = QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=v.ibv_qp_cap(8, 8, 1, 1),
                           qp_type=v.IBV_QPT_UD))
    qp.modify(v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, pkey_index=0, port_num=1, qkey=qkey),
              v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT | v.IBV_QP_QKEY)
    if rts:
        qp.modify(v.ibv_qp_attr(qp_state=v.IBV_QPS_RTR), v.IBV_QP_STATE)
        qp.modify(v.ibv_qp_attr(qp_state=v.IBV_QPS_RTS, sq_psn=0x10),
                  v.IBV_QP_STATE | v.IBV_QP_SQ_PSN)
    return UdSide(m, p, ctx, pd, cq, mr, qp)


@pytest.fixture(params=["loopback", "fabric"])
def pair(request) -> tuple[UdSide, UdSide]:
    if request.param == "loopback":
        m = rdma_host(ram_size=128 << 20)
        ma = mb = m
        m.load_module("mlx5_ib")
    else:
        fabric = Fabric()
        ma, mb = (rdma_host(ram_size=128 << 20, name=n, fabric=fabric) for n in ("a", "b"))
        ma.load_module("mlx5_ib")
        mb.load_module("mlx5_ib")
    return ud_side(ma, "sender"), ud_side(mb, "receiver")


def pattern(n: int, seed: int = 3) -> bytes:
    return bytes((i * 13 + seed) & 0xFF for i in range(n))


@pytest.mark.parametrize("sgid_index,v2", [(0, False), (1, True)])
def test_ud_send_delivers_grh_then_payload(pair, sgid_index, v2):
    a, b = pair
    b.mr.write(b"\xee" * 1024)
    a.mr.write(pattern(300), 2048)
    dgid = b.ctx.query_gid(1, sgid_index)
    ah = a.ah(dgid, sgid_index, flow_label=0x2468, traffic_class=0x20, hop_limit=17)
    b.recv(7)
    a.send(9, ah, b.qp.qp_num, length=300)
    [swc] = a.cq.poll_until(1)
    assert (swc.wr_id, swc.status, swc.opcode, swc.qp_num) == (9, 0, v.IBV_WC_SEND, a.qp.qp_num)
    [rwc] = b.cq.poll_until(1)
    assert (rwc.wr_id, rwc.status, rwc.opcode, rwc.byte_len, rwc.qp_num, rwc.src_qp) == \
        (7, 0, v.IBV_WC_RECV, 300 + GRH, b.qp.qp_num, a.qp.qp_num)
    assert rwc.wc_flags == v.IBV_WC_GRH
    got = b.mr.read(1024)
    assert got[GRH:GRH + 300] == pattern(300)
    assert got[GRH + 300:] == b"\xee" * (1024 - GRH - 300)       # nothing past the message
    ver_tc_fl, paylen, next_hdr, hop = struct.unpack(">IHBB", got[:8])
    assert ver_tc_fl == 6 << 28 | 0x20 << 20 | 0x2468
    assert next_hdr == (0x11 if v2 else 0x1B) and hop == 17
    assert paylen == 12 + 8 + 300 + 4 + (8 if v2 else 0)         # (UDP) BTH DETH data ICRC
    assert got[8:24] == a.ctx.query_gid(1, sgid_index) and got[24:40] == dgid
    assert v.ibv_destroy_ah(ah) == 0


def test_ud_send_with_immediate_and_many_messages(pair):
    a, b = pair
    ah = a.ah(b.ctx.query_gid(1, 1), 1)
    for i in range(4):
        b.recv(100 + i, offset=i * 1024)
    for i in range(4):
        a.mr.write(pattern(50, seed=i), 2048 + i * 64)
        a.send(i, ah, b.qp.qp_num, length=50, offset=2048 + i * 64,
               opcode=v.IBV_WR_SEND_WITH_IMM, imm=0xABC0 + i)
    assert [wc.wr_id for wc in a.cq.poll_until(4)] == [0, 1, 2, 3]
    wcs = b.cq.poll_until(4)
    assert [(wc.wr_id, wc.byte_len, wc.imm_data, wc.wc_flags) for wc in wcs] == \
        [(100 + i, 50 + GRH, 0xABC0 + i, v.IBV_WC_GRH | v.IBV_WC_WITH_IMM) for i in range(4)]
    for i in range(4):
        assert b.mr.read(50, i * 1024 + GRH) == pattern(50, seed=i)
    v.ibv_destroy_ah(ah)


def test_qkey_mismatch_is_dropped_unseen(pair):
    a, b = pair
    ah = a.ah(b.ctx.query_gid(1, 1), 1)
    eng = b.m.hcas[0].engine
    before = eng.stats["qkey_violations"]
    b.recv(7)
    b.mr.write(b"\xee" * 600)
    a.mr.write(pattern(64), 2048)
    a.send(1, ah, b.qp.qp_num, qkey=0x22222222)
    # the sender completes (UD has no acknowledgement); the receiver sees nothing
    assert [(wc.wr_id, wc.status) for wc in a.cq.poll_until(1)] == [(1, 0)]
    assert b.settle() == []
    assert b.mr.read(600) == b"\xee" * 600
    assert eng.stats["qkey_violations"] == before + 1
    # the receive is still there for the right Q_Key; a Q_Key with the high bit set
    # means the sender QP's own (which is the receiver's here)
    a.send(2, ah, b.qp.qp_num, qkey=0x80000000)
    a.cq.poll_until(1)
    [rwc] = b.cq.poll_until(1)
    assert (rwc.wr_id, rwc.status, rwc.byte_len) == (7, 0, 64 + GRH)
    assert b.mr.read(64, GRH) == pattern(64)
    v.ibv_destroy_ah(ah)


def test_datagrams_nobody_takes_are_dropped(pair):
    a, b = pair
    ah = a.ah(b.ctx.query_gid(1, 0), 0)
    b.recv(7)
    a.send(1, ah, 0xFFFFF)                  # no such QP
    a.send(2, ah, a.qp.qp_num + 0x100)     # nor this one
    assert [wc.status for wc in a.cq.poll_until(2)] == [0, 0]
    assert b.settle() == []
    # a QP with no receive posted drops it too; the next one arrives
    b2 = ud_side(b.m, "other")
    a.send(3, ah, b2.qp.qp_num)
    a.cq.poll_until(1)
    assert b2.settle() == []
    b2.recv(5)
    a.send(4, ah, b2.qp.qp_num)
    a.cq.poll_until(1)
    assert [wc.wr_id for wc in b2.cq.poll_until(1)] == [5]
    # a QP only in INIT takes nothing
    b3 = ud_side(b.m, "init-only", rts=False)
    b3.recv(6)
    a.send(5, ah, b3.qp.qp_num)
    a.cq.poll_until(1)
    assert b3.settle() == []
    v.ibv_destroy_ah(ah)


def test_receive_smaller_than_grh_plus_payload_is_local_length_error(pair):
    a, b = pair
    ah = a.ah(b.ctx.query_gid(1, 1), 1)
    b.recv(7, length=GRH + 10)
    a.send(1, ah, b.qp.qp_num, length=64)
    a.cq.poll_until(1)
    [rwc] = b.cq.poll_until(1)
    assert (rwc.wr_id, v.ibv_wc_status_str(rwc.status)) == (7, "LOC_LEN_ERR")
    v.ibv_destroy_ah(ah)


def test_ud_rdma_write_is_a_local_qp_operation_error(pair):
    a, b = pair
    ah = a.ah(b.ctx.query_gid(1, 1), 1)
    a.send(1, ah, b.qp.qp_num, opcode=v.IBV_WR_RDMA_WRITE)
    [wc] = a.cq.poll_until(1)
    assert v.ibv_wc_status_str(wc.status) == "LOC_QP_OP_ERR"
    v.ibv_destroy_ah(ah)


def test_ud_post_without_ah_is_einval(pair):
    a, b = pair
    rc = v.ibv_post_send(a.qp.qp, v.ibv_send_wr(wr_id=1, remote_qpn=b.qp.qp_num,
                                                remote_qkey=QKEY), [])
    assert rc == errno.EINVAL


def test_create_ah_errnos_through_libmlx5(pair):
    a, b = pair
    gid = b.ctx.query_gid(1, 0)
    bad = [v.ibv_ah_attr(grh=v.ibv_global_route(dgid=gid), is_global=0, port_num=1),
           v.ibv_ah_attr(grh=v.ibv_global_route(dgid=gid), is_global=1, port_num=2),
           v.ibv_ah_attr(grh=v.ibv_global_route(dgid=gid, sgid_index=9), is_global=1,
                         port_num=1)]
    errs = []
    for attr in bad:
        with pytest.raises(VerbsError) as e:
            v.ibv_create_ah(a.pd.pd, attr)
        errs.append(e.value.errno)
    # no GRH on RoCE, no port 2: EINVAL before any command; an empty GID slot has no
    # gid type (ibv_query_gid_type)
    assert errs[:2] == [errno.EINVAL, errno.EINVAL] and errs[2] in (errno.ENODATA,
                                                                    errno.ENOENT)


def test_ah_from_wc_answers_the_sender(pair):
    a, b = pair
    ah = a.ah(b.ctx.query_gid(1, 1), 1, flow_label=0x55)
    b.recv(7)
    a.recv(8)
    a.mr.write(b"ping", 2048)
    a.send(1, ah, b.qp.qp_num, length=4)
    a.cq.poll_until(1)
    [rwc] = b.cq.poll_until(1)
    # the receiver answers from the completion and the GRH it received
    back = v.ibv_create_ah_from_wc(b.pd.pd, rwc, b.mr.read(GRH), 1)
    attr = v.ibv_init_ah_from_wc(b.ctx.ctx, 1, rwc, b.mr.read(GRH))
    assert (attr.grh.dgid, attr.grh.sgid_index, attr.grh.flow_label, attr.grh.hop_limit) == \
        (a.ctx.query_gid(1, 1), 1, 0x55, 0xFF)
    b.mr.write(b"pong", 2048)
    b.send(2, back, rwc.src_qp, length=4)
    b.cq.poll_until(1)
    [awc] = a.cq.poll_until(1)
    assert awc.src_qp == b.qp.qp_num and a.mr.read(4, GRH) == b"pong"
    v.ibv_destroy_ah(back)
    v.ibv_destroy_ah(ah)

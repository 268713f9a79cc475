"""Shared receive queues end to end: bytes sent to several QPs land in the buffers of
one SRQ's WQEs, in the order they were posted, through ibv_post_srq_recv ->
libmlx5's linked ring -> the HCA following the links -> the CQE's wqe_counter ->
the WQE back on the free list; the limit event; and what a process writes into
its own SRQ ring or doorbell record errs only its own QPs (as test_hostile_rings.py
for the send side)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from kernel_model.hw.mlx5_engine import engine_of
from kernel_model.sched import SCHED
from userspace.pyverbs import base, host
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from userspace.pyverbs.wr import SGE, RecvWR, SendWR


@pytest.fixture(autouse=True)
def fresh_host() -> Iterator[None]:
    host.shutdown(check_leaks=False)
    yield
    base._graveyard.clear()
    host.shutdown(check_leaks=True)


class Side:
    """An SRQ with `n` RC QPs receiving from it, each connected to a sending QP."""

    def __init__(self, ctx: d.Context, pd: PD, n: int, max_wr: int = 16) -> None:
        self.ctx, self.pd = ctx, pd
        self.cq = CQ(ctx, 256, None, None, 0)
        self.srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=max_wr, max_sge=1)))
        self.recv = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                       srq=self.srq, cap=QPCap(1, 0)), QPAttr())
                     for _ in range(n)]
        self.send = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                       cap=QPCap(8, 1)), QPAttr()) for _ in range(n)]
        gid = ctx.query_gid(1, 0)
        for s, r in zip(self.send, self.recv, strict=True):
            for me, peer in ((s, r), (r, s)):
                attr = QPAttr()
                attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = \
                    peer.qp_num, 1, 1
                attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 0
                attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
                me.to_rts(attr)
        self.dst = MR(pd, 64 * 64, e.IBV_ACCESS_LOCAL_WRITE)
        self.src = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)

    @property
    def srqn(self) -> int:
        return self.srq.get_srq_num()

    def post(self, wr_id: int, slot: int) -> None:
        self.srq.post_recv(RecvWR(wr_id=wr_id, num_sge=1,
                                  sg=[SGE(self.dst.buf + 64 * slot, 64, self.dst.lkey)]))

    def send_text(self, qp: int, text: bytes, wr_id: int = 0) -> None:
        self.src.write(text, len(text))
        self.send[qp].post_send(SendWR(wr_id=wr_id, num_sge=1,
                                       sg=[SGE(self.src.buf, len(text), self.src.lkey)]))

    def poll(self, n: int) -> list:
        wcs: list = []
        for _ in range(20_000):
            wcs += self.cq.poll(n - len(wcs))[1]
            if len(wcs) >= n:
                break
        return wcs


def _machine():
    return host.host().machine


def test_sends_to_three_qps_fill_the_srq_wqes_in_posted_order():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        side = Side(ctx, pd, 3)
        for i in range(6):
            side.post(wr_id=1000 + i, slot=i)
        msgs = [(i % 3, f"message {i} to QP {i % 3}".encode()) for i in range(6)]
        seen = []
        for n, (qp, text) in enumerate(msgs):
            side.send_text(qp, text, wr_id=n)
            wcs = side.poll(2)
            rwc = next(w for w in wcs if w.opcode == e.IBV_WC_RECV)
            assert rwc.status == e.IBV_WC_SUCCESS and rwc.byte_len == len(text)
            assert rwc.qp_num == side.recv[qp].qp_num
            seen.append(rwc.wr_id)
            assert side.dst.read(len(text), 64 * (rwc.wr_id - 1000)) == text
        assert seen == [1000 + i for i in range(6)]      # the HCA follows the posted order


def test_the_ring_wraps_through_the_free_list_many_times():
    """An SRQ of 8 WQEs carries 40 messages: each completion links its WQE back."""
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        side = Side(ctx, pd, 2, max_wr=4)
        for i in range(4):
            side.post(wr_id=i, slot=i)
        for n in range(40):
            text = f"lap {n}".encode()
            side.send_text(n % 2, text)
            rwc = next(w for w in side.poll(2) if w.opcode == e.IBV_WC_RECV)
            assert rwc.status == e.IBV_WC_SUCCESS
            assert side.dst.read(len(text), 64 * (rwc.wr_id % 64)) == text
            side.post(wr_id=rwc.wr_id + 4, slot=(rwc.wr_id + 4) % 64)
        assert engine_of(_machine().hcas[0]).srq_hw[side.srqn][1] == 40


def test_an_empty_srq_is_rnr_and_the_limit_event_fires_once():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        side = Side(ctx, pd, 1)
        side.send_text(0, b"nobody listens")
        (wc,) = side.poll(1)
        assert wc.status == e.IBV_WC_RNR_RETRY_EXC_ERR       # rnr_retry 0
        side2 = Side(ctx, pd, 1)
        for i in range(4):
            side2.post(wr_id=i, slot=i)
        side2.srq.modify(SrqAttr(srq_limit=3), e.IBV_SRQ_LIMIT)
        events = _machine().hcas[0].async_events
        side2.send_text(0, b"one")
        side2.poll(2)
        assert ("srq_limit", side2.srqn) not in events       # 3 left: not below 3
        side2.send_text(0, b"two")
        side2.poll(2)
        side2.send_text(0, b"three")
        side2.poll(2)
        assert events.count(("srq_limit", side2.srqn)) == 1  # once, then disarmed
        assert side2.srq.query().srq_limit == 0


# -- hostile input: a process's own SRQ ring and doorbell record -------------------------
def _hostile_then_victim(corrupt) -> tuple[Side, Side]:
    """`corrupt(side)` writes into the hostile side's SRQ; its send then errs its QPs
    only, and a victim side on the same HCA still moves its bytes."""
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    bad, victim = Side(ctx, pd, 1), Side(ctx, pd, 1)
    corrupt(bad)
    bad.send_text(0, b"hostile bytes")
    bad.poll(2)
    assert SCHED.failed == [] and _machine().bugs == []
    fw = _machine().hcas[0].fw
    victim.post(wr_id=5, slot=0)
    victim.send_text(0, b"victim bytes arrive")
    rwc = next(w for w in victim.poll(2) if w.opcode == e.IBV_WC_RECV)
    assert rwc.status == e.IBV_WC_SUCCESS
    assert victim.dst.read(19, 0) == b"victim bytes arrive"
    assert fw.qps[victim.recv[0].qp_num].state == 3                       # RTS
    assert SCHED.failed == [] and _machine().bugs == []
    return bad, victim


def test_a_doorbell_record_far_ahead_takes_zeroed_wqes_as_a_length_error():
    def corrupt(side: Side) -> None:
        side.ctx.ctx.proc.store(side.srq.srq.db, struct.pack(">I", 0xFFFF))
    bad, _victim = _hostile_then_victim(corrupt)
    assert _machine().hcas[0].fw.qps[bad.recv[0].qp_num].state == 6       # ERR
    assert any(ev[0] == "qp_error" and ev[1] == bad.recv[0].qp_num
               for ev in _machine().hcas[0].async_events)


def test_garbage_next_indexes_and_keys_err_only_the_hostile_qp():
    def corrupt(side: Side) -> None:
        srq = side.srq.srq
        proc = side.ctx.ctx.proc
        for i in range(srq.max):            # every link out of range, every key bogus
            proc.store(srq.buf + (i << srq.wqe_shift),
                       struct.pack(">HHI", 0, 0xFFFF, 0) + bytes(8)
                       + struct.pack(">IIQ", 64, 0xDEAD00, 0x1000))
        proc.store(srq.db, struct.pack(">I", 3))
    bad, _victim = _hostile_then_victim(corrupt)
    assert _machine().hcas[0].fw.qps[bad.recv[0].qp_num].state == 6

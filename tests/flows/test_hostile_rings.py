"""A process that writes garbage into its own rings cannot hurt anyone else (issue 18).

Every byte a process can write - its send ring, its doorbell record, its UAR
page and BlueFlame buffers, a response buffer the kernel fills - is, at
worst, its own QP's problem: the HCA completes the offending WQE in error
(local QP operation error for a WQE it cannot parse, local length error for
a length it cannot honour), moves that QP to ERR and flushes it, and goes on
serving every other QP.  Each test runs a hostile process next to a victim
pair on the same HCA and checks, after the attack: the hostile QP's
completions and state, that the HCA's engine task did not die
(SCHED.failed), that the engine stayed within its rings, and that the
victim's RDMA WRITE still moves its bytes.
"""

from __future__ import annotations

import struct

import attrs
import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.mlx5_engine import OP_NOP, OP_RDMA_WRITE, OP_SEND, engine_of
from kernel_model.sched import SCHED
from kernel_model.uapi import ib_user_verbs as uv
from tests.flows.test_data_path import QPS_ERR, QPS_RTS, SIG, endpoint, pattern
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR
from userspace.tools.write_bw import Endpoint, connect

INLINE = 0x80000000


@attrs.define(eq=False)
class Pair:
    """Two connected RC QPs of one or two processes (a sends to b)."""

    a: Endpoint
    b: Endpoint

    @property
    def p(self):
        return self.a.ctx.proc

    @property
    def qpn(self) -> int:
        return self.a.qp.qp_num

    def slot(self, counter: int) -> int:
        """The address of send WQEBB `counter` in a's ring."""
        q = self.a.qp.qp
        return q.buf + q.sq.offset + (counter & (q.sq.wqe_cnt - 1)) * 64

    def dbrec(self, send: int | None = None, recv: int | None = None) -> None:
        """Write a's doorbell record counters directly."""
        q = self.a.qp.qp
        if recv is not None:
            self.p.store(q.db, struct.pack(">I", recv))
        if send is not None:
            self.p.store(q.db + 4, struct.pack(">I", send))

    def doorbell(self, counter: int = 0, opcode: int = OP_RDMA_WRITE, ds: int = 1) -> None:
        """A 64-bit send doorbell to a's BlueFlame register (the ctrl segment's first 8 bytes)."""
        self.p.store(self.a.qp.qp.bf.reg, ctrl(counter, opcode, self.qpn, ds)[:8])

    def write(self, wr_id: int = 1, length: int = 64, src: int = 0, dst: int = 0) -> None:
        self.a.qp.post_send(SendWR(wr_id=wr_id, opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                                   sg_list=[v.ibv_sge(self.a.mr.buf + src, length,
                                                      self.a.mr.lkey)],
                                   remote_addr=self.b.mr.buf + dst, rkey=self.b.mr.rkey))

    def fw_state(self) -> int:
        return self.p.machine.hcas[0].fw.qps[self.qpn].state


@attrs.define(eq=False)
class Hca:
    """One machine: a hostile process's pair and a victim pair of two other processes."""

    m: object
    bad: Pair
    victim: Pair

    @property
    def hca(self):
        return self.m.hcas[0]

    @property
    def engine(self):
        return engine_of(self.hca)

    def settle(self, turns: int = 50) -> None:
        for _ in range(turns):
            self.bad.p.sched_yield()

    def assert_others_unharmed(self) -> None:
        """The engine task lives, nothing was WARNed, and the victim's WRITE lands."""
        assert SCHED.failed == [] and self.m.bugs == []
        assert self.hca.device_errors == []
        data = pattern(256, seed=5)
        self.victim.a.mr.write(data)
        self.victim.write(wr_id=77, length=256, dst=512)
        (wc,) = self.victim.a.cq.poll_until(1)
        assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (77, "SUCCESS")
        assert self.victim.b.mr.read(256, 512) == data
        assert self.victim.b.mr.read(64, 768) == bytes(64)
        assert self.victim.a.qp.qp_num in self.engine.qps
        assert SCHED.failed == [] and self.m.bugs == []


def ctrl(counter: int, opcode: int, qpn: int, ds: int, fm_ce_se: int = 8, imm: int = 0
         ) -> bytes:
    """A WQE control segment: opmod_idx_opcode, qpn_ds, signature, fm_ce_se, imm."""
    return struct.pack(">IIBHBI", (counter & 0xFFFF) << 8 | opcode, qpn << 8 | ds, 0, 0,
                       fm_ce_se, imm)


def _pair(m, names: tuple[str, str], connected: bool = True) -> Pair:
    pa = m.spawn(names[0])
    pb = pa if names[1] == names[0] else m.spawn(names[1])
    pair = Pair(endpoint(pa, psn=0x10), endpoint(pb, psn=0x20))
    if connected:
        connect_pair(pair)
    return pair


def connect_pair(pair: Pair) -> None:
    connect(pair.b, pair.a.dest())
    connect(pair.a, pair.b.dest())


@pytest.fixture
def hca() -> Hca:
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    hca = Hca(m, _pair(m, ("hostile", "hostile")), _pair(m, ("victim-a", "victim-b")))
    hca.settle()                  # the engine has looked at the new RTS queues (empty)
    return hca


@pytest.fixture
def idle_hca() -> Hca:
    """As `hca`, the hostile pair left in RESET."""
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    return Hca(m, _pair(m, ("hostile", "hostile"), connected=False),
               _pair(m, ("victim-a", "victim-b")))


def _statuses(pair: Pair, n: int) -> list[str]:
    return [v.ibv_wc_status_str(wc.status) for wc in pair.a.cq.poll_until(n)]


# -- defect 3: what the engine cannot parse ends in a completion error -------------------
def test_doorbell_record_past_the_posted_wqes(hca):
    """Nothing posted, the send counter moved to 3: WQE 0 is all zeros (ds 0)."""
    hca.bad.dbrec(send=3)
    hca.bad.doorbell()
    assert _statuses(hca.bad, 3) == ["LOC_QP_OP_ERR", "WR_FLUSH_ERR", "WR_FLUSH_ERR"]
    assert hca.bad.fw_state() == QPS_ERR
    assert ("qp_error", hca.bad.qpn, "local QP operation: WQE with ds 0") in \
        hca.hca.async_events
    assert hca.engine.qps[hca.bad.qpn].sq_ci == 3
    hca.assert_others_unharmed()


def test_wqe_with_ds_zero(hca):
    hca.bad.p.store(hca.bad.slot(0), ctrl(0, OP_RDMA_WRITE, hca.bad.qpn, 0))
    hca.bad.dbrec(send=1)
    hca.bad.doorbell(ds=0)
    (wc,) = hca.bad.a.cq.poll_until(1)
    assert v.ibv_wc_status_str(wc.status) == "LOC_QP_OP_ERR" and wc.qp_num == hca.bad.qpn
    assert hca.bad.fw_state() == QPS_ERR
    hca.assert_others_unharmed()


@pytest.mark.parametrize("opcode", [OP_RDMA_WRITE, 0x10], ids=["write", "read"])
def test_rdma_wqe_without_its_remote_address_segment(hca, opcode):
    """ds 1: the control segment alone, where an RDMA opcode needs a raddr segment next."""
    hca.bad.p.store(hca.bad.slot(0), ctrl(0, opcode, hca.bad.qpn, 1))
    hca.bad.dbrec(send=1)
    hca.bad.doorbell(opcode=opcode)
    assert _statuses(hca.bad, 1) == ["LOC_QP_OP_ERR"]
    assert hca.bad.fw_state() == QPS_ERR
    why = [e[2] for e in hca.hca.async_events if e[0] == "qp_error"]
    assert why and "no remote address segment" in why[0]
    hca.assert_others_unharmed()


def test_inline_data_longer_than_the_wqe_is_a_local_length_error(hca):
    wqe = ctrl(0, OP_SEND, hca.bad.qpn, 2) + struct.pack(">I", INLINE | 4000) + b"hi!!" * 3
    hca.bad.p.store(hca.bad.slot(0), wqe)
    hca.bad.dbrec(send=1)
    hca.bad.doorbell(opcode=OP_SEND, ds=2)
    assert _statuses(hca.bad, 1) == ["LOC_LEN_ERR"]
    assert hca.bad.fw_state() == QPS_ERR
    assert hca.bad.b.cq.poll(4) == []            # nothing was sent
    hca.assert_others_unharmed()


def test_a_message_beyond_max_msg_sz_is_a_local_length_error(hca):
    """Two data segments of 2^31 - 1 bytes each: longer than the port's 1 GiB limit,
    refused before any key is looked at (the engine never gathers it)."""
    seg = struct.pack(">IIQ", 0x7FFFFFFF, hca.bad.a.mr.lkey, hca.bad.a.mr.buf)
    wqe = ctrl(0, OP_SEND, hca.bad.qpn, 3) + seg + seg
    hca.bad.p.store(hca.bad.slot(0), wqe)
    hca.bad.dbrec(send=1)
    hca.bad.doorbell(opcode=OP_SEND, ds=3)
    assert _statuses(hca.bad, 1) == ["LOC_LEN_ERR"]
    assert hca.engine.stats["bytes"] == 0
    hca.assert_others_unharmed()


# -- defect 4: every engine loop ends within the ring ----------------------------------------
@pytest.mark.parametrize("opcode", [0xFF, OP_NOP], ids=["bad-opcode", "nop"])
def test_a_ring_of_two_wqebb_wqes_with_an_odd_counter_does_not_hang(idle_hca, opcode):
    """Every slot holds a ds-8 WQE (two WQEBBs); the counter says 1.  Stepping by two
    never meets 1: the first WQE runs past the doorbell record, a QP operation error."""
    bad = idle_hca.bad
    n = bad.a.qp.qp.sq.wqe_cnt
    for i in range(n):
        bad.p.store(bad.slot(i), ctrl(i, opcode, bad.qpn, 8))
    bad.dbrec(send=1)
    connect_pair(bad)                              # RTS: the engine looks at the ring
    assert _statuses(bad, 1) == ["LOC_QP_OP_ERR"]
    assert bad.fw_state() == QPS_ERR
    why = [e[2] for e in idle_hca.hca.async_events if e[0] == "qp_error"]
    assert why == ["local QP operation: WQE of 2 WQEBBs runs past the doorbell record "
                   "(1 posted)"]
    assert idle_hca.engine.qps[bad.qpn].sq_ci == 1
    idle_hca.assert_others_unharmed()


def test_a_doorbell_record_far_ahead_flushes_at_most_one_ring(hca):
    """Send counter 0x8000 ahead of the device's, receive counter 0x7000: one error CQE
    and one ring's worth of flushes for each queue, then the counters jump."""
    bad = hca.bad
    for i in range(bad.a.qp.qp.sq.wqe_cnt):
        bad.p.store(bad.slot(i), ctrl(i, OP_NOP, bad.qpn, 1))
    bad.dbrec(send=0x8000, recv=0x7000)
    mark = len(hca.hca.async_events)
    before = hca.engine.stats["cqes"]
    bad.doorbell(opcode=OP_NOP)
    hca.settle()
    sq, rq = bad.a.qp.qp.sq.wqe_cnt, bad.a.qp.qp.rq.wqe_cnt
    wcs = bad.a.cq.poll(256)
    assert [v.ibv_wc_status_str(w.status) for w in wcs[:2]] == ["LOC_QP_OP_ERR", "WR_FLUSH_ERR"]
    assert bad.fw_state() == QPS_ERR
    why = [e[2] for e in hca.hca.async_events[mark:] if e[0] == "qp_error"]
    assert why == [f"local QP operation: doorbell record 32768 WQEBBs ahead, the send "
                   f"queue holds {sq}"]
    # the CQ (64 entries) holds what it can; the rest is counted as overrun, and
    # no more CQEs were attempted than one error plus one ring of each queue
    overruns = sum(1 for e in hca.hca.async_events[mark:] if e[0] == "cq_overrun")
    assert len(wcs) + overruns <= 1 + sq + rq
    assert hca.engine.stats["cqes"] - before == len(wcs)
    hw = hca.engine.qps[bad.qpn]
    assert (hw.sq_ci & 0xFFFF, hw.rq_ci & 0xFFFF) == (0x8000, 0x7000)
    hca.assert_others_unharmed()


# -- defect 5: stores of any width to the UAR page -----------------------------------------
@pytest.mark.parametrize("offset", [0x0, 0x20, 0x24, 0x800, 0x804, 0x900, 0x9FC, 0xBFF])
def test_stores_of_any_width_to_the_uar_page(hca, offset):
    bad = hca.bad
    base = bad.a.qp.qp.bf.reg & ~0xFFF
    for width in (1, 2, 4, 8, 3, 100):
        n = min(width, 0x1000 - offset)
        bad.p.store(base + offset, bytes(range(1, n + 1)))
    hca.settle(10)
    assert SCHED.failed == [] and hca.m.bugs == []
    assert bad.a.cq.poll(4) == [] and bad.fw_state() == QPS_RTS
    # the QP still works: a real post after the junk
    bad.a.mr.write(b"after junk")
    bad.write(wr_id=9, length=10, dst=64)
    assert _statuses(bad, 1) == ["SUCCESS"]
    assert bad.b.mr.read(10, 64) == b"after junk"
    hca.assert_others_unharmed()


def _bf_copy(pair: Pair, counter: int = 0) -> bytes:
    """A signalled 16-byte RDMA WRITE WQE (64 bytes): what libmlx5 copies to BlueFlame."""
    wqe = ctrl(counter, OP_RDMA_WRITE, pair.qpn, 3) + \
        struct.pack(">QII", pair.b.mr.buf + 128, pair.b.mr.rkey, 0) + \
        struct.pack(">IIQ", 16, pair.a.mr.lkey, pair.a.mr.buf)
    return wqe + bytes(64 - len(wqe))


def test_a_blueflame_copy_in_narrow_stores_is_taken(hca):
    """The CPU may issue the 64 bytes as any sequence of contiguous stores."""
    bad = hca.bad
    bad.a.mr.write(b"sixteen bytes!!!")
    wqe = _bf_copy(bad)
    bad.p.store(bad.slot(0), wqe)
    bad.dbrec(send=1)
    reg = bad.a.qp.qp.bf.reg
    for at, n in ((0, 4), (4, 4), (8, 1), (9, 7), (16, 40), (56, 8)):
        bad.p.store(reg + at, wqe[at:at + n])
    assert _statuses(bad, 1) == ["SUCCESS"]
    assert bad.b.mr.read(16, 128) == b"sixteen bytes!!!"
    hca.assert_others_unharmed()


def test_a_torn_blueflame_copy_is_dropped_and_the_doorbell_fetches_the_ring(hca):
    bad = hca.bad
    bad.a.mr.write(b"from the ring!!!")
    wqe = _bf_copy(bad)
    bad.p.store(bad.slot(0), wqe)
    bad.dbrec(send=1)
    reg = bad.a.qp.qp.bf.reg
    bad.p.store(reg, wqe[:4])                        # 4 bytes, then a gap
    bad.p.store(reg + 16, wqe[16:64])
    bad.p.store(reg + 0x100, b"\xff" * 4)            # the other buffer, mid-way: junk
    hca.settle(10)
    assert bad.a.cq.poll(4) == []                    # nothing rang
    bad.doorbell(counter=0, ds=3)                    # the process's real doorbell
    assert _statuses(bad, 1) == ["SUCCESS"]
    assert bad.b.mr.read(16, 128) == b"from the ring!!!"
    assert hca.engine.qps[bad.qpn].bf == {}
    hca.assert_others_unharmed()


def test_blueflame_copies_for_counters_never_posted_stay_within_the_ring(hca):
    bad = hca.bad
    reg = bad.a.qp.qp.bf.reg
    for counter in range(100, 300):
        bad.p.store(reg + (counter & 1) * 0x100, _bf_copy(bad, counter))
    hca.settle(10)
    assert len(hca.engine.qps[bad.qpn].bf) <= bad.a.qp.qp.sq.wqe_cnt
    assert bad.a.cq.poll(4) == [] and bad.fw_state() == QPS_RTS
    hca.assert_others_unharmed()


def test_a_write_command_whose_response_lands_in_the_uar_page(hca):
    """ALLOC_PD with its 4-byte response pointed at the BlueFlame buffer: copy_to_user
    stores through the VM_IO|VM_PFNMAP mapping, as Linux's does (the PTE is present and
    writable), so the device sees a 4-byte store; the command succeeds."""
    bad = hca.bad
    ctx = bad.a.ctx.ctx
    req = uv.ib_uverbs_alloc_pd()
    req.response = bad.a.qp.qp.bf.reg + 0x100
    body = req.pack()
    count = uv.ib_uverbs_cmd_hdr.SIZE + len(body)
    hdr = uv.ib_uverbs_cmd_hdr(command=uv.IB_USER_VERBS_CMD_ALLOC_PD, in_words=count // 4,
                               out_words=uv.ib_uverbs_alloc_pd_resp.SIZE // 4)
    bad.p.store(ctx.cmd_buf, hdr.pack() + body)
    assert bad.p.write(ctx.cmd_fd, ctx.cmd_buf, count) == count
    (rec,) = [r for r in hca.hca.uar_log if r.offset == 0x900]
    assert (rec.kind, len(rec.data)) == ("bf", uv.ib_uverbs_alloc_pd_resp.SIZE)
    hca.settle(10)
    assert bad.fw_state() == QPS_RTS
    hca.assert_others_unharmed()
    # the PD exists (its handle went to the device, not to memory): the process's
    # exit releases it, which the leak check verifies


# -- the consumer index and the receive ring -------------------------------------------------
def test_a_cq_consumer_index_moved_anywhere_only_drops_that_cqs_entries(hca):
    bad = hca.bad
    cq = bad.a.cq.cq
    bad.p.store(cq.dbrec, struct.pack(">I", 0xABCDEF))
    bad.a.mr.write(b"x" * 64)
    bad.write(wr_id=3, length=64)
    hca.settle()
    assert ("cq_overrun", cq.cqn, bad.qpn) in hca.hca.async_events
    hca.assert_others_unharmed()

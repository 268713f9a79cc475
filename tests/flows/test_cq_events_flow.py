"""Completion events and the extended CQ end to end: a responder process arms its CQ
(libmlx5's arm doorbell record + the UAR CQ doorbell), a requester process sends,
the HCA writes the CQE, an EQE and raises the EQ's vector; mlx5_core's handler
calls the CQ's comp handler, uverbs queues the event on the channel, and the
responder's blocked read() returns it.  The CQE's fields and the bytes are then
read through the extended poll API.  A process writing garbage into its own CQ
doorbells (any cqn, any consumer index) arms at most its own CQs."""

from __future__ import annotations

import struct

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.page_alloc import page_to_phys
from kernel_model.sched import SCHED
from tests.flows.test_data_path import ALL_ACCESS, BUF
from tests.flows.test_hostile_rings import Hca, _pair
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_cq as vcq
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.libibverbs.verbs_types import IBV_WC_STANDARD_FLAGS, ibv_cq_init_attr_ex
from userspace.tools.write_bw import Endpoint, connect

MSG = bytes((i * 37 + 11) & 0xFF for i in range(300))


class ExCQ(CQ):
    """The pyverbs-style CQ wrapper over an extended CQ on a completion channel."""

    def __init__(self, ctx: Context, cqe: int, channel) -> None:
        super(CQ, self).__init__()
        self.cq = vcq.ibv_create_cq_ex(ctx.ctx, ibv_cq_init_attr_ex(
            cqe=cqe, channel=channel, wc_flags=IBV_WC_STANDARD_FLAGS))
        self.proc = ctx.proc
        ctx._adopt(self)


def side(p, psn: int, channel: bool):
    ctx = Context(p)
    pd = PD(ctx)
    ch = vcq.ibv_create_comp_channel(ctx.ctx) if channel else None
    cq = ExCQ(ctx, 64, ch) if channel else CQ(ctx, 64)
    mr = MR(pd, BUF, ALL_ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1,
                                              max_recv_sge=1)))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn), ch


@pytest.fixture
def link() -> tuple:
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    a, _ = side(m.spawn("requester"), 0x10, channel=False)
    b, ch = side(m.spawn("responder"), 0x20, channel=True)
    connect(b, a.dest())
    connect(a, b.dest())
    return m, a, b, ch


def post(a: Endpoint, b: Endpoint, imm: int, wr_id: int) -> None:
    a.mr.write(MSG)
    b.qp.post_recv(v.ibv_recv_wr(wr_id=wr_id, sg_list=[v.ibv_sge(b.mr.buf + 64, 512,
                                                                 b.mr.lkey)]))
    a.qp.post_send(SendWR(wr_id=wr_id + 1, opcode=v.IBV_WR_SEND_WITH_IMM, imm_data=imm,
                          send_flags=v.IBV_SEND_SIGNALED,
                          sg_list=[v.ibv_sge(a.mr.buf, len(MSG), a.mr.lkey)]))


def test_an_armed_cq_gets_one_event_and_the_ex_api_reads_the_cqe(link):
    m, a, b, ch = link
    hca = m.hcas[0]
    cq = b.cq.cq
    eq = hca.pdev.dev.driver_data.priv.eq_table.comp_eqs[0]
    eq_ci = eq.cons_index
    assert vcq.ibv_req_notify_cq(cq) == 0
    # the arm word (arm_sn 0, REQ_NOT, ci 0) in the record and on the UAR, with the CQN
    assert b.ctx.proc.load(cq.dbrec + 4, 4) == bytes(4)
    rec = hca.uar_log[-1]
    assert (rec.kind, rec.offset, rec.data) == ("cq_db", 0x20, struct.pack(">II", 0, cq.cqn))
    post(a, b, 0xA1B2C3D4, wr_id=100)
    got, _ = vcq.ibv_get_cq_event(ch)          # blocks: the HCA runs, the event arrives
    assert got is cq and cq.arm_sn == 1
    eqe = m.phys_read(page_to_phys(eq.buf) + eq_ci % eq.nent * 64, 64)
    assert eqe[1] == 0 and int.from_bytes(eqe[56:60], "big") == cq.cqn
    assert eq.cons_index == eq_ci + 1          # one EQE: the CQ is disarmed after it
    assert vcq.ibv_start_poll(cq, vcq.ibv_poll_cq_attr()) == 0
    assert (cq.wr_id, cq.status) == (100, 0)
    rd = lambda what: vcq.ibv_wc_read(cq, what)  # noqa: E731
    assert rd("opcode") == v.IBV_WC_RECV and rd("byte_len") == len(MSG)
    assert rd("qp_num") == b.qp.qp_num and rd("src_qp") == a.qp.qp_num
    assert rd("wc_flags") & v.IBV_WC_WITH_IMM and rd("imm_data") == 0xA1B2C3D4
    assert vcq.ibv_next_poll(cq) == 2          # ENOENT: only the receive lands here
    vcq.ibv_end_poll(cq)
    assert b.mr.read(len(MSG), 64) == MSG
    assert a.cq.poll_until(1)[0].wr_id == 101
    vcq.ibv_ack_cq_events(cq, 1)
    # armed again with nothing new: no event until the next CQE
    assert vcq.ibv_req_notify_cq(cq) == 0
    q = ch_queue(b, ch)
    b.ctx.proc.sched_yield()
    assert not q.event_list and hca.engine.cq_armed == {cq.cqn: 1}
    post(a, b, 1, wr_id=200)
    got, _ = vcq.ibv_get_cq_event(ch)
    assert got is cq and cq.arm_sn == 2
    vcq.ibv_ack_cq_events(cq, 1)
    assert vcq.ibv_start_poll(cq, vcq.ibv_poll_cq_attr()) == 0 and cq.wr_id == 200
    vcq.ibv_end_poll(cq)
    assert SCHED.failed == [] and m.bugs == []


def ch_queue(ep: Endpoint, ch):
    return ep.ctx.proc.task.files.fdt[ch.fd].private_data.ev_queue


@pytest.fixture
def hca() -> Hca:
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    hca = Hca(m, _pair(m, ("hostile", "hostile")), _pair(m, ("victim-a", "victim-b")))
    hca.settle()
    return hca


def test_garbage_cq_doorbells_arm_at_most_the_writers_own_cqs(hca):
    p = hca.bad.p
    ctx = hca.bad.a.ctx.ctx
    own = {hca.bad.a.cq.cq.cqn, hca.bad.b.cq.cq.cqn}
    victims = {hca.victim.a.cq.cq.cqn, hca.victim.b.cq.cq.cqn}
    for i, cqn in enumerate(sorted(own | victims) + [0, 0xFFFFFF, 0x123456]):
        word = (i * 0x9E3779B1) & 0xFFFFFFFF            # any arm_sn, command, index
        p.store(hca.bad.a.cq.cq.dbrec + 4, struct.pack(">I", word))
        for reg in (ctx.cq_uar_reg, ctx.uar[1].reg):
            p.store(reg + 0x20, struct.pack(">II", word, cqn))
    hca.settle()
    assert not set(hca.engine.cq_armed) & victims
    assert any(e[0] == "bad_cq_doorbell" for e in hca.hca.async_events)
    hca.assert_others_unharmed()


def test_an_arm_with_a_bogus_index_is_a_spurious_event_on_the_own_cq_only(hca):
    p, cq = hca.bad.p, hca.bad.a.cq.cq
    eq = hca.hca.pdev.dev.driver_data.priv.eq_table.comp_eqs[0]
    before = eq.cons_index
    p.store(hca.bad.a.ctx.ctx.cq_uar_reg + 0x20, struct.pack(">II", 0x00ABCDEF, cq.cqn))
    hca.settle()
    assert eq.cons_index == before + 1 and cq.cqn not in hca.engine.cq_armed
    hca.assert_others_unharmed()

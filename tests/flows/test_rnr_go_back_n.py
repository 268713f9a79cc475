"""After an RNR NAK the requester goes back to the NAKed PSN: the WQEs it had sent after
it (which the responder dropped as out of sequence) are sent again behind the retried
one, as the IB spec's go-back-N retransmission has it.  Found by the stateful fuzzer
(peermem_testing/fuzz.py, odp_race): four RDMA WRITEs into an ODP MR whose pages were
not present - the first faulted (RNR NAK), was retried and completed; the three after it
never did, and the QP sat in RTS with them outstanding forever."""

from __future__ import annotations

import pytest

from tests.flows.test_data_path import LINKS, SIG, make_link, status
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, SendWR

PAGE = 4096


@pytest.mark.parametrize("kind", LINKS)
def test_sends_behind_an_rnr_naked_send_all_arrive(kind):
    link = make_link(kind)
    a, b = link.a, link.b
    a.mr.write(b"0123")
    for i in range(4):
        a.qp.post_send(SendWR(wr_id=i, sg_list=[a.sge(i, 1)], opcode=v.IBV_WR_SEND,
                              send_flags=SIG))
    for _ in range(20):                     # the first is RNR-NAKed, the rest dropped
        a.p.sched_yield()
    for i in range(4):
        b.recv(10 + i, 8 * i, 8)
    assert status(a.cq.poll_until(4)) == [(i, "SUCCESS") for i in range(4)]
    assert status(b.cq.poll_until(4)) == [(10 + i, "SUCCESS") for i in range(4)]
    assert [b.mr.read(1, 8 * i) for i in range(4)] == [b"0", b"1", b"2", b"3"]


@pytest.mark.parametrize("kind", LINKS)
def test_writes_behind_one_that_faulted_on_an_odp_mr_all_land(kind):
    link = make_link(kind)
    a, b = link.a, link.b
    odp = MR(b.ep.pd, 4 * PAGE, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
             | v.IBV_ACCESS_ON_DEMAND)
    a.mr.write(bytes(range(256)) * 16)
    for i in range(4):
        a.qp.post_send(SendWR(wr_id=i, sg_list=[a.sge(i * 64, 64)],
                              opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                              remote_addr=odp.buf + i * PAGE, rkey=odp.rkey))
    assert status(a.cq.poll_until(4)) == [(i, "SUCCESS") for i in range(4)]
    for i in range(4):
        assert odp.read(64, i * PAGE) == (bytes(range(256)) * 16)[i * 64:i * 64 + 64]

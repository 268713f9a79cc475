"""A UD send longer than the UD QP's message limit (qpc.log_msg_max 12: the 4096-byte MTU
mlx5_ib gives every UD QP) completes with a local length error and puts only the sender
in ERR; nothing reaches the receiver.  Found by the stateful fuzzer: a UD WQE whose data
segment said 1 MiB got as far as building the datagram's GRH, whose payload length is
16 bits, and the engine raised (a WARN)."""

from __future__ import annotations

import pytest

from kernel_model.emu.platform import rdma_host
from tests.flows.test_ud_flow import ud_side
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR

QPS_ERR = 6


@pytest.mark.parametrize("length,status", [(4096, "SUCCESS"), (4097, "LOC_LEN_ERR"),
                                           (1 << 20, "LOC_LEN_ERR")])
def test_a_ud_send_beyond_the_mtu_is_a_local_length_error(length, status):
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    a, b = ud_side(m, "sender"), ud_side(m, "receiver")
    big = MR(a.pd, 1 << 20, v.IBV_ACCESS_LOCAL_WRITE)
    rbuf = MR(b.pd, 8192, v.IBV_ACCESS_LOCAL_WRITE)
    b.qp.post_recv(v.ibv_recv_wr(wr_id=5, sg_list=[v.ibv_sge(rbuf.buf, 8192, rbuf.lkey)]))
    ah = a.ah(b.ctx.query_gid(1, 0))
    a.qp.post_send(v.ibv_send_wr(wr_id=1, sg_list=[v.ibv_sge(big.buf, length, big.lkey)],
                                 opcode=v.IBV_WR_SEND, send_flags=v.IBV_SEND_SIGNALED, ah=ah,
                                 remote_qpn=b.qp.qp_num, remote_qkey=0x11111111))
    [wc] = a.cq.poll_until(1)
    assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (1, status)
    got = b.settle()
    if status == "SUCCESS":
        assert [(w.wr_id, w.byte_len) for w in got] == [(5, length + 40)]
    else:
        assert got == [] and not m.bugs
        assert m.hcas[0].fw.qps[a.qp.qp_num].state == QPS_ERR
        assert m.hcas[0].fw.qps[b.qp.qp_num].state == 3

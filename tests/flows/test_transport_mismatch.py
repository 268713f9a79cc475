"""An RC requester aimed at a QP of another transport - a UC QP (ready or not) or a UD
QP - gets no answer: the responder drops requests its transport has no opcodes for, so
the RC WQE completes with a transport retry error, the responder's memory and state
untouched.  Found by the stateful fuzzer: the RC requester waited for an answer forever
(its WQE outstanding, its QP in RTS)."""

from __future__ import annotations

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.fabric import Fabric
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPInitAttr

ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


def _side(m, name: str, qp_type: int):
    p = m.spawn(name)
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, 4096, ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, qp_type=qp_type, cap=v.ibv_qp_cap(4, 4, 1, 1)))
    return ctx, cq, mr, qp


@pytest.mark.parametrize("kind", ["loopback", "fabric"])
@pytest.mark.parametrize("target,ready", [(v.IBV_QPT_UC, True), (v.IBV_QPT_UC, False),
                                          (v.IBV_QPT_UD, True)])
def test_an_rc_request_to_another_transport_times_out(kind, target, ready):
    if kind == "loopback":
        ma = mb = rdma_host(ram_size=128 << 20)
        ma.load_module("mlx5_ib")
    else:
        fabric = Fabric()
        ma, mb = (rdma_host(ram_size=128 << 20, name=n, fabric=fabric) for n in ("a", "b"))
        ma.load_module("mlx5_ib")
        mb.load_module("mlx5_ib")
    actx, acq, amr, aqp = _side(ma, "rc", v.IBV_QPT_RC)
    bctx, _bcq, bmr, bqp = _side(mb, "other", target)
    if ready:
        bqp.to_rts(actx.query_gid(1, 0), aqp.qp_num)
    aqp.to_rts(bctx.query_gid(1, 0), bqp.qp_num, retry_cnt=1)
    amr.write(b"must not land")
    aqp.post_send(v.ibv_send_wr(wr_id=1, opcode=v.IBV_WR_RDMA_WRITE,
                                send_flags=v.IBV_SEND_SIGNALED,
                                sg_list=[v.ibv_sge(amr.buf, 13, amr.lkey)],
                                remote_addr=bmr.buf, rkey=bmr.rkey))
    [wc] = acq.poll_until(1)
    assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (1, "RETRY_EXC_ERR")
    assert bmr.read(13) == bytes(13)
    assert mb.hcas[0].fw.qps[bqp.qp_num].state == (3 if ready else 0)
    assert not ma.bugs and not mb.bugs

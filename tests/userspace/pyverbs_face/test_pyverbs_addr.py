"""userspace/pyverbs addr: AH(pd, attr=AHAttr) and AH(pd, wc=, grh=, port_num=) over
ibv_create_ah / ibv_create_ah_from_wc, close() and the PD's children, and UD traffic
through SendWR.set_wr_ud and QP.post_send."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.addr import AH, GID, GRH, AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.wr import SGE, RecvWR, SendWR

QKEY = 0x11111111
GRH_SIZE = 40


def kernel_ahs(ctx: d.Context) -> int:
    """The AH uobjects the kernel holds in the context's uverbs file."""
    ufile = host.host().proc.task.files.fdt[ctx.ctx.cmd_fd].private_data
    return sum(1 for u in ufile.idr.values() if u.type.name == "AH")


@pytest.fixture
def ctx():
    c = d.Context(name="mlx5_0")
    yield c
    c.close()


def global_attr(ctx, gid_index: int = 0) -> AHAttr:
    gr = GlobalRoute(dgid=ctx.query_gid(1, gid_index), sgid_index=gid_index)
    return AHAttr(gr=gr, is_global=1, port_num=1)


def test_create_and_close_ah(ctx):
    pd = PD(ctx)
    ah = AH(pd, attr=global_attr(ctx, 1))
    assert kernel_ahs(ctx) == 1 and ah.ah.kern_ah
    # the destination is the port's own link-local GID: its MAC is the port's
    mac = host.host().machine.hcas[0].fw.vport.mac.to_bytes(6, "big")
    assert ah.ah.av.rmac == mac
    ah.close()
    ah.close()                                   # idempotent
    assert kernel_ahs(ctx) == 0
    pd.close()


def test_ah_is_closed_with_its_pd(ctx):
    pd = PD(ctx)
    ahs = [AH(pd, attr=global_attr(ctx)), AH(pd, attr=global_attr(ctx, 1))]
    assert kernel_ahs(ctx) == 2
    pd.close()                                   # the AHs first, then the PD (no EBUSY)
    assert kernel_ahs(ctx) == 0 and all(ah._closed for ah in ahs)


def test_non_global_ah_on_roce_fails(ctx):
    pd = PD(ctx)
    with pytest.raises(PyverbsRDMAError) as ex:
        AH(pd, attr=AHAttr(is_global=0, port_num=1))
    assert ex.value.error_code == errno.EINVAL and "Failed to create AH" in str(ex.value)
    with pytest.raises(PyverbsRDMAError) as ex:
        AH(pd, attr=AHAttr(gr=GlobalRoute(dgid=ctx.query_gid(1, 0)), port_num=3))
    assert ex.value.error_code == errno.EINVAL
    assert kernel_ahs(ctx) == 0


def test_ah_needs_attr_or_wc(ctx):
    pd = PD(ctx)
    with pytest.raises(PyverbsUserError):
        AH(pd)
    with pytest.raises(PyverbsUserError):
        AH(pd, wc=object())                      # no grh / port_num


def ud_qp(pd: PD, cq: CQ) -> QP:
    attr = QPAttr(port_num=1)
    attr.qkey, attr.pkey_index = QKEY, 0
    return QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                             cap=QPCap(4, 4, 1, 1)), attr)


def test_ud_traffic_through_set_wr_ud_and_ah_from_wc(ctx):
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    client, server = ud_qp(pd, cq), ud_qp(pd, cq)
    assert client.qp_state == e.IBV_QPS_RTS
    mr.write(b"\x00" * 4096, 4096)
    mr.write(b"hello, datagram!", 16, 2048)
    server.post_recv(RecvWR(1, 1, [SGE(mr.buf, 512, mr.lkey)]))
    wr = SendWR(2, num_sge=1, sg=[SGE(mr.buf + 2048, 16, mr.lkey)],
                send_flags=e.IBV_SEND_SIGNALED)
    ah = AH(pd, attr=global_attr(ctx, 1))
    wr.set_wr_ud(ah, server.qp_num, QKEY)
    client.post_send(wr)
    wcs = []
    while len(wcs) < 2:
        wcs += cq.poll(2)[1]
    send, recv = sorted(wcs, key=lambda w: w.wr_id, reverse=True)
    assert (send.wr_id, send.status, send.opcode) == (2, e.IBV_WC_SUCCESS, e.IBV_WC_SEND)
    assert (recv.wr_id, recv.status, recv.opcode, recv.byte_len, recv.src_qp) == \
        (1, e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 16 + GRH_SIZE, client.qp_num)
    assert recv.wc_flags & e.IBV_WC_GRH
    assert mr.read(16, GRH_SIZE) == b"hello, datagram!"
    # answer from the completion: grh as the received buffer's address, and as a GRH
    back = AH(pd, wc=recv, grh=mr.buf, port_num=1)
    assert back.init_attr.sgid_index == 1 and back.init_attr.dgid == ctx.query_gid(1, 1).gid
    raw = mr.read(GRH_SIZE, 0)
    grh = GRH(sgid=GID(raw[8:24]), dgid=GID(raw[24:40]),
              version_tclass_flow=int.from_bytes(raw[:4], "big"),
              paylen=int.from_bytes(raw[4:6], "big"), next_hdr=raw[6], hop_limit=raw[7])
    back2 = AH(pd, wc=recv, grh=grh, port_num=1)
    assert back2.init_attr.sgid_index == 1
    assert kernel_ahs(ctx) == 3
    ctx.close()                                  # the AHs, QPs, MR, CQ and PD with it

"""userspace/pyverbs XRC: XRCD on a (host) file shared by inode, the open flags'
errnos, XRC SRQs and XRC send/receive QPs with bytes arriving in the target SRQ,
and the order closing keeps (the domain's SRQs and QPs before it)."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttrEx
from userspace.pyverbs.srq import SRQ, SrqInitAttrEx
from userspace.pyverbs.wr import SGE, RecvWR, SendWR
from userspace.pyverbs.xrcd import XRCD, XRCDInitAttr

FD_OFLAGS = e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS


def fw():
    return host.host().machine.hcas[0].fw


@pytest.fixture
def tmpfd():
    with tempfile.NamedTemporaryFile() as tf:
        fd = os.open(tf.name, os.O_RDONLY | os.O_CREAT)
        yield fd
        os.close(fd)


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 64, None, None, 0)
    yield ctx, pd, cq
    ctx.close()


def xrc_srq(ctx, pd, cq, xrcd, max_wr: int = 16) -> SRQ:
    a = SrqInitAttrEx(max_wr=max_wr)
    a.srq_type, a.pd, a.xrcd, a.cq = e.IBV_SRQT_XRC, pd, xrcd, cq
    a.comp_mask = (e.IBV_SRQ_INIT_ATTR_TYPE | e.IBV_SRQ_INIT_ATTR_PD | e.IBV_SRQ_INIT_ATTR_CQ
                   | e.IBV_SRQ_INIT_ATTR_XRCD)
    return SRQ(ctx, a)


def test_two_xrcds_on_one_file_share_the_domain(res, tmpfd):
    ctx, pd, cq = res
    a = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, os.O_CREAT, tmpfd))
    b = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, 0, tmpfd))           # found by the inode
    assert len(fw().xrcds) == 1
    private = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, 0, -1))         # fd -1: its own domain
    assert len(fw().xrcds) == 2
    a.close()
    assert len(fw().xrcds) == 2                                  # b still holds it
    b.close()
    private.close()
    assert not fw().xrcds


@pytest.mark.parametrize("comp_mask,oflags,first,err", [
    (FD_OFLAGS, 0, False, errno.EAGAIN),                     # no domain yet, no O_CREAT
    (FD_OFLAGS, os.O_CREAT | os.O_EXCL, True, errno.EINVAL),  # exists, O_EXCL
    (e.IBV_XRCD_INIT_ATTR_FD, 0, False, errno.EINVAL),       # OFLAGS missing
    (FD_OFLAGS | 4, os.O_CREAT, False, errno.EOPNOTSUPP),    # unknown comp_mask bit
])
def test_open_flags_errnos(res, tmpfd, comp_mask, oflags, first, err):
    ctx, pd, cq = res
    kept = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, os.O_CREAT, tmpfd)) if first else None
    before = len(fw().xrcds)
    with pytest.raises(PyverbsRDMAError, match="Failed to allocate XRCD") as ei:
        XRCD(ctx, XRCDInitAttr(comp_mask, oflags, tmpfd))
    assert ei.value.error_code == err and len(fw().xrcds) == before
    assert kept is None or not kept._closed


def test_a_host_fd_that_is_none_fails(res):
    ctx, pd, cq = res
    with pytest.raises(PyverbsRDMAError) as ei:
        XRCD(ctx, XRCDInitAttr(FD_OFLAGS, os.O_CREAT, 987654))
    assert ei.value.error_code == errno.EBADF


def _xrc_pair(ctx, pd, cq, xrcd):
    """An XRC receive QP in the domain and an XRC send QP aimed at it, both RTS."""
    recv = QP(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_XRC_RECV, comp_mask=e.IBV_QP_INIT_ATTR_XRCD,
                                xrcd=xrcd))
    send = QP(ctx, QPInitAttrEx(qp_type=e.IBV_QPT_XRC_SEND, comp_mask=e.IBV_QP_INIT_ATTR_PD,
                                pd=pd, scq=cq, cap=QPCap(8, 0, 1, 0), sq_sig_all=1))
    gid = ctx.query_gid(1, 0)
    for me, peer in ((recv, send), (send, recv)):
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
        me.to_rts(attr)
    return recv, send


def _poll(cq: CQ, n: int) -> list:
    wcs: list = []
    for _ in range(20_000):
        wcs += cq.poll(n - len(wcs))[1]
        if len(wcs) >= n:
            break
    return wcs


def test_an_xrc_send_lands_in_the_named_srq(res):
    ctx, pd, cq = res
    xrcd = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, 0, -1))
    scq = CQ(ctx, 16, None, None, 0)
    srqs = [xrc_srq(ctx, pd, scq, xrcd), xrc_srq(ctx, pd, scq, xrcd)]
    recv, send = _xrc_pair(ctx, pd, cq, xrcd)
    assert fw().qps[recv.qp_num].qpc["xrcd"] in fw().xrcds
    dst = MR(pd, 256, e.IBV_ACCESS_LOCAL_WRITE)
    src = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    for i, srq in enumerate(srqs):
        srq.post_recv(RecvWR(wr_id=50 + i, num_sge=1, sg=[SGE(dst.buf + 64 * i, 64, dst.lkey)]))
    for n, srq in enumerate(reversed(srqs)):           # to the second SRQ, then the first
        text = f"xrc to srq {srq.get_srq_num():#x}".encode()
        src.write(text, len(text))
        wr = SendWR(wr_id=n, num_sge=1, sg=[SGE(src.buf, len(text), src.lkey)])
        wr.set_qp_type_xrc(srq.get_srq_num())
        send.post_send(wr)
        (swc,) = _poll(cq, 1)
        (rwc,) = _poll(scq, 1)                         # the SRQ's CQ, not the QP's
        assert swc.status == rwc.status == e.IBV_WC_SUCCESS
        assert rwc.qp_num == recv.qp_num and rwc.byte_len == len(text)
        assert rwc.wr_id == 51 - n
        assert dst.read(len(text), 64 * (1 - n)) == text


def test_a_send_to_an_srq_of_another_domain_is_a_remote_invalid_request(res):
    ctx, pd, cq = res
    mine = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, 0, -1))
    other = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, 0, -1))
    foreign = xrc_srq(ctx, pd, cq, other)
    recv, send = _xrc_pair(ctx, pd, cq, mine)
    src = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    wr = SendWR(wr_id=1, num_sge=1, sg=[SGE(src.buf, 8, src.lkey)])
    wr.set_qp_type_xrc(foreign.get_srq_num())
    send.post_send(wr)
    (wc,) = _poll(cq, 1)
    assert wc.status == e.IBV_WC_REM_INV_REQ_ERR
    assert fw().qps[recv.qp_num].state == 6               # the target QP errs, not the SRQ


def test_closing_the_xrcd_closes_its_srqs_and_qps_first(res):
    ctx, pd, cq = res
    xrcd = XRCD(ctx, XRCDInitAttr(FD_OFLAGS, 0, -1))
    srq = xrc_srq(ctx, pd, cq, xrcd)
    recv, _send = _xrc_pair(ctx, pd, cq, xrcd)
    xrcd.close()
    assert srq._closed and recv._closed and not fw().xrcds and not fw().srqs


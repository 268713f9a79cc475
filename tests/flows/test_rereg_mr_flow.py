"""ibv_rereg_mr end to end: the responder re-registers its MR (new pages, new access, new
PD) and the requester's RDMA WRITEs land - or are refused - as the new registration
says.  Over one machine's loopback and across a fabric."""

from __future__ import annotations

import pytest

from tests.drivers.mlx5_ib.ladder import user_pages
from tests.flows.test_data_path import BUF, LINKS, SIG, Link, make_link, pattern, settle, status
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR

LW, RW = v.IBV_ACCESS_LOCAL_WRITE, v.IBV_ACCESS_REMOTE_WRITE
TRANS, PD, ACCESS = (v.IBV_REREG_MR_CHANGE_TRANSLATION, v.IBV_REREG_MR_CHANGE_PD,
                     v.IBV_REREG_MR_CHANGE_ACCESS)


@pytest.fixture(params=LINKS)
def link(request) -> Link:
    return make_link(request.param)


def write_to(lk: Link, wr_id: int, addr: int, rkey: int, length: int, src: int = 0) -> SendWR:
    """A signaled RDMA WRITE of `length` bytes at `src` of a's MR to (addr, rkey)."""
    return SendWR(wr_id=wr_id, sg_list=[lk.a.sge(src, length)], opcode=v.IBV_WR_RDMA_WRITE,
                  send_flags=SIG, remote_addr=addr, rkey=rkey)


def test_a_write_lands_in_the_pages_of_the_new_translation(link):
    a, b = link.a, link.b
    old_buf, old_rkey = b.mr.buf, b.mr.rkey
    b.mr.write(b"\xee" * BUF)
    new = user_pages(b.p, 2)
    b.p.store(new, b"\x55" * 2 * 4096)
    assert v.ibv_rereg_mr(b.mr.mr, TRANS, None, new, 2 * 4096, 0) == (0, 0)
    assert b.mr.rkey != old_rkey            # no mkey cache in the model: a new mkey
    a.mr.write(pattern(BUF))
    a.qp.post_send(write_to(link, 1, new + 100, b.mr.rkey, 5000))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    got = b.p.load(new, 2 * 4096)
    assert got[100:5100] == pattern(BUF)[:5000]
    assert got[:100] == b"\x55" * 100 and got[5100:] == b"\x55" * (2 * 4096 - 5100)
    assert b.p.load(old_buf, BUF) == b"\xee" * BUF      # the old pages saw nothing
    # the old key is gone: a WRITE through it is refused
    a.qp.post_send(write_to(link, 2, old_buf, old_rkey, 64))
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert settle(b) == []


def test_remote_write_follows_the_access_the_rereg_gives(link):
    a, b = link.a, link.b
    rkey = b.mr.rkey
    # the link's MRs allow remote write; take it away (a UMR: the same key)
    assert v.ibv_rereg_mr(b.mr.mr, ACCESS, None, 0, 0, LW) == (0, 0)
    assert b.mr.rkey == rkey
    b.mr.write(b"\xee" * 64)
    a.mr.write(pattern(64))
    a.qp.post_send(write_to(link, 1, b.mr.buf, rkey, 64))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]
    assert b.mr.read(64) == b"\xee" * 64


def test_give_remote_write_back_and_the_same_rkey_works(link):
    a, b = link.a, link.b
    rkey = b.mr.rkey
    assert v.ibv_rereg_mr(b.mr.mr, ACCESS, None, 0, 0, LW) == (0, 0)
    assert v.ibv_rereg_mr(b.mr.mr, ACCESS, None, 0, 0, LW | RW) == (0, 0)
    assert b.mr.rkey == rkey
    a.mr.write(pattern(300))
    a.qp.post_send(write_to(link, 1, b.mr.buf + 1000, rkey, 300))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(300, 1000) == pattern(300)


def test_an_mr_moved_to_another_pd_is_out_of_the_qps_reach(link):
    a, b = link.a, link.b
    pd2 = v.ibv_alloc_pd(b.ep.ctx.ctx)
    assert v.ibv_rereg_mr(b.mr.mr, PD, pd2, 0, 0, 0) == (0, 0)
    b.mr.write(b"\xee" * 64)
    a.qp.post_send(write_to(link, 1, b.mr.buf, b.mr.rkey, 64))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]
    assert b.mr.read(64) == b"\xee" * 64
    # back in the QP's PD before teardown (the link's PD is closed after its MR)
    assert v.ibv_rereg_mr(b.mr.mr, PD, b.ep.pd.pd, 0, 0, 0) == (0, 0)
    assert v.ibv_dealloc_pd(pd2) == 0

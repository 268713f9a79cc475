"""Memory windows end to end: the responder binds a window over part of its MR (type 1
with ibv_bind_mw, type 2 with a BIND_MW work request), the requester's RDMA WRITEs
through the window's rkey land in exactly that range, and every way of closing the
window - rebinding to nothing, LOCAL_INV, SEND_WITH_INV, deallocation - shuts it.
Binds the device refuses complete with MW_BIND_ERR; binds libmlx5 refuses return
the errno."""

from __future__ import annotations

import errno

import pytest

from kernel_model.hw.mlx5_engine import WqeError, engine_of
from tests.flows.test_data_path import (
    BUF,
    LINKS,
    SIG,
    Link,
    make_link,
    pattern,
    status,
)
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR

LW, RW, RR = v.IBV_ACCESS_LOCAL_WRITE, v.IBV_ACCESS_REMOTE_WRITE, v.IBV_ACCESS_REMOTE_READ
MR_ACCESS = LW | RW | RR | v.IBV_ACCESS_MW_BIND
PAGE = 4096
QPS_ERR = 6


@pytest.fixture(params=LINKS)
def link(request) -> Link:
    return make_link(request.param, b_kw=dict(mr_access=MR_ACCESS))


def write_to(lk: Link, wr_id: int, addr: int, rkey: int, length: int) -> SendWR:
    return SendWR(wr_id=wr_id, sg_list=[lk.a.sge(0, length)], opcode=v.IBV_WR_RDMA_WRITE,
                  send_flags=SIG, remote_addr=addr, rkey=rkey)


def info(lk: Link, offset: int, length: int, access: int = RW, mr=None) -> v.ibv_mw_bind_info:
    mr = lk.b.mr.mr if mr is None else mr
    return v.ibv_mw_bind_info(mr, mr.addr + offset, length, access)


def bind1(lk: Link, mw, offset: int, length: int, access: int = RW, wr_id: int = 7) -> list:
    """ibv_bind_mw on the responder's QP; its completion(s)."""
    assert v.ibv_bind_mw(lk.b.qp.qp, mw, v.ibv_mw_bind(wr_id, SIG, info(lk, offset, length,
                                                                           access))) == 0
    return lk.b.cq.poll_until(1)


def bind2(lk: Link, mw, offset: int, length: int, access: int = RW, wr_id: int = 8):
    """A BIND_MW work request for a type 2 window; (its completions, the bound rkey)."""
    rkey = v.ibv_inc_rkey(mw.rkey)
    wr = v.ibv_send_wr(wr_id=wr_id, opcode=v.IBV_WR_BIND_MW, send_flags=SIG,
                       bind_mw=v.ibv_bind_mw_wr(mw, rkey, info(lk, offset, length, access)))
    assert v.ibv_post_send(lk.b.qp.qp, wr) == 0
    return lk.b.cq.poll_until(1), rkey


def local_inv(lk: Link, rkey: int, wr_id: int = 9) -> list:
    wr = v.ibv_send_wr(wr_id=wr_id, opcode=v.IBV_WR_LOCAL_INV, send_flags=SIG)
    wr.invalidate_rkey = rkey
    assert v.ibv_post_send(lk.b.qp.qp, wr) == 0
    return lk.b.cq.poll_until(1)


def test_a_type1_window_exposes_exactly_its_range(link):
    a, b = link.a, link.b
    mw = v.ibv_alloc_mw(b.ep.pd.pd, v.IBV_MW_TYPE_1)
    old = mw.rkey
    wcs = bind1(link, mw, PAGE, PAGE)
    assert [(wc.wr_id, wc.status, wc.opcode) for wc in wcs] == [(7, 0, v.IBV_WC_BIND_MW)]
    assert mw.rkey == v.ibv_inc_rkey(old)           # the window took its next key
    b.mr.write(b"\xee" * BUF)
    a.mr.write(pattern(BUF))
    a.qp.post_send(write_to(link, 1, b.mr.buf + PAGE + 10, mw.rkey, 100))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    got = b.mr.read(BUF)
    assert got[PAGE + 10:PAGE + 110] == pattern(100)
    assert got[:PAGE + 10] == b"\xee" * (PAGE + 10) and got[PAGE + 110:] == b"\xee" * \
        (BUF - PAGE - 110)
    # the MR's own rkey still reaches the whole MR; the window's stops at its end
    a.qp.post_send(write_to(link, 2, b.mr.buf + 2 * PAGE - 50, mw.rkey, 100))
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert b.mr.read(100, 2 * PAGE - 50) == b"\xee" * 100
    assert v.ibv_dealloc_mw(mw) == 0


def test_rebinding_a_type1_window_to_nothing_shuts_it(link):
    a, b = link.a, link.b
    mw = v.ibv_alloc_mw(b.ep.pd.pd, v.IBV_MW_TYPE_1)
    bind1(link, mw, 0, PAGE)
    bound = mw.rkey
    assert v.ibv_bind_mw(b.qp.qp, mw, v.ibv_mw_bind(3, SIG, info(link, 0, 0, 0))) == 0
    assert status(b.cq.poll_until(1)) == [(3, "SUCCESS")]
    mk = b.hca.fw.mkeys[bound >> 8]
    assert mk.mkc["free"] == 1 and mw.rkey != bound
    a.qp.post_send(write_to(link, 1, b.mr.buf, bound, 64))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]
    assert v.ibv_dealloc_mw(mw) == 0


def test_a_type2_window_bound_by_a_work_request_then_invalidated_locally(link):
    a, b = link.a, link.b
    mw = v.ibv_alloc_mw(b.ep.pd.pd, v.IBV_MW_TYPE_2)
    wcs, rkey = bind2(link, mw, 0, 2 * PAGE, RW | RR)
    assert [(wc.wr_id, wc.status, wc.opcode) for wc in wcs] == [(8, 0, v.IBV_WC_BIND_MW)]
    mk = b.hca.fw.mkeys[rkey >> 8]
    assert (mk.mkc["qpn"], mk.mkey, mk.mkc["rr"]) == (b.qp.qp_num, rkey, 1)
    a.mr.write(pattern(64))
    a.qp.post_send(write_to(link, 1, b.mr.buf + 500, rkey, 64))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(64, 500) == pattern(64)
    # a type 2 window serves only the QP it is bound to
    eng = engine_of(b.hca)
    with pytest.raises(WqeError, match="bound to QP"):
        eng._mw_qp_check(rkey, b.qp.qp_num + 1)
    eng._mw_qp_check(rkey, b.qp.qp_num)        # its own QP: fine
    wcs = local_inv(link, rkey)
    assert [(wc.wr_id, wc.status, wc.opcode) for wc in wcs] == [(9, 0, v.IBV_WC_LOCAL_INV)]
    assert mk.mkc["free"] == 1
    a.qp.post_send(write_to(link, 2, b.mr.buf, rkey, 64))
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert v.ibv_dealloc_mw(mw) == 0


def test_send_with_invalidate_frees_the_responders_window(link):
    a, b = link.a, link.b
    mw = v.ibv_alloc_mw(b.ep.pd.pd, v.IBV_MW_TYPE_2)
    _, rkey = bind2(link, mw, 0, PAGE)
    b.recv(1, 0, 64)
    a.mr.write(b"hello")
    wr = SendWR(wr_id=2, sg_list=[a.sge(0, 5)], opcode=v.IBV_WR_SEND_WITH_INV, send_flags=SIG)
    wr.imm_data = rkey                          # the union: wr.invalidate_rkey
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    (wc,) = b.cq.poll_until(1)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, 0, v.IBV_WC_RECV, 5)
    assert wc.wc_flags & v.IBV_WC_WITH_INV and wc.imm_data == rkey
    assert b.mr.read(5) == b"hello"
    assert b.hca.fw.mkeys[rkey >> 8].mkc["free"] == 1
    a.qp.post_send(write_to(link, 3, b.mr.buf, rkey, 64))
    assert status(a.cq.poll_until(1)) == [(3, "REM_ACCESS_ERR")]
    assert v.ibv_dealloc_mw(mw) == 0


def test_send_with_invalidate_of_a_key_that_is_not_a_bound_type2_window(link):
    a, b = link.a, link.b
    b.recv(1, 0, 64)
    wr = SendWR(wr_id=2, sg_list=[a.sge(0, 5)], opcode=v.IBV_WR_SEND_WITH_INV, send_flags=SIG)
    wr.imm_data = b.mr.rkey                     # an MR: not remotely invalidatable
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(2, "REM_OP_ERR")]
    assert b.hca.fw.mkeys[b.mr.rkey >> 8].mkc["free"] == 0


def test_deallocating_a_bound_window_kills_its_rkey(link):
    a, b = link.a, link.b
    mw = v.ibv_alloc_mw(b.ep.pd.pd, v.IBV_MW_TYPE_2)
    _, rkey = bind2(link, mw, 0, PAGE)
    assert v.ibv_dealloc_mw(mw) == 0
    a.qp.post_send(write_to(link, 1, b.mr.buf, rkey, 64))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]


@pytest.mark.parametrize("case", ["bound_twice", "inv_unbound", "no_local_write",
                                  "outside_mr", "other_pd"])
def test_binds_the_device_refuses_complete_with_mw_bind_err(link, case):
    b = link.b
    pd = b.ep.pd.pd
    if case == "bound_twice":
        mw = v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_2)
        bind2(link, mw, 0, PAGE)
        wcs, _ = bind2(link, mw, 0, PAGE, wr_id=10)           # CHECK_FREE
    elif case == "inv_unbound":
        mw = v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_2)
        wcs = local_inv(link, mw.rkey, wr_id=10)               # CHECK_QPN: not bound
    elif case == "no_local_write":
        ro = v.ibv_reg_mr(pd, b.mr.buf, PAGE, v.IBV_ACCESS_MW_BIND)
        mw = v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_2)
        rkey = v.ibv_inc_rkey(mw.rkey)
        wr = v.ibv_send_wr(wr_id=10, opcode=v.IBV_WR_BIND_MW, send_flags=SIG,
                           bind_mw=v.ibv_bind_mw_wr(mw, rkey, info(link, 0, PAGE, RW, ro)))
        assert v.ibv_post_send(b.qp.qp, wr) == 0
        wcs = b.cq.poll_until(1)
    elif case == "outside_mr":
        mw = v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_1)
        assert v.ibv_bind_mw(b.qp.qp, mw, v.ibv_mw_bind(10, SIG, info(
            link, BUF - PAGE, 2 * PAGE))) == 0
        wcs = b.cq.poll_until(1)
    else:
        pd2 = v.ibv_alloc_pd(b.ep.ctx.ctx)
        mr2 = v.ibv_reg_mr(pd2, b.mr.buf, PAGE, MR_ACCESS)
        mw = v.ibv_alloc_mw(pd2, v.IBV_MW_TYPE_1)              # window and MR in pd2,
        assert v.ibv_bind_mw(b.qp.qp, mw, v.ibv_mw_bind(      # the QP in pd
            10, SIG, info(link, 0, PAGE, RW, mr2))) == 0
        wcs = b.cq.poll_until(1)
    assert status(wcs) == [(10, "MW_BIND_ERR")]
    assert b.fw_state() == QPS_ERR              # a completion error: the QP is in ERR
    assert v.ibv_dealloc_mw(mw) == 0
    if case == "no_local_write":
        assert v.ibv_dereg_mr(ro) == 0
    if case == "other_pd":
        assert v.ibv_dereg_mr(mr2) == 0 and v.ibv_dealloc_pd(pd2) == 0


def test_binds_libmlx5_refuses(link):
    b = link.b
    pd, qp = b.ep.pd.pd, b.qp.qp
    mw1 = v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_1)
    mw2 = v.ibv_alloc_mw(pd, v.IBV_MW_TYPE_2)
    pd2 = v.ibv_alloc_pd(b.ep.ctx.ctx)
    mr2 = v.ibv_reg_mr(pd2, b.mr.buf, PAGE, MR_ACCESS)

    def bind(mw, bind_info):
        return v.ibv_bind_mw(qp, mw, v.ibv_mw_bind(1, SIG, bind_info))
    assert bind(mw2, info(link, 0, PAGE)) == errno.EINVAL                 # type 2: a WR
    assert bind(mw1, v.ibv_mw_bind_info(None, 0x1000, PAGE, RW)) == errno.EINVAL
    assert bind(mw1, info(link, 0, PAGE, RW | v.IBV_ACCESS_ZERO_BASED)) == errno.EINVAL
    assert bind(mw1, info(link, 0, PAGE, RW, mr2)) == errno.EPERM
    dmabuf_like = v.ibv_mr(b.mr.mr.context, pd, b.mr.buf, PAGE, 0, b.mr.lkey, b.mr.rkey,
                           v.IBV_MR_TYPE_DMABUF_MR)
    assert bind(mw1, info(link, 0, PAGE, RW, dmabuf_like)) == errno.ENOTSUP
    assert bind(mw1, info(link, 0, (1 << 31) + 1)) == errno.EOPNOTSUPP
    assert b.cq.poll(4) == [] and mw1.rkey == b.hca.fw.mkeys[mw1.rkey >> 8].mkey
    for mw in (mw1, mw2):
        assert v.ibv_dealloc_mw(mw) == 0
    assert v.ibv_dereg_mr(mr2) == 0 and v.ibv_dealloc_pd(pd2) == 0


# -- the new post-send API (ibv_wr_bind_mw, ibv_wr_local_inv, ibv_wr_send_inv) -----------------
@pytest.mark.parametrize("kind", LINKS)
def test_the_new_post_send_api_binds_and_invalidates(kind):
    from tests.flows.test_atomic_qpex_flow import ALL_RC_OPS, ATOMIC_ACCESS, make_pair
    from userspace.providers.mlx5 import qp_ex as mx
    ops = ALL_RC_OPS | mx.IBV_QP_EX_WITH_BIND_MW | mx.IBV_QP_EX_WITH_LOCAL_INV | \
        mx.IBV_QP_EX_WITH_SEND_WITH_INV
    a, b = make_pair(kind, b_mr=ATOMIC_ACCESS | v.IBV_ACCESS_MW_BIND, ops=ops)
    mw = v.ibv_alloc_mw(b.pd.pd, v.IBV_MW_TYPE_2)
    rkey = v.ibv_inc_rkey(mw.rkey)
    bx = b.qpx

    def post(qx, wr_id: int, build) -> int:
        v.ibv_wr_start(qx)
        qx.wr_id, qx.wr_flags = wr_id, SIG
        build(qx)
        return v.ibv_wr_complete(qx)
    bind = v.ibv_mw_bind_info(b.mr.mr, b.mr.buf, PAGE, RW)
    assert post(bx, 5, lambda q: v.ibv_wr_bind_mw(q, mw, rkey, bind)) == 0
    assert [(wc.wr_id, wc.status, wc.opcode) for wc in b.cq.poll_until(1)] == \
        [(5, 0, v.IBV_WC_BIND_MW)]
    a.mr.write(pattern(32))
    a.qp.post_send(v.ibv_send_wr(wr_id=1, sg_list=[v.ibv_sge(a.mr.buf, 32, a.mr.lkey)],
                                 opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                                 remote_addr=b.mr.buf + 64, rkey=rkey))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(32, 64) == pattern(32)
    assert post(bx, 6, lambda q: v.ibv_wr_local_inv(q, rkey)) == 0
    assert [(wc.wr_id, wc.opcode) for wc in b.cq.poll_until(1)] == [(6, v.IBV_WC_LOCAL_INV)]
    # bound again, then invalidated by the requester's SEND_WITH_INV
    assert post(bx, 7, lambda q: v.ibv_wr_bind_mw(q, mw, rkey, bind)) == 0
    b.cq.poll_until(1)
    b.qp.post_recv(v.ibv_recv_wr(wr_id=8, sg_list=[v.ibv_sge(b.mr.buf, 64, b.mr.lkey)]))

    def send_inv(q) -> None:
        v.ibv_wr_send_inv(q, rkey)
        v.ibv_wr_set_sge(q, a.mr.lkey, a.mr.buf, 4)
    assert post(a.qpx, 9, send_inv) == 0
    assert status(a.cq.poll_until(1)) == [(9, "SUCCESS")]
    (wc,) = b.cq.poll_until(1)
    assert wc.wr_id == 8 and wc.wc_flags & v.IBV_WC_WITH_INV and wc.imm_data == rkey
    # libmlx5's checks, reported by wr_complete (nothing posted)
    pd2 = v.ibv_alloc_pd(b.ctx.ctx)
    mr2 = v.ibv_reg_mr(pd2, b.mr.buf, PAGE, MR_ACCESS)
    for info_, err in [(v.ibv_mw_bind_info(mr2, b.mr.buf, PAGE, RW), errno.EPERM),
                       (v.ibv_mw_bind_info(None, b.mr.buf, PAGE, RW), errno.EINVAL),
                       (v.ibv_mw_bind_info(b.mr.mr, b.mr.buf, PAGE,
                                           RW | v.IBV_ACCESS_ZERO_BASED), errno.EINVAL),
                       (v.ibv_mw_bind_info(b.mr.mr, b.mr.buf, (1 << 31) + 1, RW),
                        errno.EOPNOTSUPP)]:
        assert post(bx, 10, lambda q, i=info_: v.ibv_wr_bind_mw(q, mw, rkey, i)) == err
    assert b.cq.poll(4) == []
    assert v.ibv_dereg_mr(mr2) == 0 and v.ibv_dealloc_pd(pd2) == 0
    assert v.ibv_dealloc_mw(mw) == 0


def test_a_bind_mw_work_request_without_a_window_is_einval(link):
    wr = v.ibv_send_wr(wr_id=1, opcode=v.IBV_WR_BIND_MW, send_flags=SIG)
    bad: list = []
    assert v.ibv_post_send(link.b.qp.qp, wr, bad) == errno.EINVAL and bad == [wr]
    assert link.b.cq.poll(4) == []

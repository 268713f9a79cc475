"""Tests for XRC: OPEN_XRCD / CLOSE_XRCD with the inode-based sharing (ib_uverbs_open_xrcd,
uverbs_free_xrcd), mlx5_ib_alloc_xrcd and the firmware's ALLOC_XRCD / DEALLOC_XRCD, XRC
SRQs (CREATE_XSRQ), XRC target and initiator QPs, and the regular files of the
emulated VFS the domains are shared through (kernel_model/fs.py)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.fs import O_CREAT, O_EXCL, O_RDONLY
from kernel_model.hw.mlx5 import Mlx5Config
from tests.drivers.mlx5_ib.ladder import errno_of, fw, host, last_error, open_ctx
from userspace.libibverbs import verbs as v

FD_OFLAGS = v.IBV_XRCD_INIT_ATTR_FD | v.IBV_XRCD_INIT_ATTR_OFLAGS


def _open(ctx, fd: int, oflags: int = O_CREAT, comp_mask: int = FD_OFLAGS):
    return v.ibv_open_xrcd(ctx, v.ibv_xrcd_init_attr(comp_mask, fd, oflags))


def _xsrq(ctx, pd, xrcd, cq, max_wr: int = 8):
    return v.ibv_create_srq_ex(ctx, v.ibv_srq_init_attr_ex(
        attr=v.ibv_srq_attr(max_wr, 1), pd=pd, xrcd=xrcd, cq=cq, srq_type=v.IBV_SRQT_XRC,
        comp_mask=v.IBV_SRQ_INIT_ATTR_TYPE | v.IBV_SRQ_INIT_ATTR_PD | v.IBV_SRQ_INIT_ATTR_CQ
        | v.IBV_SRQ_INIT_ATTR_XRCD))


def _tgt(ctx, xrcd):
    return v.ibv_create_qp_ex(ctx, v.ibv_qp_init_attr_ex(
        qp_type=v.IBV_QPT_XRC_RECV, comp_mask=v.IBV_QP_INIT_ATTR_XRCD, xrcd=xrcd))


@pytest.fixture
def res(app):
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)


# -- the emulated VFS's regular files ----------------------------------------------------
def test_a_regular_file_is_made_by_o_creat_and_keeps_its_inode(app):
    p, _ctx = app
    assert p.open("/tmp/xrc-a", O_RDONLY) == -errno.ENOENT
    fd1 = p.open("/tmp/xrc-a", O_RDONLY | O_CREAT)
    fd2 = p.open("/tmp/xrc-a", O_RDONLY)
    files = p.task.files.fdt
    assert fd1 >= 0 and fd2 >= 0 and files[fd1].f_inode is files[fd2].f_inode
    assert p.open("/tmp/xrc-a", O_RDONLY | O_CREAT | O_EXCL) == -errno.EEXIST
    q = p.machine.spawn("other")
    fd3 = q.open("/tmp/xrc-a", O_RDONLY)
    assert q.task.files.fdt[fd3].f_inode is files[fd1].f_inode      # one inode per path
    q.exit(0)


# -- OPEN_XRCD / CLOSE_XRCD ----------------------------------------------------------------
def test_processes_share_a_domain_through_a_file(m):
    a, b = m.spawn("a"), m.spawn("b")
    ca, cb = open_ctx(a), open_ctx(b)
    fa, fb = a.open("/tmp/dom", O_RDONLY | O_CREAT), b.open("/tmp/dom", O_RDONLY)
    xa = _open(ca, fa)
    xb = _open(cb, fb, oflags=0)                     # found through the inode
    assert len(fw(m).xrcds) == 1
    assert v.ibv_close_xrcd(xa) == 0 and len(fw(m).xrcds) == 1
    assert v.ibv_close_xrcd(xb) == 0 and not fw(m).xrcds
    xc = _open(cb, fb)                               # out of the table: a new domain
    assert len(fw(m).xrcds) == 1 and v.ibv_close_xrcd(xc) == 0
    a.exit(0)
    b.exit(0)


@pytest.mark.parametrize("case,err", [("bad_fd", errno.EBADF), ("no_creat", errno.EAGAIN),
                                      ("excl", errno.EINVAL)])
def test_open_xrcd_errors(res, case, err):
    p, ctx, _pd, _cq = res
    fd = p.open("/tmp/xrc-e", O_RDONLY | O_CREAT)
    if case == "bad_fd":
        fd, oflags = 77, O_CREAT
    elif case == "no_creat":
        oflags = 0
    else:
        _open(ctx, fd)
        oflags = O_CREAT | O_EXCL
    before = dict(fw(p.machine).xrcds)
    assert errno_of(_open, ctx, fd, oflags) == err
    assert fw(p.machine).xrcds == before
    assert "ib_uverbs_open_xrcd" in last_error(p)


@pytest.mark.parametrize("comp_mask,err", [(FD_OFLAGS | v.IBV_XRCD_INIT_ATTR_RESERVED,
                                            errno.EOPNOTSUPP),
                                           (v.IBV_XRCD_INIT_ATTR_FD, errno.EINVAL)])
def test_libibverbs_checks_the_comp_mask(res, comp_mask, err):
    _p, ctx, _pd, _cq = res
    assert errno_of(_open, ctx, -1, O_CREAT, comp_mask) == err


def test_a_device_without_xrc_has_no_xrcd():
    m = host(hca=Mlx5Config(caps={"xrc": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    assert errno_of(_open, ctx, -1) == errno.EOPNOTSUPP
    assert "mlx5_ib_alloc_xrcd" in last_error(p)
    p.exit(0)


def test_a_domain_in_use_cannot_be_closed(res):
    p, ctx, pd, cq = res
    xrcd = _open(ctx, -1)
    srq = _xsrq(ctx, pd, xrcd, cq)
    qp = _tgt(ctx, xrcd)
    assert v.ibv_close_xrcd(xrcd) == errno.EBUSY
    assert v.ibv_destroy_qp(qp) == 0
    assert v.ibv_close_xrcd(xrcd) == errno.EBUSY         # the SRQ still
    assert v.ibv_destroy_srq(srq) == 0
    assert v.ibv_close_xrcd(xrcd) == 0 and not fw(p.machine).xrcds


def test_exit_tears_a_domain_down_after_its_srqs_and_qps(m):
    p = m.spawn("quitter")
    ctx = open_ctx(p)
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
    fd = p.open("/tmp/q", O_RDONLY | O_CREAT)
    xrcd = _open(ctx, fd)
    _xsrq(ctx, pd, xrcd, cq)
    _tgt(ctx, xrcd)
    p.exit(0)
    assert not fw(m).xrcds and not fw(m).srqs and not fw(m).qps


# -- XRC SRQs and QPs ------------------------------------------------------------------------
def test_an_xrc_srq_is_the_kernels_and_names_its_domain_cq_and_user_index(res):
    p, ctx, pd, cq = res
    xrcd = _open(ctx, -1)
    srq = _xsrq(ctx, pd, xrcd, cq)
    f = fw(p.machine)
    s = f.srqs[srq.srqn]
    assert s.uid == 0 and s.srqc["xrcd"] in f.xrcds and s.srqc["cqn"] == cq.cqn
    assert s.srqc["user_index"] == srq.uidx and ctx.uidx_table[srq.uidx] is srq
    assert srq.srq_num == srq.srqn                   # the core's response names it
    assert v.ibv_destroy_srq(srq) == 0 and srq.uidx not in ctx.uidx_table


@pytest.mark.parametrize("bad", ["xrcd", "cq"])
def test_an_xrc_srq_needs_its_domain_and_cq(res, bad):
    p, ctx, pd, cq = res
    xrcd = _open(ctx, -1)
    fake = type(xrcd)(ctx, 99) if bad == "xrcd" else type(cq)(ctx, 99, 16)
    before = dict(fw(p.machine).srqs)
    assert errno_of(_xsrq, ctx, pd, fake if bad == "xrcd" else xrcd,
                    fake if bad == "cq" else cq) == errno.EINVAL
    assert fw(p.machine).srqs == before


def test_a_basic_qp_cannot_take_an_xrc_srq(res):
    p, ctx, pd, cq = res
    srq = _xsrq(ctx, pd, _open(ctx, -1), cq)
    before = dict(fw(p.machine).qps)
    assert errno_of(v.ibv_create_qp, pd, v.ibv_qp_init_attr(cq, cq, srq, v.ibv_qp_cap(1, 0),
                                                             v.IBV_QPT_RC)) == errno.EINVAL
    assert fw(p.machine).qps == before


def test_xrc_qps_have_the_queues_their_role_needs(res):
    p, ctx, pd, cq = res
    xrcd = _open(ctx, -1)
    tgt = _tgt(ctx, xrcd)
    ini = v.ibv_create_qp_ex(ctx, v.ibv_qp_init_attr_ex(
        cq, cq, None, v.ibv_qp_cap(4, 0, 1, 0), v.IBV_QPT_XRC_SEND,
        comp_mask=v.IBV_QP_INIT_ATTR_PD, pd=pd))
    f = fw(p.machine)
    t, i = f.qps[tgt.qp_num].qpc, f.qps[ini.qp_num].qpc
    assert (t["st"], t["no_sq"], t["rq_type"], t["pd"]) == (3, 1, 1, 0)
    assert t["xrcd"] in f.xrcds and f.qps[tgt.qp_num].uid == 0
    assert (i["st"], i["no_sq"], i["rq_type"], i["log_rq_size"]) == (3, 0, 3, 0)
    assert ini.rq.wqe_cnt == 0                       # the kernel takes no receive side
    bogus = v.ibv_xrcd(ctx, 77)
    assert errno_of(_tgt, ctx, bogus) == errno.EINVAL

"""userspace/providers/mlx5 (verbs.py, wqsize.py, qp.py): caps and lengths as C holds them.

rdma-core keeps the caller's capabilities in uint32_t, its sizes in int and
mixes them with size_t; what it computes wraps, and it creates the QP anyway
(max_send_sge 0, max_inline_data 0 gives max_inline_data (u32)-4).  No value a
caller passes may raise a Python exception out of the provider: each gives
what rdma-core gives, or the errno it returns.
"""

from __future__ import annotations

import itertools
import time

import pytest

from drivers.ib_core.cache import make_default_gid
from tests.drivers.mlx5_ib.ladder import (
    RC_ACCESS,
    RC_INIT_MASK,
    RC_RTR_MASK,
    RC_RTS_MASK,
    fw,
    host,
    init_attr,
    rtr_attr,
    rts_attr,
    user_pages,
)
from userspace.libibverbs import verbs as v

ODD = (0, 1, 2**31, 2**32 - 1, -1, -(2**31), 2**40)


@pytest.fixture
def rig():
    m = host()
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    yield p, ctx, pd, cq
    p.exit(0)


def _qp(pd, cq, qp_type=v.IBV_QPT_RC, **caps):
    cap = v.ibv_qp_cap(**{**dict(max_send_wr=4, max_recv_wr=4, max_send_sge=1,
                                 max_recv_sge=1, max_inline_data=0), **caps})
    return v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq, cap=cap,
                                                  qp_type=qp_type)), cap


@pytest.mark.parametrize("qp_type", [v.IBV_QPT_RC, v.IBV_QPT_UD])
def test_no_sge_and_no_inline_gives_inline_minus_four_and_a_qp(rig, qp_type):
    """The WQE is the overhead alone, so the inline room is 64k - overhead - 4 = -4:
    the QP's int holds -4, the caller's uint32_t cap 0xfffffffc."""
    p, ctx, pd, cq = rig
    qp, cap = _qp(pd, cq, qp_type, max_send_sge=0, max_inline_data=0)
    assert qp.max_inline_data == -4
    assert cap.max_inline_data == 0xFFFFFFFC
    assert qp.sq.max_gs == 0 and qp.qp_num


def test_inline_near_2_to_the_32_wraps_to_a_small_wqe(rig):
    """inl_size = size + align(4 + 0xffffffff, 16) is computed in unsigned long and
    stored in an int: 0x1_0000_0010 + 192 wraps to 208, so the WQE is 4 basic
    blocks (256) and the QP reports 60 bytes of inline data."""
    p, ctx, pd, cq = rig
    qp, cap = _qp(pd, cq, max_inline_data=2**32 - 1)
    assert qp.max_inline_data == 256 - 192 - 4
    assert cap.max_inline_data == 60


def test_odd_caps_never_raise_anything_but_an_errno(rig):
    p, ctx, pd, cq = rig
    made = 0
    for field, value in itertools.product(("max_send_wr", "max_recv_wr", "max_send_sge",
                                           "max_recv_sge", "max_inline_data"), ODD):
        try:
            qp, _ = _qp(pd, cq, **{field: value})
        except OSError as e:
            assert e.errno, (field, value)
            continue
        made += 1
        assert v.ibv_destroy_qp(qp) == 0
    assert made >= 10


@pytest.mark.parametrize("cqe", ODD)
def test_odd_cq_sizes_never_raise_anything_but_an_errno(rig, cqe):
    p, ctx, pd, cq = rig
    try:
        new = v.ibv_create_cq(ctx, cqe)
    except OSError as e:
        assert e.errno
    else:
        assert v.ibv_destroy_cq(new) == 0


@pytest.mark.parametrize("length, access", [(-1, v.IBV_ACCESS_LOCAL_WRITE), (2**64 + 4096, 1),
                                            (4096, -1), (4096, 2**40)])
def test_odd_mr_arguments_never_raise_anything_but_an_errno(rig, length, access):
    p, ctx, pd, cq = rig
    try:
        mr = v.ibv_reg_mr(pd, user_pages(p), length, access)
    except OSError as e:
        assert e.errno
    else:
        assert v.ibv_dereg_mr(mr) == 0


@pytest.mark.parametrize("field", ["qkey", "rq_psn", "pkey_index", "port_num", "timeout",
                                   "max_dest_rd_atomic", "min_rnr_timer", "qp_access_flags"])
@pytest.mark.parametrize("value", [-1, 2**32 + 1, 2**64])
def test_odd_modify_attributes_never_raise_anything_but_an_errno(rig, field, value):
    p, ctx, pd, cq = rig
    qp, _ = _qp(pd, cq)
    attr = init_attr()
    setattr(attr, field, value)
    assert isinstance(v.ibv_modify_qp(qp, attr, RC_INIT_MASK | v.IBV_QP_QKEY), int)


def _rts_qp(p, ctx, pd, cq, **caps):
    qp, _ = _qp(pd, cq, **caps)
    gid = make_default_gid(fw(p.machine).vport.mac.to_bytes(6, "big"))
    for attr, mask in ((init_attr(), RC_INIT_MASK), (rtr_attr(gid, qp.qp_num), RC_RTR_MASK),
                       (rts_attr(), RC_RTS_MASK)):
        assert v.ibv_modify_qp(qp, attr, mask) == 0
    return qp


def test_inline_beyond_max_inline_fails_before_reading_the_sge(rig):
    """A 2 GiB inline SGE: ENOMEM at once, without loading a byte of it (the load
    of 2 GiB took 30 s and 2 GiB of memory)."""
    p, ctx, pd, cq = rig
    qp = _rts_qp(p, ctx, pd, cq, max_inline_data=64)
    loads = []
    real_load = p.load
    p.load = lambda addr, n: loads.append(n) or real_load(addr, n)
    buf = user_pages(p)
    mr = v.ibv_reg_mr(pd, buf, 4096, RC_ACCESS)
    for lengths in ([2**31], [2**32 - 1], [32, 2**31 - 1], [60, 60]):
        wr = v.ibv_send_wr(wr_id=1, opcode=v.IBV_WR_SEND, send_flags=v.IBV_SEND_INLINE,
                           sg_list=[v.ibv_sge(buf, n, mr.lkey) for n in lengths])
        start = time.monotonic()
        assert v.ibv_post_send(qp, wr) == 12, lengths          # ENOMEM
        assert time.monotonic() - start < 1
    assert max(loads, default=0) <= 64
    p.load = real_load


def test_zero_length_inline_sge_on_a_qp_without_inline_room_is_enomem(rig):
    """max_inline_data is -4 (no SGE, no inline asked): set_data_inl_seg's 0 > -4."""
    p, ctx, pd, cq = rig
    qp = _rts_qp(p, ctx, pd, cq, max_send_sge=0, max_inline_data=0)
    wr = v.ibv_send_wr(wr_id=1, opcode=v.IBV_WR_SEND, send_flags=v.IBV_SEND_INLINE,
                       sg_list=[v.ibv_sge(user_pages(p), 0, 0)])
    assert v.ibv_post_send(qp, wr) == 12


def test_odd_sge_fields_never_raise(rig):
    p, ctx, pd, cq = rig
    qp = _rts_qp(p, ctx, pd, cq, max_send_sge=2)
    buf = user_pages(p)
    for length, lkey, addr in ((-1, -1, -1), (2**33, 2**40, 2**70), (8, 0, buf)):
        wr = v.ibv_send_wr(wr_id=-1, opcode=v.IBV_WR_RDMA_WRITE, remote_addr=-1, rkey=-1,
                           sg_list=[v.ibv_sge(addr, length, lkey)])
        assert isinstance(v.ibv_post_send(qp, wr), int)
        rwr = v.ibv_recv_wr(wr_id=1, sg_list=[v.ibv_sge(addr, length, lkey)])
        assert isinstance(v.ibv_post_recv(qp, rwr), int)

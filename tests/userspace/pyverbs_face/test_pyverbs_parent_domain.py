"""userspace/pyverbs ParentDomain (ibv_alloc_parent_domain, libmlx5's custom allocators):
the Python allocator is asked for each QP, CQ and SRQ buffer and doorbell record with
the right resource type, size and alignment; the objects live where it said (the
kernel pinned those addresses and the HCA moved a message through them); the default
marker falls back to libmlx5's own memory; NULL, EBUSY and EINVAL paths; everything
given back through free_func."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
import userspace.pyverbs.mem_alloc as mem
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_cq as vcq
from userspace.libibverbs.driver import verbs_context_ops
from userspace.libibverbs.verbs_types import ibv_parent_domain_init_attr
from userspace.providers.mlx5.buf import (
    MLX5_ALLOC_TYPE_ANON,
    MLX5_ALLOC_TYPE_CUSTOM,
    MLX5DV_RES_TYPE_CQ,
    MLX5DV_RES_TYPE_DBR,
    MLX5DV_RES_TYPE_QP,
    MLX5DV_RES_TYPE_SRQ,
)
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ, CQEX, CqInitAttrEx, PollCqAttr
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD, ParentDomain, ParentDomainContext, ParentDomainInitAttr
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from userspace.pyverbs.wr import SGE, RecvWR, SendWR

PAGE = 4096
MSG = b"through the application's own rings"


def rc_pair(ctx: d.Context, pd: PD, cq) -> tuple[QP, QP]:
    qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)),
              QPAttr()) for _ in range(2)]
    gid = ctx.query_gid(1, 0)
    for me, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
        attr = QPAttr()
        attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
        me.to_rts(attr)
    return qps[0], qps[1]


def send(pd: PD, a: QP, b: QP) -> MR:
    src, dst = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE), MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    src.write(MSG, len(MSG))
    b.post_recv(RecvWR(wr_id=2, num_sge=1, sg=[SGE(dst.buf, 64, dst.lkey)]))
    a.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                       sg=[SGE(src.buf, len(MSG), src.lkey)], send_flags=e.IBV_SEND_SIGNALED))
    return dst


def poll_two(cq: CQEX) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    for _ in range(20_000):
        if cq.start_poll(PollCqAttr()) == 0:
            seen.append((cq.wr_id, cq.status))
            while cq.poll_next() == 0:
                seen.append((cq.wr_id, cq.status))
            cq.end_poll()
        if len(seen) == 2:
            break
    return sorted(seen)


class Recorder:
    """Allocators that record every call; `answer` decides what alloc returns."""

    def __init__(self, answer=None) -> None:
        self.allocs: list[tuple[int, int, int, int]] = []   # (size, align, type, addr)
        self.frees: list[tuple[int, int]] = []               # (ptr, type)
        self.answer = answer
        self.pds: list = []

    def alloc(self, pd, context, size, alignment, resource_type):
        self.pds.append((pd, context))
        if self.answer is not None:
            addr = self.answer(size, alignment, resource_type)
        else:
            addr = mem.posix_memalign(size, alignment)
        self.allocs.append((size, alignment, resource_type, addr))
        return addr

    def free(self, pd, context, ptr, resource_type):
        self.frees.append((ptr, resource_type))
        mem.free(ptr)

    def given(self, resource_type: int) -> list[int]:
        return [a[3] for a in self.allocs if a[2] == resource_type]


def parent_domain(ctx: d.Context, pd: PD, rec: Recorder | None) -> ParentDomain:
    pd_ctx = ParentDomainContext(pd, rec.alloc, rec.free, "data") if rec else None
    return ParentDomain(ctx, attr=ParentDomainInitAttr(pd=pd, pd_context=pd_ctx))


def cqex_on(ctx: d.Context, pdom: ParentDomain, cqe: int = 100) -> CQEX:
    return CQEX(ctx, CqInitAttrEx(cqe=cqe, wc_flags=e.IBV_WC_STANDARD_FLAGS,
                                  parent_domain=pdom, comp_mask=e.IBV_CQ_INIT_ATTR_MASK_FLAGS
                                  | e.IBV_CQ_INIT_ATTR_MASK_PD))


def test_init_attr_sets_both_comp_mask_bits_only_with_a_context():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        assert ParentDomainInitAttr(pd=pd).comp_mask == 0
        pd_ctx = ParentDomainContext(pd, print, print, user_data=7)
        assert pd_ctx.user_data == 7
        attr = ParentDomainInitAttr(pd=pd, pd_context=pd_ctx)
        assert attr.comp_mask == (e.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT
                                  | e.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS)
        with pytest.raises(TypeError):
            ParentDomainInitAttr(pd=None)


def test_without_allocators_the_parent_domain_is_its_pd_to_the_kernel():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, None)
        assert pdom.handle == pd.handle and pdom.pd.pdn == pd.pd.pdn
        cq = CQ(ctx, 16, None, None, 0)
        qp = QP(pdom, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)))
        assert qp.qp.buf_type == MLX5_ALLOC_TYPE_ANON and not qp.qp.custom_db
        ctx.close()                      # the QP, the parent domain, then the PD
        assert pdom._closed and pd._closed


def test_the_allocator_is_asked_for_each_buffer_with_type_size_and_alignment():
    rec = Recorder()
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        cq = cqex_on(ctx, pdom, cqe=100)                 # 128 CQEs of 64 bytes
        assert [a[:3] for a in rec.allocs] == [(128 * 64, PAGE, MLX5DV_RES_TYPE_CQ),
                                               (8, 8, MLX5DV_RES_TYPE_DBR)]
        assert cq.cq.buf == rec.given(MLX5DV_RES_TYPE_CQ)[0]
        assert cq.cq.dbrec == rec.given(MLX5DV_RES_TYPE_DBR)[0]
        assert cq.cq.buf_type == MLX5_ALLOC_TYPE_CUSTOM and cq.cq.custom_db
        del rec.allocs[:]
        qp = QP(pdom, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)))
        (size, align, kind, addr), (dsize, dalign, dkind, daddr) = rec.allocs
        assert (kind, dkind, dsize, dalign) == (MLX5DV_RES_TYPE_QP, MLX5DV_RES_TYPE_DBR, 8, 8)
        assert (qp.qp.buf, qp.qp.db) == (addr, daddr)
        # the size, rounded up to the alignment libmlx5 asks for (a power of two)
        assert align & (align - 1) == 0 and size % align == 0 and size >= qp.qp.buf_size
        assert rec.pds[-1][0] is pd and rec.pds[-1][1].user_data == "data"
        del rec.allocs[:]
        srq = SRQ(pdom, SrqInitAttr(SrqAttr(max_wr=60, max_sge=1)))
        assert [a[:3] for a in rec.allocs] == [(64 * 32, PAGE, MLX5DV_RES_TYPE_SRQ),
                                               (8, 8, MLX5DV_RES_TYPE_DBR)]
        assert (srq.srq.buf, srq.srq.db) == (rec.allocs[0][3], rec.allocs[1][3])
        srq_given = {(a[3], a[2]) for a in rec.allocs}
        qp.close()                        # its record, then its buffer, by type
        assert rec.frees == [(daddr, MLX5DV_RES_TYPE_DBR), (addr, MLX5DV_RES_TYPE_QP)]
        srq.close()
        assert set(rec.frees[2:]) == srq_given
        cq.close()
        assert len(rec.frees) == 6        # every buffer and record went back, once
        assert not mem._blocks


def test_a_message_moves_through_the_application_buffers():
    rec = Recorder()
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        cq = cqex_on(ctx, pdom)
        a, b = rc_pair(ctx, pdom, cq)
        assert {a.qp.buf, b.qp.buf} <= set(rec.given(MLX5DV_RES_TYPE_QP))
        dst = send(pdom, a, b)
        assert poll_two(cq) == [(1, e.IBV_WC_SUCCESS), (2, e.IBV_WC_SUCCESS)]
        assert dst.read(len(MSG), 0) == MSG
        assert cq.cq.buf in rec.given(MLX5DV_RES_TYPE_CQ)
        ctx.close()
    assert len(rec.frees) == len(rec.allocs) and not mem._blocks


def test_the_default_marker_falls_back_to_libmlx5_memory():
    rec = Recorder(answer=lambda size, align, kind: e._IBV_ALLOCATOR_USE_DEFAULT)
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        cq = cqex_on(ctx, pdom)
        qp = QP(pdom, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)))
        assert {a[2] for a in rec.allocs} == {MLX5DV_RES_TYPE_CQ, MLX5DV_RES_TYPE_QP,
                                              MLX5DV_RES_TYPE_DBR}
        assert qp.qp.buf_type == cq.cq.buf_type == MLX5_ALLOC_TYPE_ANON
        assert not qp.qp.custom_db and not cq.cq.custom_db
        ctx.close()
    assert rec.frees == []               # nothing of the application's to give back


@pytest.mark.parametrize("fail", [MLX5DV_RES_TYPE_QP, MLX5DV_RES_TYPE_DBR])
def test_a_null_allocation_fails_the_qp_and_unwinds(fail):
    def answer(size, align, kind):
        return 0 if kind == fail else mem.posix_memalign(size, align)

    rec = Recorder()
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        cq = CQ(ctx, 16, None, None, 0)
        rec.answer = answer
        with pytest.raises(PyverbsRDMAError) as ex:
            QP(pdom, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)))
        assert ex.value.error_code == errno.ENOMEM
        assert "Failed to create QP" in str(ex.value)
        # what was given before the failure went back
        assert sorted(p for p, _ in rec.frees) == sorted(a[3] for a in rec.allocs if a[3])
        assert pdom.pd.refcount == 1
        ctx.close()
    assert not mem._blocks


def test_an_allocator_that_raises_is_a_null_pointer():
    def answer(size, align, kind):
        raise RuntimeError("no memory today")

    rec = Recorder(answer=answer)
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        with pytest.raises(PyverbsRDMAError) as ex:
            cqex_on(ctx, pdom)
        assert ex.value.error_code == errno.ENOMEM
        ctx.close()


def test_a_cq_with_the_pd_mask_needs_a_parent_domain():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        with pytest.raises(PyverbsRDMAError) as ex:
            CQEX(ctx, CqInitAttrEx(cqe=8, parent_domain=pd,
                                   comp_mask=e.IBV_CQ_INIT_ATTR_MASK_PD))
        assert ex.value.error_code == errno.EINVAL


def test_busy_while_used_and_freed_in_order():
    rec = Recorder()
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        assert v.ibv_dealloc_pd(pd.pd) == errno.EBUSY         # the parent domain holds it
        cq = cqex_on(ctx, pdom)
        qp = QP(pdom, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)))
        assert pdom.pd.refcount == 3
        assert v.ibv_dealloc_pd(pdom.pd) == errno.EBUSY       # a QP and a CQ use it
        qp.close()
        assert v.ibv_dealloc_pd(pdom.pd) == errno.EBUSY       # the CQ still does
        pdom.close()                                          # closes its CQEX first
        assert cq._closed and pd.pd.refcount == 1
        pd.close()
    assert len(rec.frees) == len(rec.allocs)


def test_resize_asks_the_allocator_for_the_new_ring_and_frees_the_old():
    rec = Recorder()
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        pdom = parent_domain(ctx, pd, rec)
        cq = cqex_on(ctx, pdom, cqe=15)
        old = cq.cq.buf
        assert vcq.ibv_resize_cq(cq.cq, 63) == 0
        assert rec.allocs[-1][:3] == (64 * 64, PAGE, MLX5DV_RES_TYPE_CQ)
        assert cq.cq.buf == rec.allocs[-1][3] and (old, MLX5DV_RES_TYPE_CQ) in rec.frees
        ctx.close()
    assert len(rec.frees) == len(rec.allocs) and not mem._blocks


def test_alloc_parent_domain_errnos():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        for attr in (ibv_parent_domain_init_attr(pd=None),
                     ibv_parent_domain_init_attr(pd=pd.pd, comp_mask=4)):
            with pytest.raises(OSError) as ex:
                v.ibv_alloc_parent_domain(ctx.ctx, attr)
            assert ex.value.errno == errno.EINVAL
        assert pd.pd.refcount == 1

        class NoOp:
            ops = verbs_context_ops()

        with pytest.raises(OSError) as ex:
            v.ibv_alloc_parent_domain(NoOp(), ibv_parent_domain_init_attr(pd=pd.pd))
        assert ex.value.errno == errno.EOPNOTSUPP

"""The pyverbs-like face (userspace/libibverbs/pyverbs.py): children closed first,
close() twice harmless, errors carry errno - checked against what the kernel saw."""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.trace import Tracer
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import (
    CQ,
    MR,
    PD,
    QP,
    Context,
    PyverbsRDMAError,
    QPAttr,
    QPInitAttr,
)


@pytest.fixture
def proc():
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    yield p
    p.exit(0)


def test_closing_the_context_closes_its_children_newest_first(proc):
    ctx = Context(proc)
    pd = PD(ctx)
    cq = CQ(ctx, 8)
    QP(pd, QPInitAttr(scq=cq, rcq=cq))
    MR(pd, 4096, v.IBV_ACCESS_LOCAL_WRITE)
    with Tracer() as t:
        ctx.close()
    order = [c.func for c in t.trace.calls() if c.func in (
        "mlx5_ib_dereg_mr", "mlx5_ib_destroy_qp", "mlx5_ib_destroy_cq", "mlx5_ib_dealloc_pd",
        "mlx5_ib_dealloc_ucontext")]
    # the CQ (newest child of the context) closes its QP first, then the PD its MR
    assert order == ["mlx5_ib_destroy_qp", "mlx5_ib_destroy_cq", "mlx5_ib_dereg_mr",
                     "mlx5_ib_dealloc_pd", "mlx5_ib_dealloc_ucontext"]
    assert proc.mm.pinned_vm == 0


def test_close_twice_is_harmless(proc):
    with Context(proc) as ctx:
        pd = PD(ctx)
        pd.close()
        with Tracer() as t:
            pd.close()
        assert not [c for c in t.trace.calls() if c.func == "mlx5_ib_dealloc_pd"]
    ctx.close()


def test_errors_carry_errno(proc):
    with Context(proc) as ctx, PD(ctx) as pd:
        with pytest.raises(PyverbsRDMAError) as e:
            MR(pd, 4096, v.IBV_ACCESS_REMOTE_WRITE)  # remote write without local write
        assert e.value.errno == errno.EINVAL
        assert proc.mm.pinned_vm == 0


# -- QP states ------------------------------------------------------------------------------
@pytest.mark.parametrize("qp_type", [v.IBV_QPT_RC, v.IBV_QPT_UC, v.IBV_QPT_UD])
def test_to_rts_connects_each_qp_type_with_its_own_attributes(proc, qp_type):
    with Context(proc) as ctx:
        pd, cq = PD(ctx), CQ(ctx, 8)
        qp = QP(pd, QPInitAttr(scq=cq, rcq=cq, qp_type=qp_type))
        qp.to_rts(ctx.query_gid(1, 0), qp.qp_num, sq_psn=3, rq_psn=4)
        attr, init = qp.query(v.IBV_QP_STATE)
        assert (attr.qp_state, attr.sq_psn, init.qp_type, qp.qp.state) == \
            (v.IBV_QPS_RTS, 3, qp_type, v.IBV_QPS_RTS)
        if qp_type != v.IBV_QPT_UD:
            assert (attr.dest_qp_num, attr.rq_psn, attr.ah_attr.grh.dgid) == \
                (qp.qp_num, 4, ctx.query_gid(1, 0))


def test_modify_errors_carry_errno(proc):
    with Context(proc) as ctx:
        pd, cq = PD(ctx), CQ(ctx, 8)
        qp = QP(pd, QPInitAttr(scq=cq, rcq=cq))
        with pytest.raises(PyverbsRDMAError) as e:
            qp.modify(QPAttr(qp_state=v.IBV_QPS_RTS), v.IBV_QP_STATE)   # RESET -> RTS
        assert e.value.errno == errno.EINVAL and qp.qp.state == v.IBV_QPS_RESET
        with pytest.raises(PyverbsRDMAError) as e:
            ctx.query_gid(1, 300)
        assert e.value.errno == errno.ENOENT

"""The pyverbs-like face (userspace/libibverbs/pyverbs.py): children closed first,
close() twice harmless, errors carry errno - checked against what the kernel saw."""

from __future__ import annotations

import errno

import pytest

from kernel_model.platform import rdma_host
from kernel_model.trace import Tracer
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, PyverbsRDMAError, QPInitAttr


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

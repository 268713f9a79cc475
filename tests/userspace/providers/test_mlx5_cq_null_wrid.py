"""libmlx5's CQE parsing for a queue the QP does not have (wqe_cnt 0 - an XRC target
QP has neither send nor receive queue): C reads wq->wrid[idx] through a NULL pointer,
the process's own SIGSEGV; the provider raises it the same way (a load of that address)
rather than a Python IndexError.  Found by peermem fuzz: a CQE zeroed by MADV_DONTNEED of
the CQ ring named the XRC target QP that had user index 0."""

from __future__ import annotations

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.emu.process import SegmentationFault
from userspace.providers.mlx5.cq import _null_wrid
from userspace.providers.mlx5.wqsize import mlx5_wq


class _Ctx:
    def __init__(self, proc):
        self.proc = proc


class _Cq:
    def __init__(self, proc):
        self.context = _Ctx(proc)


def test_a_cqe_for_a_queue_the_qp_has_not_is_the_processs_sigsegv():
    m = rdma_host(ram_size=64 << 20)
    p = m.spawn("app")
    with pytest.raises(SegmentationFault):
        _null_wrid(_Cq(p), mlx5_wq(), 5)
    wq = mlx5_wq()
    wq.wqe_cnt = 8
    _null_wrid(_Cq(p), wq, 5)                 # a queue it has: nothing happens
    p.exit(0)

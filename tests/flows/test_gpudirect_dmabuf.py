"""RDMA into GPU memory registered through a dma-buf, end to end: the bytes arrive in
the GPU's memory, cudaFree does not stop the MR (the dma-buf holds the pages), and
the memory goes only at the MR's dereg and the fd's close - where with peer memory
(test_gpudirect.py) cudaFree revokes the MR at once."""

from __future__ import annotations

from peermem_testing.gpu import gpu_load
from tests.flows.test_gpudirect import (
    GPU_BUF,
    K64,
    GpuLink,
    Side,
    endpoint,
    gpu,
    gpu_machine,
    pattern,
    status,
)
from userspace.cuda.runtime import CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, cudart
from userspace.libibverbs import verbs as v
from userspace.tools.write_bw import connect

ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


def test_rdma_write_into_a_dmabuf_mr_and_what_cudafree_does_not_do():
    m = gpu_machine()
    pa, pb = m.spawn("requester"), m.spawn("responder")
    a = Side(m, pa, endpoint(pa, 0x111))
    b = Side(m, pb, endpoint(pb, 0x222))
    link = GpuLink(a, b, m)

    def register():
        cu = cudart(pb)
        d = cu.cudaMalloc(GPU_BUF)
        fd = cu.cuMemGetHandleForAddressRange(d, GPU_BUF,
                                              CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
        return d, fd, v.ibv_reg_dmabuf_mr(b.ep.pd.pd, 0, GPU_BUF, d, fd, ACCESS)
    link.d, fd, link.gmr = pb.run(register)
    connect(b.ep, a.ep.dest())
    connect(a.ep, b.ep.dest())
    dev = gpu(m)
    off = 0x18000
    a.ep.mr.write(pattern(K64))
    a.qp.post_send(link.write(1, 0, off, K64))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    got = gpu_load(pb, link.d, GPU_BUF)
    assert got[off:off + K64] == pattern(K64) and got[:off] == bytes(off)
    # cudaFree: no callback, no revoke - the next WRITE still lands
    windows = dict(dev.bar1_ptes)
    pb.run(cudart(pb).cudaFree, link.d)
    a.ep.mr.write(pattern(K64, seed=7))
    a.qp.post_send(link.write(2, 0, off, K64))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert dict(dev.bar1_ptes) == windows and dev.bar1_faults == []
    # the MR and the fd let go: the windows are unmapped and the pages go back
    pb.run(v.ibv_dereg_mr, link.gmr)
    pb.run(pb.close, fd)
    assert dev.bar1_ptes == {}
    a.ep.ctx.close()
    b.ep.ctx.close()
    pa.exit(0)
    pb.exit(0)

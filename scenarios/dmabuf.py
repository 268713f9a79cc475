"""GPU memory registered through a dma-buf (the upstream design), to trace beside the
peer-memory scenarios (cuda-free-invalidate)."""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from scenarios import scenario
from userspace.cuda.runtime import CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, cudart
from userspace.libibverbs import verbs as v

MiB = 1 << 20


def dmabuf_register(p, cu, d: int) -> tuple:
    """Export the GPU range as a dma-buf and register it: (ctx, pd, fd, mr)."""
    fd = cu.cuMemGetHandleForAddressRange(d, MiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    pd = v.ibv_alloc_pd(ctx)
    mr = v.ibv_reg_dmabuf_mr(pd, 0, MiB, d, fd,
                             v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
    return ctx, pd, fd, mr


def dmabuf_teardown(p, ctx, pd, fd: int, mr) -> None:
    """Deregister, then close the dma-buf fd: the last reference frees the memory."""
    v.ibv_dereg_mr(mr)
    p.close(fd)
    v.ibv_dealloc_pd(pd)
    v.ibv_close_device(ctx)


@scenario("gpudirect-dmabuf", "GPU memory exported as a dma-buf and registered "
          "(ibv_reg_dmabuf_mr); cudaFree revokes nothing: the memory goes at the MR's "
          "dereg and the fd's close")
def gpudirect_dmabuf() -> str:
    m = rdma_host(nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    p = m.spawn("app")
    cu = cudart(p)
    d = p.run(cu.cudaMalloc, MiB)
    ctx, pd, fd, mr = p.run(dmabuf_register, p, cu, d)
    p.run(cu.cudaFree, d)
    dev = m.modules["nvidia"].state.devices[0]
    kept = f"after cudaFree: {dev.bar1_mapped_bytes() >> 10} KiB of BAR1 still mapped\n"
    p.run(dmabuf_teardown, p, ctx, pd, fd, mr)
    kept += f"after dereg and close: {dev.bar1_mapped_bytes() >> 10} KiB\n"
    p.exit(0)
    m.check_leaks()
    return kept

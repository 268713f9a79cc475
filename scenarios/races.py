"""Race scenarios for `peermem explore`: each in a fixed and a legacy configuration.

A race scenario is a program the explorer (kernel_model/explore.py) runs
under many schedules: it builds its machine, sets up, starts the competing
tasks, joins them and asserts.  `legacy=True` builds the configuration
with the real bug (an older driver release, core design or client); the
fixed one must survive every schedule the explorer tries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from drivers.nvidia.nv_p2p import nvidia_p2p_get_pages, nvidia_p2p_put_pages
from kernel_model.locking import cond_resched
from kernel_model.platform import rdma_host
from userspace.cuda.runtime import cudart

MiB = 1 << 20


@dataclass(frozen=True)
class Race:
    name: str
    fixed: str
    legacy: str
    run: Callable[[bool], None]


RACES: dict[str, Race] = {}


def race(name: str, fixed: str, legacy: str) -> Callable:
    """Register fn(legacy) as the race scenario `name` with what each configuration is."""
    def reg(fn: Callable[[bool], None]) -> Callable[[bool], None]:
        RACES[name] = Race(name, fixed, legacy, fn)
        return fn
    return reg


@race("free-callback-vs-put-pages",
      fixed="nvidia 580.65.06: put_pages on a mapping whose free callback is running "
            "waits for it, then does nothing",
      legacy="nvidia 525.60.13 (R515 up to 535.14): put_pages frees the page table while "
             "the free callback runs, and the driver frees it again after (seed 002 ch. 10)")
def free_callback_vs_put_pages(legacy: bool) -> None:
    """A third-party driver pinned GPU memory; the owner cudaFrees it (the free callback
    runs on nv_queue, waiting for the driver's transfers) while the driver unpins it."""
    m = rdma_host(ram_size=64 * MiB, nr_gpus=1, modules=())
    m.load_module("nvidia", release="525.60.13" if legacy else "580.65.06")
    p = m.spawn("app")
    cu = cudart(p)
    va = p.run(cu.cudaMalloc, MiB)
    calls: list[str] = []

    def free_callback(data: object) -> None:
        calls.append("callback")
        cond_resched()                 # waits for the device's pending transfers

    pt = p.run(nvidia_p2p_get_pages, 0, 0, va, MiB, free_callback, "dev")
    freer = p.start(cu.cudaFree, va)
    unpin = p.thread(nvidia_p2p_put_pages, 0, 0, va, pt, name="unpin")
    freer.join()
    assert unpin.join() == 0
    assert calls in ([], ["callback"])
    p.exit(0)


@race("dereg-vs-invalidate",
      fixed="nv_peer_mem registered with PEER_MEM_INVALIDATE_UNMAPS (peerdirect_support=0): "
            "deregistration calls dma_unmap/put_pages after dropping mapping_lock - no "
            "deadlock; the explorer still finds nv_peer_memory issue 53 (dma_unmap through a "
            "page table the driver freed after the callback), which no release fixes",
      legacy="nv_peer_mem as an old-style client (peerdirect_support=1, the MLNX_OFED 5.1-5.3 "
             "era): deregistration calls put_pages under mapping_lock, put_pages waits for "
             "the free callback, the callback waits for mapping_lock - the deadlock of "
             "MLNX bug 2696789")
def dereg_vs_invalidate(legacy: bool) -> None:
    """A GPU MR is deregistered by one thread while another cudaFrees its memory."""
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.pyverbs import MR, PD, Context

    m = rdma_host(ram_size=64 * MiB, nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem", persistent_api_support=0, peerdirect_support=int(legacy))
    p = m.spawn("app")
    cu = cudart(p)

    def setup() -> tuple:
        ctx = Context(p)
        pd = PD(ctx)
        d = cu.cudaMalloc(MiB)
        mr = MR(pd, MiB, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, addr=d)
        return ctx, d, mr
    ctx, d, mr = p.run(setup)
    dereg = p.start(mr.close)
    free = p.thread(cu.cudaFree, d, name="free")
    dereg.join()
    free.join()
    p.run(ctx.close)
    p.exit(0)

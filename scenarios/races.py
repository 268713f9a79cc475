"""Race scenarios for `peermem explore`: each in a fixed and a legacy configuration.

A race scenario is a program the explorer (kernel_model/emu/explore.py) runs
under many schedules: it builds its machine, sets up, starts the competing
tasks, joins them and asserts.  `legacy=True` builds the configuration
with the real bug (an older driver release, core design or client); the
fixed one must survive every schedule the explorer tries.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from drivers.nvidia.nv_p2p import nvidia_p2p_get_pages, nvidia_p2p_put_pages
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import EINVAL, KernelError
from kernel_model.locking import cond_resched
from kernel_model.syscalls import sys_exit
from userspace.cuda.runtime import cudart

MiB = 1 << 20


@dataclass(frozen=True)
class Race:
    name: str
    fixed: str
    legacy: str
    finds: tuple[str, ...]          # the checks the legacy configuration fails
    run: Callable[[bool], None]


RACES: dict[str, Race] = {}


def race(name: str, fixed: str, legacy: str, finds: tuple[str, ...]) -> Callable:
    """Register fn(legacy) as the race scenario `name`: what each configuration is, and
    which explorer checks (explore.Failure.check) the legacy one's bug shows as."""
    def reg(fn: Callable[[bool], None]) -> Callable[[bool], None]:
        RACES[name] = Race(name, fixed, legacy, finds, fn)
        return fn
    return reg


@race("free-callback-vs-put-pages",
      fixed="nvidia 580.65.06: put_pages on a mapping whose free callback is running "
            "waits for it, then does nothing",
      legacy="nvidia 525.60.13 (R515 up to 535.14): put_pages frees the page table while "
             "the free callback runs, and the driver frees it again after (NVIDIA's GPUDirect "
             "RDMA guide, \"Changes in CUDA 12.2\")",
      finds=("UseAfterFree", "DoubleFree"))
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


def _gpu_host(client: dict[str, int], ofed: str = "25.04",
              core: dict[str, int] | None = None) -> Any:
    """A host whose ib_core is MLNX_OFED `ofed`'s (with `core`'s other parameters), with
    mlx5, nvidia and nv_peer_mem loaded - the latter with `client`'s parameters."""
    m = rdma_host(ram_size=64 * MiB, nr_gpus=1, modules=())
    m.load_module("ib_core", ofed=ofed, **(core or {}))
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem", **client)
    return m


def _gpu_mr(client: dict[str, int], ofed: str = "25.04",
            core: dict[str, int] | None = None) -> tuple:
    """_gpu_host, and a process with a 1 MiB GPU MR: (proc, cudart, ctx, va, mr)."""
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.pyverbs import MR, PD, Context

    p = _gpu_host(client, ofed, core).spawn("app")
    cu = cudart(p)

    def setup() -> tuple:
        ctx = Context(p)
        pd = PD(ctx)
        d = cu.cudaMalloc(MiB)
        mr = MR(pd, MiB, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, addr=d)
        return ctx, d, mr
    return (p, cu, *p.run(setup))


# nvidia-peermem's configurations (module parameters), by name
PERSISTENT = {"persistent_api_support": 1}                      # 560+ default
UNMAPS = {"persistent_api_support": 0, "peerdirect_support": 0}  # invalidating, _ex client
OLD_STYLE = {"persistent_api_support": 0, "peerdirect_support": 1}  # pre-UNMAPS layout
# the invalidating _ex client with the proposed fix for nv_peer_memory issue 53 (open
# upstream): the fixed configurations' client (nv_peer_mem.py, issue53_fix)
UNMAPS_FIXED = {**UNMAPS, "issue53_fix": 1}


@race("dereg-vs-invalidate",
      fixed="MLNX_OFED 25.04 with nvidia-peermem 580 as the invalidating _ex client "
            "(persistent_api_support=0, peerdirect_support=0: PEER_MEM_INVALIDATE_UNMAPS, "
            "nv_peer_memory PR #92 / MLNX_OFED 5.1b's fix of bug 2696789): the core "
            "calls neither put_pages nor dma_unmap under mapping_lock, and the stop "
            "unmaps outside it; with the proposed fix for nv_peer_memory issue 53 "
            "(issue53_fix=1), which UNMAPS alone leaves open (see invalidate-vs-teardown)",
      legacy="MLNX_OFED 5.3 with nv_peer_mem as an old-style client (peerdirect_support=1, "
             "as nv_peer_mem before 1.2 registered): deregistration calls put_pages under "
             "mapping_lock, put_pages waits for the free callback, the callback waits for "
             "mapping_lock - the deadlock of MLNX bug 2696789 (one preemption, or none); "
             "and, when the callback runs while deregistration releases the MR, its "
             "write of callback_task into the nv_mem_context release() freed "
             "(nvidia-peermem.c's nv_get_p2p_free_callback, as in invalidate-during-reg)",
      finds=("deadlock", "UseAfterFree"))
def dereg_vs_invalidate(legacy: bool) -> None:
    """A GPU MR is deregistered by one thread while another cudaFrees its memory."""
    if legacy:
        dereg_vs_invalidate_with(OLD_STYLE, ofed="5.3")
    else:
        dereg_vs_invalidate_with(UNMAPS_FIXED)


def dereg_vs_invalidate_with(client: dict[str, int], ofed: str = "25.04") -> None:
    """dereg-vs-invalidate with nv_peer_mem's parameters `client` on OFED `ofed`."""
    p, cu, ctx, d, mr = _gpu_mr(client, ofed)
    dereg = p.start(mr.close)
    free = p.thread(cu.cudaFree, d, name="free")
    dereg.join()
    free.join()
    p.run(ctx.close)
    p.exit(0)


@race("dereg-vs-invalidate-ticket",
      fixed="MLNX_OFED 25.04 (the 5.1 redesign removed mlx5_ib_peer_id and the tickets: the "
            "invalidation finds the umem by its xarray id under xa_lock and holds a kref "
            "on it, and mlx5's dereg revokes the mkey and stops the notifier under "
            "mapping_lock before it releases anything) with nvidia-peermem 580 "
            "invalidating (UNMAPS, as nv_peer_mem 1.2+ needs on a 5.x core) and the "
            "proposed fix for nv_peer_memory issue 53 (issue53_fix=1)",
      legacy="MLNX_OFED 4.9 with nv_peer_memory 1.0 (amdp2p hits it too): the user's dereg "
             "wins mr->invalidated, and dereg_mr frees mr->peer_id (in clean_mr, or after "
             "unreg_umr for a cached mkey) before ib_umem_release takes the ticket off the "
             "client's list (peer_umem_release, ib_peer_destroy_invalidation_ctx); a free "
             "callback in between finds the ticket and the invalidation calls "
             "mlx5_invalidate_umem with the freed peer_id, which waits on peer_id->comp "
             "(hw/mlx5/mr.c of MLNX_OFED 4.3 to 5.0, read; code-derived, not reported "
             "upstream)",
      finds=("UseAfterFree",))
def dereg_vs_invalidate_ticket(legacy: bool) -> None:
    """ibv_dereg_mr of a GPU MR on one thread while another cudaFrees its memory (the
    client's free callback invalidates the MR), on the 4.x ticket core or a 5.1+ one."""
    if legacy:
        dereg_vs_invalidate_with(NV_PEER_MEM_1_0, ofed="4.9")
    else:
        dereg_vs_invalidate_with(UNMAPS_FIXED)


@race("invalidate-vs-teardown",
      fixed="nvidia-peermem 580 invalidating (UNMAPS) with the proposed fix for issue 53 "
            "(nv_peer_mem issue53_fix=1; no upstream fix): nv_dma_unmap leaves the DMA "
            "mappings to put_pages, which the driver orders with its teardown (it waits "
            "for a callback in flight, then does nothing), and the callback touches no "
            "context after ib_core's invalidate returned",
      legacy="nvidia-peermem 580 as the invalidating client (persistent_api_support=0, "
             "UNMAPS): the teardown's ib_umem_stop_invalidation_notifier marks the umem "
             "UNMAPPED and unmaps outside mapping_lock; a free callback in between finds "
             "nothing to do, returns, and the driver frees the page table - the teardown's "
             "dma_unmap then uses it (nv_peer_memory issue 53, open)",
      finds=("UseAfterFree",))
def invalidate_vs_teardown(legacy: bool) -> None:
    """The uverbs file is closed with a GPU MR still registered (the kernel tears the MR
    down) while another thread cudaFrees the memory (the driver invalidates it)."""
    from userspace.libibverbs import verbs as v

    p, cu, ctx, d, mr = _gpu_mr(UNMAPS if legacy else UNMAPS_FIXED)
    close = p.start(v.ibv_close_device, ctx.ctx)
    free = p.thread(cu.cudaFree, d, name="free")
    close.join()
    free.join()
    p.exit(0)


@race("get-pages-vs-free",
      fixed="nvidia 580.65.06: when rm_p2p_register_callback fails because the range was "
            "freed after rm_p2p_get_pages, the error path skips the arrays it already freed "
            "(the separate label open-gpu-kernel-modules HEAD has)",
      legacy="nvidia 535.104.05: the register-callback error path of nv_p2p_get_pages frees "
             "its scratch arrays a second time when another CPU frees the same GPU range "
             "between the two RM calls - the double free of open-gpu-kernel-modules PR #557",
      finds=("DoubleFree",))
def get_pages_vs_free(legacy: bool) -> None:
    """A third-party driver pins a GPU range while the owner cudaFrees it."""
    m = rdma_host(ram_size=64 * MiB, nr_gpus=1, modules=())
    m.load_module("nvidia", release="535.104.05" if legacy else "580.65.06")
    p = m.spawn("app")
    cu = cudart(p)
    va = p.run(cu.cudaMalloc, MiB)
    calls: list[str] = []

    def pin() -> object:
        try:
            return nvidia_p2p_get_pages(0, 0, va, MiB, lambda data: calls.append("callback"),
                                        "dev")
        except KernelError as e:
            assert e.errno == EINVAL, e
            return None

    pinner = p.start(pin)
    p.thread(cu.cudaFree, va, name="free").join()
    pt = pinner.join()
    if pt is not None:                  # pinned first: the free called back, then took it
        assert calls == ["callback"]
        assert p.run(nvidia_p2p_put_pages, 0, 0, va, pt) == 0
    else:
        assert calls == []
    p.exit(0)


@race("invalidate-during-reg",
      fixed="MLNX_OFED 25.04 (mapping_lock from get_pages until mlx5 activates) with "
            "nvidia-peermem 580 invalidating (UNMAPS) and the proposed fix for issue 53 "
            "(issue53_fix=1): its free callback invalidates even before dma_map stored "
            "the mapping - the core's lock holds it until activation - where 580 as "
            "released prints 'invalid dma_mapping' and drops the invalidation (the "
            "signature of nv_peer_memory issues 53/112), leaving the MR on pages the "
            "driver freed",
      legacy="MLNX_OFED 4.9 (the ticket core) with nvidia-peermem's peerdirect_support=1, "
             "the setting NVIDIA documents for 4.9 LTS: an invalidation before activation "
             "only marks the ticket, activate fails, and peer_umem_release still calls "
             "dma_unmap on the page table the driver freed after the callback "
             "(Mellanox/nv_peer_memory issue #15; callback_task, from nv_peer_memory PR #92, "
             "guards only the callback's own task); one after activation "
             "tears the MR down inside the callback, release() frees the client context, "
             "and the callback then writes callback_task into it (read from nvidia-peermem.c's "
             "nv_get_p2p_free_callback and MLNX_OFED 4.9's peer_mem.c; not reported upstream)",
      finds=("UseAfterFree",))
def invalidate_during_reg(legacy: bool) -> None:
    """ibv_reg_mr of GPU memory on one thread while another cudaFrees it; then, if the
    registration won, ibv_dereg_mr."""
    if legacy:
        invalidate_during_reg_with(OLD_STYLE, ofed="4.9")
    else:
        invalidate_during_reg_with(UNMAPS_FIXED)


def invalidate_during_reg_with(client: dict[str, int], ofed: str = "25.04") -> None:
    """invalidate-during-reg with nv_peer_mem's parameters `client` on OFED `ofed`."""
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.cmd import VerbsError
    from userspace.libibverbs.pyverbs import MR, PD, Context

    m = _gpu_host(client, ofed)
    p = m.spawn("app")
    cu = cudart(p)

    def setup() -> tuple:
        ctx = Context(p)
        return ctx, PD(ctx), cu.cudaMalloc(MiB)
    ctx, pd, d = p.run(setup)

    def reg() -> object:
        try:
            return MR(pd, MiB, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, addr=d)
        except VerbsError as e:            # freed first, or invalidated before activation
            assert e.errno in (errno.EFAULT, errno.EINVAL), e
            return None
    registering = p.start(reg)
    p.thread(cu.cudaFree, d, name="free").join()
    mr = registering.join()
    if mr is not None:
        p.run(mr.close)
    p.run(ctx.close)
    p.exit(0)


@race("exit-order",
      fixed="MLNX_OFED 25.04 with nvidia-peermem 580 (UNMAPS) and the proposed fix for "
            "issue 53 (issue53_fix=1): closing the GPU file first invalidates the MR "
            "(revoke, INVALIDATED) and the uverbs file's close then only releases it; the "
            "other order unpins before the GPU memory goes",
      legacy="MLNX_OFED 4.9 with nvidia-peermem's peerdirect_support=1: when exit closes "
             "the GPU file first, the free callback deregisters the MR inside "
             "ib_invalidate_peer_memory, release() frees nv_mem_context, and the callback "
             "writes callback_task into it after (nvidia-peermem.c's nv_get_p2p_free_callback, "
             "as in invalidate-during-reg); the uverbs-first order is clean",
      finds=("UseAfterFree",))
def exit_order(legacy: bool) -> None:
    """Two processes each exit with a GPU MR registered: one opened its GPU file before
    its uverbs file (exit closes the GPU file first), the other after; their exits run
    at the same time."""
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.pyverbs import MR, PD, Context

    m = _gpu_host(OLD_STYLE if legacy else UNMAPS_FIXED, ofed="4.9" if legacy else "25.04")
    procs = []
    for gpu_first in (True, False):
        p = m.spawn("gpu-first" if gpu_first else "uverbs-first")

        def setup(p: Any = p, gpu_first: bool = gpu_first) -> tuple:
            # the file opened first gets the lower fd, and exit_files closes in fd order
            if gpu_first:
                cu = cudart(p)            # opens /dev/nvidia0
                ctx = Context(p)
            else:
                ctx = Context(p)
                cu = cudart(p)
            mr = MR(PD(ctx), MiB, v.IBV_ACCESS_LOCAL_WRITE, addr=cu.cudaMalloc(MiB))
            return ctx, mr
        p.run(setup)
        procs.append(p)
    exits = [p.start(sys_exit, 0) for p in procs]
    for t in exits:
        t.join()
    assert not any(p.alive for p in procs)


NV_PEER_MEM_1_0 = {"version": "1.0"}   # Mellanox nv_peer_memory 1.0, as with MLNX_OFED 4.x


@race("dma-vs-invalidate",
      fixed="MLNX_OFED 25.04 with nvidia-peermem 580 invalidating (UNMAPS) and the "
            "proposed fix for issue 53 (issue53_fix=1): mlx5 builds and enables the mkey "
            "before it activates the notifier, and the core holds mapping_lock until "
            "then, so the invalidation revokes a whole mkey - a WRITE lands in live GPU "
            "memory or is refused (REM_ACCESS_ERR), or the registration fails",
      legacy="MLNX_OFED 4.9 (4.6 and 4.7 read) with nv_peer_memory 1.0: mlx5 publishes the "
             "MR to the invalidation (complete(peer_id->comp)) before mlx5_ib_update_xlt "
             "loads and enables its cached mkey, and clears mr->free only after that UMR "
             "completed.  An invalidation in the window finds mr->free set, so unreg_umr "
             "disables nothing, and gives the pages back: before populate_xlt, that "
             "dereferences the cleared mr->umem; while the poster sleeps on the UMR's "
             "completion, the mkey stays enabled over the freed GPU pages and the HCA's "
             "WRITE lands in BAR1 windows nothing maps (the first schedule).  "
             "(nv_peer_memory 1.0's own 'invalid dma_mapping' drop, a free callback between "
             "get_pages and dma_map, ends in that DMA too, or in dma_map reading the "
             "mapping the driver freed)",
      finds=("warn", "null-deref", "UseAfterFree"))
def dma_vs_invalidate(legacy: bool) -> None:
    """ibv_reg_mr of GPU memory on one thread while another cudaFrees it; then, if the
    registration won, an RDMA WRITE into the MR through a loopback RC QP pair - the
    HCA's DMA, landing in live memory or refused by a revoked mkey - and the dereg."""
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.cmd import VerbsError
    from userspace.libibverbs.pyverbs import MR, SendWR
    from userspace.tools.write_bw import connect, setup

    m = _gpu_host(NV_PEER_MEM_1_0 if legacy else UNMAPS_FIXED, "4.9" if legacy else "25.04")
    p = m.spawn("app")
    cu = cudart(p)
    write = 64 << 10

    def build() -> tuple:
        a = setup(p, write, 4, 0x100)          # the requester and its host buffer
        b = setup(p, 4096, 4, 0x200)           # the responder: the GPU MR joins its PD
        connect(a, b.dest())
        connect(b, a.dest())
        return a, b, cu.cudaMalloc(MiB)
    a, b, d = p.run(build)

    def reg() -> object:
        try:
            return MR(b.pd, MiB, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, addr=d)
        except VerbsError as e:               # freed first, or invalidated before activation
            assert e.errno in (errno.EFAULT, errno.EINVAL), e
            return None

    def rdma_write(mr: Any) -> str:
        a.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(a.mr.buf, write, a.mr.lkey)],
                              opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                              remote_addr=d, rkey=mr.rkey))
        (wc,) = a.cq.poll_until(1)
        return v.ibv_wc_status_str(wc.status)

    registering = p.start(reg)
    p.thread(cu.cudaFree, d, name="free").join()
    mr = registering.join()
    if mr is not None:                # lands before the revoke, or is refused after it
        status = p.run(rdma_write, mr)
        assert status in ("SUCCESS", "REM_ACCESS_ERR"), status
        p.run(mr.close)
    p.exit(0)


@race("unregister-client-busy",
      fixed="MLNX_OFED 4.9 with nv_peer_memory 1.0, whose free callback holds its module "
            "reference (__module_get ... module_put) around ib_core's invalidate: rmmod "
            "fails EBUSY while an MR or a callback is outstanding, and once it can run, "
            "ib_invalidate_peer_memory has unlocked the client it frees",
      legacy="MLNX_OFED 4.9 with amdp2p before ROCnRDMA c2f76a7, whose only module "
             "reference is the MR's (acquire to release): mlx5 4.x tears the MR down inside "
             "the invalidation, release() drops the reference, rmmod amdp2p goes through, "
             "and ib_unregister_peer_memory_client - its last umem gone - frees the client "
             "while ib_invalidate_peer_memory still holds the client's lock; the unlock "
             "then writes freed memory (code-derived)",
      finds=("UseAfterFree",))
def unregister_client_busy(legacy: bool) -> None:
    """A GPU MR is registered; one thread frees the GPU memory (the client's free
    callback invalidates the MR) while another unloads the client module; then the
    user deregisters, and the client is unloaded for good."""
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.pyverbs import MR, PD, Context

    client = "amdp2p" if legacy else "nv_peer_mem"
    m = rdma_host(ram_size=64 * MiB, nr_gpus=0 if legacy else 1, nr_amd_gpus=int(legacy),
                  modules=())
    m.load_module("ib_core", ofed="4.9")
    m.load_module("mlx5_ib")
    if legacy:
        m.load_module("amdp2p", ignore_put_after_free=0)
    else:
        m.load_module("nv_peer_mem", **NV_PEER_MEM_1_0)
    p = m.spawn("app")
    if legacy:
        from userspace.hip.runtime import hiprt
        gpu = hiprt(p)
        alloc, release = gpu.hipMalloc, gpu.hipFree
    else:
        cu = cudart(p)
        alloc, release = cu.cudaMalloc, cu.cudaFree

    def setup() -> tuple:
        ctx = Context(p)
        d = alloc(MiB)
        return ctx, d, MR(PD(ctx), MiB, v.IBV_ACCESS_LOCAL_WRITE, addr=d)
    ctx, d, mr = p.run(setup)

    def rmmod() -> int:
        try:
            m.unload_module(client)
        except KernelError as e:
            assert e.errno == errno.EBUSY, e          # the MR, or a callback, holds it
            return e.errno
        return 0

    admin = m.spawn("rmmod")
    freeing = p.start(release, d)
    unloading = admin.start(rmmod)
    freeing.join()
    unloaded = unloading.join() == 0
    admin.exit(0)
    p.run(mr.close)
    p.run(ctx.close)
    if not unloaded:
        m.unload_module(client)                       # nothing holds it now
    assert client not in m.modules
    p.exit(0)


@race("late-invalidate-vs-release",
      fixed="MLNX_OFED 25.04 with the proposed fix (ib_core late_invalidate_fix=1, the "
            "default; no upstream fix): an invalidation that gets mapping_lock after the "
            "stop finds the umem UNMAPPED and leaves it; nvidia-peermem 580 invalidating "
            "with issue53_fix=1 puts, in release(), the pin the invalidated umem's "
            "teardown no longer puts",
      legacy="MLNX_OFED 25.04 as released (ib_core late_invalidate_fix=0): the "
             "invalidation takes its umem reference under xa_lock, then waits for "
             "mapping_lock while the deregistration stops the notifier and "
             "ib_peer_umem_release clears umem_p->ib_peer_client; "
             "ib_peer_unmap_on_invalidate then dereferences NULL (peer_mem.c, "
             "ib_invalidate_peer_memory(), 5.1b to 25.04; code-derived, not reported "
             "upstream).  nvidia-peermem's own callback is masked - the driver's put_pages "
             "waits for it - but the core says a client need not fence put_pages "
             "against its invalidation",
      finds=("null-deref",))
def late_invalidate_vs_release(legacy: bool) -> None:
    """The peer client invalidates a GPU MR (ib_core's invalidate callback with the MR's
    core_context, from a task of its own, as a client does when its memory goes) while
    the user deregisters the MR; then the memory is freed."""
    p, cu, ctx, d, mr = _gpu_mr(UNMAPS_FIXED, core={"late_invalidate_fix": int(not legacy)})
    state = p.machine.modules["nv_peer_mem"].state
    (core_context,) = state.reg_handle.umem_xa.entries     # the MR's id: its only one
    dereg = p.start(mr.close)
    late = p.thread(state.mem_invalidate_callback[0], state.reg_handle, core_context,
                    name="invalidate")
    dereg.join()
    assert late.join() == 0
    p.run(cu.cudaFree, d)
    p.run(ctx.close)
    p.exit(0)

"""nv_peer_mem / nvidia-peermem, the GPU's peer-memory client (peermem_clients/nv_peer_mem.py).

What is checked is what the client does per peermem_facts.md section 3:

  * module parameters: persistent_api_support and peerdirect_support take 0 or 1,
    anything else fails the load with EINVAL and registers nothing; the default
    (persistent_api_support=1) registers one non-invalidating client "nv_mem";
    0 registers "nv_mem" (invalidating; PEER_MEM_INVALIDATE_UNMAPS unless
    peerdirect_support=1, the old-style layout) and then "nv_mem_nc";
  * acquire rounds the range out to 64 KiB GPU pages and probes it with
    nvidia_p2p_get_pages + nvidia_p2p_put_pages; anything the GPU driver refuses
    (host memory, another process's GPU memory, BAR1 exhaustion) is "not mine", and
    ibv_reg_mr then fails with gup's EFAULT;
  * dma_map hands out one 64 KiB entry per GPU page (the BAR1 bus addresses),
    get_page_size is 64 KiB, and the core trims the first and last entry, so an
    MR on an unaligned GPU address receives RDMA at exactly its bytes;
  * the free callback runs ib_core's invalidation on its own task and never gives
    pages back from there (dma_unmap/put_pages are skipped on callback_task);
  * with persistent_api_support=1, cudaFree invalidates nothing: the pages stay
    pinned (and RDMA keeps working) until the MR is deregistered.

Many tests call the client's callbacks directly, in a process's kernel context,
the way ib_core does (peer_mem.py); the rest go through ibv_reg_mr.
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.device import ib_device_get_by_name
from drivers.ib_core.peer_mem import (
    PEER_MEM_INVALIDATE_UNMAPS,
    ib_peer_unmap_on_invalidate,
    peer_clients,
)
from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow, filter_trace
from kernel_model.errno import KernelError
from kernel_model.hw.nvgpu import GpuConfig
from kernel_model.scatterlist import sg_table
from kernel_model.slab import UseAfterFree
from kernel_model.trace import Tracer
from kernel_model.tracedata import Call
from peermem_clients.nv_peer_mem import DRV_VERSION, GPU_PAGE_SIZE, nv_mem_context
from peermem_testing.gpu import gpu_load, gpu_store
from userspace.cuda.runtime import cudart
from userspace.libc import free, posix_memalign, read_sysfs
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.tools.write_bw import Endpoint, connect

K64 = GPU_PAGE_SIZE
MiB = 1 << 20
PEERS = "/sys/kernel/mm/memory_peers"
ALL_ACCESS = (v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
              | v.IBV_ACCESS_REMOTE_READ)
SIG = v.IBV_SEND_SIGNALED


# -- helpers ----------------------------------------------------------------------------------
def gpu_host(gpu: GpuConfig | None = None, load: bool = True, **params):
    """A host with an HCA and a GPU, mlx5_ib and nvidia loaded, and nv_peer_mem with
    `params` (unless load=False)."""
    m = rdma_host(nr_gpus=1, gpu=gpu)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    if load:
        m.load_module("nv_peer_mem", **params)
    return m


def mapped_context(m, p, d: int, core_context: int):
    """nv_mem's acquire, get_pages (with `core_context`) and dma_map of [d, d + 64K), as
    ib_core would call them on `p`: (module state, the context, the sg table)."""
    st = state(m)
    with p.kernel():
        cc = [None]
        assert st.nv_mem_acquire(d, K64, None, None, cc) == 1
        ctx = cc[0]
        assert st.nv_mem_get_pages(d, K64, 1, 0, None, ctx, core_context) == 0
        sgt = sg_table(m)
        assert st.nv_dma_map(sgt, ctx, hca_dma_device(m), 0, [0]) == 0
    return st, ctx, sgt


def free_spying(p, d: int, st, spy) -> None:
    """cudaFree(d) with ib_core's invalidate callback, as nv_peer_mem calls it, wrapped:
    spy(real, reg_handle, core_context) runs in its place and returns its result."""
    real = st.mem_invalidate_callback[0]
    st.mem_invalidate_callback[0] = lambda reg, cc: spy(real, reg, cc)
    try:
        cudart(p).cudaFree(d)
    finally:
        st.mem_invalidate_callback[0] = real


def state(m):
    return m.modules["nv_peer_mem"].state


def refcnt(m) -> int:
    return m.modules["nv_peer_mem"].refcnt


def registered(m) -> list[tuple[str, bool, bool]]:
    """(name, invalidation_required, unmaps on invalidate) of every client, in order."""
    with m.kernel():
        return [(c.peer_mem.name, c.invalidation_required, ib_peer_unmap_on_invalidate(c))
                for c in peer_clients()]


def open_pd(p):
    ctx = Context(p)
    return ctx, PD(ctx)


def hca_dma_device(m):
    with m.kernel():
        return ib_device_get_by_name("mlx5_0").dma_device


def stats(p, client: str = "nv_mem") -> dict[str, int]:
    names = ("num_alloc_mrs", "num_dealloc_mrs", "num_reg_pages", "num_dereg_pages",
             "num_reg_bytes", "num_dereg_bytes", "num_free_callbacks")
    return {n: int(read_sysfs(p, f"{PEERS}/{client}/{n}")) for n in names}


def calls_named(trace, name: str) -> list[Call]:
    return [c for c in trace.calls() if c.func == name]


def below(call: Call) -> list[str]:
    return [c.func for c in call.walk() if isinstance(c, Call) and c is not call]


def args_of(call: Call) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in call.args.split(", "))


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed * 31) & 0xFF for i in range(n))


def rc_endpoint(p, psn: int, host_buf: int = 4 * K64) -> Endpoint:
    ctx, pd = open_pd(p)
    cq = CQ(ctx, 32)
    mr = MR(pd, host_buf, ALL_ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=16, max_recv_wr=2, max_send_sge=1,
                                             max_recv_sge=1)))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn)


def loopback_pair(m) -> tuple:
    """A requester and a responder process on m, with connected RC QPs."""
    pa, pb = m.spawn("requester"), m.spawn("responder")
    a, b = rc_endpoint(pa, 0x10), rc_endpoint(pb, 0x20)
    connect(b, a.dest())
    connect(a, b.dest())
    return pa, a, pb, b


def post(ep: Endpoint, wr_id: int, opcode: int, local_off: int, length: int, raddr: int,
         rkey: int) -> str:
    ep.qp.post_send(SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(ep.mr.buf + local_off, length,
                                                           ep.mr.lkey)],
                           opcode=opcode, send_flags=SIG, remote_addr=raddr, rkey=rkey))
    (wc,) = ep.cq.poll_until(1)
    assert wc.wr_id == wr_id
    return v.ibv_wc_status_str(wc.status)


# -- module parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("params", [
    {"persistent_api_support": 2},
    {"persistent_api_support": -1},
    {"persistent_api_support": 0, "peerdirect_support": 2},
    {"peerdirect_support": -1},
    {"persistent_api_support": 1, "peerdirect_support": 7},
], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_bad_parameter_values_fail_the_load_with_einval(params):
    m = gpu_host(load=False)
    with pytest.raises(KernelError) as ei:
        m.load_module("nv_peer_mem", **params)
    assert ei.value.errno == errno.EINVAL
    assert "nv_peer_mem" not in m.modules
    assert registered(m) == []
    p = m.spawn("reader")
    assert read_sysfs(p, f"{PEERS}/nv_mem/version") is None
    assert read_sysfs(p, f"{PEERS}/nv_mem_nc/version") is None
    # nothing was left half-registered: a good load works afterwards
    m.load_module("nv_peer_mem", persistent_api_support=0)
    assert [n for n, _, _ in registered(m)] == ["nv_mem", "nv_mem_nc"]
    p.exit(0)


def test_unknown_parameter_fails_the_load():
    m = gpu_host(load=False)
    with pytest.raises(KernelError) as ei:
        m.load_module("nv_peer_mem", enable_dbg=1)     # nv_peer_memory's, not nvidia-peermem's
    assert ei.value.errno == errno.ENOENT
    assert registered(m) == []


def test_default_registers_only_a_persistent_nv_mem():
    m = gpu_host()
    assert state(m).persistent == 1 and state(m).peerdirect_support == 0
    assert registered(m) == [("nv_mem", False, False)]
    assert state(m).reg_handle is None                  # no invalidating registration
    p = m.spawn("reader")
    assert read_sysfs(p, f"{PEERS}/nv_mem/version") == DRV_VERSION + "\n"
    assert read_sysfs(p, f"{PEERS}/nv_mem_nc/version") is None
    assert stats(p) == dict.fromkeys(stats(p), 0)
    p.exit(0)


@pytest.mark.parametrize("peerdirect, unmaps", [(0, True), (1, False)])
def test_persistent_0_registers_nv_mem_then_nv_mem_nc(peerdirect, unmaps):
    m = gpu_host(persistent_api_support=0, peerdirect_support=peerdirect)
    assert registered(m) == [("nv_mem", True, unmaps), ("nv_mem_nc", False, False)]
    with m.kernel():
        inval, nc = peer_clients()
    # both layouts carry the ex marker; only peerdirect_support=0 has a real _ex
    assert inval.peer_mem.version_ex == 1
    ex = inval.peer_mem.container
    if peerdirect == 0:
        assert (ex.ex_size, ex.flags) == (2, PEER_MEM_INVALIDATE_UNMAPS)
    else:
        assert (ex.ex_size, ex.flags) == (0, 0)
    assert inval is state(m).reg_handle and nc is state(m).reg_handle_nc
    # the core handed its invalidate callback to the invalidating registration
    assert state(m).mem_invalidate_callback[0] is not None
    p = m.spawn("reader")
    for name in ("nv_mem", "nv_mem_nc"):
        assert read_sysfs(p, f"{PEERS}/{name}/version") == DRV_VERSION + "\n"
    p.exit(0)


@pytest.mark.parametrize("persistent", [0, 1])
def test_unload_unregisters_every_client(persistent):
    m = gpu_host(persistent_api_support=persistent)
    m.unload_module("nv_peer_mem")
    assert registered(m) == []
    p = m.spawn("reader")
    assert p.getdents(f"{PEERS}/nv_mem") in (-errno.ENOENT, [])
    assert read_sysfs(p, f"{PEERS}/nv_mem/num_alloc_mrs") is None
    p.exit(0)
    # and it loads again
    m.load_module("nv_peer_mem", persistent_api_support=persistent)
    assert registered(m)[0][0] == "nv_mem"


# -- acquire --------------------------------------------------------------------------------------
@pytest.mark.parametrize("persistent", [0, 1])
def test_acquire_rounds_to_64k_and_probes_with_get_then_put(persistent):
    m = gpu_host(persistent_api_support=persistent)
    p = m.spawn("app")
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(MiB)
    addr, length = d + 0x3000, 0x20000 + 0x234          # [d+0x3000, d+0x23234)
    with Tracer() as t:
        mr = p.run(MR, pd, length, ALL_ACCESS, addr)
    acq_name = "nv_mem_acquire" if not persistent else "nv_mem_acquire_nc"
    get = "nvidia_p2p_get_pages" if not persistent else "nvidia_p2p_get_pages_persistent"
    put = "nvidia_p2p_put_pages" if not persistent else "nvidia_p2p_put_pages_persistent"
    (acq,) = calls_named(t.trace, acq_name)
    assert acq.ret == "1"
    a = args_of(acq)
    assert (int(a["addr"], 16), int(a["size"], 16)) == (addr, length)
    # inside acquire: the probe, on the range rounded out to GPU pages, get then put
    probe = [c for c in acq.children if isinstance(c, Call)]
    assert [c.func for c in probe] == [get, put]
    pa = args_of(probe[0])
    assert int(pa["virtual_address"], 16) == d
    assert int(pa["length"], 16) == 0x30000               # 3 GPU pages
    assert int(args_of(probe[1])["virtual_address"], 16) == d
    # get_pages pins the same rounded range (addr/size are not used)
    sub = filter_trace(t.trace, function="nv_mem_get_pages" if not persistent
                       else "nv_mem_get_pages_nc")
    (gp,) = [c for c in sub.calls() if c.func == get]
    ga = args_of(gp)
    assert (int(ga["virtual_address"], 16), int(ga["length"], 16)) == (d, 0x30000)
    assert_call_flow(t.trace, [acq_name, get, put, "nv_mem_get_pages" if not persistent
                               else "nv_mem_get_pages_nc", get, "nv_dma_map"])
    # the probe's mapping is gone; the pin holds 3 BAR1 windows; one module ref per MR
    assert len(m.gpus[0].bar1_ptes) == 3
    assert refcnt(m) == 1
    mr.close()
    assert m.gpus[0].bar1_ptes == {}
    assert refcnt(m) == 0
    cudart(p).cudaFree(d)
    ctx.close()
    p.exit(0)


@pytest.mark.parametrize("persistent", [0, 1])
def test_acquire_says_not_mine_for_what_the_gpu_driver_refuses(persistent):
    m = gpu_host(persistent_api_support=persistent)
    p, other = m.spawn("app"), m.spawn("other")
    d = cudart(p).cudaMalloc(4 * K64)
    t = cudart(other).cudaMalloc(16 * K64)
    # an address of the other process's buffer that is none of ours (the two address
    # spaces are laid out alike, so their buffer may start where ours does)
    theirs = next(x for x in range(t, t + 16 * K64, K64) if not d <= x < d + 4 * K64)
    host = posix_memalign(p, K64, K64)
    st = state(m)
    acquire = st.nv_mem_acquire_nc if persistent else st.nv_mem_acquire
    with p.kernel():
        for addr, size in ((host, 4096),                  # host memory
                           (theirs, K64),                 # another process's GPU memory
                           (d + 3 * K64, 2 * K64),        # beyond the allocation's end
                           (d - K64, 2 * K64)):           # before its start
            cc = [None]
            assert acquire(addr, size, None, None, cc) == 0, hex(addr)
            assert cc[0] is None
        assert refcnt(m) == 0                            # "not mine" takes no module ref
        cc = [None]
        assert acquire(d + 0x10, 0x100, None, None, cc) == 1
        ctx = cc[0]
        assert isinstance(ctx, nv_mem_context)
        assert (ctx.page_virt_start, ctx.page_virt_end, ctx.mapped_size) == (d, d + K64, K64)
        assert ctx.page_table is None and ctx.sg_allocated == 0   # the probe kept nothing
        assert refcnt(m) == 1
        st.nv_mem_release(ctx)
    assert refcnt(m) == 0
    assert m.gpus[0].bar1_ptes == {}
    free(p, host, K64)
    for proc in (p, other):
        proc.exit(0)


def test_reg_mr_beyond_the_gpu_allocation_gets_gups_efault():
    m = gpu_host(persistent_api_support=0)
    p = m.spawn("app")
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(2 * K64)
    with Tracer() as t, pytest.raises(VerbsError) as ei:
        p.run(MR, pd, 3 * K64, ALL_ACCESS, d)
    assert ei.value.errno == errno.EFAULT
    assert [c.ret for c in calls_named(t.trace, "nv_mem_acquire")] == ["0"]
    assert [c.ret for c in calls_named(t.trace, "nv_mem_acquire_nc")] == ["0"]
    assert calls_named(t.trace, "nv_mem_get_pages") == []
    assert stats(p)["num_alloc_mrs"] == 0
    cudart(p).cudaFree(d)
    ctx.close()
    p.exit(0)


@pytest.mark.parametrize("persistent", [0, 1])
def test_bar1_exhaustion_is_not_mine_and_reg_mr_fails_with_efault(persistent):
    # 64 MiB BAR1 - 36 MiB reserve: 28 MiB for third-party mappings
    m = gpu_host(gpu=GpuConfig(bar1_size=64 << 20), persistent_api_support=persistent)
    p = m.spawn("app", cap_ipc_lock=True)
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(32 * MiB)
    with Tracer() as t, pytest.raises(VerbsError) as ei:
        p.run(MR, pd, 32 * MiB, ALL_ACCESS, d)
    assert ei.value.errno == errno.EFAULT               # gup's error stands
    acq = [c for c in t.trace.calls() if c.func in ("nv_mem_acquire", "nv_mem_acquire_nc")]
    assert acq and all(c.ret == "0" for c in acq)
    gets = [c for c in t.trace.calls()
            if c.func in ("nvidia_p2p_get_pages", "nvidia_p2p_get_pages_persistent")]
    assert gets and all(c.ret == "-ENOMEM" for c in gets)
    assert m.gpus[0].bar1_ptes == {}                     # nothing half-mapped
    # 16 MiB fits; another 16 MiB of new pages does not; the same 16 MiB again reuses
    mr1 = MR(pd, 16 * MiB, ALL_ACCESS, addr=d)
    with pytest.raises(VerbsError) as ei:
        MR(pd, 16 * MiB, ALL_ACCESS, addr=d + 16 * MiB)
    assert ei.value.errno == errno.EFAULT
    mr2 = MR(pd, 16 * MiB, ALL_ACCESS, addr=d)
    assert len(m.gpus[0].bar1_ptes) == 16 * MiB // K64
    mr1.close()
    mr2.close()
    assert m.gpus[0].bar1_ptes == {}
    mr3 = MR(pd, 16 * MiB, ALL_ACCESS, addr=d + 16 * MiB)  # the windows came back
    mr3.close()
    assert stats(p)["num_alloc_mrs"] == stats(p)["num_dealloc_mrs"] == 3
    assert m.gpus[0].bar1_faults == []
    cudart(p).cudaFree(d)
    ctx.close()
    p.exit(0)


# -- get_pages / dma_map / dma_unmap / put_pages / release, called as ib_core does ----------------
@pytest.mark.parametrize("persistent", [0, 1])
def test_dma_map_gives_one_64k_entry_per_gpu_page(persistent):
    m = gpu_host(persistent_api_support=persistent)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(MiB)
    st = state(m)
    if persistent:
        acquire, get_pages, put_pages = (st.nv_mem_acquire_nc, st.nv_mem_get_pages_nc,
                                         st.nv_mem_put_pages_nc)
    else:
        acquire, get_pages, put_pages = (st.nv_mem_acquire, st.nv_mem_get_pages,
                                         st.nv_mem_put_pages)
    dma_device = hca_dma_device(m)
    addr, size = d + K64 + 0x1234, 3 * K64             # touches GPU pages 1..4
    with p.kernel():
        cc = [None]
        assert acquire(addr, size, None, None, cc) == 1
        ctx = cc[0]
        assert get_pages(addr, size, 1, 0, None, ctx, 5) == 0
        assert ctx.core_context == 5
        assert st.nv_mem_get_page_size(ctx) == K64 == 65536
        pt = ctx.page_table
        assert pt.entries == 4
        sgt = sg_table(m)
        nmap = [0]
        assert st.nv_dma_map(sgt, ctx, dma_device, 0, nmap) == 0
        assert nmap == [4] and sgt.nents == 4 and ctx.npages == 4
        assert list(sgt.dma_len.view[:4]) == [K64] * 4
        assert list(sgt.sg_len.view[:4]) == [K64] * 4
        # identity IOMMU: the HCA's bus addresses are the BAR1 windows' addresses
        assert list(sgt.dma_addr.view[:4]) == [pg.physical_address for pg in pt.pages]
        assert ctx.sg_head is sgt and ctx.sg_allocated == 1
        assert ctx.dma_mapping.entries == 4
        assert len(m.gpus[0].bar1_ptes) == 4
        # teardown in the core's order: dma_unmap, put_pages, release
        assert st.nv_dma_unmap(sgt, ctx, dma_device) == 0
        put_pages(sgt, ctx)
        assert m.gpus[0].bar1_ptes == {}
        assert refcnt(m) == 1
        st.nv_mem_release(ctx)
        assert sgt.nents == 0                      # release freed the sg table
    assert refcnt(m) == 0
    cudart(p).cudaFree(d)
    p.exit(0)


def test_get_pages_without_a_context_is_einval():
    m = gpu_host(persistent_api_support=0)
    st = state(m)
    with m.kernel():
        assert st.nv_mem_get_pages(0, K64, 1, 0, None, None, 0) == -errno.EINVAL
        assert st.nv_mem_get_pages_nc(0, K64, 1, 0, None, None, 0) == -errno.EINVAL


def test_get_pages_failing_returns_the_drivers_errno():
    """cudaFree between acquire and get_pages: get_pages reports EINVAL (the range is
    no allocation any more) and logs it."""
    m = gpu_host(persistent_api_support=0)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st = state(m)
    with p.kernel():
        cc = [None]
        assert st.nv_mem_acquire(d, K64, None, None, cc) == 1
    cudart(p).cudaFree(d)
    with p.kernel():
        assert st.nv_mem_get_pages(d, K64, 1, 0, None, cc[0], 0) == -errno.EINVAL
        assert cc[0].page_table is None
        st.nv_mem_release(cc[0])
    assert any("nv_mem_get_pages: error" in line for line in m.dmesg)
    p.exit(0)


def test_unmap_and_put_with_a_foreign_sg_table_warn_and_do_nothing():
    m = gpu_host(persistent_api_support=0)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st = state(m)
    dma_device = hca_dma_device(m)
    with p.kernel():
        cc = [None]
        assert st.nv_mem_acquire(d, K64, None, None, cc) == 1
        ctx = cc[0]
        assert st.nv_mem_get_pages(d, K64, 1, 0, None, ctx, 0) == 0
        sgt = sg_table(m)
        assert st.nv_dma_map(sgt, ctx, dma_device, 0, [0]) == 0
        other = sg_table(m)
        assert st.nv_dma_unmap(other, ctx, dma_device) == -errno.EINVAL
        st.nv_mem_put_pages(other, ctx)
        assert len(m.bugs) == 2 and all("nv_peer_mem" in b for b in m.bugs)
        m.bugs.clear()
        assert len(m.gpus[0].bar1_ptes) == 1             # still mapped and pinned
        assert ctx.dma_mapping is not None
        # a NULL context: -EINVAL / nothing, no WARN
        assert st.nv_dma_unmap(sgt, None, dma_device) == -errno.EINVAL
        st.nv_mem_put_pages(sgt, None)
        assert m.bugs == []
        assert st.nv_dma_unmap(sgt, ctx, dma_device) == 0
        st.nv_mem_put_pages(sgt, ctx)
        st.nv_mem_release(ctx)
    assert m.gpus[0].bar1_ptes == {}
    cudart(p).cudaFree(d)
    p.exit(0)


# -- an MR on an unaligned GPU address ------------------------------------------------------------
@pytest.mark.parametrize("persistent", [0, 1])
def test_unaligned_gpu_mr_receives_rdma_at_exactly_its_bytes(persistent):
    m = gpu_host(persistent_api_support=persistent)
    pa, a, pb, b = loopback_pair(m)
    size = 4 * K64
    d = cudart(pb).cudaMalloc(size)
    gpu_store(pb, d, b"\xee" * size)
    start, length = 0x3000, 2 * K64 + 0x1F00         # [d+0x3000, d+0x24F00): 3 GPU pages
    gmr = MR(b.pd, length, ALL_ACCESS, addr=d + start)
    data = pattern(length)
    a.mr.write(data)
    # the whole MR in one WRITE, then its first and last byte alone
    assert post(a, 1, v.IBV_WR_RDMA_WRITE, 0, length, d + start, gmr.rkey) == "SUCCESS"
    got = gpu_load(pb, d, size)
    assert got[start:start + length] == data
    assert got[:start] == b"\xee" * start
    assert got[start + length:] == b"\xee" * (size - start - length)
    a.mr.write(b"\x01\x02")
    assert post(a, 2, v.IBV_WR_RDMA_WRITE, 0, 1, d + start, gmr.rkey) == "SUCCESS"
    assert post(a, 3, v.IBV_WR_RDMA_WRITE, 1, 1, d + start + length - 1, gmr.rkey) == "SUCCESS"
    got = gpu_load(pb, d, size)
    assert got[start] == 1 and got[start + length - 1] == 2
    assert got[start - 1] == got[start + length] == 0xEE
    # READ back the middle, across a GPU page boundary, into host memory at offset 0x30000
    off = K64 - start - 0x80                           # 0x80 bytes before GPU page 1
    assert post(a, 4, v.IBV_WR_RDMA_READ, 0x30000, 0x1000, d + start + off,
                gmr.rkey) == "SUCCESS"
    assert a.mr.read(0x1000, 0x30000) == got[start + off:start + off + 0x1000]
    # one byte past the MR's end is not the MR's, though it is on a pinned GPU page
    assert post(a, 5, v.IBV_WR_RDMA_WRITE, 0, 1, d + start + length, gmr.rkey) == \
        "REM_ACCESS_ERR"
    assert gpu_load(pb, d + start + length, 1) == b"\xee"
    assert m.gpus[0].bar1_faults == []
    gmr.close()
    cudart(pb).cudaFree(d)
    a.ctx.close()
    b.ctx.close()
    s = stats(pb)
    assert s["num_reg_bytes"] == s["num_dereg_bytes"] == length
    assert s["num_reg_pages"] == s["num_dereg_pages"] == 3
    pa.exit(0)
    pb.exit(0)


# -- the free callback ---------------------------------------------------------------------------
@pytest.mark.parametrize("peerdirect", [0, 1], ids=["unmaps", "old-style"])
def test_free_callback_never_gives_pages_back_itself(peerdirect):
    m = gpu_host(persistent_api_support=0, peerdirect_support=peerdirect)
    p = m.spawn("app")
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(4 * K64)
    mr = MR(pd, 4 * K64, ALL_ACCESS, addr=d)
    with Tracer() as t:
        p.run(cudart(p).cudaFree, d)
    (cb,) = calls_named(t.trace, "nv_get_p2p_free_callback")
    name = t.trace.tracks
    assert name[cb.track].startswith("kworker/nv_queue")
    inside = below(cb)
    assert "ib_invalidate_peer_memory" in inside
    # never from inside the callback: it would wait on the callback itself
    assert "nvidia_p2p_put_pages" not in inside
    assert "nvidia_p2p_dma_unmap_pages" not in inside
    if peerdirect:
        # old-style: the core unmaps inside the invalidation; the client skips both on
        # the callback's own task
        assert_call_flow(filter_trace(t.trace, function="nv_get_p2p_free_callback"), [
            "ib_invalidate_peer_memory", "ib_unmap_peer_client", "nv_dma_unmap",
            "nv_mem_put_pages"])
        for f in ("nv_dma_unmap", "nv_mem_put_pages"):
            (c,) = [c for c in cb.walk() if isinstance(c, Call) and c.func == f]
            assert c.track == cb.track
            assert [x for x in c.children if isinstance(x, Call)] == [], f
    else:
        assert "nv_dma_unmap" not in inside and "nv_mem_put_pages" not in inside
    # then the tables go back to the driver (no-ops), and RM frees after the callback
    assert_call_flow(filter_trace(t.trace, function="nv_get_p2p_free_callback"), [
        "ib_invalidate_peer_memory", "nvidia_p2p_free_dma_mapping",
        "nvidia_p2p_free_page_table"])
    (fpd,) = [c for c in calls_named(t.trace, "nv_p2p_free_platform_data")]
    assert fpd.start >= cb.end
    assert m.gpus[0].bar1_ptes == {}
    assert refcnt(m) == 1                               # the MR's context is still held
    # the dereg afterwards gives nothing back twice
    with Tracer() as t2:
        mr.close()
    for f in ("nvidia_p2p_put_pages", "nvidia_p2p_dma_unmap_pages", "nv_p2p_free_platform_data"):
        assert calls_named(t2.trace, f) == [], f
    assert refcnt(m) == 0
    assert m.gpus[0].bar1_faults == []
    ctx.close()
    s = stats(p)
    assert s["num_free_callbacks"] == 1
    assert s["num_alloc_mrs"] == s["num_dealloc_mrs"] == 1
    assert s["num_reg_pages"] == s["num_dereg_pages"] == 4
    p.exit(0)


def test_free_callback_clears_callback_task():
    """callback_task marks the callback's task only while the invalidation runs: a later
    dma_unmap/put_pages from that same worker would not be skipped."""
    m = gpu_host(persistent_api_support=0)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st, ctx, sgt = mapped_context(m, p, d, 9)
    seen = []
    from kernel_model.current import current

    def spy(real, reg_handle, core_context):
        seen.append((ctx.callback_task is current(), core_context, reg_handle))
        return real(reg_handle, core_context)
    free_spying(p, d, st, spy)
    assert seen == [(True, 9, st.reg_handle)]
    assert ctx.callback_task is None
    with p.kernel():
        # the driver freed the tables after the callback: a dma_unmap from another task
        # now goes through a freed page table (nv_peer_memory issue 53's use-after-free);
        # put_pages finds nothing (0)
        with pytest.raises(UseAfterFree):
            st.nv_dma_unmap(sgt, ctx, hca_dma_device(m))
        st.nv_mem_put_pages(sgt, ctx)
        st.nv_mem_release(ctx)
    assert refcnt(m) == 0
    p.exit(0)


def test_free_callback_with_a_bad_context_logs_and_does_nothing():
    m = gpu_host(persistent_api_support=0)
    st = state(m)
    bad_magic = nv_mem_context()
    bad_magic.pad2 = 0
    no_pt = nv_mem_context()
    no_map = nv_mem_context()
    no_map.page_table = object()
    calls = []
    real = st.mem_invalidate_callback[0]
    st.mem_invalidate_callback[0] = lambda *a: calls.append(a)
    try:
        with m.kernel():
            for ctx in (None, bad_magic, no_pt, no_map):
                st.nv_get_p2p_free_callback(ctx)
    finally:
        st.mem_invalidate_callback[0] = real
    assert calls == []
    log = [line for line in m.dmesg if line.startswith("nvidia-peermem:")]
    assert [line.split(" -- ")[1] for line in log[-4:]] == [
        "detected invalid context, skipping further processing",
        "detected invalid context, skipping further processing",
        "invalid page_table", "invalid dma_mapping"]
    assert refcnt(m) == 0                              # module_get/put balanced


# -- persistent_api_support=1: cudaFree does not invalidate ---------------------------------------
def test_persistent_mr_outlives_cuda_free_until_dereg():
    m = gpu_host()                                     # persistent_api_support=1
    pa, a, pb, b = loopback_pair(m)
    dev = m.modules["nvidia"].state.devices[0]
    free_before = len(dev.free_pages)
    d = cudart(pb).cudaMalloc(2 * K64)
    gmr = MR(b.pd, 2 * K64, ALL_ACCESS, addr=d)
    a.mr.write(pattern(0x2000))
    assert post(a, 1, v.IBV_WR_RDMA_WRITE, 0, 0x2000, d + 0x100, gmr.rkey) == "SUCCESS"
    assert gpu_load(pb, d + 0x100, 0x2000) == pattern(0x2000)
    with Tracer() as t:
        cudart(pb).cudaFree(d)
    assert calls_named(t.trace, "nv_get_p2p_free_callback") == []
    assert calls_named(t.trace, "ib_invalidate_peer_memory") == []
    assert stats(pb)["num_free_callbacks"] == 0
    # the pages stay pinned: not back in the free list, still behind their BAR1 windows
    assert len(dev.free_pages) == free_before - 2
    assert len(m.gpus[0].bar1_ptes) == 2
    # a new allocation does not get them, and RDMA into the old MR still lands
    d2 = cudart(pb).cudaMalloc(2 * K64)
    a.mr.write(pattern(0x2000, seed=3))
    assert post(a, 2, v.IBV_WR_RDMA_WRITE, 0, 0x2000, d + K64, gmr.rkey) == "SUCCESS"
    assert post(a, 3, v.IBV_WR_RDMA_READ, 0x10000, 0x2000, d + K64, gmr.rkey) == "SUCCESS"
    assert a.mr.read(0x2000, 0x10000) == pattern(0x2000, seed=3)
    assert post(a, 4, v.IBV_WR_RDMA_READ, 0x20000, 0x2000, d + 0x100, gmr.rkey) == "SUCCESS"
    assert a.mr.read(0x2000, 0x20000) == pattern(0x2000)   # the first WRITE, still there
    assert gpu_load(pb, d2, 2 * K64) == bytes(2 * K64)      # the new buffer is untouched
    assert b.qp and m.hcas[0].fw.qps[b.qp.qp_num].state == 3    # RTS: no error anywhere
    # dereg gives the pages back
    gmr.close()
    assert m.gpus[0].bar1_ptes == {}
    assert len(dev.free_pages) == free_before - 2         # only d2's pages are out
    cudart(pb).cudaFree(d2)
    assert len(dev.free_pages) == free_before
    assert m.gpus[0].bar1_faults == []
    a.ctx.close()
    b.ctx.close()
    s = stats(pb)
    assert s["num_alloc_mrs"] == s["num_dealloc_mrs"] == 1
    assert s["num_reg_pages"] == s["num_dereg_pages"] == 2
    pa.exit(0)
    pb.exit(0)


def test_persistent_mr_when_the_gpu_file_closes_first():
    """Process exit with the GPU file closed before uverbs: the persistent mapping keeps
    the pages until the uverbs close deregisters the MR."""
    m = gpu_host()
    p = m.spawn("app")

    def program():
        cudart(p)
        ctx, pd = open_pd(p)
        d = cudart(p).cudaMalloc(3 * K64)
        return MR(pd, 3 * K64, ALL_ACCESS, addr=d)

    p.run(program)
    dev = m.modules["nvidia"].state.devices[0]
    with Tracer() as t:
        p.exit(0)
    names = [c.func for c in t.trace.calls()]
    assert names.index("nvidia_close") < names.index("mlx5_ib_dereg_mr") < \
        names.index("nvidia_p2p_put_pages_persistent")
    assert "nv_get_p2p_free_callback" not in names
    assert dev.clients == [] and m.gpus[0].bar1_ptes == {}
    assert len(dev.free_pages) == m.gpus[0].nr_pages
    reader = m.spawn("reader")
    s = stats(reader)
    assert s["num_alloc_mrs"] == s["num_dealloc_mrs"] == 1
    assert s["num_free_callbacks"] == 0
    reader.exit(0)


# -- cudaFree racing a registration ------------------------------------------------------------
def _free_during_registration(m, p, d: int, pd):
    """ibv_reg_mr of d, with cudaFree(d) running on another thread of p right after
    nv_mem's get_pages returned (before dma_map): what the MR registration sees."""
    from kernel_model.sched import SCHED
    with m.kernel():
        client = peer_clients()[0].peer_mem
    get_pages = client.get_pages
    threads = []

    def get_pages_then_let_cuda_free_run(*args):
        ret = get_pages(*args)
        threads.append(p.thread(cudart(p).cudaFree, d, name="freer"))
        for _ in range(20):
            SCHED.yield_("test: let the freeing thread run")
        return ret

    client.get_pages = get_pages_then_let_cuda_free_run
    try:
        return p.run(MR, pd, K64, ALL_ACCESS, d)
    finally:
        client.get_pages = get_pages
        for t in threads:
            t.join()


def test_cuda_free_between_get_pages_and_dma_map_is_the_known_invalid_dma_mapping_race():
    """nvidia-peermem's free callback bails out ("invalid dma_mapping", the log line of
    nv_peer_memory issues #53/#111/#112) when it runs before dma_map: ib_core is never
    told, RM frees the page table, and dma_map then reads it.  This mirrors the real
    client (get_pages' own comment warns that an invalidation may already run); KASAN
    names the use-after-free."""
    from kernel_model.slab import UseAfterFree
    m = gpu_host(persistent_api_support=0)
    p = m.spawn("app")
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(K64)
    with pytest.raises(UseAfterFree) as ei:
        _free_during_registration(m, p, d, pd)
    assert "nv_dma_map" in str(ei.value) and "nvidia_p2p_page_table" in str(ei.value)
    assert "nvidia-peermem: nv_get_p2p_free_callback -- invalid dma_mapping" in m.dmesg
    assert stats(p)["num_free_callbacks"] == 0         # ib_core never heard of it
    assert stats(p)["num_alloc_mrs"] == 0
    assert refcnt(m) == 0 and m.gpus[0].bar1_ptes == {}
    ctx.close()
    p.exit(0)


def test_cuda_free_racing_a_persistent_registration_leaves_the_mr_working():
    m = gpu_host()                                     # persistent_api_support=1
    p = m.spawn("app")
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(K64)
    mr = _free_during_registration(m, p, d, pd)
    assert d not in cudart(p).allocations              # cudaFree went through
    assert len(m.gpus[0].bar1_ptes) == 1               # the persistent pin keeps the page
    mr.close()
    assert m.gpus[0].bar1_ptes == {}
    ctx.close()
    p.exit(0)


# -- nv_peer_memory 1.0 (version="1.0") -----------------------------------------------------------
def test_version_other_than_the_two_modelled_fails_the_load_with_einval():
    m = gpu_host(load=False)
    with pytest.raises(KernelError) as ei:
        m.load_module("nv_peer_mem", version="1.2")
    assert ei.value.errno == errno.EINVAL and "1.2" in str(ei.value)
    assert registered(m) == []


def test_version_1_0_registers_one_old_style_invalidating_nv_mem():
    m = gpu_host(version="1.0")
    assert registered(m) == [("nv_mem", True, False)]
    with m.kernel():
        (client,) = peer_clients()
    assert client.peer_mem.version_ex == 0 and client.peer_mem.container is None
    p = m.spawn("reader")
    assert read_sysfs(p, f"{PEERS}/nv_mem/version") == "1.0\n"
    assert read_sysfs(p, f"{PEERS}/nv_mem_nc/version") is None
    p.exit(0)


def test_version_1_0_is_callback_stays_set_and_silences_unmap_and_put_on_any_task():
    """1.0's is_callback is sticky (B5): after the callback, dma_unmap and put_pages do
    nothing on any task - the driver freed the tables - and the callback never touches
    the context once ib_core's invalidate returned."""
    m = gpu_host(version="1.0")
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st, ctx, sgt = mapped_context(m, p, d, 3)
    seen = []

    def spy(real, reg_handle, core_context):
        seen.append((ctx.is_callback, ctx.callback_task, core_context))
        return real(reg_handle, core_context)
    free_spying(p, d, st, spy)
    assert seen == [(1, None, 3)] and ctx.is_callback == 1
    with Tracer() as t, p.kernel():           # another task: still nothing reaches RM
        assert st.nv_dma_unmap(sgt, ctx, hca_dma_device(m)) == 0
        st.nv_mem_put_pages(sgt, ctx)
        st.nv_mem_release(ctx)
    assert calls_named(t.trace, "nvidia_p2p_dma_unmap_pages") == []
    assert calls_named(t.trace, "nvidia_p2p_put_pages") == []
    assert refcnt(m) == 0 and m.gpus[0].bar1_ptes == {}
    p.exit(0)


def test_version_1_0_holds_the_module_through_its_free_callback():
    """rmmod while the callback runs fails EBUSY even when the MR was torn down inside
    it (a 4.x core): the callback's own __module_get outlives ib_core's invalidate."""
    m = rdma_host(nr_gpus=1, modules=())
    m.load_module("ib_core", ofed="4.9")
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem", version="1.0")
    p = m.spawn("app")
    ctx, pd = open_pd(p)
    d = cudart(p).cudaMalloc(K64)
    mr = MR(pd, K64, ALL_ACCESS, addr=d)
    st = state(m)
    tried = []

    def spy(real, reg_handle, core_context):
        ret = real(reg_handle, core_context)          # the MR is gone: release() ran
        with pytest.raises(KernelError) as ei:
            m.unload_module("nv_peer_mem")
        tried.append((ei.value.errno, refcnt(m)))
        return ret
    free_spying(p, d, st, spy)
    assert tried == [(errno.EBUSY, 1)]                # the callback's own reference
    assert refcnt(m) == 0
    mr.close()
    ctx.close()
    m.unload_module("nv_peer_mem")
    p.exit(0)

"""GPUDirect RDMA end to end: RDMA into and out of GPU memory registered through nv_peer_mem.

host-b has a GPU, the nvidia driver and nv_peer_mem (persistent_api_support=0,
so MRs can be invalidated).  Its process cudaMallocs a buffer and ibv_reg_mrs
it: gup fails on the VM_IO|VM_PFNMAP GPU mapping, ib_core asks the peer
clients, nv_mem pins the pages with nvidia_p2p_get_pages and hands the HCA one
64 KiB bus address (a BAR1 window) per GPU page.  host-a's process RDMA-WRITEs
into the buffer and RDMA-READs from it; cudaMemcpy shows the bytes.  cudaFree
runs nv_mem's free callback on the GPU driver's nv_queue worker, the MR is
revoked, and the next WRITE completes with REM_ACCESS_ERR - the revoked mkey
answers, no DMA reaches an unmapped BAR1 window.

Each flow also runs on one machine (loopback: both processes on host-b).
Teardown is checked in both orders the process exit can take (the GPU file
or the uverbs file closed first), with the peer-memory statistics in
/sys/kernel/mm/memory_peers/nv_mem/ balanced afterwards; the suite's autouse
fixture runs the leak check after each test.
"""

from __future__ import annotations

import errno

import attrs
import pytest

from drivers.ib_core.peer_mem import peer_clients
from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import KernelError
from kernel_model.hw.fabric import Fabric
from kernel_model.trace import Tracer
from kernel_model.tracedata import Call
from peermem_testing.gpu import gpu_load, gpu_store
from userspace.cuda.runtime import cudart
from userspace.libc import read_sysfs
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.tools import write_bw
from userspace.tools.write_bw import Endpoint, connect

K64 = 1 << 16
GPU_BUF = 1 << 20
HOST_BUF = 128 << 10
ALL_ACCESS = (v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
              | v.IBV_ACCESS_REMOTE_READ)
QPS_RTS, QPS_ERR = 3, 6                      # qpc.state
SIG = v.IBV_SEND_SIGNALED
PEERS = "/sys/kernel/mm/memory_peers"
STATS = ("num_alloc_mrs", "num_dealloc_mrs", "num_reg_pages", "num_dereg_pages",
         "num_reg_bytes", "num_dereg_bytes", "num_free_callbacks")
LINKS = ["loopback", "fabric"]


# -- the two ends -----------------------------------------------------------------------------
@attrs.define(eq=False)
class Side:
    m: object
    p: object
    ep: Endpoint

    @property
    def qp(self):
        return self.ep.qp

    @property
    def cq(self):
        return self.ep.cq

    def fw_state(self) -> int:
        return self.m.hcas[0].fw.qps[self.qp.qp_num].state


@attrs.define(eq=False)
class GpuLink:
    """A (requester) on host-a or host-b, b (responder, owner of the GPU buffer) on host-b."""

    a: Side
    b: Side
    gpu_host: object
    d: int = 0                  # the responder's cudaMalloc'd buffer
    gmr: object = None          # its MR

    def write(self, wr_id: int, src: int, dst: int, length: int) -> SendWR:
        """RDMA WRITE of a's host buffer [src, src+length) to the GPU buffer at d + dst."""
        return SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(self.a.ep.mr.buf + src, length,
                                                      self.a.ep.mr.lkey)],
                      opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                      remote_addr=self.d + dst, rkey=self.gmr.rkey)

    def read(self, wr_id: int, dst: int, src: int, length: int) -> SendWR:
        """RDMA READ of the GPU buffer at d + src into a's host buffer at dst."""
        return SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(self.a.ep.mr.buf + dst, length,
                                                      self.a.ep.mr.lkey)],
                      opcode=v.IBV_WR_RDMA_READ, send_flags=SIG,
                      remote_addr=self.d + src, rkey=self.gmr.rkey)


def gpu_machine(name: str | None = None, fabric: Fabric | None = None, *,
                persistent: int = 0, peerdirect: int = 0):
    m = rdma_host(name=name, fabric=fabric, nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem", persistent_api_support=persistent,
                  peerdirect_support=peerdirect)
    return m


def endpoint(p, psn: int) -> Endpoint:
    """Context, PD, CQ, a HOST_BUF host MR and an RC QP in RESET."""
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, HOST_BUF, ALL_ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=16, max_recv_wr=4, max_send_sge=1,
                                             max_recv_sge=1)))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn)


def gpu_register(ep: Endpoint, size: int = GPU_BUF, access: int = ALL_ACCESS) -> tuple:
    """cudaMalloc and ibv_reg_mr of the whole buffer: (address, MR)."""
    d = cudart(ep.ctx.proc).cudaMalloc(size)
    return d, MR(ep.pd, size, access, addr=d)


def make_link(kind: str, **gpu_kw) -> GpuLink:
    """Requester and GPU-owning responder, connected; the responder's GPU MR registered
    (by the responder process itself, so the call flow sits on its track)."""
    if kind == "loopback":
        b_m = gpu_machine(**gpu_kw)
        a_m = b_m
    else:
        fabric = Fabric()
        a_m = rdma_host(name="host-a", fabric=fabric)
        a_m.load_module("mlx5_ib")
        b_m = gpu_machine("host-b", fabric, **gpu_kw)
    pa, pb = a_m.spawn("requester"), b_m.spawn("responder")
    a = Side(a_m, pa, endpoint(pa, 0x111))
    b = Side(b_m, pb, endpoint(pb, 0x222))
    link = GpuLink(a, b, b_m)
    link.d, link.gmr = pb.run(gpu_register, b.ep)
    connect(b.ep, a.ep.dest())
    connect(a.ep, b.ep.dest())
    return link


def fresh_qps(link: GpuLink) -> None:
    """Replace both QPs by a new connected pair (after an error moved them to ERR)."""
    for side in (link.a, link.b):
        side.ep.qp.close()
        side.ep.qp = QP(side.ep.pd, QPInitAttr(side.cq, side.cq, cap=QPCap(
            max_send_wr=16, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)))
    connect(link.b.ep, link.a.ep.dest())
    connect(link.a.ep, link.b.ep.dest())


def status(wcs) -> list[tuple[int, str]]:
    return [(wc.wr_id, v.ibv_wc_status_str(wc.status)) for wc in wcs]


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 13 + seed * 7) & 0xFF for i in range(n))


def peer_stats(p, client: str = "nv_mem") -> dict[str, int]:
    """The client's statistics as a user process reads them from sysfs."""
    out = {}
    for name in STATS:
        text = read_sysfs(p, f"{PEERS}/{client}/{name}")
        assert text is not None and text.endswith("\n"), (name, text)
        out[name] = int(text)
    return out


def balanced(nmrs: int, nbytes: int, callbacks: int, pages: int | None = None
             ) -> dict[str, int]:
    """Statistics after every MR is gone: as much deregistered as registered."""
    pages = nbytes // K64 if pages is None else pages
    return {"num_alloc_mrs": nmrs, "num_dealloc_mrs": nmrs, "num_reg_pages": pages,
            "num_dereg_pages": pages, "num_reg_bytes": nbytes, "num_dereg_bytes": nbytes,
            "num_free_callbacks": callbacks}


def gpu(m):
    return m.gpus[0]


def calls_named(trace, name: str) -> list[Call]:
    return [c for c in trace.calls() if c.func == name]


def below(call: Call) -> list[str]:
    """The names of every call under `call` (not itself)."""
    return [c.func for c in call.walk() if isinstance(c, Call) and c is not call]


# -- the main flow ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", LINKS)
def test_write_read_then_cuda_free_invalidates(kind):
    link = make_link(kind)
    a, b = link.a, link.b
    # WRITE 64 KiB into the second half of the 2nd GPU page and on into the 3rd
    off = 0x18000
    a.ep.mr.write(pattern(K64))
    a.qp.post_send(link.write(1, 0, off, K64))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    got = gpu_load(b.p, link.d, GPU_BUF)
    assert got[off:off + K64] == pattern(K64)
    assert got[:off] == bytes(off)                      # nothing else was touched
    assert got[off + K64:] == bytes(GPU_BUF - off - K64)
    # READ from GPU memory: what cudaMemcpy put there comes back to host-a
    gpu_store(b.p, link.d + 0xF0000, pattern(0x8000, seed=5))
    a.qp.post_send(link.read(2, K64, 0xF0000, 0x8000))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert a.ep.mr.read(0x8000, K64) == pattern(0x8000, seed=5)
    assert gpu(link.gpu_host).bar1_faults == []
    # cudaFree: the free callback revokes the MR; the next WRITE meets the revoked mkey
    with Tracer() as t:
        b.p.run(cudart(b.p).cudaFree, link.d)
    assert len(calls_named(t.trace, "ib_invalidate_peer_memory")) == 1
    a.qp.post_send(link.write(3, 0, off, K64))
    assert status(a.cq.poll_until(1)) == [(3, "REM_ACCESS_ERR")]
    assert a.fw_state() == QPS_ERR
    assert b.fw_state() == QPS_ERR
    assert gpu(link.gpu_host).bar1_faults == []         # no DMA reached a dead window
    assert gpu(link.gpu_host).bar1_ptes == {}           # every BAR1 window unmapped
    a.ep.ctx.close()
    b.ep.ctx.close()                                    # dereg of the revoked MR
    assert peer_stats(b.p) == balanced(1, GPU_BUF, 1)
    assert peer_stats(b.p, "nv_mem_nc") == balanced(0, 0, 0)
    for p in (a.p, b.p):
        p.exit(0)


@pytest.mark.parametrize("peerdirect", [0, 1], ids=["unmaps", "old-style"])
def test_cuda_free_invalidates_with_either_client_layout(peerdirect):
    """peerdirect_support=1 (the core unmaps inside the invalidation) ends the same way."""
    link = make_link("loopback", peerdirect=peerdirect)
    a, b = link.a, link.b
    a.ep.mr.write(pattern(0x1000))
    a.qp.post_send(link.write(1, 0, 0x100, 0x1000))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert gpu_load(b.p, link.d + 0x100, 0x1000) == pattern(0x1000)
    b.p.run(cudart(b.p).cudaFree, link.d)
    a.qp.post_send(link.write(2, 0, 0x100, 0x1000))
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert b.fw_state() == QPS_ERR
    assert gpu(link.gpu_host).bar1_faults == []
    b.ep.ctx.close()
    a.ep.ctx.close()
    assert peer_stats(b.p) == balanced(1, GPU_BUF, 1)


def test_two_mrs_on_one_buffer_are_both_invalidated():
    link = make_link("loopback")
    a, b = link.a, link.b
    # a second MR over the middle of the same allocation: BAR1 windows are shared
    mr2 = MR(b.ep.pd, 3 * K64, ALL_ACCESS, addr=link.d + 2 * K64)
    windows = len(gpu(link.gpu_host).bar1_ptes)
    assert windows == GPU_BUF // K64
    b.p.run(cudart(b.p).cudaFree, link.d)
    for wr_id, rkey in ((1, link.gmr.rkey), (2, mr2.rkey)):
        wr = link.write(wr_id, 0, 2 * K64, 64)
        wr.rkey = rkey
        a.qp.post_send(wr)
        assert status(a.cq.poll_until(1)) == [(wr_id, "REM_ACCESS_ERR")]
        assert b.fw_state() == QPS_ERR
        fresh_qps(link)                       # both QPs are in ERR: a new pair
    assert gpu(link.gpu_host).bar1_ptes == {}
    b.ep.ctx.close()
    a.ep.ctx.close()
    assert peer_stats(b.p) == balanced(2, GPU_BUF + 3 * K64, 2)


# -- call flows -----------------------------------------------------------------------------------
def test_registration_call_flow():
    m = gpu_machine()
    p = m.spawn("app")
    ep = endpoint(p, 0)
    with Tracer() as t:
        d, mr = p.run(gpu_register, ep)
    calls = assert_call_flow(t.trace, [
        "ibv_reg_mr", "mlx5_ib_reg_user_mr", "ib_umem_get_peer", "pin_user_pages_fast",
        "ib_peer_umem_get", "ib_get_peer_client", "nv_mem_acquire", "nv_mem_get_pages",
        "nvidia_p2p_get_pages", "nv_dma_map", "nvidia_p2p_dma_map_pages",
        "nv_mem_get_page_size", "reg_create", "ib_umem_activate_invalidation_notifier"])
    by = {c.func: c for c in calls}
    assert by["pin_user_pages_fast"].ret == "-EFAULT"   # gup refuses the GPU mapping
    assert by["nv_mem_acquire"].ret == "1"
    assert by["nv_mem_get_pages"].ret == "0" and by["nv_dma_map"].ret == "0"
    # every step ran on the registering process's own track
    name = t.trace.tracks
    assert {name[c.track] for c in calls} == {f"app-{p.pid}"}
    # the invalidating client took it: nv_mem_nc was never asked
    assert calls_named(t.trace, "nv_mem_acquire_nc") == []
    assert gpu(m).bar1_faults == []
    mr.close()
    cudart(p).cudaFree(d)
    ep.ctx.close()
    p.exit(0)


def test_cuda_free_call_flow_and_tracks():
    m = gpu_machine()
    p = m.spawn("app")
    ep = endpoint(p, 0)
    d, mr = p.run(gpu_register, ep)
    with Tracer() as t:
        p.run(cudart(p).cudaFree, d)
    calls = assert_call_flow(t.trace, [
        "cudaFree", "nv_p2p_mem_info_free_callback", "nv_get_p2p_free_callback",
        "ib_invalidate_peer_memory", "mlx5_invalidate_umem", "mlx5r_umr_revoke_mr",
        "ib_unmap_peer_client", "nvidia_p2p_free_dma_mapping", "nvidia_p2p_free_page_table",
        "nv_p2p_free_platform_data"])
    by = {c.func: c for c in calls}
    name = t.trace.tracks
    assert name[by["cudaFree"].track] == f"app-{p.pid}"
    cb_track = name[by["nv_get_p2p_free_callback"].track]
    assert cb_track.startswith("kworker/nv_queue")
    for f in ("nv_p2p_mem_info_free_callback", "ib_invalidate_peer_memory",
              "mlx5_invalidate_umem", "mlx5r_umr_revoke_mr"):
        assert name[by[f].track] == cb_track, f
    # nothing under the callback gives pages back: RM does it after the callback returns
    cb = by["nv_get_p2p_free_callback"]
    inside = below(cb)
    for f in ("nvidia_p2p_put_pages", "nvidia_p2p_dma_unmap_pages", "nv_mem_put_pages",
              "nv_dma_unmap", "nv_p2p_free_platform_data"):
        assert f not in inside, f
    assert by["nv_p2p_free_platform_data"].start >= cb.end
    assert gpu(m).bar1_faults == []
    assert gpu(m).bar1_ptes == {}
    mr.close()
    ep.ctx.close()
    assert peer_stats(p) == balanced(1, GPU_BUF, 1)
    p.exit(0)


def _umem_states(trace) -> list[tuple[str, str]]:
    return [(pt.fields["old"], pt.fields["new"]) for pt in trace.points("peer_umem_state")
            if pt.fields["client"] == "nv_mem"]


def test_peer_umem_state_tracepoint_new_states():
    m = gpu_machine()
    p = m.spawn("app")
    ep = endpoint(p, 0)
    with Tracer() as t:
        d, mr = p.run(gpu_register, ep)
        p.run(cudart(p).cudaFree, d)
        p.run(mr.close)
    news = [new for _old, new in _umem_states(t.trace)]
    # registration, invalidation by cudaFree, dereg (release's own no-op write after it)
    assert news[:3] == ["MAPPED", "INVALIDATED", "UNMAPPED"]
    assert set(news[3:]) <= {"UNMAPPED"}
    ep.ctx.close()
    p.exit(0)


def test_peer_umem_state_tracepoint_transitions():
    m = gpu_machine()
    p = m.spawn("app")
    ep = endpoint(p, 0)
    with Tracer() as t:
        d, mr = p.run(gpu_register, ep)
        p.run(cudart(p).cudaFree, d)
        p.run(mr.close)
    states = _umem_states(t.trace)
    ep.ctx.close()
    p.exit(0)
    # (stop_invalidation_notifier records INVALIDATED -> UNMAPPED as it takes the umem
    # away from ib_invalidate_peer_memory; the unmap it then runs outside the lock
    # records the same transition)
    assert states[:3] == [("UNMAPPED", "MAPPED"), ("MAPPED", "INVALIDATED"),
                          ("INVALIDATED", "UNMAPPED")]
    assert all(new == "UNMAPPED" for _old, new in states[3:])


# -- process exit ---------------------------------------------------------------------------------
@pytest.mark.parametrize("first", ["gpu", "uverbs"])
def test_process_exit_in_either_fd_order(first):
    m = gpu_machine()
    p = m.spawn("app")

    def program():
        if first == "gpu":
            cudart(p)                         # /dev/nvidia0 gets the lower fd
            ctx = Context(p)
        else:
            ctx = Context(p)
            cudart(p)
        pd = PD(ctx)
        d = cudart(p).cudaMalloc(GPU_BUF)
        return MR(pd, GPU_BUF, ALL_ACCESS, addr=d)

    p.run(program)
    reader = m.spawn("reader")
    with Tracer() as t:
        p.exit(0)                             # MR registered, memory not freed
    names = [c.func for c in t.trace.calls()]
    gpu_close, uv_close = names.index("nvidia_close"), names.index("ib_uverbs_close")
    dereg = names.index("mlx5_ib_dereg_mr")
    if first == "gpu":
        # the GPU file goes first: the free callback invalidates the MR, then uverbs
        # close deregisters the already-revoked MR without touching the GPU driver again
        assert gpu_close < uv_close
        cb = names.index("nv_get_p2p_free_callback")
        assert gpu_close < cb < names.index("ib_invalidate_peer_memory") < uv_close < dereg
        assert "nvidia_p2p_put_pages" not in names[dereg:]
        assert "nvidia_p2p_dma_unmap_pages" not in names[dereg:]
        callbacks = 1
    else:
        # dereg first: dma_unmap + put_pages give everything back; the GPU file then
        # frees memory nobody maps any more (no callback)
        assert uv_close < dereg < gpu_close
        assert names.index("nvidia_p2p_dma_unmap_pages", dereg) < \
            names.index("nvidia_p2p_put_pages", dereg) < gpu_close
        assert "nv_get_p2p_free_callback" not in names
        callbacks = 0
    assert gpu(m).bar1_faults == []
    assert gpu(m).bar1_ptes == {}
    assert peer_stats(reader) == balanced(1, GPU_BUF, callbacks)
    reader.exit(0)
    m.check_leaks()


def test_exit_with_everything_outstanding_two_machines():
    """Both processes exit with QPs, MRs and the GPU buffer still there: do_exit tears
    it all down."""
    link = make_link("fabric")
    a, b = link.a, link.b
    a.ep.mr.write(pattern(0x2000))
    a.qp.post_send(link.write(1, 0, 0x3000, 0x2000))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    reader = b.m.spawn("reader")
    a.p.exit(0)
    b.p.exit(0)
    assert gpu(b.m).bar1_faults == []
    assert gpu(b.m).bar1_ptes == {}
    stats = peer_stats(reader)
    assert stats["num_alloc_mrs"] == stats["num_dealloc_mrs"] == 1
    assert stats["num_reg_pages"] == stats["num_dereg_pages"] == GPU_BUF // K64
    assert stats["num_reg_bytes"] == stats["num_dereg_bytes"] == GPU_BUF
    reader.exit(0)
    for mach in (a.m, b.m):
        mach.check_leaks()


# -- module unload --------------------------------------------------------------------------------
@pytest.mark.parametrize("persistent", [0, 1])
def test_unload_nv_peer_mem_is_ebusy_while_an_mr_is_outstanding(persistent):
    m = gpu_machine(persistent=persistent)
    p = m.spawn("app")
    ep = endpoint(p, 0)
    d, mr = gpu_register(ep)
    with pytest.raises(KernelError) as ei:
        m.unload_module("nv_peer_mem")
    assert ei.value.errno == errno.EBUSY
    assert "nv_peer_mem" in m.modules
    with m.kernel():
        assert [c.peer_mem.name for c in peer_clients()][0] == "nv_mem"
    assert read_sysfs(p, f"{PEERS}/nv_mem/num_alloc_mrs") == "1\n"
    mr.close()
    m.unload_module("nv_peer_mem")
    assert "nv_peer_mem" not in m.modules
    with m.kernel():
        assert peer_clients() == []
    assert read_sysfs(p, f"{PEERS}/nv_mem/version") is None
    assert read_sysfs(p, f"{PEERS}/nv_mem_nc/version") is None
    cudart(p).cudaFree(d)
    ep.ctx.close()
    p.exit(0)


# -- perftest over GPU memory ---------------------------------------------------------------------
@pytest.mark.parametrize("persistent", [0, 1])
def test_write_bw_with_gpu_buffers(persistent):
    m = gpu_machine(persistent=persistent)
    lines: list[str] = []
    write_bw.main((m, m), size=3 * K64 + 0x123, iters=8, tx_depth=4, cq_mod=2,
                  out=lines.append, use_gpu=True)
    assert any("data verified" in line for line in lines)
    reader = m.spawn("reader")
    size = 3 * K64 + 0x123                    # 4 GPU pages per buffer
    assert peer_stats(reader) == balanced(2, 2 * size, 0, pages=2 * 4)
    reader.exit(0)
    assert gpu(m).bar1_faults == []

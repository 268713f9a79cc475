"""The `gpudirect` and `cuda-free-invalidate` scenarios: RDMA into GPU memory, then cudaFree.

gpudirect - the main job.  host-a and host-b share a Fabric; host-b also has
a GPU, the nvidia driver and nv_peer_mem (persistent_api_support=0, so MRs
can be invalidated):

  gpu_register       the server cudaMallocs 1 MiB and ibv_reg_mrs it: gup fails
                     on the GPU VMA (VM_IO|VM_PFNMAP), ib_umem_get_peer asks the
                     peer clients, nv_mem's acquire probes, get_pages pins
                     (nvidia_p2p_get_pages: BAR1 windows), dma_map hands the HCA
                     one 64 KiB bus address per GPU page, CREATE_MKEY, then the
                     invalidation notifier is armed
  write_to_gpu       the client on host-a RDMA-WRITEs 64 KiB into it: host-b's
                     HCA DMAs through BAR1 into GPU memory
  gpu_readback       the server cudaMemcpys it back and checks every byte
  gpu_free           cudaFree: the GPU driver runs nv_mem's free callback on its
                     own thread -> ib_invalidate_peer_memory -> mlx5_invalidate_umem
                     -> the mkey is revoked (UMR) -> BAR1 windows unmapped
  write_after_free   the client's next WRITE completes with REM_ACCESS_ERR: the
                     revoked mkey, not the freed memory, answers
  teardown           dereg (revoke, stop, release), close, exit; leak check

cuda-free-invalidate - one machine: a process registers GPU memory, then
cudaFree revokes it; the free callback's chain on its own.

`peermem trace gpudirect` prints the story (GPUDIRECT_STORY): the five steps
above, three calls deep, each with what every task did meanwhile and its
outcome read from the trace, then one summary line; `--full` or any filter
prints the whole graph.  With `peermem trace gpudirect --stats` the
peer-memory statistics the server reads from /sys/kernel/mm/memory_peers/
after teardown are printed.
"""

from __future__ import annotations

from kernel_model.emu.platform import Fabric, rdma_host
from kernel_model.trace import traced
from kernel_model.tracedata import Call, Trace
from scenarios import scenario
from scenarios.story import Story, StoryStep, calls_of, completions, during
from userspace.cuda.runtime import cudaMemcpyDeviceToHost, cudart
from userspace.libc import free, posix_memalign, read_sysfs
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, SendWR
from userspace.tools.write_bw import Endpoint, connect, setup

GPU_BUF = 1 << 20
WRITE = 64 << 10
OFFSET = 0x18000           # into the GPU buffer: the second half of its 2nd GPU page on
PEERS = "/sys/kernel/mm/memory_peers"
STATS = ("num_alloc_mrs", "num_dealloc_mrs", "num_reg_pages", "num_dereg_pages",
         "num_reg_bytes", "num_dereg_bytes", "num_free_callbacks")


def _pattern(n: int) -> bytes:
    return bytes((i * 13 + 5) & 0xFF for i in range(n))


@traced(layer="userspace")
def gpu_register(ep: Endpoint) -> tuple[int, MR]:
    """cudaMalloc, then ibv_reg_mr of the GPU buffer (the peer-memory path)."""
    cu = cudart(ep.ctx.proc)
    d = cu.cudaMalloc(GPU_BUF)
    mr = MR(ep.pd, GPU_BUF, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, addr=d)
    return d, mr


def _write(ep: Endpoint, wr_id: int, raddr: int, rkey: int) -> str:
    ep.qp.post_send(SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(ep.mr.buf, WRITE, ep.mr.lkey)],
                           opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                           remote_addr=raddr, rkey=rkey))
    (wc,) = ep.cq.poll_until(1)
    return v.ibv_wc_status_str(wc.status)


@traced(layer="userspace")
def write_to_gpu(ep: Endpoint, raddr: int, rkey: int) -> str:
    """One signalled RDMA WRITE of 64 KiB into the remote GPU buffer."""
    ep.mr.write(_pattern(WRITE))
    return _write(ep, 1, raddr, rkey)


@traced(layer="userspace")
def gpu_readback(proc, d: int) -> bytes:
    """cudaMemcpy the written range back to host memory."""
    host = posix_memalign(proc, 0, WRITE)
    try:
        cudart(proc).cudaMemcpy(host, d + OFFSET, WRITE, cudaMemcpyDeviceToHost)
        return proc.load(host, WRITE)
    finally:
        free(proc, host, WRITE)


@traced(layer="userspace")
def gpu_free(proc, d: int) -> None:
    """cudaFree of the registered buffer: its MR is invalidated."""
    cudart(proc).cudaFree(d)


@traced(layer="userspace")
def write_after_free(ep: Endpoint, raddr: int, rkey: int) -> str:
    """The same WRITE again, after the owner freed the memory."""
    return _write(ep, 2, raddr, rkey)


def read_peer_stats(proc, client: str = "nv_mem") -> dict[str, int]:
    """The client's statistics as a user reads them from sysfs."""
    out = {}
    for name in STATS:
        text = read_sysfs(proc, f"{PEERS}/{client}/{name}")
        out[name] = int(text) if text is not None else -1
    return out


def format_stats(stats: dict[str, int], client: str = "nv_mem") -> str:
    lines = [f"{PEERS}/{client}/"]
    lines += [f"  {k:20} {v}" for k, v in stats.items()]
    return "\n".join(lines) + "\n"


# -- the story: each outcome read from the trace ------------------------------------------

def _registered(trace: Trace, call: Call) -> str:
    mrs = [c for c in call.walk() if isinstance(c, Call) and c.func == "ibv_reg_mr"]
    peer = [c.ret for c in call.walk() if isinstance(c, Call) and c.func == "nv_mem_get_pages"]
    how = "pinned by nv_mem (nvidia_p2p_get_pages)" if peer else "no peer client pinned it"
    ok = "MR registered" if mrs and mrs[-1].ret not in (None, "") and \
        not mrs[-1].ret.startswith(("!", "-")) else "no MR"
    return f"{ok} over {GPU_BUF >> 20} MiB of GPU memory, {how}"


def _arrived(trace: Trace, call: Call) -> int:
    """Payload bytes the remote HCA DMA'd into memory while `call` ran (hca_dma_scatter)."""
    total = 0
    for c in during(trace, call, "hca_dma_scatter"):
        if c.track != call.track and "payload=bytes[" in c.args:
            total += int(c.args.split("payload=bytes[", 1)[1].split("]", 1)[0])
    return total


def _write_outcome(trace: Trace, call: Call) -> str:
    n = _arrived(trace, call)
    arrived = f"yes, {n:,} bytes DMA'd by host-b's HCA" if n else "no, nothing DMA'd"
    return f"completion {'/'.join(completions(call)) or 'none'}; bytes arrived: {arrived}"


def _readback(trace: Trace, call: Call) -> str:
    return f"cudaMemcpy read back {call.ret} (the scenario checks every byte)"


def _invalidated(trace: Trace, after: int = 0) -> bool:
    return any(c.start >= after for c in calls_of(trace, "mlx5_invalidate_umem"))


def _freed(trace: Trace, call: Call) -> str:
    cb = during(trace, call, "nv_p2p_mem_info_free_callback")
    if not _invalidated(trace, call.start):
        return "the MR was not invalidated"
    where = f" on {trace.tracks[cb[0].track]}" if cb else ""
    return f"MR invalidated: free callback{where} -> ib_invalidate_peer_memory, mkey revoked"


def _summary(trace: Trace) -> str:
    writes = calls_of(trace, "write_to_gpu") + calls_of(trace, "write_after_free")
    frees = calls_of(trace, "gpu_free")
    parts = []
    for w in writes:
        when = "before cudaFree" if not frees or w.start < frees[0].start else "after cudaFree"
        status = "/".join(completions(w)) or "no completion"
        why = "bytes arrived" if _arrived(trace, w) else "no bytes arrived"
        if when == "after cudaFree" and _invalidated(trace, frees[0].start):
            why += ", MR invalidated" if _arrived(trace, w) else ": MR invalidated"
        label = when if frees else ("first" if w is writes[0] else "second")
        parts.append(f"{label} {status} ({why})")
    return "gpudirect: WRITE " + ", ".join(parts)


GPUDIRECT_STORY = Story(steps=(
    StoryStep("gpu_register", "the server cudaMallocs 1 MiB and ibv_reg_mrs it (peer memory)",
              _registered),
    StoryStep("write_to_gpu", "the client RDMA-WRITEs 64 KiB into it through host-b's BAR1",
              _write_outcome),
    StoryStep("gpu_readback", "the server cudaMemcpys it back", _readback),
    StoryStep("gpu_free", "cudaFree: the GPU driver runs nv_mem's free callback", _freed),
    StoryStep("write_after_free", "the same WRITE again, after cudaFree", _write_outcome),
), summary=_summary)


@scenario("gpudirect", "host-b cudaMallocs and ibv_reg_mrs GPU memory (nv_peer_mem, "
          "nvidia_p2p_get_pages), host-a RDMA-WRITEs into it, cudaFree invalidates the MR",
          story=GPUDIRECT_STORY)
def gpudirect() -> str:
    return run_gpudirect()


def run_gpudirect(*, cuda_free: bool = True) -> str:
    """The gpudirect run; cuda_free=False leaves the buffer allocated (a variant for
    tests: the second WRITE then succeeds, and the story says so)."""
    fabric = Fabric()
    a = rdma_host(name="host-a", fabric=fabric)
    b = rdma_host(name="host-b", fabric=fabric, nr_gpus=1)
    a.load_module("mlx5_ib")
    b.load_module("mlx5_ib")
    b.load_module("nvidia")
    b.load_module("nv_peer_mem", persistent_api_support=0)
    client, server = a.spawn("client"), b.spawn("server")
    srv = server.run(setup, server, 4096, 16, 0x100)
    cli = client.run(setup, client, WRITE, 16, 0x200)
    d, gmr = server.run(gpu_register, srv)
    server.run(connect, srv, cli.dest())
    client.run(connect, cli, srv.dest())
    assert client.run(write_to_gpu, cli, d + OFFSET, gmr.rkey) == "SUCCESS"
    got = server.run(gpu_readback, server, d)
    assert got == _pattern(WRITE), "the GPU buffer does not hold what was written"
    if cuda_free:
        server.run(gpu_free, server, d)
    status = client.run(write_after_free, cli, d + OFFSET, gmr.rkey)
    assert status == ("REM_ACCESS_ERR" if cuda_free else "SUCCESS"), status
    client.run(cli.ctx.close)
    server.run(srv.ctx.close)             # dereg: the revoked MR, then the rest
    stats = server.run(read_peer_stats, server)
    for p in (client, server):
        p.exit(0)
    for m in (a, b):
        m.check_leaks()
    return format_stats(stats)


@scenario("cuda-free-invalidate", "a process registers GPU memory, then cudaFree: the "
          "free callback, ib_invalidate_peer_memory, the mkey revoked, BAR1 unmapped")
def cuda_free_invalidate() -> str:
    m = rdma_host(nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem", persistent_api_support=0)
    p = m.spawn("app")
    ep = p.run(setup, p, 4096, 4, 0x300)
    d, _mr = p.run(gpu_register, ep)
    p.run(gpu_free, p, d)
    p.run(ep.ctx.close)
    stats = p.run(read_peer_stats, p)
    p.exit(0)
    m.check_leaks()
    return format_stats(stats)

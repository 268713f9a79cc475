"""Peer memory: registering 1 GiB of GPU memory, and RDMA bandwidth into GPU memory.

Registration.  A process cudaMallocs 1 GiB (16,384 GPU pages of 64 KiB) on
a GPU with a 2 GiB BAR1 and ibv_reg_mrs it with nv_peer_mem (persistent
API off, so the invalidating client): gup fails, nv_mem_acquire probes
(get_pages + put_pages), get_pages maps 16,384 BAR1 windows, dma_map builds
the 16,384-entry sg table, CREATE_MKEY carries the MTT.  One round is one
ibv_reg_mr; the previous round's MR is deregistered in the untimed setup.
Against it, in the same run:
  * the bare C loop doing the per-page work of that registration and nothing
    else (c_ext baseline_peer_table: BAR1 window, page-table entry, sg entry);
  * ibv_reg_mr of 1 GiB of host memory (gup pins 262,144 pages).
The registration is checked once after the benchmark: 16,384 entries, the
client's statistics, and the MR deregistered cleanly by the leak check.

The fixed cost of a GPU registration: ibv_reg_mr + ibv_dereg_mr of one GPU
page (64 KiB) through nv_peer_mem, against ibv_reg_mr + ibv_dereg_mr of 64 KiB
of host memory (gup, 16 pages) in the same run.

Bandwidth.  RDMA WRITEs of 1 MiB from a host buffer into a 4 MiB target that
is GPU memory (registered through nv_peer_mem; the HCA's DMA goes through
BAR1) or host memory, on one machine and across two; the GPU's bytes are
read back with cudaMemcpy and compared.

Ratios are reported in the closing notes; nothing is asserted about time.
"""

from __future__ import annotations

import pytest

import c_ext
from c_ext import U64Array
from kernel_model.emu.platform import Fabric, GpuConfig, rdma_host
from tests.benchmarks.test_verbs_bench import VerbsHost
from userspace.cuda.runtime import cudart
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import PD, Context, SendWR
from userspace.tools.write_bw import connect, contents, setup

GiB, MiB = 1 << 30, 1 << 20
GPU_PAGE = 1 << 16
# nv-p2p's fixed latency per call into RM, modelled as a parameter (not spent): the
# figure reported with the measured time (assumed: 10 us per call)
P2P_LATENCY_US = 10
ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE


class GpuReg:
    """A host with a GPU (2 GiB BAR1) and nv_peer_mem; a process with 1 GiB cudaMalloc'd."""

    def __init__(self, gpu: bool):
        self.m = rdma_host(ram_size=(2 * GiB if not gpu else 256 * MiB), nr_gpus=1,
                           gpu=GpuConfig(bar1_size=2 * GiB))
        self.m.load_module("mlx5_ib")
        self.m.load_module("nvidia", p2p_latency_us=P2P_LATENCY_US)
        self.m.load_module("nv_peer_mem", persistent_api_support=0)
        self.p = p = self.m.spawn("reg", cap_ipc_lock=True)
        self.pd = p.run(lambda: PD(Context(p)))
        if gpu:
            self.addr = p.run(cudart(p).cudaMalloc, GiB)
        else:
            self.addr = p.mmap(0, GiB, 3, 0x22, -1, 0)
            p.run(p.store, self.addr, b"\1")          # the mapping exists; gup faults the rest
        self.mr = None

    def drop(self) -> None:
        if self.mr is not None:
            self.p.run(v.ibv_dereg_mr, self.mr)
            self.mr = None

    def reg(self) -> None:
        self.mr = self.p.run(v.ibv_reg_mr, self.pd.pd, self.addr, GiB, ACCESS)


@pytest.mark.benchmark(group="register 1 GiB")
def test_reg_mr_1gib_gpu(benchmark):
    r = GpuReg(True)
    benchmark.pedantic(r.reg, setup=r.drop, rounds=5, iterations=1, warmup_rounds=1)
    # one more registration, to read the nv-p2p latency it would add (4 RM calls:
    # the probe's get and put, get_pages, dma_map_pages)
    dev = r.m.modules["nvidia"].state.devices[0]
    r.drop()
    before = dev.p2p_latency_us
    r.reg()
    assert dev.p2p_latency_us - before == 4 * P2P_LATENCY_US
    benchmark.extra_info["modelled_nv_p2p_latency_us"] = dev.p2p_latency_us - before
    with r.m.kernel():
        from drivers.ib_core.peer_mem import peer_clients
        nv = next(c for c in peer_clients() if c.peer_mem.name == "nv_mem")
    assert nv.stats["num_reg_pages"] - nv.stats["num_dereg_pages"] == GiB // GPU_PAGE
    r.drop()
    r.p.exit(0)


@pytest.mark.benchmark(group="register 1 GiB")
@pytest.mark.parametrize("gib", ["contiguous"], indirect=True)
def test_reg_mr_1gib_host(benchmark, gib):
    """The same registration of 1 GiB of host memory through gup (262,144 pages): the
    session's faulted 1 GiB (tests/benchmarks/conftest.py), on its rdma_host."""
    h = VerbsHost(gib)
    mrs = []

    def drop() -> None:
        while mrs:
            assert v.ibv_dereg_mr(mrs.pop()) == 0

    def reg() -> None:
        mrs.append(v.ibv_reg_mr(h.pd, gib.addr, gib.size, ACCESS))
    try:
        benchmark.pedantic(reg, setup=drop, rounds=5, iterations=1, warmup_rounds=1)
        assert mrs and mrs[0].length == gib.size
        vm = h.m.vmstat
        assert vm["nr_foll_pin_acquired"] - vm["nr_foll_pin_released"] == gib.nr_pages
        drop()
    finally:
        drop()
        h.teardown()


@pytest.mark.benchmark(group="register + deregister 64 KiB")
@pytest.mark.parametrize("memory", ["gpu-nv_peer_mem", "host-gup"])
def test_reg_dereg_mr_64kib(benchmark, memory):
    """The fixed cost of a registration: ibv_reg_mr + ibv_dereg_mr of one GPU page
    (64 KiB) through nv_peer_mem - the probe, get_pages, dma_map, CREATE_MKEY and
    back - against the same 64 KiB of host memory through gup (16 pages)."""
    gpu = memory.startswith("gpu")
    r = GpuReg(gpu)
    fw = r.m.hcas[0].fw

    vm = r.m.vmstat

    def once() -> tuple:
        pins = vm["nr_foll_pin_acquired"]
        mr = v.ibv_reg_mr(r.pd.pd, r.addr, GPU_PAGE, ACCESS)
        seen = (fw.mkeys.get(mr.lkey >> 8), r.p.mm.pinned_vm, vm["nr_foll_pin_acquired"] - pins)
        return seen + (v.ibv_dereg_mr(mr),)

    mkey, pinned_vm, pinned, dereg = r.p.run(lambda: benchmark(once))
    assert dereg == 0 and mkey is not None
    assert (mkey.mkc["start_addr"], mkey.mkc["len"]) == (r.addr, GPU_PAGE)
    # both charge pinned_vm (a peer umem keeps ib_umem_get's charge); gup pins host pages only
    assert pinned_vm == GPU_PAGE >> r.m.page_shift
    assert pinned == (0 if gpu else GPU_PAGE >> r.m.page_shift)
    assert r.p.mm.pinned_vm == 0 and vm["nr_foll_pin_acquired"] == vm["nr_foll_pin_released"]
    if gpu:
        with r.m.kernel():
            from drivers.ib_core.peer_mem import peer_clients
            nv = next(c for c in peer_clients() if c.peer_mem.name == "nv_mem")
        assert nv.stats["num_reg_pages"] == nv.stats["num_dereg_pages"] > 0
    r.p.exit(0)


@pytest.mark.benchmark(group="register 1 GiB")
def test_bare_c_peer_table_baseline(benchmark):
    """The yardstick: BAR1 window + page-table entry + sg entry per GPU page, in C."""
    n = GiB // GPU_PAGE
    ops = c_ext.backend("c")
    pages = U64Array(n)
    for i in range(n):
        pages.view[i] = i
    bar1 = U64Array(2 * GiB // GPU_PAGE)
    cols = [U64Array(n, zero=False) for _ in range(4)]
    got = benchmark(ops.baseline_peer_table, pages, n, bar1, 0, 0x40_0000_0000, 16, *cols)
    assert got == n
    assert cols[0].view[n - 1] == 0x40_0000_0000 + ((n - 1) << 16)
    assert cols[1].view[0] == GPU_PAGE


# -- bandwidth into GPU memory -------------------------------------------------------------
class Link:
    """A server whose 4 MiB target is GPU or host memory, a client, RC QPs at RTS."""

    def __init__(self, topology: str, target: str):
        fabric = Fabric() if topology == "two-machines" else None
        server_m = rdma_host(ram_size=128 * MiB, name="server", fabric=fabric, nr_gpus=1)
        client_m = rdma_host(ram_size=128 * MiB, name="client", fabric=fabric) \
            if fabric else server_m
        self.machines = list(dict.fromkeys([server_m, client_m]))
        for m in self.machines:
            m.load_module("mlx5_ib")
        server_m.load_module("nvidia")
        server_m.load_module("nv_peer_mem")
        self.server, self.client = server_m.spawn("srv"), client_m.spawn("cli")
        self.srv = self.server.run(setup, self.server, 4 * MiB, 8, 1, target == "gpu")
        self.cli = self.client.run(setup, self.client, 4 * MiB, 8, 2)
        self.server.run(connect, self.srv, self.cli.dest())
        self.client.run(connect, self.cli, self.srv.dest())
        self.pattern = bytes((i * 11 + 1) & 0xFF for i in range(4 * MiB))
        self.client.run(self.cli.mr.write, self.pattern)
        dest = self.srv.dest()
        self.wrs = [SendWR(wr_id=i, sg_list=[v.ibv_sge(self.cli.mr.buf + i * MiB, MiB,
                                                       self.cli.mr.lkey)],
                           opcode=v.IBV_WR_RDMA_WRITE,
                           send_flags=v.IBV_SEND_SIGNALED if i == 3 else 0,
                           remote_addr=dest["vaddr"] + i * MiB, rkey=dest["rkey"])
                    for i in range(4)]

    def round(self) -> list:
        def burst() -> list:
            for wr in self.wrs:
                self.cli.qp.post_send(wr)
            return [(wc.wr_id, wc.status) for wc in self.cli.cq.poll_until(1)]
        return self.client.run(burst)

    def teardown(self) -> None:
        from userspace.tools.write_bw import teardown
        self.client.run(teardown, self.cli)
        self.server.run(teardown, self.srv)
        for p in (self.client, self.server):
            p.exit(0)


@pytest.mark.benchmark(group="rdma-write 1 MiB into GPU vs host")
@pytest.mark.parametrize("target", ["gpu", "host"])
@pytest.mark.parametrize("topology", ["one-machine", "two-machines"])
def test_write_bw_into_gpu(benchmark, topology, target):
    """4 WRITEs of 1 MiB per round (the last signalled) into GPU or host memory."""
    lk = Link(topology, target)
    wcs = benchmark.pedantic(lk.round, rounds=20, iterations=1, warmup_rounds=1)
    if not benchmark.disabled:
        benchmark.extra_info["bytes_per_s"] = 4 * MiB / benchmark.stats.stats.median
    assert wcs == [(3, v.IBV_WC_SUCCESS)]
    assert lk.server.run(contents, lk.srv, 4 * MiB) == lk.pattern
    lk.teardown()

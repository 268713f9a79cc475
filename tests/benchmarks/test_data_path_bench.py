"""The RDMA data path: RDMA WRITE message rate and bandwidth, and the DMA copy under it.

A client and a server process each open mlx5_0 and set up a PD, a CQ, a
4 MiB buffer registered with remote write and an RC QP (write_bw.setup, as
ib_write_bw), and bring the QPs to RTS against each other (write_bw.connect).
Two topologies: both processes on one machine (the HCA's internal loopback),
and one process on each of two machines whose ConnectX ports share a Fabric.
Each on the C loops and on the Python twins (rdma_host(backend=...): the HCA
engine takes its ops - dma_copy, mtt_pieces - from its machine).

One benchmark round is one burst, perftest-style with CQ moderation: the
client posts N RDMA WRITEs (one ibv_post_send each, the WRs built beforehand
as perftest does), WR i from offset i * size of its buffer to offset
i * size of the server's, every CQ_MOD-th WR and the last one signalled,
then polls until those completions are in (each CQE also retires the
unsignalled WRs before it, so the send queue is empty again for the next
round).  N * size covers the 4 MiB buffer, or 512 bytes for the message rate:
  * message rate: 64 WRITEs of 8 bytes, 4 CQEs per round;
  * bandwidth:    64 WRITEs of 64 KiB (4 CQEs), and 4 WRITEs of 1 MiB (1 CQE);
    bytes/s and messages/s go into benchmark.extra_info.
Correctness is asserted once per benchmark, after it: the last round's
completions (wr_id, SUCCESS) and the server's buffer - every written byte
equal to the client's, the bytes beyond untouched.  The link is built per
test (the HCA engines are scheduler tasks, which must not outlive a test);
its teardown closes both contexts, ends the processes and runs the leak check.

Each bandwidth group also holds its yardstick, measured in the same run so that
the group's relative column is the ratio the closing notes quote: the same round's
messages as bare C memmoves (ffi.memmove of each message's bytes, from a buffer
holding PATTERN to another, at the same offsets) - "RDMA WRITE vs memcpy of the
same size".

Then the copy itself: 1 MiB DMA-read out of a machine's RAM (c_ext MemCtx)
into a payload bytearray by machine.ops.dma_copy, as hca_dma_gather does -
from 256 4 KiB pieces on non-adjacent pages (every other page of a 2 MiB
block, a fragmented MR) and from one 1 MiB piece - on the C loop and on its
Python twin, against the bare C baseline: ffi.memmove of the same 1 MiB
between the same two buffers.

Ratios (one vs two machines, C vs Python twin, dma_copy vs memmove,
fragmented vs one piece) are reported in the closing notes; nothing is
asserted about time (CI machines are noisy).  Without --benchmark-enable
each benchmark runs one round.
"""

from __future__ import annotations

import pytest
from c_ext._pm import ffi

import c_ext
from c_ext import U64Array
from kernel_model.emu.machine import Machine
from kernel_model.emu.platform import rdma_host
from kernel_model.hw.fabric import Fabric
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR
from userspace.tools.write_bw import connect, setup

KiB, MiB = 1 << 10, 1 << 20
MR_SIZE = 4 * MiB
TX_DEPTH = 64         # max_send_wr: a whole burst fits in the send queue
CQ_MOD = 16           # every 16th WR signalled (and the last of a burst)
ROUNDS = 40
TOPOLOGIES = ["one-machine", "two-machines"]
# 251 is prime: a byte landing at the wrong offset (a page off, a WR off) shows
PATTERN = (bytes(range(251)) * (2 * MR_SIZE // 251 + 1))[:2 * MR_SIZE]


def _u64(values: list[int]) -> U64Array:
    a = U64Array(len(values))
    for i, x in enumerate(values):
        a.view[i] = x
    return a


class Link:
    """A client and a server endpoint, RC QPs at RTS; the client's buffer holds PATTERN."""

    def __init__(self, topology: str, backend: str):
        if topology == "one-machine":
            m = rdma_host(ram_size=64 * MiB, backend=backend)
            hosts = [m, m]
        else:
            fabric = Fabric()
            hosts = [rdma_host(ram_size=64 * MiB, backend=backend, name=name, fabric=fabric)
                     for name in ("host-a", "host-b")]
        self.machines = list(dict.fromkeys(hosts))
        for m in self.machines:
            m.load_module("mlx5_ib")
            assert m.ops.name == backend
        self.client, self.server = hosts[0].spawn("client"), hosts[1].spawn("server")
        self.srv = setup(self.server, MR_SIZE, TX_DEPTH, 0x1A2B3C)
        self.cli = setup(self.client, MR_SIZE, TX_DEPTH, 0x4D5E6F)
        connect(self.srv, self.cli.dest())
        connect(self.cli, self.srv.dest())
        self.cli.mr.write(PATTERN[:MR_SIZE])

    def burst(self, size: int, n: int) -> tuple[list[SendWR], list[int]]:
        """The n WRITE WRs of a round (built once, as perftest does) and the
        wr_ids of the signalled ones."""
        remote = self.srv.dest()
        wrs, signalled = [], []
        for i in range(n):
            flags = 0
            if (i + 1) % CQ_MOD == 0 or i == n - 1:
                flags = v.IBV_SEND_SIGNALED
                signalled.append(i)
            wrs.append(SendWR(wr_id=i, sg_list=[v.ibv_sge(self.cli.mr.buf + i * size, size,
                                                          self.cli.mr.lkey)],
                              opcode=v.IBV_WR_RDMA_WRITE, send_flags=flags,
                              remote_addr=remote["vaddr"] + i * size, rkey=remote["rkey"]))
        return wrs, signalled

    def round(self, wrs: list[SendWR], ncqe: int) -> list[tuple[int, int]]:
        """Post the burst, poll its completions: (wr_id, status) of each CQE."""
        qp = self.cli.qp
        for wr in wrs:
            qp.post_send(wr)
        return [(wc.wr_id, wc.status) for wc in self.cli.cq.poll_until(ncqe)]

    def teardown(self) -> None:
        self.cli.ctx.close()
        self.srv.ctx.close()
        for p in (self.client, self.server):
            p.exit(0)
        for m in self.machines:
            m.check_leaks()


@pytest.fixture
def link(topology, backend):
    lk = Link(topology, backend)
    yield lk
    lk.teardown()


def _write_bench(benchmark, lk: Link, size: int, n: int) -> None:
    wrs, signalled = lk.burst(size, n)
    wcs = benchmark.pedantic(lk.round, args=(wrs, len(signalled)), rounds=ROUNDS,
                             iterations=1, warmup_rounds=1)
    if not benchmark.disabled:
        median = benchmark.stats.stats.median
        benchmark.extra_info["msgs_per_s"] = n / median
        benchmark.extra_info["bytes_per_s"] = n * size / median
    assert wcs == [(i, v.IBV_WC_SUCCESS) for i in signalled]
    written = n * size
    got = lk.srv.mr.read(min(written + 64 * KiB, MR_SIZE))
    assert got[:written] == PATTERN[:written]
    assert got[written:] == bytes(len(got) - written)  # nothing beyond the last WRITE


@pytest.mark.benchmark(group="rdma-write 8 B message rate")
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("backend", ["c", "python"])
def test_write_msg_rate_8b(benchmark, link):
    """64 WRITEs of 8 bytes per round, every 16th signalled."""
    _write_bench(benchmark, link, 8, 64)


@pytest.mark.benchmark(group="rdma-write 64 KiB bandwidth")
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("backend", ["c", "python"])
def test_write_bw_64kib(benchmark, link):
    """64 WRITEs of 64 KiB (4 MiB) per round, every 16th signalled."""
    _write_bench(benchmark, link, 64 * KiB, MR_SIZE // (64 * KiB))


@pytest.mark.benchmark(group="rdma-write 1 MiB bandwidth")
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("backend", ["c", "python"])
def test_write_bw_1mib(benchmark, link):
    """4 WRITEs of 1 MiB (4 MiB) per round, the last signalled."""
    _write_bench(benchmark, link, MiB, MR_SIZE // MiB)


def _memcpy_bench(benchmark, size: int, n: int) -> None:
    """The yardstick of a bandwidth group: n memmoves of `size` bytes, message i from
    offset i * size of one 4 MiB buffer to the same offset of another."""
    src, dst = bytearray(PATTERN[:MR_SIZE]), bytearray(MR_SIZE)
    s, d = ffi.from_buffer(src), ffi.from_buffer(dst)

    def round_() -> None:
        for i in range(n):
            ffi.memmove(d + i * size, s + i * size, size)

    benchmark.pedantic(round_, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    if not benchmark.disabled:
        benchmark.extra_info["bytes_per_s"] = n * size / benchmark.stats.stats.median
    assert dst[:n * size] == src[:n * size]


@pytest.mark.benchmark(group="rdma-write 64 KiB bandwidth")
def test_write_bw_64kib_memcpy_baseline(benchmark):
    """The yardstick: the round's 64 messages of 64 KiB as bare C memmoves."""
    _memcpy_bench(benchmark, 64 * KiB, MR_SIZE // (64 * KiB))


@pytest.mark.benchmark(group="rdma-write 1 MiB bandwidth")
def test_write_bw_1mib_memcpy_baseline(benchmark):
    """The yardstick: the round's 4 messages of 1 MiB as bare C memmoves."""
    _memcpy_bench(benchmark, MiB, MR_SIZE // MiB)


# -- the copy under the data path ------------------------------------------------------------
class CopyEnv:
    """A 2 MiB block of a machine's RAM holding PATTERN; 1 MiB of it as source
    pieces: 256 4 KiB pieces on every other page, or the first 1 MiB in one."""

    def __init__(self):
        self.m = m = Machine(ram_size=64 * MiB)
        self.order = 9
        self.pfn = m.zone.alloc(0, self.order, "bench dma_copy").pfn
        self.base = base = self.pfn << m.page_shift
        block = PATTERN[:2 * MiB]
        m.mem.ram[base:base + len(block)] = block
        ps = m.page_size
        frag = [base + 2 * i * ps for i in range(MiB // ps)]
        self.pieces = {
            "4k-pieces": (_u64(frag), _u64([ps] * len(frag)), len(frag)),
            "one-piece": (_u64([base]), _u64([MiB]), 1),
        }
        self.expected = {
            "4k-pieces": b"".join(block[a - base:a - base + ps] for a in frag),
            "one-piece": block[:MiB],
        }

    def teardown(self) -> None:
        self.m.zone.free(self.pfn, self.order)
        self.m.check_leaks()


@pytest.fixture(scope="module")
def copy_env():
    env = CopyEnv()
    yield env
    env.teardown()


@pytest.mark.benchmark(group="dma_copy 1 MiB")
@pytest.mark.parametrize("layout", ["4k-pieces", "one-piece"])
@pytest.mark.parametrize("backend", ["c", "python"])
def test_dma_copy_1mib(benchmark, copy_env, backend, layout):
    """machine.ops.dma_copy of 1 MiB from RAM into a payload (hca_dma_gather's copy)."""
    ops = c_ext.backend(backend)
    src_addr, src_len, nsrc = copy_env.pieces[layout]
    dst, dst_addr, dst_len = bytearray(MiB), _u64([0]), _u64([MiB])
    moved = benchmark(ops.dma_copy, dst, dst_addr, dst_len, 1,
                      copy_env.m.mem, src_addr, src_len, nsrc)
    if not benchmark.disabled:
        benchmark.extra_info["bytes_per_s"] = MiB / benchmark.stats.stats.median
    assert moved == MiB
    assert dst == copy_env.expected[layout]


@pytest.mark.benchmark(group="dma_copy 1 MiB")
def test_memmove_1mib_bare_c_baseline(benchmark, copy_env):
    """The yardstick: ffi.memmove of the same 1 MiB, RAM to the payload, nothing around it."""
    src = copy_env.m.mem.ram[copy_env.base:copy_env.base + MiB]
    dst = bytearray(MiB)
    benchmark(ffi.memmove, dst, src, MiB)
    if not benchmark.disabled:
        benchmark.extra_info["bytes_per_s"] = MiB / benchmark.stats.stats.median
    assert dst == copy_env.expected["one-piece"]

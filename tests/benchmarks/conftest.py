"""Shared set-ups for the benchmarks: 1 GiB of faulted anonymous memory.

Building it (faulting 262,144 pages, fragmenting physical memory) takes
seconds, so each layout is built once per session and both backends share it:
`machine.ops` is swapped between the C loops and the Python twins, which
work on the same RAM and mem_map.

In the suite's smoke run (benchmarks disabled: pyproject's addopts) nothing
is timed, only each benchmark's code and its checks run, so the layouts are
SMOKE_SIZE (64 MiB: 16,384 pages, the same paths - one segment when
contiguous, one per page when fragmented) instead of building and tearing
down 2 GiB of faulted memory (10 s of the suite).  The benchmarks read the
size from the fixture (`gib.size`, `gib.nr_pages`).
"""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model.emu.machine import GiB, Machine
from kernel_model.emu.platform import rdma_host
from kernel_model.gup import FOLL_LONGTERM, FOLL_WRITE, pin_user_pages_fast, unpin_user_pages

GIB_PAGES = GiB // 4096
SMOKE_SIZE = 64 << 20


def smoke_run(config: pytest.Config) -> bool:
    """Whether the benchmarks only run, untimed (pytest-benchmark disabled)."""
    return bool(config.getoption("benchmark_disable")
                and not config.getoption("benchmark_enable"))


class Faulted:
    """A process with `size` bytes of anonymous memory, every page present."""

    def __init__(self, size: int, fragmented: bool, machine: Machine | None = None):
        # `machine`: one built by the caller (an rdma_host with its HCA), else a bare 3 GiB one
        self.machine = m = machine if machine is not None else Machine(ram_size=3 * GiB)
        self.size = size
        self.nr_pages = size >> m.page_shift
        self.holes: list[int] = []
        if fragmented:
            # take 2x the pages and give back every other one: the buddy allocator
            # can no longer hand out two physically adjacent pages
            # (+2048 pairs so the page-table pages come from the holes too)
            count = 2 * (self.nr_pages + 2048)
            taken = [m.zone.alloc(0, 0, "bench fragmenter").pfn for _ in range(count)]
            for pfn in taken[::2]:
                m.zone.free(pfn, 0)
            self.holes = taken[1::2]
            for pfn in self.holes:
                m.zone.pages[pfn * 4 + 1] = 1  # keep them referenced until teardown
        self.proc = p = m.spawn("bench")
        self.addr = p.mmap(0, size)
        if not fragmented:
            # build the page tables first, so table pages don't interleave with data
            span = m.page_size << (m.page_shift - 3)
            for va in range(self.addr, self.addr + size, span):
                p.mm.pgtable.pte_slot(va, True)
        pages = U64Array(self.nr_pages)
        with p.kernel():  # fault everything in through gup's slow path, then unpin
            n = pin_user_pages_fast(self.addr, self.nr_pages, FOLL_WRITE | FOLL_LONGTERM, pages)
            assert n == self.nr_pages
            unpin_user_pages(pages, n)
        # how many physically contiguous runs the pages make: the segments a map with
        # a large max segment coalesces them into (1 GiB contiguous: 1; fragmented:
        # one per page; the smoke run's 64 MiB starts in a block boot left half used)
        pfn = pages.view
        self.runs = 1 + sum(1 for i in range(1, n) if pfn[i] != pfn[i - 1] + 1)
        if not fragmented and size == GiB:
            assert self.runs == 1

    def teardown(self) -> None:
        m = self.machine
        self.proc.exit()
        for pfn in self.holes:
            m.zone.pages[pfn * 4 + 1] = 0
            m.zone.free(pfn, 0)
        m.check_leaks()


@pytest.fixture(scope="session", params=["contiguous", "fragmented"])
def gib(request):
    """Each layout built once for the pin, umem, trace and verbs benchmarks together
    (1 GiB; SMOKE_SIZE in the smoke run, see the module docstring)
    (pytest runs every test of one layout before building the other): a build faults
    262,144 pages and takes seconds.  On an rdma_host with mlx5_ib loaded, for the
    verbs benchmarks; the others use only its memory (RAM is committed lazily)."""
    size = SMOKE_SIZE if smoke_run(request.config) else GiB
    m = rdma_host(ram_size=3 * GiB)
    m.load_module("mlx5_ib")
    f = Faulted(size, request.param == "fragmented", machine=m)
    f.layout = request.param
    yield f
    f.teardown()

"""Shared set-ups for the benchmarks: 1 GiB of faulted anonymous memory.

Building it (faulting 262,144 pages, fragmenting physical memory) takes
seconds, so each layout is built once per session and both backends share it:
`machine.ops` is swapped between the C loops and the Python twins, which
work on the same RAM and mem_map.
"""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model.emu.machine import GiB, Machine
from kernel_model.emu.platform import rdma_host
from kernel_model.gup import FOLL_LONGTERM, FOLL_WRITE, pin_user_pages_fast, unpin_user_pages

GIB_PAGES = GiB // 4096


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
    (pytest runs every test of one layout before building the other): a build faults
    262,144 pages and takes seconds.  On an rdma_host with mlx5_ib loaded, for the
    verbs benchmarks; the others use only its memory (RAM is committed lazily)."""
    m = rdma_host(ram_size=3 * GiB)
    m.load_module("mlx5_ib")
    f = Faulted(GiB, request.param == "fragmented", machine=m)
    f.layout = request.param
    yield f
    f.teardown()

"""The `pin` scenario: the life of a pinned, DMA-mapped user buffer.

A process ("app") maps four pages of anonymous memory and touches them:
four page faults.  A kernel caller - a kernel thread ("pin_worker"), as a
driver's worker would be - pins the process's pages with
pin_user_pages_remote(FOLL_WRITE | FOLL_LONGTERM), builds a scatterlist
from them and DMA-maps it for a PCI device; then it undoes all three in
the reverse order (what ib_umem_release does).  The process exits and the
machine must pass the leak check.

Three tasks appear in the trace: swapper-0 (boot: the device's DMA mask),
app-1 (the user program, its system calls and page faults) and
pin_worker-2; `main` is the harness that starts and joins them.
"""

from __future__ import annotations

from c_ext import U64Array
from kernel_model.dma import (
    DMA_BIDIRECTIONAL,
    DMA_BIT_MASK,
    device,
    dma_map_sgtable,
    dma_set_mask_and_coherent,
    dma_unmap_sgtable,
)
from kernel_model.emu.machine import Machine
from kernel_model.emu.process import Process
from kernel_model.gup import FOLL_LONGTERM, FOLL_WRITE, pin_user_pages_remote, unpin_user_pages
from kernel_model.kthread import kthread_run
from kernel_model.mm import mm_struct
from kernel_model.scatterlist import (
    sg_alloc_append_table_from_pages,
    sg_append_table,
    sg_free_append_table,
)
from kernel_model.trace import traced
from scenarios import scenario

NPAGES = 4
MAX_SEG = 2 << 30  # mlx5_core's dma_set_max_seg_size


@traced(layer="userspace")
def map_and_touch(proc: Process, size: int) -> int:
    """The user program: mmap anonymous memory and write every page."""
    addr = proc.mmap(0, size)
    proc.store(addr, bytes(range(256)) * (size // 256))
    return addr


@traced(layer="driver")
def demo_pin_and_map(dev: device, mm: mm_struct, addr: int, npages: int,
                     pages: U64Array) -> sg_append_table:
    """The kernel caller: pin, build the scatterlist, DMA-map (ib_umem_get's steps)."""
    m = dev.machine
    n = pin_user_pages_remote(mm, addr, npages, FOLL_WRITE | FOLL_LONGTERM, pages)
    app = sg_append_table(m)
    sg_alloc_append_table_from_pages(app, pages, n, 0, n << m.page_shift, MAX_SEG, 0)
    dma_map_sgtable(dev, app.sgt, DMA_BIDIRECTIONAL)
    return app


@traced(layer="driver")
def demo_unmap_and_unpin(dev: device, app: sg_append_table, pages: U64Array, n: int) -> None:
    """The teardown, in reverse: DMA-unmap, free the table, unpin (ib_umem_release)."""
    dma_unmap_sgtable(dev, app.sgt, DMA_BIDIRECTIONAL)
    sg_free_append_table(app)
    unpin_user_pages(pages, n)


def pin_worker(dev: device, mm: mm_struct, addr: int) -> int:
    """The kernel thread's body: map for DMA, then tear down; the entries it mapped."""
    pages = U64Array(NPAGES)
    app = demo_pin_and_map(dev, mm, addr, NPAGES, pages)
    nents = app.sgt.nents
    demo_unmap_and_unpin(dev, app, pages, NPAGES)
    return nents


@scenario("pin", "a process maps and touches memory; a kernel thread pins, "
          "scatterlists and DMA-maps it, then undoes it all")
def pin() -> None:
    m = Machine(ram_size=64 << 20, name="host0")
    dev = device("0000:08:00.0", m, bus="pci")
    with m.kernel():
        dma_set_mask_and_coherent(dev, DMA_BIT_MASK(64))
    p = m.spawn("app")
    addr = p.run(map_and_touch, p, NPAGES * m.page_size)
    with m.kernel():
        worker = kthread_run(pin_worker, dev, p.mm, addr, name="pin_worker")
    nents = worker.join()
    assert nents == 1, nents  # four fresh pages from the buddy allocator are contiguous
    p.exit(0)
    m.check_leaks()

"""ib_umem_get + ib_umem_release, and the DMA-block fill of a 1 GiB umem (issue 4's figures).

On the shared 1 GiB of faulted anonymous memory (contiguous and fragmented
layouts, see conftest.py):
  * ib_umem_get + ib_umem_release of one page: the per-call floor of the
    whole path (rlimit, pinned_vm, one gup batch, append, DMA map, unmap, unpin);
  * the same for 1 GiB: 512 gup batches of 512 pages, coalesced into 1 entry
    (contiguous) or 262,144 (fragmented), mapped and released;
  * ib_umem_fill_dma_blocks of that umem at 4 KiB (262,144 big-endian PAS
    entries, as mlx5_ib_populate_pas writes them) on the C loop and on its
    Python twin.
Nothing is asserted about time (CI machines are noisy), only the results.
"""

from __future__ import annotations

import sys

import pytest

import c_ext
from c_ext import U64Array
from drivers.ib_core.umem import (
    IB_ACCESS_LOCAL_WRITE,
    ib_umem_fill_dma_blocks,
    ib_umem_get,
    ib_umem_num_dma_blocks,
    ib_umem_release,
)
from kernel_model.dma import device
from kernel_model.task import RLIM_INFINITY, RLIMIT_MEMLOCK

PAS_FLAGS = 0x1  # an access bit OR-ed into each entry


class IbDev:
    """Stand-in for an ib_device: ib_umem only reads .dma_device (2 GiB max segment)."""

    def __init__(self, m):
        self.dma_device = device("bench-mlx5", m, bus="pci")
        self.dma_device.dma_parms.max_segment_size = 2 << 30


@pytest.fixture(scope="module")
def umem_env(gib):
    """The 1 GiB process with `ulimit -l unlimited`, and a device to map for."""
    task = gib.proc.task
    saved = task.rlim[RLIMIT_MEMLOCK]
    task.rlim[RLIMIT_MEMLOCK] = [RLIM_INFINITY, RLIM_INFINITY]
    yield gib, IbDev(gib.machine)
    task.rlim[RLIMIT_MEMLOCK] = saved


def _get_release(f, dev, size: int) -> int:
    with f.proc.kernel():
        umem = ib_umem_get(dev, f.addr, size, IB_ACCESS_LOCAL_WRITE)
        nents = umem.sgt_append.sgt.nents
        ib_umem_release(umem)
    return nents


def test_umem_get_release_1page(benchmark, umem_env):
    f, dev = umem_env
    nents = benchmark(_get_release, f, dev, f.machine.page_size)
    assert nents == 1 and f.proc.mm.pinned_vm == 0


def test_umem_get_release_1gib(benchmark, umem_env):
    f, dev = umem_env
    nents = benchmark.pedantic(_get_release, args=(f, dev, f.size), rounds=10, iterations=1)
    assert nents == f.runs
    assert f.proc.mm.pinned_vm == 0


@pytest.fixture(scope="module")
def gib_umem(umem_env):
    f, dev = umem_env
    with f.proc.kernel():
        umem = ib_umem_get(dev, f.addr, f.size, IB_ACCESS_LOCAL_WRITE)
    yield f, umem
    with f.proc.kernel():
        ib_umem_release(umem)


@pytest.mark.parametrize("backend", ["c", "python"])
def test_fill_dma_blocks_262144(benchmark, gib_umem, backend):
    f, umem = gib_umem
    m = f.machine
    pgsz = m.page_size
    n = ib_umem_num_dma_blocks(umem, pgsz)
    assert n == f.nr_pages == f.size >> 12            # 262,144 for the timed 1 GiB
    pas = U64Array(n, zero=False)
    m.ops = c_ext.backend(backend)
    try:
        rounds = 20 if backend == "c" else 2
        written = benchmark.pedantic(ib_umem_fill_dma_blocks,
                                     args=(umem, pgsz, pas, PAS_FLAGS, True),
                                     rounds=rounds, iterations=1)
    finally:
        m.ops = c_ext.backend("c")
    assert written == n
    sgt = umem.sgt_append.sgt
    k = sgt.nents - 1
    first, last = sgt.dma_addr.view[0], sgt.dma_addr.view[k] + sgt.dma_len.view[k] - pgsz
    assert [pas[0], pas[n - 1]] == [int.from_bytes((v | PAS_FLAGS).to_bytes(8, "big"),
                                                   sys.byteorder) for v in (first, last)]

"""Mirrors include/rdma/ib_umem.h: struct ib_umem, its inline helpers and the peer
flags, with no pinning behind them.

The header under umem.c (umem.py), the peer-memory core (peer_mem.py) and the
dma-buf umems (umem_dmabuf.py): each of them names an ib_umem through this file, so
umem.py can call into the other two (a peer or dma-buf umem is released by its
own code) without a circle.  umem.py re-exports every name here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.scatterlist import sg_append_table

if TYPE_CHECKING:
    from drivers.ib_core.device import ib_device
    from kernel_model.emu.machine import Machine
    from kernel_model.mm import mm_struct

# enum ib_peer_mem_flags (include/rdma/ib_umem.h)
IB_PEER_MEM_ALLOW = 1 << 0
IB_PEER_MEM_INVAL_SUPP = 1 << 1


class ib_umem:
    """Mirrors struct ib_umem.

    `sgt_append.sgt` holds the pinned page runs (CPU side) and, once mapped,
    the DMA segments.  address/length are what the user asked for; iova is
    the device-visible start a driver settles on (find_best_pgsz sets it).
    """

    def __init__(self, ibdev: ib_device | None, machine: Machine):
        self.ibdev = ibdev
        self.owning_mm: mm_struct | None = None
        self.iova = 0
        self.length = 0
        self.address = 0
        self.writable = False
        self.is_odp = False
        self.is_dmabuf = False
        self.is_peer = False
        self.sgt_append = sg_append_table(machine)

    @property
    def trace_name(self) -> str:
        return f"umem {self.address:#x}+{self.length:#x}"

    def __repr__(self) -> str:
        sgt = self.sgt_append.sgt
        return (f"ib_umem {self.address:#x}+{self.length:#x} iova {self.iova:#x} "
                f"{'rw' if self.writable else 'ro'} pages {ib_umem_num_pages(self)} "
                f"sg {sgt.orig_nents} dma {sgt.nents}")


# -- ib_umem.h: inline helpers ---------------------------------------------------------
def _page_shift(umem: ib_umem) -> int:
    return umem.sgt_append.sgt.page_shift


def _align(x: int, a: int) -> int:
    return (x + a - 1) & ~(a - 1)


def ib_umem_offset(umem: ib_umem) -> int:
    """Mirrors ib_umem_offset(): where the umem starts inside its first page."""
    return umem.address & ((1 << _page_shift(umem)) - 1)


def ib_umem_start_dma_addr(umem: ib_umem) -> int:
    """Mirrors ib_umem_start_dma_addr(): the DMA address of the umem's first byte."""
    return umem.sgt_append.sgt.dma_addr.view[0] + ib_umem_offset(umem)


def ib_umem_dma_offset(umem: ib_umem, pgsz: int) -> int:
    """Mirrors ib_umem_dma_offset(): the first byte's offset in a pgsz device page."""
    return ib_umem_start_dma_addr(umem) & (pgsz - 1)


def ib_umem_num_dma_blocks(umem: ib_umem, pgsz: int) -> int:
    """Mirrors ib_umem_num_dma_blocks(): pgsz blocks covering [iova, iova + length)."""
    return (_align(umem.iova + umem.length, pgsz) - (umem.iova & ~(pgsz - 1))) // pgsz


def ib_umem_num_pages(umem: ib_umem) -> int:
    """Mirrors ib_umem_num_pages(): the same count in PAGE_SIZE blocks (what gets pinned)."""
    return ib_umem_num_dma_blocks(umem, 1 << _page_shift(umem))

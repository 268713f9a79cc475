"""Mirrors lib/scatterlist.c and include/linux/scatterlist.h: sg_table and its builders.

A kernel sg_table is a chained array of `struct scatterlist` (page, offset,
length, dma_address, dma_length).  Here the same fields are five parallel
c_ext.U64Array columns owned by the table (`sg_pfn`, `sg_off`, `sg_len`,
`dma_addr`, `dma_len`), so the coalescing loop (ops.sg_append) and the DMA
mapping loops run in C over them without building Python objects per entry.

    orig_nents  CPU entries (page runs), as built by sg_alloc_append_table_from_pages
    nents       entries the DMA layer produced: equal to orig_nents until
                dma_map_sgtable, then the number of DMA segments (an IOMMU may merge)

A `scatterlist` object is a small view (table, index) handed out by the
for_each_sgtable_* iterators; it reads the columns, it stores nothing.

Capacity: the kernel allocates scatterlist chunks and chains them; here a
table's columns are reallocated at double size when an append would overflow
(# EMU: one growable array instead of chained SG_MAX_SINGLE_ALLOC chunks).

Lock order: none; the caller serialises use of a table, as in the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from c_ext import U64Array
from kernel_model.errno import EINVAL, KernelError
from kernel_model.page_alloc import page
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

UINT_MAX = 0xFFFFFFFF
_COLUMNS = ("sg_pfn", "sg_off", "sg_len", "dma_addr", "dma_len")
#: the columns of every table of capacity 0, shared: no entry to read or write
#: (its view is cut to length 0, so a stray store raises IndexError)
_EMPTY = U64Array(0)
_EMPTY.view = _EMPTY.view[:0]


class sg_table:
    """Mirrors struct sg_table: the CPU entries plus the DMA columns of one mapping."""

    def __init__(self, machine: Machine, capacity: int = 0):
        self.machine = machine
        self.page_shift = machine.page_shift
        self.ops = machine.ops
        self.nents = 0
        self.orig_nents = 0
        self._alloc(capacity)

    def _alloc(self, capacity: int, zero: bool = False) -> None:
        self.capacity = capacity
        if not capacity:  # an empty (new or freed) table: nothing to hold, nothing to make
            self.sg_pfn = self.sg_off = self.sg_len = self.dma_addr = self.dma_len = _EMPTY
            return
        for name in _COLUMNS:
            setattr(self, name, U64Array(capacity, zero=zero))  # filled before read, or 0

    def ensure_capacity(self, needed: int) -> None:
        """Grow every column to hold `needed` entries, keeping the first orig_nents.

        # EMU: stands in for get_next_sg() allocating and chaining a new chunk.
        """
        if needed <= self.capacity:
            return
        keep = self.orig_nents
        old = {name: getattr(self, name) for name in _COLUMNS}
        self._alloc(max(needed, 2 * self.capacity, 16))
        for name, arr in old.items():
            getattr(self, name).view[:keep] = arr.view[:keep]

    def __len__(self) -> int:
        return self.orig_nents

    def __repr__(self) -> str:
        return f"sg_table orig_nents={self.orig_nents} nents={self.nents} cap={self.capacity}"

    # -- conveniences for tests and debug output (not kernel API) ----------
    def cpu_entries(self) -> list[tuple[int, int, int]]:
        """(pfn, offset, length) of every CPU entry."""
        n = self.orig_nents
        return list(zip(self.sg_pfn.view[:n].tolist(), self.sg_off.view[:n].tolist(),
                        self.sg_len.view[:n].tolist(), strict=True))

    def dma_entries(self) -> list[tuple[int, int]]:
        """(dma_address, dma_length) of every DMA segment."""
        n = self.nents
        return list(zip(self.dma_addr.view[:n].tolist(), self.dma_len.view[:n].tolist(),
                        strict=True))


class sg_append_table:
    """Mirrors struct sg_append_table: a table being built batch by batch.

    `prv` is the index of the last entry (the kernel's `struct scatterlist *prv`),
    None before the first batch; `total_nents` is the capacity in use.
    """

    def __init__(self, machine: Machine, sgt: sg_table | None = None):
        self.sgt = sgt if sgt is not None else sg_table(machine)
        self.prv: int | None = None
        self.total_nents = 0
        self.end_marked = False

    def __repr__(self) -> str:
        return f"sg_append_table prv={self.prv} {self.sgt!r}"


class scatterlist:
    """Mirrors struct scatterlist: a view of entry `index` of `table`."""

    __slots__ = ("table", "index")

    def __init__(self, table: sg_table, index: int):
        self.table = table
        self.index = index

    @property
    def pfn(self) -> int:
        return self.table.sg_pfn.view[self.index]

    @property
    def offset(self) -> int:
        return self.table.sg_off.view[self.index]

    @property
    def length(self) -> int:
        return self.table.sg_len.view[self.index]

    @property
    def dma_address(self) -> int:
        return self.table.dma_addr.view[self.index]

    @property
    def dma_length(self) -> int:
        return self.table.dma_len.view[self.index]

    def __repr__(self) -> str:
        return (f"sg[{self.index}] pfn={self.pfn:#x} off={self.offset:#x} len={self.length:#x} "
                f"dma={self.dma_address:#x}+{self.dma_length:#x}")


def sg_page(sg: scatterlist) -> page:
    """Mirrors sg_page(): the first page of the entry."""
    return page(sg.table.machine.zone, sg.pfn)


def sg_phys(sg: scatterlist) -> int:
    """Mirrors sg_phys(): page_to_phys(sg_page(sg)) + sg->offset."""
    return (sg.pfn << sg.table.page_shift) + sg.offset


def sg_dma_address(sg: scatterlist) -> int:
    """Mirrors sg_dma_address()."""
    return sg.dma_address


def sg_dma_len(sg: scatterlist) -> int:
    """Mirrors sg_dma_len()."""
    return sg.dma_length


def for_each_sgtable_sg(sgt: sg_table) -> Iterator[scatterlist]:
    """Mirrors for_each_sgtable_sg(): every CPU entry (orig_nents of them)."""
    for i in range(sgt.orig_nents):
        yield scatterlist(sgt, i)


def for_each_sgtable_dma_sg(sgt: sg_table) -> Iterator[scatterlist]:
    """Mirrors for_each_sgtable_dma_sg(): every DMA segment (nents of them)."""
    for i in range(sgt.nents):
        yield scatterlist(sgt, i)


@traced
def sg_alloc_append_table_from_pages(sgt_append: sg_append_table, pages: U64Array,
                                     n_pages: int, offset: int, size: int, max_segment: int,
                                     left_pages: int, pages_off: int = 0) -> None:
    """Mirrors sg_alloc_append_table_from_pages(): append a batch of pages, coalescing.

    Physically consecutive pages share one entry up to max_segment bytes; the
    first page of a batch may extend the previous batch's last entry.  `pages`
    holds PFNs (struct page * in the kernel); `pages_off` is the `pages + off`
    a C caller would pass.  The coalescing loop is ops.sg_append (C or twin).
    """
    sgt = sgt_append.sgt
    page_size = 1 << sgt.page_shift
    # the algorithm needs a page-aligned max_segment or it can overshoot
    max_segment &= ~(page_size - 1)
    if max_segment < page_size:
        sgt.machine.report_bug("sg_alloc_append_table_from_pages",
                               f"max_segment {max_segment:#x} below PAGE_SIZE")
        raise KernelError(EINVAL, "sg_alloc_append_table_from_pages: max_segment "
                          "below PAGE_SIZE")
    if sgt_append.prv is not None and offset:
        sgt.machine.report_bug("sg_alloc_append_table_from_pages",
                               f"append with offset {offset:#x}")
        raise KernelError(EINVAL, "sg_alloc_append_table_from_pages: append with offset")
    _check_batch(sgt, pages, pages_off, n_pages, offset, sgt_append.prv is not None)
    if n_pages:
        # EMU: the kernel counts the chunks first and sizes its chain to fit; here
        # room for the worst case (one entry per page) is reserved instead - the
        # columns are not cleared, so capacity never written is never touched and
        # costs nothing, and the counting pass over the batch is saved.
        sgt.ensure_capacity(sgt.orig_nents + n_pages)
        nents = sgt.ops.sg_append(sgt.page_shift, pages, pages_off, n_pages, offset, size,
                                  max_segment, sgt.sg_pfn, sgt.sg_off, sgt.sg_len,
                                  sgt.orig_nents)
        sg_appended(sgt_append, nents, left_pages)
    elif not left_pages:
        sgt_append.end_marked = True  # sg_mark_end(s)


def sg_appended(sgt_append: sg_append_table, nents: int, left_pages: int) -> None:
    """A batch was appended and the table now has nents entries: the end of
    sg_alloc_append_table_from_pages (prv is the last entry; sg_mark_end once no
    pages are left).  Also for a caller whose C loop appended the batches itself."""
    sgt = sgt_append.sgt
    sgt.orig_nents = sgt.nents = nents
    sgt_append.prv = nents - 1
    sgt_append.total_nents = sgt.capacity
    if not left_pages:
        sgt_append.end_marked = True  # sg_mark_end(s)


def _check_batch(sgt: sg_table, pages: U64Array, pages_off: int, n_pages: int, offset: int,
                 appending: bool) -> None:
    """Validate what C would otherwise trust (the wrapper rule of c_ext)."""
    if not isinstance(pages, U64Array):
        raise TypeError("sg_alloc_append_table_from_pages: pages must be a U64Array of PFNs")
    if n_pages < 0 or pages_off < 0 or pages_off + n_pages > len(pages):
        raise KernelError(EINVAL, "sg_alloc_append_table_from_pages: pages array too short")
    # EMU: the kernel would read pages[0] of an empty first batch; callers never pass one.
    if n_pages == 0 and not appending:
        raise KernelError(EINVAL, "sg_alloc_append_table_from_pages: no pages")
    # EMU: callers pass offset_in_page(); a larger offset would wrap the chunk length.
    if not 0 <= offset < (1 << sgt.page_shift):
        raise KernelError(EINVAL, "sg_alloc_append_table_from_pages: offset beyond a page")


@traced
def sg_alloc_table_from_pages_segment(sgt: sg_table, pages: U64Array, n_pages: int,
                                      offset: int, size: int, max_segment: int) -> None:
    """Mirrors sg_alloc_table_from_pages_segment(): a whole table in one batch.

    The kernel builds it through an on-stack sg_append_table and frees that on
    error, so a failure leaves `sgt` empty.
    """
    if sgt.orig_nents:
        raise KernelError(EINVAL, "sg_alloc_table_from_pages_segment: table not empty")
    append = sg_append_table(sgt.machine, sgt)
    try:
        sg_alloc_append_table_from_pages(append, pages, n_pages, offset, size, max_segment, 0)
    except KernelError:
        sg_free_append_table(append)
        raise


@traced
def sg_alloc_table_from_pages(sgt: sg_table, pages: U64Array, n_pages: int, offset: int,
                              size: int) -> None:
    """Mirrors sg_alloc_table_from_pages(): segments limited only by UINT_MAX."""
    sg_alloc_table_from_pages_segment(sgt, pages, n_pages, offset, size, UINT_MAX)


@traced
def sg_alloc_table(sgt: sg_table, nents: int) -> None:
    """Mirrors sg_alloc_table(): room for nents entries, all of them in use (page-less
    and zero-length until the caller sets them, as sg_set_page(sg, NULL, ...) leaves
    them).  EINVAL for 0 entries."""
    if nents <= 0:
        raise KernelError(EINVAL, f"sg_alloc_table: {nents} entries")
    sgt._alloc(nents, zero=True)
    sgt.nents = sgt.orig_nents = nents


@traced
def sg_free_table(sgt: sg_table) -> None:
    """Mirrors sg_free_table(): drop every entry (the DMA side must be unmapped first)."""
    sgt.nents = sgt.orig_nents = 0
    sgt._alloc(0)


@traced
def sg_free_append_table(sgt_append: sg_append_table) -> None:
    """Mirrors sg_free_append_table()."""
    sg_free_table(sgt_append.sgt)
    sgt_append.prv = None
    sgt_append.total_nents = 0
    sgt_append.end_marked = False

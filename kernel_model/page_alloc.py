"""Mirrors mm/page_alloc.c: struct page, the buddy allocator, get/put_page.

Physical memory is one zone of RAM pages.  Each page has a `struct page`
record in a C array (c_ext pm.h: flags, refcount, pincount, mapcount) so the
gup loops in C and their Python twins read and write the same counts.  The
`page` class here is a thin view (zone, pfn) over one record.

The allocator is the kernel's buddy system: free blocks of 2^order pages on
per-order free lists (MAX_ORDER 10), split on allocation (`expand`) and merged
with their buddy on free.  Freed pages are poisoned (0xaa, as page_poisoning
does) and user pages are zeroed on allocation, so a use of freed memory shows.

Lock order: none yet (the zone lock arrives with the scheduler issue; every
operation here runs without a scheduling point, which is what zone->lock buys).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

from kernel_model.current import current
from kernel_model.errno import ENOMEM, KernelError
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

MAX_ORDER = 10  # MAX_PAGE_ORDER: the largest block is 2^10 pages
PAGE_POISON = 0xAA

# gfp flags (include/linux/gfp_types.h); only what changes behaviour here.
__GFP_ZERO = 0x100
_GFP_ZERO = __GFP_ZERO  # usable inside class bodies (no name mangling)
GFP_KERNEL = 0xCC0
GFP_HIGHUSER_MOVABLE = 0x100CCA

# page flags (pm.h)
PG_reserved = 1 << 0
PG_buddy = 1 << 1
PG_dirty = 1 << 2
PG_pgtable = 1 << 3
PG_anon = 1 << 4

#: a struct page's words in the mem_map (int32 each; pm.h's PAGE_STRUCT_WORDS)
PAGE_FLAGS, PAGE_REFCOUNT, PAGE_PINCOUNT, PAGE_MAPCOUNT = 0, 1, 2, 3


def _field(i: int) -> property:
    """A struct page field: its word of the mem_map, read and written directly (every
    page fault, reference and free goes through these: no second call)."""
    return property(lambda self: self.zone.pages[self.pfn * 4 + i],
                    lambda self, v: self.zone.pages.__setitem__(self.pfn * 4 + i, v))


class page:
    """A view of one struct page: `pfn` plus its counters in the mem_map."""

    __slots__ = ("zone", "pfn")

    def __init__(self, zone: zone, pfn: int):
        self.zone = zone
        self.pfn = pfn

    flags = _field(PAGE_FLAGS)
    _refcount = _field(PAGE_REFCOUNT)
    _pincount = _field(PAGE_PINCOUNT)
    # EMU: the kernel's _mapcount starts at -1; ours counts mappings from 0.
    _mapcount = _field(PAGE_MAPCOUNT)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, page) and other.zone is self.zone and other.pfn == self.pfn

    def __hash__(self) -> int:
        return hash(self.pfn)

    def __repr__(self) -> str:
        return (f"page pfn={self.pfn:#x} ref={self._refcount} pin={self._pincount} "
                f"map={self._mapcount} flags={self.flags:#x}")


class zone:
    """The buddy allocator over one machine's RAM (struct zone + free_area)."""

    def __init__(self, machine: Machine):
        self.machine = machine
        self.pages = machine.mem.pages
        self.ram = machine.mem.ram
        self.page_shift = machine.page_shift
        self.page_size = 1 << machine.page_shift
        self.nr_pages = machine.nr_pages
        # free_area[order]: head pfn -> None; a dict keeps kernel LIFO order and
        # removes a buddy in O(1).
        self.free_area: list[dict[int, None]] = [dict() for _ in range(MAX_ORDER + 1)]
        self.nr_free = 0
        # allocated head pfn -> (order, owner, where): what the leak check names
        self.allocated: dict[int, tuple[int, str, str]] = {}
        self._zero = bytes(self.page_size)
        self._poison = bytes([PAGE_POISON]) * self.page_size

    # -- boot: memblock_free_all() hands every usable range to the buddy lists
    def free_boot_range(self, start: int, end: int) -> None:
        """Free [start, end) as the largest naturally aligned blocks.

        Blocks are added highest first so that the LIFO free lists hand out low
        addresses first, in ascending order, as a freshly booted kernel does.
        """
        blocks = []
        pfn = start
        while pfn < end:
            order = MAX_ORDER
            while order and (pfn & ((1 << order) - 1) or pfn + (1 << order) > end):
                order -= 1
            blocks.append((pfn, order))
            pfn += 1 << order
        for pfn, order in reversed(blocks):
            self._add_free(pfn, order)

    def _add_free(self, pfn: int, order: int) -> None:
        self.free_area[order][pfn] = None
        self.pages[pfn * 4 + PAGE_FLAGS] |= PG_buddy
        self.nr_free += 1 << order

    def _del_free(self, pfn: int, order: int) -> None:
        del self.free_area[order][pfn]
        self.pages[pfn * 4 + PAGE_FLAGS] &= ~PG_buddy
        self.nr_free -= 1 << order

    # -- __rmqueue_smallest + expand
    def rmqueue(self, order: int) -> int | None:
        free_area = self.free_area
        for current_order in range(order, MAX_ORDER + 1):
            area = free_area[current_order]
            if area:
                pfn, _ = area.popitem()
                self.pages[pfn * 4 + PAGE_FLAGS] &= ~PG_buddy
                self.nr_free -= 1 << current_order
                while current_order > order:  # expand(): keep the low half
                    current_order -= 1
                    self._add_free(pfn + (1 << current_order), current_order)
                return pfn
        return None

    def alloc(self, gfp: int, order: int, owner: str) -> page:
        """__alloc_pages(): take a block, set the head's refcount to 1."""
        if not 0 <= order <= MAX_ORDER:
            raise KernelError(ENOMEM, f"__alloc_pages: order {order} above MAX_ORDER")
        pfn = self.rmqueue(order)
        if pfn is None:
            raise KernelError(ENOMEM, f"__alloc_pages: out of memory for order {order}")
        pages = self.pages
        pages[pfn * 4 + PAGE_REFCOUNT] = 1
        pages[pfn * 4 + PAGE_FLAGS] &= ~(PG_dirty | PG_anon | PG_pgtable)
        if gfp & _GFP_ZERO:
            self._fill(pfn, order, self._zero)
        self.allocated[pfn] = (order, owner, _caller())
        return page(self, pfn)

    def alloc_zeroed_run(self, n: int, rec: tuple[int, str, str]) -> list[int]:
        """Up to n zeroed order-0 pages, as n calls of alloc(gfp | __GFP_ZERO, 0, ...)
        would take them (rmqueue's order, the same free lists after), each recorded as
        `rec` (order 0, owner, where: an earlier page's record from the same call site);
        fewer when memory runs out.  The pfns.

        # EMU: the first-touch faults of a run of pages (memory.access_vm) take their
        # pages here in one loop instead of one alloc() each."""
        free0, pages, allocated = self.free_area[0], self.pages, self.allocated
        ram, ps, shift, zero = self.ram, self.page_size, self.page_shift, self._zero
        keep = ~(PG_dirty | PG_anon | PG_pgtable)
        out: list[int] = []
        for _ in range(n):
            if free0:                          # rmqueue(0) without a split
                pfn, _ = free0.popitem()
                pages[pfn * 4 + PAGE_FLAGS] &= ~PG_buddy
                self.nr_free -= 1
            else:
                pfn = self.rmqueue(0)
                if pfn is None:
                    break
            pages[pfn * 4 + PAGE_REFCOUNT] = 1
            pages[pfn * 4 + PAGE_FLAGS] &= keep
            base = pfn << shift
            ram[base:base + ps] = zero
            allocated[pfn] = rec
            out.append(pfn)
        return out

    def _fill(self, pfn: int, order: int, page_bytes: bytes) -> None:
        """Write one page's worth of bytes (zeroes, poison) over each page of a block."""
        ram, ps = self.ram, self.page_size
        base = pfn << self.page_shift
        for off in range(base, base + (ps << order), ps):
            ram[off:off + ps] = page_bytes

    def free(self, pfn: int, order: int) -> None:
        """__free_pages_ok(): check, poison, and merge with free buddies."""
        rec = self.allocated.pop(pfn, None)
        if rec is None:
            self.machine.report_bug("__free_pages", f"pfn {pfn:#x} freed but not allocated "
                                    "(double free?)")
            return
        if rec[0] != order:
            self.machine.report_bug("__free_pages", f"pfn {pfn:#x} allocated at order "
                                    f"{rec[0]} freed at order {order}")
        p = pfn * 4
        pages = self.pages
        if pages[p + PAGE_PINCOUNT] or pages[p + PAGE_MAPCOUNT]:
            self.machine.report_bug("free_pages_check", f"Bad page state pfn {pfn:#x}: "
                                    f"pincount {pages[p + PAGE_PINCOUNT]} mapcount "
                                    f"{pages[p + PAGE_MAPCOUNT]}")
        pages[p + PAGE_REFCOUNT] = 0
        self._fill(pfn, order, self._poison)
        free_area = self.free_area
        while order < MAX_ORDER:
            buddy = pfn ^ (1 << order)
            if buddy not in free_area[order]:
                break
            self._del_free(buddy, order)
            pfn = min(pfn, buddy)
            order += 1
        self._add_free(pfn, order)

    def put_pfn(self, pfn: int, order: int = 0) -> None:
        """put_page() of the page at pfn, on its mem_map word (a zap drops thousands:
        no page view made for each)."""
        pages = self.pages
        ref = pages[pfn * 4 + PAGE_REFCOUNT]
        if ref <= 0:
            self.machine.report_bug("put_page", f"refcount underflow on pfn {pfn:#x}")
            return
        pages[pfn * 4 + PAGE_REFCOUNT] = ref - 1
        if ref == 1:
            self.free(pfn, order)

    def owner_of(self, pfn: int) -> tuple[int, str, str] | None:
        """(head pfn, owner, where) of the allocated block containing pfn."""
        for order in range(MAX_ORDER + 1):
            head = pfn & ~((1 << order) - 1)
            rec = self.allocated.get(head)
            if rec and rec[0] >= order and pfn < head + (1 << rec[0]):
                return head, rec[1], rec[2]
        return None


def _caller() -> str:
    """file:line of the first frame outside the allocator, for leak reports (the name
    formatted once per code object and instruction: every page allocation records one)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    if f is None:
        return "?"
    co = f.f_code
    key = (id(co), f.f_lasti)       # see lockdep.call_site: no code hash, no line scan
    site = _CALLERS.get(key)
    if site is None:
        site = _CALLERS[key] = f"{co.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {co.co_name}"
        _CALLER_CODES.append(co)    # no id reused while it is a key
    return site


_CALLERS: dict[tuple[int, int], str] = {}
_CALLER_CODES: list[types.CodeType] = []


def _zone() -> zone:
    return current().machine.zone


@traced
def alloc_pages(gfp: int, order: int, owner: str = "kernel") -> page:
    """Mirrors alloc_pages(): 2^order pages from the current machine, refcount 1.

    `owner` (EMU) tags the block so the leak check can say who allocated it.
    """
    return _zone().alloc(gfp, order, owner)


@traced
def __free_pages(pg: page, order: int) -> None:
    """Mirrors __free_pages(): drop a reference; free the block when it was the last."""
    put_page(pg, order)


def get_page(pg: page) -> None:
    """Mirrors get_page(): take a reference on a page that already has one."""
    if pg._refcount <= 0:
        pg.zone.machine.report_bug("get_page", f"reference taken on free pfn {pg.pfn:#x}")
    pg._refcount += 1


def put_page(pg: page, order: int = 0) -> None:
    """Mirrors put_page(): drop a reference and free the page when it reaches 0."""
    pg.zone.put_pfn(pg.pfn, order)


def page_ref_count(pg: page) -> int:
    """Mirrors page_ref_count()."""
    return pg._refcount


def page_maybe_dma_pinned(pg: page) -> bool:
    """Mirrors folio_maybe_dma_pinned() (exact here: pins are counted apart)."""
    return pg._pincount > 0


def page_to_pfn(pg: page) -> int:
    """Mirrors page_to_pfn()."""
    return pg.pfn


def page_to_phys(pg: page) -> int:
    """Mirrors page_to_phys()."""
    return pg.pfn << pg.zone.page_shift

"""Mirrors arch/x86/include/asm/pgtable*.h and mm/pgtable-generic.c.

Page tables live in emulated physical memory, as on real hardware: each mm
has a root page (the pgd); each table is one page of 64-bit entries; a walk
reads those words out of RAM, exactly what the C gup loop (c_ext/pm.c) does.
With 4 KiB pages and a 48-bit VA there are 4 levels (pgd, pud, pmd, pte);
with 64 KiB pages 3 (the p4d/pud fold away, as on arm64).

PTE layout (x86-64): bit 0 present, 1 rw, 2 user, 3 pwt, 4 pcd, 5 accessed,
6 dirty, 9 special (software bit 1), 63 nx; the physical address in 12..51.
EMU: no huge pages; every leaf is a PTE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from c_ext import PTE_ADDR_MASK
from kernel_model.page_alloc import __GFP_ZERO, GFP_KERNEL, PG_pgtable

if TYPE_CHECKING:
    from kernel_model.mm_types import mm_struct

_PAGE_PRESENT = 1 << 0
_PAGE_RW = 1 << 1
_PAGE_USER = 1 << 2
_PAGE_PWT = 1 << 3
_PAGE_PCD = 1 << 4
_PAGE_ACCESSED = 1 << 5
_PAGE_DIRTY = 1 << 6
_PAGE_SPECIAL = 1 << 9
_PAGE_NX = 1 << 63
_PAGE_TABLE = _PAGE_PRESENT | _PAGE_RW | _PAGE_USER | _PAGE_ACCESSED
_PAGE_CACHE_MASK = _PAGE_PWT | _PAGE_PCD


def pte_present(pte: int) -> bool:
    return bool(pte & _PAGE_PRESENT)


def pte_write(pte: int) -> bool:
    return bool(pte & _PAGE_RW)


def pte_special(pte: int) -> bool:
    return bool(pte & _PAGE_SPECIAL)


def pte_addr(pte: int) -> int:
    """The physical address a PTE maps (pte_pfn() << PAGE_SHIFT)."""
    return pte & PTE_ADDR_MASK


def pgprot_noncached(prot: int) -> int:
    """Mirrors pgprot_noncached(): UC- through PCD."""
    return (prot & ~_PAGE_CACHE_MASK) | _PAGE_PCD


def pgprot_writecombine(prot: int) -> int:
    """Mirrors pgprot_writecombine(): Linux programs PAT entry 1 (PWT) as WC."""
    return (prot & ~_PAGE_CACHE_MASK) | _PAGE_PWT


def cache_mode(prot: int) -> str:
    """"WB", "WC" or "UC-": what a mapping's prot asks the CPU for."""
    return {0: "WB", _PAGE_PWT: "WC", _PAGE_PCD: "UC-"}.get(prot & _PAGE_CACHE_MASK, "UC")


class PageTable:
    """The walker over one mm's tables (emulator helper; the MMU's view)."""

    def __init__(self, mm: mm_struct):
        m = mm.machine
        self.mm = mm
        self.machine = m
        self.shift = m.page_shift
        self.bits = m.page_shift - 3
        self.levels = m.levels
        self.ram_q = m.mem.ram_q
        self.pgd = pgd_alloc(mm)

    def pte_slot(self, va: int, alloc: bool) -> int | None:
        """Physical address of va's PTE; allocate missing tables when `alloc`."""
        table, ram_q, shift, bits = self.pgd, self.ram_q, self.shift, self.bits
        mask = (1 << bits) - 1
        for level in range(self.levels - 1, 0, -1):
            slot = table + 8 * ((va >> (shift + level * bits)) & mask)
            e = ram_q[slot >> 3]
            if not e & _PAGE_PRESENT:
                if not alloc:
                    return None
                e = pte_alloc_one(self.mm) | _PAGE_TABLE
                ram_q[slot >> 3] = e
            table = e & PTE_ADDR_MASK
        return table + 8 * ((va >> shift) & mask)

    def get(self, va: int) -> int:
        """The PTE for va, or 0 when no table covers it: the walk in C (ops.pte_get),
        as every load and store of a process makes it."""
        m = self.machine
        return m.ops.pte_get(m.mem, self.pgd, va)

    def set(self, slot: int, pte: int) -> None:
        self.ram_q[slot >> 3] = pte

    def free_all(self) -> None:
        """free_pgtables() + pgd_free(): return every table page to the allocator."""
        self._free_level(self.pgd, self.levels - 1)
        self.pgd = 0

    def _free_level(self, table: int, level: int) -> None:
        if level > 0:
            ram_q, base = self.ram_q, table >> 3
            for e in ram_q[base:base + (1 << self.bits)]:
                if e & _PAGE_PRESENT:
                    self._free_level(e & PTE_ADDR_MASK, level - 1)
        pgtable_free(self.mm, table)


def pgd_alloc(mm: mm_struct) -> int:
    """Mirrors pgd_alloc(): a zeroed root table."""
    return pte_alloc_one(mm)


def pte_alloc_one(mm: mm_struct) -> int:
    """Mirrors pte_alloc_one()/__pud_alloc()...: one zeroed table page, charged to mm."""
    zone = mm.machine.zone
    pg = zone.alloc(GFP_KERNEL | __GFP_ZERO, 0, f"pgtable pid {mm.owner_pid}")
    pg.flags |= PG_pgtable
    mm.pgtables_bytes += zone.page_size
    return pg.pfn << zone.page_shift


def pgtable_free(mm: mm_struct, table: int) -> None:
    zone = mm.machine.zone
    pfn = table >> zone.page_shift
    zone.pages[pfn * 4] &= ~PG_pgtable
    zone.pages[pfn * 4 + 1] = 0
    zone.free(pfn, 0)
    mm.pgtables_bytes -= zone.page_size

"""Tests for kernel_model/pgtable.py: page tables as words in emulated RAM."""

from __future__ import annotations

import pytest

from kernel_model.emu.machine import Machine, pgtable_levels
from kernel_model.mm import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_PRIVATE,
    PROT_READ,
    VM_EXEC,
    VM_READ,
    VM_WRITE,
    vm_get_page_prot,
)
from kernel_model.page_alloc import PG_pgtable, page
from kernel_model.pgtable import (
    _PAGE_ACCESSED,
    _PAGE_NX,
    _PAGE_PCD,
    _PAGE_PRESENT,
    _PAGE_PWT,
    _PAGE_RW,
    _PAGE_USER,
    cache_mode,
    pgprot_noncached,
    pgprot_writecombine,
    pte_addr,
    pte_present,
    pte_write,
)

ADDR_MASK = 0x000FFFFFFFFFF000


def walk(m: Machine, pgd: int, va: int) -> list[int]:
    """Each level's entry for va, read from RAM independently of PageTable."""
    bits = m.page_shift - 3
    table, entries = pgd, []
    for level in range(m.levels - 1, -1, -1):
        idx = (va >> (m.page_shift + level * bits)) & ((1 << bits) - 1)
        e = m.mem.ram_q[(table >> 3) + idx]
        entries.append(e)
        if not e & _PAGE_PRESENT:
            break
        table = e & ADDR_MASK
    return entries


@pytest.mark.parametrize("page_size, levels", [(4096, 4), (16384, 4), (65536, 3)])
def test_levels_for_a_48_bit_va(backend, page_size, levels):
    m = Machine(ram_size=64 << 20, page_size=page_size, backend=backend)
    assert pgtable_levels(m.page_shift) == levels
    assert m.levels == levels
    p = m.spawn()
    a = p.mmap(0, page_size)
    p.store(a, b"x")
    entries = walk(m, p.mm.pgd, a)
    assert len(entries) == levels  # pgd .. pte, every level present
    assert all(e & _PAGE_PRESENT for e in entries)
    # one table page per level (the root included) for one touched page
    assert p.mm.pgtables_bytes == levels * page_size


@pytest.mark.parametrize("page_size", [4096, 65536])
def test_ptes_are_words_in_ram(backend, page_size):
    m = Machine(ram_size=64 << 20, page_size=page_size, backend=backend)
    p = m.spawn()
    a = p.mmap(0, 2 * page_size)
    p.store(a + page_size + 3, b"abc")
    slot = p.mm.pgtable.pte_slot(a + page_size, False)
    assert slot is not None and slot < m.ram_size
    pte = m.mem.ram_q[slot >> 3]
    assert pte == walk(m, p.mm.pgd, a + page_size)[-1] == p.mm.pgtable.get(a + page_size)
    assert pte_present(pte) and pte_write(pte) and pte & _PAGE_USER and pte & _PAGE_NX
    phys = pte_addr(pte)
    assert bytes(m.mem.ram[phys + 3:phys + 6]) == b"abc"
    assert p.mm.pgtable.get(a) == 0  # the untouched page: a zero PTE in the same table
    # every table page is a real, allocated page-table page
    for e in walk(m, p.mm.pgd, a)[:-1]:
        pg = page(m.zone, pte_addr(e) >> m.page_shift)
        assert pg.flags & PG_pgtable and pg._refcount == 1
    # editing the word in RAM is editing the mapping
    m.mem.ram_q[slot >> 3] = 0
    assert p.mm.pgtable.get(a + page_size) == 0
    m.mem.ram_q[slot >> 3] = pte


def test_untouched_address_has_no_table(backend):
    m = Machine(ram_size=32 << 20, backend=backend)
    p = m.spawn()
    assert p.mm.pgtable.pte_slot(0x1000, False) is None
    assert p.mm.pgtable.get(0x1000) == 0
    assert p.mm.pgtables_bytes == m.page_size  # only the pgd


def test_page_tables_are_freed_at_exit(backend):
    m = Machine(ram_size=32 << 20, backend=backend)
    before = m.zone.nr_free
    p = m.spawn()
    assert m.zone.nr_free == before - 1  # the pgd
    a = p.mmap(0, 8 << 20)
    for off in (0, 2 << 20, 4 << 20, (8 << 20) - m.page_size):  # four PTE tables
        p.store(a + off, b"x")
    b = p.mmap(1 << 40, m.page_size, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)
    p.store(b, b"y")  # another pgd slot: a new pud, pmd and pte table
    tables = p.mm.pgtables_bytes // m.page_size
    assert tables == 1 + (1 + 1 + 4) + 3
    assert m.zone.nr_free == before - tables - 5
    pgd = p.mm.pgd
    p.exit()
    assert m.zone.nr_free == before
    assert not page(m.zone, pgd >> m.page_shift).flags & PG_pgtable


def test_vm_get_page_prot():
    ro = vm_get_page_prot(VM_READ)
    assert ro == _PAGE_PRESENT | _PAGE_USER | _PAGE_ACCESSED | _PAGE_NX
    assert vm_get_page_prot(VM_READ | VM_WRITE) == ro | _PAGE_RW
    assert not vm_get_page_prot(VM_READ | VM_EXEC) & _PAGE_NX
    assert PROT_READ == VM_READ  # calc_vm_flags relies on the same bit


def test_cache_modes():
    prot = vm_get_page_prot(VM_READ | VM_WRITE)
    assert cache_mode(prot) == "WB"
    wc = pgprot_writecombine(prot)
    assert wc & _PAGE_PWT and not wc & _PAGE_PCD and cache_mode(wc) == "WC"
    uc = pgprot_noncached(wc)
    assert uc & _PAGE_PCD and not uc & _PAGE_PWT and cache_mode(uc) == "UC-"
    assert cache_mode(prot | _PAGE_PWT | _PAGE_PCD) == "UC"
    assert uc & ~(_PAGE_PWT | _PAGE_PCD) == prot

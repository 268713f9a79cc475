"""Tests for kernel_model/page_alloc.py: the buddy allocator and struct page counts."""

from __future__ import annotations

import pytest

from kernel_model.current import running
from kernel_model.emu.machine import KernelBug, Machine
from kernel_model.errno import ENOMEM, KernelError
from kernel_model.page_alloc import (
    __GFP_ZERO,
    GFP_KERNEL,
    MAX_ORDER,
    PAGE_POISON,
    PG_buddy,
    PG_reserved,
    __free_pages,
    alloc_pages,
    get_page,
    page,
    page_maybe_dma_pinned,
    page_ref_count,
    page_to_phys,
    put_page,
)


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


def free_lists(m: Machine) -> list[list[int]]:
    return [sorted(area) for area in m.zone.free_area]


def page_bytes(m: Machine, pfn: int, npages: int = 1) -> bytes:
    base = pfn << m.page_shift
    return bytes(m.mem.ram[base:base + (npages << m.page_shift)])


def test_boot_frees_everything_but_pfn0_as_aligned_blocks(m):
    assert m.zone.nr_free == m.nr_pages - 1
    assert m.mem.pages[0] & PG_reserved and m.mem.pages[1] == 1  # pfn 0: reserved, held
    lists = free_lists(m)
    # [1, 8192) is 1 + 2 + 4 + ... + 512 and then seven order-10 blocks
    for order in range(MAX_ORDER):
        assert lists[order] == [1 << order]
    assert lists[MAX_ORDER] == list(range(1024, 8192, 1024))
    assert all(page(m.zone, pfn).flags & PG_buddy for area in lists for pfn in area)


def test_order0_allocations_split_and_frees_merge_back(m):
    boot = free_lists(m)
    pages = [m.zone.alloc(GFP_KERNEL, 0, "test") for _ in range(20)]
    # LIFO lists and expand() keeping the low half hand pages out in pfn order
    assert [pg.pfn for pg in pages] == list(range(1, 21))
    assert m.zone.nr_free == m.nr_pages - 1 - 20
    assert all(pg._refcount == 1 and not pg.flags & PG_buddy for pg in pages)
    for pg in pages[::2] + pages[1::2]:  # free out of order: merging must not care
        put_page(pg)
    assert m.zone.nr_free == m.nr_pages - 1
    assert free_lists(m) == boot


def test_split_then_single_free_merges_to_the_original_block(m):
    m.zone.alloc(GFP_KERNEL, 0, "test")  # takes pfn 1: the next one needs a split
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    assert pg.pfn == 2
    assert 3 in m.zone.free_area[0] and 2 not in m.zone.free_area[1]
    put_page(pg)
    assert 2 in m.zone.free_area[1] and 3 not in m.zone.free_area[0]
    put_page(page(m.zone, 1))
    assert m.zone.nr_free == m.nr_pages - 1


@pytest.mark.parametrize("order", [1, 3, 6, MAX_ORDER])
def test_higher_order_blocks_are_naturally_aligned(m, order):
    frag = [m.zone.alloc(GFP_KERNEL, 0, "frag") for _ in range(5)]  # odd-sized hole
    pg = m.zone.alloc(GFP_KERNEL, order, "test")
    assert pg.pfn % (1 << order) == 0
    assert pg.pfn > 5  # not overlapping the five order-0 pages at 1..5
    assert m.zone.owner_of(pg.pfn + (1 << order) - 1)[0] == pg.pfn
    put_page(pg, order)
    for f in frag:
        put_page(f)
    assert m.zone.nr_free == m.nr_pages - 1


def test_free_poisons_and_gfp_zero_clears(m):
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    base = pg.pfn << m.page_shift
    m.mem.ram[base:base + 5] = b"hello"
    put_page(pg)
    assert page_bytes(m, pg.pfn) == bytes([PAGE_POISON]) * m.page_size
    again = m.zone.alloc(GFP_KERNEL, 0, "test")  # LIFO: the same page, not zeroed
    assert again.pfn == pg.pfn
    assert page_bytes(m, pg.pfn) == bytes([0xAA]) * m.page_size
    put_page(again)
    zeroed = m.zone.alloc(GFP_KERNEL | __GFP_ZERO, 0, "test")
    assert zeroed.pfn == pg.pfn
    assert page_bytes(m, pg.pfn) == bytes(m.page_size)
    put_page(zeroed)


def test_higher_order_free_poisons_every_page(m):
    pg = m.zone.alloc(GFP_KERNEL | __GFP_ZERO, 2, "test")
    assert page_bytes(m, pg.pfn, 4) == bytes(4 * m.page_size)
    put_page(pg, 2)
    assert page_bytes(m, pg.pfn, 4) == bytes([PAGE_POISON]) * (4 * m.page_size)


def test_put_page_frees_at_zero_and_not_before(m):
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    get_page(pg)
    assert page_ref_count(pg) == 2
    put_page(pg)
    assert page_ref_count(pg) == 1 and pg.pfn in m.zone.allocated
    assert m.zone.nr_free == m.nr_pages - 2
    put_page(pg)
    assert page_ref_count(pg) == 0 and pg.pfn not in m.zone.allocated
    assert m.zone.nr_free == m.nr_pages - 1
    assert m.bugs == []


def test_double_free_is_reported_not_applied(m):
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    put_page(pg)
    nr_free = m.zone.nr_free
    m.zone.free(pg.pfn, 0)
    assert len(m.bugs) == 1 and "double free" in m.bugs[0] and f"{pg.pfn:#x}" in m.bugs[0]
    assert m.zone.nr_free == nr_free
    m.bugs.clear()


def test_refcount_underflow_and_get_on_free_page_are_reported(m):
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    put_page(pg)
    put_page(pg)
    assert m.bugs == [f"WARNING: put_page: refcount underflow on pfn {pg.pfn:#x}"]
    assert page_ref_count(pg) == 0
    get_page(pg)  # the kernel increments anyway after warning
    assert m.bugs[1] == f"WARNING: get_page: reference taken on free pfn {pg.pfn:#x}"
    pg._refcount = 0  # undo the bogus reference so the page is free again
    m.bugs.clear()


def test_freeing_a_pinned_page_reports_bad_page_state(m):
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    pg._pincount = 1
    put_page(pg)
    assert m.bugs == [f"WARNING: free_pages_check: Bad page state pfn {pg.pfn:#x}: "
                      "pincount 1 mapcount 0"]
    pg._pincount = 0
    m.bugs.clear()


def test_panic_on_warn_raises(backend):
    m = Machine(ram_size=32 << 20, backend=backend, panic_on_warn=True)
    pg = m.zone.alloc(GFP_KERNEL, 0, "test")
    put_page(pg)
    with pytest.raises(KernelBug, match="put_page: refcount underflow"):
        put_page(pg)
    m.bugs.clear()


def test_enomem_when_ram_is_exhausted(m):
    boot = free_lists(m)
    pages = []
    with pytest.raises(KernelError) as ei:
        while True:
            pages.append(m.zone.alloc(GFP_KERNEL, 0, "hog"))
    assert ei.value.errno == ENOMEM
    assert ei.value.function == "__alloc_pages"
    assert len(pages) == m.nr_pages - 1 and m.zone.nr_free == 0
    for pg in pages:
        put_page(pg)
    assert free_lists(m) == boot


def test_enomem_for_high_order_when_fragmented(m):
    # hold one page of every order-10 block: plenty free, no order-10 block left
    hog = [m.zone.alloc(GFP_KERNEL, 0, "hog") for _ in range(m.nr_pages - 1)]
    for pg in hog:
        if pg.pfn % 1024 != 1:
            put_page(pg)
    assert m.zone.nr_free > m.nr_pages // 2
    with pytest.raises(KernelError) as ei:
        m.zone.alloc(GFP_KERNEL, MAX_ORDER, "big")
    assert ei.value.errno == ENOMEM
    assert m.zone.alloc(GFP_KERNEL, MAX_ORDER - 1, "half").pfn % 512 == 0
    for head, (order, _, _) in list(m.zone.allocated.items()):
        put_page(page(m.zone, head), order)
    assert m.zone.nr_free == m.nr_pages - 1


def test_order_above_max_is_enomem(m):
    with pytest.raises(KernelError) as ei:
        m.zone.alloc(GFP_KERNEL, MAX_ORDER + 1, "test")
    assert ei.value.errno == ENOMEM


def test_alloc_pages_uses_current_and_records_the_owner(m):
    with running(m.init_task):
        pg = alloc_pages(GFP_KERNEL, 2, "mydrv")
        head, owner, where = m.zone.owner_of(pg.pfn + 3)
        assert (head, owner) == (pg.pfn, "mydrv")
        assert where.startswith("test_page_alloc.py:")
        assert where.endswith("test_alloc_pages_uses_current_and_records_the_owner")
        assert m.zone.owner_of(pg.pfn + 4) is None  # the next block is free
        assert page_to_phys(pg) == pg.pfn * m.page_size
        assert not page_maybe_dma_pinned(pg)
        assert repr(pg) == f"page pfn={pg.pfn:#x} ref=1 pin=0 map=0 flags=0x0"
        __free_pages(pg, 2)
    assert m.zone.owner_of(pg.pfn) is None
    assert m.zone.nr_free == m.nr_pages - 1

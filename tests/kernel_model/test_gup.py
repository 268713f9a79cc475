"""Tests for kernel_model/gup.py: pin_user_pages_fast, its slow path, and unpinning.

Every errno path ends with no pin held (nr_foll_pin_acquired == _released and
no page with a pincount); the suite's leak check proves it again at the end.
"""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model import gup
from kernel_model.current import running
from kernel_model.emu.machine import Machine
from kernel_model.errno import EFAULT, EINVAL, ENOMEM, EOVERFLOW, KernelError
from kernel_model.fs import cdev, cdev_add, file_operations
from kernel_model.gup import (
    FOLL_FORCE,
    FOLL_GET,
    FOLL_LONGTERM,
    FOLL_WRITE,
    pin_user_pages_fast,
    pin_user_pages_remote,
    unpin_user_page_range_dirty_lock,
    unpin_user_pages,
    unpin_user_pages_dirty_lock,
)
from kernel_model.memory import remap_pfn_range
from kernel_model.mm import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_PRIVATE,
    MAP_SHARED,
    PROT_NONE,
    PROT_READ,
    PROT_WRITE,
)
from kernel_model.page_alloc import GFP_KERNEL, PG_dirty, page, put_page
from kernel_model.pgtable import _PAGE_DIRTY, _PAGE_PRESENT, _PAGE_RW, _PAGE_USER, pte_addr

RW = PROT_READ | PROT_WRITE
ANON = MAP_PRIVATE | MAP_ANONYMOUS
SENTINEL = 0xDEAD


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


@pytest.fixture
def p(m):
    return m.spawn("guptest")


def pfn_at(p, va: int) -> int:
    return pte_addr(p.mm.pgtable.get(va)) >> p.machine.page_shift


def counts(m: Machine, pfn: int) -> tuple[int, int, int]:
    pg = page(m.zone, pfn)
    return pg._refcount, pg._pincount, pg._mapcount


def assert_no_pins(m: Machine) -> None:
    assert m.vmstat["nr_foll_pin_acquired"] == m.vmstat["nr_foll_pin_released"]
    pins = m.mem.pages[2::4]
    assert not any(pins), [pfn for pfn, n in enumerate(pins) if n]


def pin(p, start: int, nr: int, flags: int = FOLL_WRITE, size: int | None = None):
    """pin_user_pages_fast as p: (count or -errno, the pfn array)."""
    pfns = U64Array(nr if size is None else size)
    for i in range(len(pfns)):
        pfns[i] = SENTINEL
    with p.kernel():
        try:
            return pin_user_pages_fast(start, nr, flags, pfns), pfns
        except KernelError as e:
            return -e.errno, pfns


def unpin(p, pfns: U64Array, n: int) -> None:
    with p.kernel():
        unpin_user_pages(pfns, n)


def add_bar_device(m: Machine, path: str = "/dev/bar") -> int:
    """A device whose mmap maps its BAR (VM_IO|VM_PFNMAP); returns the BAR's base."""
    base = m.alloc_mmio_window(1 << 20)

    def mmap(f, vma):
        remap_pfn_range(vma, vma.vm_start, base >> m.page_shift, vma.vm_end - vma.vm_start,
                        vma.vm_page_prot)

    with running(m.init_task):
        cdev_add(cdev(file_operations(mmap=mmap)), path)
    return base


def test_fast_path_pins_present_pages_slow_path_faults_the_rest(p, m, monkeypatch):
    ps = m.page_size
    a = p.mmap(0, 8 * ps)
    for i in (0, 1, 2, 5):
        p.store(a + i * ps, bytes([i]))
    before = {i: pfn_at(p, a + i * ps) for i in (0, 1, 2, 5)}
    faults = []
    real = gup.handle_mm_fault

    def spy(vma, address, flags):
        faults.append(address)
        return real(vma, address, flags)

    monkeypatch.setattr(gup, "handle_mm_fault", spy)
    n, pfns = pin(p, a, 8)
    assert n == 8
    # only the untouched pages: each run of them takes one handle_mm_fault, the rest
    # of the run comes in with it (memory.fault_anon_run)
    assert faults == [a + i * ps for i in (3, 6)]
    assert all(pfns[i] == pfn for i, pfn in before.items())
    assert pfns.tolist() == [pfn_at(p, a + i * ps) for i in range(8)]
    assert len(set(pfns.tolist())) == 8
    assert all(counts(m, pfn) == (2, 1, 1) for pfn in pfns.tolist())
    assert p.mm.rss == 8
    assert m.vmstat["nr_foll_pin_acquired"] == 8
    unpin(p, pfns, 8)
    assert all(counts(m, pfn) == (1, 0, 1) for pfn in pfns.tolist())
    assert m.vmstat["nr_foll_pin_released"] == 8
    assert_no_pins(m)


def test_pin_twice_counts_twice(p, m):
    a = p.mmap(0, m.page_size)
    n1, first = pin(p, a, 1)
    n2, second = pin(p, a + 123, 1, FOLL_WRITE | FOLL_LONGTERM)  # start rounds down
    assert n1 == n2 == 1 and first[0] == second[0]
    assert counts(m, first[0]) == (3, 2, 1)
    unpin(p, first, 1)
    unpin(p, second, 1)
    assert counts(m, first[0]) == (1, 0, 1)
    assert_no_pins(m)


def test_read_pin_of_read_only_mapping(p, m):
    a = p.mmap(0, 2 * m.page_size, PROT_READ)
    n, pfns = pin(p, a, 2, 0)
    assert n == 2 and p.mm.pgtable.get(a) & (_PAGE_PRESENT | _PAGE_RW) == _PAGE_PRESENT
    unpin(p, pfns, 2)
    assert_no_pins(m)


@pytest.mark.parametrize("touched", [False, True])
def test_write_pin_of_read_only_mapping_is_efault(p, m, touched):
    a = p.mmap(0, 2 * m.page_size, PROT_READ)
    if touched:
        p.load(a, 2 * m.page_size)
    n, pfns = pin(p, a, 2)
    assert n == -EFAULT
    assert pfns[0] == SENTINEL
    if touched:
        assert counts(m, pfn_at(p, a)) == (1, 0, 1)
    assert_no_pins(m)


@pytest.mark.parametrize("touched", [False, True])
def test_forced_write_pin_of_private_read_only_mapping(p, m, touched):
    ps = m.page_size
    a = p.mmap(0, 2 * ps, PROT_READ)
    if touched:
        p.load(a, 2 * ps)
    n, pfns = pin(p, a, 2, FOLL_WRITE | FOLL_FORCE)
    assert n == 2
    for i in range(2):
        pte = p.mm.pgtable.get(a + i * ps)
        assert pte & _PAGE_DIRTY and not pte & _PAGE_RW  # the anon copy, still read-only
        assert counts(m, pfns[i]) == (2, 1, 1)
    unpin(p, pfns, 2)
    assert_no_pins(m)


def test_forced_write_pin_of_shared_read_only_mapping_is_efault(p, m):
    a = p.mmap(0, m.page_size, PROT_READ, MAP_SHARED | MAP_ANONYMOUS)
    assert pin(p, a, 1, FOLL_WRITE | FOLL_FORCE)[0] == -EFAULT
    assert_no_pins(m)


def test_read_pin_of_prot_none_is_efault(p, m):
    a = p.mmap(0, m.page_size, PROT_NONE)
    assert pin(p, a, 1, 0)[0] == -EFAULT
    assert p.mm.rss == 0
    assert_no_pins(m)


def test_unmapped_range_is_efault(p, m):
    a = p.mmap(0, m.page_size)
    p.munmap(a, m.page_size)
    assert pin(p, a, 1)[0] == -EFAULT
    assert pin(p, 0x10000, 4, 0)[0] == -EFAULT
    assert_no_pins(m)


@pytest.mark.parametrize("flags", [0, FOLL_WRITE, FOLL_WRITE | FOLL_FORCE | FOLL_LONGTERM])
def test_pfnmap_range_is_efault(p, m, flags):
    add_bar_device(m)
    fd = p.open("/dev/bar")
    a = p.mmap(0, 2 * m.page_size, RW, MAP_SHARED, fd)
    assert p.mm.pgtable.get(a) & _PAGE_PRESENT  # mapped, but no struct page to pin
    assert pin(p, a, 2, flags)[0] == -EFAULT
    assert_no_pins(m)
    assert p.close(fd) == 0


def test_partial_pin_up_to_a_hole(p, m):
    ps = m.page_size
    a = p.mmap(0, 4 * ps)
    p.munmap(a + 2 * ps, 2 * ps)
    p.store(a, b"x")  # page 0 via the fast path, page 1 via the slow path
    n, pfns = pin(p, a, 4)
    assert n == 2
    assert pfns[2] == pfns[3] == SENTINEL
    assert all(counts(m, pfns[i]) == (2, 1, 1) for i in range(2))
    assert m.vmstat["nr_foll_pin_acquired"] == 2
    unpin(p, pfns, 2)
    assert_no_pins(m)


def test_partial_pin_up_to_a_read_only_vma(p, m):
    ps = m.page_size
    a = p.mmap(0, 4 * ps)
    assert p.mmap(a + 2 * ps, 2 * ps, PROT_READ, ANON | MAP_FIXED) == a + 2 * ps
    p.load(a, 4 * ps)
    n, pfns = pin(p, a, 4)
    assert n == 2
    assert counts(m, pfn_at(p, a + 2 * ps)) == (1, 0, 1)  # present, not pinned
    unpin(p, pfns, 2)
    assert_no_pins(m)


def test_partial_pin_up_to_a_pfnmap_vma(p, m):
    ps = m.page_size
    add_bar_device(m)
    fd = p.open("/dev/bar")
    bar = p.mmap(0, ps, RW, MAP_SHARED, fd)
    a = p.mmap(bar - ps, ps, RW, ANON | MAP_FIXED)  # anon page right below the BAR
    n, pfns = pin(p, a, 2)
    assert n == 1
    unpin(p, pfns, 1)
    assert_no_pins(m)
    assert p.close(fd) == 0


def test_zero_pages_is_zero(p, m):
    a = p.mmap(0, m.page_size)
    assert pin(p, a, 0)[0] == 0
    assert pin(p, a, -1, FOLL_WRITE, 1)[0] == 0
    assert m.vmstat["nr_foll_pin_acquired"] == 0
    assert p.mm.rss == 0


def test_range_overflow_is_eoverflow(p, m):
    start = (1 << 64) - m.page_size
    assert pin(p, start, 2)[0] == -EOVERFLOW
    assert_no_pins(m)


def test_range_beyond_task_size_is_efault(p, m):
    start = p.mm.task_size & ~(m.page_size - 1)
    assert pin(p, start, 1)[0] == -EFAULT
    assert pin(p, start - m.page_size, 2)[0] == -EFAULT
    assert_no_pins(m)


def test_unsupported_gup_flag_is_einval_with_a_warning(p, m):
    a = p.mmap(0, m.page_size)
    assert pin(p, a, 1, FOLL_WRITE | FOLL_GET)[0] == -EINVAL
    assert len(m.bugs) == 1 and "gup_fast_fallback: unsupported gup_flags" in m.bugs[0]
    m.bugs.clear()
    assert p.mm.rss == 0
    assert_no_pins(m)


def test_pages_array_too_small_is_einval(p, m):
    a = p.mmap(0, 4 * m.page_size)
    assert pin(p, a, 4, FOLL_WRITE, 3)[0] == -EINVAL
    assert p.mm.rss == 0
    assert_no_pins(m)


def test_pfn_beyond_ram_is_efault(p, m):
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    p.store(a, b"ok")
    slot = p.mm.pgtable.pte_slot(a + ps, True)
    bogus = (m.nr_pages + 10) << m.page_shift
    p.mm.pgtable.set(slot, bogus | _PAGE_PRESENT | _PAGE_RW | _PAGE_USER)
    assert pin(p, a + ps, 1)[0] == -EFAULT
    assert pin(p, a + ps, 1, 0)[0] == -EFAULT
    n, pfns = pin(p, a, 2)  # the good page first: a partial pin
    assert n == 1 and pfns[1] == SENTINEL
    unpin(p, pfns, 1)
    assert_no_pins(m)
    p.mm.pgtable.set(slot, 0)


def test_kernel_thread_without_mm_is_efault(m):
    pfns = U64Array(1)
    with running(m.init_task), pytest.raises(KernelError) as ei:
        pin_user_pages_fast(0x10000, 1, 0, pfns)
    assert ei.value.errno == EFAULT


def test_pin_user_pages_remote(m):
    p = m.spawn("target")
    a = p.mmap(0, 3 * m.page_size)
    pfns = U64Array(3)
    with running(m.init_task):
        assert pin_user_pages_remote(p.mm, a, 3, FOLL_WRITE, pfns) == 3
    assert p.mm.rss == 3
    assert pfns.tolist() == [pfn_at(p, a + i * m.page_size) for i in range(3)]
    with running(m.init_task):
        unpin_user_pages(pfns, 3)
    assert_no_pins(m)


def test_out_of_memory_in_the_slow_path_is_enomem(p, m):
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    p.load(a, 1)
    hog = []
    try:
        while True:
            hog.append(m.zone.alloc(GFP_KERNEL, 0, "hog"))
    except KernelError:
        pass
    assert pin(p, a + ps, 1)[0] == -ENOMEM
    n, pfns = pin(p, a, 2)  # the present page pins, then the fault fails: partial
    assert n == 1
    unpin(p, pfns, 1)
    for pg in hog:
        put_page(pg)
    assert_no_pins(m)


@pytest.mark.parametrize("make_dirty", [True, False])
def test_unpin_dirty_lock(p, m, make_dirty):
    a = p.mmap(0, 2 * m.page_size)
    p.load(a, 2 * m.page_size)  # read faults: clean pages
    n, pfns = pin(p, a, 2)
    assert n == 2
    assert not any(page(m.zone, pfn).flags & PG_dirty for pfn in pfns.tolist())
    with p.kernel():
        unpin_user_pages_dirty_lock(pfns, 2, make_dirty)
    assert all(bool(page(m.zone, pfn).flags & PG_dirty) == make_dirty
               for pfn in pfns.tolist())
    assert_no_pins(m)


def test_unpin_twice_is_einval_with_a_warning(p, m):
    a = p.mmap(0, m.page_size)
    n, pfns = pin(p, a, 1)
    unpin(p, pfns, 1)
    with p.kernel(), pytest.raises(KernelError) as ei:
        unpin_user_pages(pfns, 1)
    assert ei.value.errno == EINVAL and ei.value.function == "unpin_user_pages"
    assert m.bugs == [f"WARNING: unpin_user_page: pfn {pfns[0]:#x} was not pinned"]
    m.bugs.clear()
    assert counts(m, pfns[0]) == (1, 0, 1)  # the page itself is untouched
    assert m.vmstat["nr_foll_pin_released"] == 1
    assert_no_pins(m)


def test_unpin_page_ranges(p, m):
    ps = m.page_size
    a = p.mmap(0, 6 * ps)
    p.store(a, bytes(6 * ps))  # consecutive touches: consecutive pfns
    n, pfns = pin(p, a, 6)
    assert n == 6 and pfns.tolist() == list(range(pfns[0], pfns[0] + 6))
    firsts, lens = U64Array(2), U64Array(2)
    firsts[0], lens[0], firsts[1], lens[1] = pfns[0], 4, pfns[4], 2
    with p.kernel():
        unpin_user_page_range_dirty_lock(firsts, lens, 2, True)
    assert all(counts(m, pfn) == (1, 0, 1) for pfn in pfns.tolist())
    assert m.vmstat["nr_foll_pin_released"] == 6
    assert_no_pins(m)


def test_last_unpin_after_exit_frees_the_page(p, m):
    a = p.mmap(0, m.page_size)
    n, pfns = pin(p, a, 1)
    p.exit()
    assert counts(m, pfns[0]) == (1, 1, 0)
    free = m.zone.nr_free
    with running(m.init_task):
        unpin_user_pages(pfns, 1)
    assert counts(m, pfns[0]) == (0, 0, 0)
    assert m.zone.nr_free == free + 1
    assert_no_pins(m)


def test_pin_across_page_table_boundaries(p, m):
    ps = m.page_size
    span = ps << (m.page_shift - 3)  # bytes one PTE table maps
    a = p.mmap(0, 2 * span)
    start = a + span - 3 * ps
    for i in range(0, 6, 2):
        p.store(start + i * ps, b"x")
    n, pfns = pin(p, start, 6)
    assert n == 6
    assert pfns.tolist() == [pfn_at(p, start + i * ps) for i in range(6)]
    unpin(p, pfns, 6)
    assert_no_pins(m)


def test_unpin_failing_partway_still_accounts_for_the_pages_before(m, p):
    """A bad page in the middle: the pins before it are released and counted,
    pages whose last reference went are freed, and the WARN names the pfn."""
    ps = m.page_size
    addr = p.mmap(0, 3 * ps)
    pages = U64Array(3)
    with p.kernel():
        assert pin_user_pages_fast(addr, 3, FOLL_WRITE, pages) == 3
    p.munmap(addr, 3 * ps)  # only the pins keep the pages now
    free_before = m.zone.nr_free
    bad = U64Array(3)
    bad[0], bad[1], bad[2] = pages[0], pages[1], pages[1]  # pages[1] unpinned twice
    with p.kernel():
        with pytest.raises(KernelError) as e:
            gup.unpin_user_pages(bad, 3)
    assert e.value.errno == EINVAL and f"{pages[1]:#x}" in e.value.message
    assert m.vmstat["nr_foll_pin_released"] == 2
    assert m.zone.nr_free == free_before + 2  # both pages went back to the allocator
    assert m.bugs and "unpin_user_page" in m.bugs[0]
    m.bugs.clear()
    rest = U64Array(1)
    rest[0] = pages[2]
    with p.kernel():
        gup.unpin_user_pages(rest, 1)
    assert m.vmstat["nr_foll_pin_acquired"] == m.vmstat["nr_foll_pin_released"] == 3

"""Tests for kernel_model/emu/leakcheck.py: what a leak report names."""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model.current import running
from kernel_model.emu.leakcheck import MAX_LINES, LeakError, find_leaks
from kernel_model.emu.machine import Machine
from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast, unpin_user_pages
from kernel_model.mm import mmdrop, mmgrab
from kernel_model.page_alloc import GFP_KERNEL, alloc_pages, put_page


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


def test_clean_machine_passes(m):
    p = m.spawn()
    a = p.mmap(0, 4 * m.page_size)
    p.store(a, b"x" * m.page_size * 4)
    # while the process runs, its task and every page it uses are listed...
    leaks = find_leaks(m)
    assert leaks[0] == f"task {p.pid} (proc) still running"
    in_use = p.mm.rss + p.mm.pgtables_bytes // m.page_size
    assert len(leaks) == 1 + in_use + 1  # + the mm itself
    m.check_leaks()  # ...and after shutdown there is nothing left
    assert find_leaks(m) == []


def test_a_leaked_pin_names_the_page_and_its_owner(m):
    p = m.spawn("leaker")
    a = p.mmap(0, m.page_size)
    pfns = U64Array(1)
    with p.kernel():
        assert pin_user_pages_fast(a, 1, FOLL_WRITE, pfns) == 1
    with pytest.raises(LeakError) as ei:
        m.check_leaks()
    msg = str(ei.value)
    assert msg.startswith(f"{m.name}: 2 leak(s):\n")
    assert (f"pfn {pfns[0]:#x}: refcount 1 pincount 1 mapcount 0 "
            f"(anon pid {p.pid} at memory.py:") in msg
    assert "do_anonymous_page)" in msg
    assert "pins: nr_foll_pin_acquired 1 != nr_foll_pin_released 0" in msg
    with running(m.init_task):
        unpin_user_pages(pfns, 1)
    m.check_leaks()


def test_a_kept_mmgrab_reports_the_mm_with_pinned_vm(m):
    p = m.spawn()
    mm = p.mm
    mmgrab(mm)
    mm.pinned_vm = 3  # what ib_umem_get charges, still held
    with pytest.raises(LeakError) as ei:
        m.check_leaks()
    assert str(ei.value) == (f"{m.name}: 1 leak(s):\n  mm of pid {p.pid} still referenced: "
                             "mm_count=1 mm_users=0 pinned_vm=3")
    mm.pinned_vm = 0
    mmdrop(mm)
    m.check_leaks()


def test_a_leaked_kernel_page_names_who_allocated_it(m):
    with running(m.init_task):
        pg = alloc_pages(GFP_KERNEL, 0, "leaky driver")
    leaks = find_leaks(m)
    assert len(leaks) == 1
    assert leaks[0].startswith(f"pfn {pg.pfn:#x}: refcount 1 pincount 0 mapcount 0 "
                               "(leaky driver at test_leakcheck.py:")
    assert leaks[0].endswith(" test_a_leaked_kernel_page_names_who_allocated_it)")
    put_page(pg)
    assert find_leaks(m) == []


def test_allocated_with_refcount_zero_is_reported(m):
    pg = m.zone.alloc(GFP_KERNEL, 1, "lost")
    pg._refcount = 0  # e.g. a driver that zeroed the count by hand
    leaks = find_leaks(m)
    assert len(leaks) == 1
    assert leaks[0].startswith(f"pfn {pg.pfn:#x} order 1: allocated by lost at ")
    assert leaks[0].endswith("with refcount 0")
    pg._refcount = 1
    put_page(pg, 1)
    assert find_leaks(m) == []


def test_warnings_running_tasks_and_subsystem_checks_are_leaks(m):
    p = m.spawn("sleeper")
    m.report_bug("some_function", "something odd")
    m.leak_checks.append(lambda mach: [f"widget of {mach.name} never freed"])
    leaks = find_leaks(m)
    assert leaks[0] == "kernel bug: WARNING: some_function: something odd"
    assert leaks[1] == f"task {p.pid} (sleeper) still running"
    assert leaks[-1] == f"widget of {m.name} never freed"
    with pytest.raises(LeakError, match="still running"):
        m.check_leaks(shutdown=False)
    assert p.alive
    m.bugs.clear()
    m.leak_checks.clear()
    m.check_leaks()
    assert not p.alive


def test_long_reports_are_cut(m):
    pages = [m.zone.alloc(GFP_KERNEL, 0, "many") for _ in range(MAX_LINES + 5)]
    with pytest.raises(LeakError) as ei:
        m.check_leaks()
    msg = str(ei.value)
    assert msg.startswith(f"{m.name}: {MAX_LINES + 5} leak(s):")
    assert msg.count("\n  pfn ") == MAX_LINES
    assert msg.endswith("\n... and 5 more")
    for pg in pages:
        put_page(pg)
    m.check_leaks()


def test_page_scan_pages_past_its_scratch_buffer(m):
    """More leaked pages than _page_leaks' 4096-entry buffer: every one is found."""
    pages = [m.zone.alloc(GFP_KERNEL, 0, "bulk") for _ in range(5000)]
    leaks = find_leaks(m)
    assert len(leaks) == 5000
    assert leaks[-1].startswith(f"pfn {pages[-1].pfn:#x}: ")
    for pg in pages:
        put_page(pg)
    assert find_leaks(m) == []


def test_a_machine_may_opt_out_after_asserting(m):
    with running(m.init_task):
        alloc_pages(GFP_KERNEL, 0, "kept on purpose")
    assert len(find_leaks(m)) == 1
    m.leak_check_expected = False  # the suite's fixture skips this machine


def test_made_since_lists_the_live_machines_built_since_a_serial_in_order():
    """What every leak check after a run or a test iterates: the machines built since
    its first serial, oldest first, and none that was collected or came before."""
    import gc

    before = Machine(ram_size=32 << 20)
    first = Machine.next_serial
    a, b, c = (Machine(ram_size=32 << 20) for _ in range(3))
    assert Machine.made_since(first) == [a, b, c]
    assert Machine.made_since(before.serial) == [before, a, b, c]
    serial_b = b.serial
    del b
    gc.collect()                                  # b is gone: no entry for its serial
    assert Machine.made_since(first) == [a, c]
    assert Machine.made_since(serial_b) == [c]
    assert Machine.made_since(Machine.next_serial) == []
    for mach in (before, a, c):
        mach.check_leaks()

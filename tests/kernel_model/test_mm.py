"""Tests for kernel_model/mm.py: VMAs, mmap/munmap placement and errors, mm lifetime."""

from __future__ import annotations

import pytest

from kernel_model.current import running
from kernel_model.emu.machine import Machine
from kernel_model.errno import EACCES, EBADF, EINVAL, ENODEV, ENOMEM, KernelError
from kernel_model.fs import O_RDONLY, cdev, cdev_add, file_operations
from kernel_model.memory import remap_pfn_range
from kernel_model.mm import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_PRIVATE,
    MAP_SHARED,
    MMAP_BASE,
    PROT_READ,
    PROT_WRITE,
    TASK_SIZE,
    VM_MAYSHARE,
    VM_READ,
    VM_SHARED,
    VM_WRITE,
    mmdrop,
    mmget,
    mmgrab,
    mmput,
    vm_operations_struct,
)

RW = PROT_READ | PROT_WRITE
ANON = MAP_PRIVATE | MAP_ANONYMOUS


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


@pytest.fixture
def p(m):
    return m.spawn("mmtest")


def spans(p) -> list[tuple[int, int]]:
    return [(v.vm_start, v.vm_end) for v in p.mm.vmas]


def add_device(m: Machine, path: str, events: list, mmap=None) -> None:
    """A char device whose VMAs record open/close and whose release is logged."""
    ops = vm_operations_struct(open=lambda vma: events.append(("open", vma.vm_start)),
                               close=lambda vma: events.append(("close", vma.vm_start)))

    def dev_mmap(f, vma):
        vma.vm_ops = ops
        if mmap is not None:
            mmap(f, vma)

    fops = file_operations(mmap=dev_mmap,
                           release=lambda inode, f: events.append(("release", f.f_path)))
    with running(m.init_task):
        cdev_add(cdev(fops), path)


def test_mmap_places_top_down(p, m):
    ps = m.page_size
    a1 = p.mmap(0, 3 * ps)
    a2 = p.mmap(0, ps + 1)  # rounded up to two pages
    assert a1 == MMAP_BASE - 3 * ps
    assert a2 == a1 - 2 * ps
    assert spans(p) == [(a2, a1), (a1, MMAP_BASE)]
    assert p.mm.total_vm == 5
    assert repr(p.mm.vmas[1]) == f"{a1:012x}-{MMAP_BASE:012x} rw-p 00000000 [anon]"


def test_mmap_fills_the_highest_hole_that_fits(p, m):
    ps = m.page_size
    a = p.mmap(0, 4 * ps)
    assert p.munmap(a + ps, ps) == 0
    assert p.mmap(0, 2 * ps) == a - 2 * ps  # the one-page hole is too small
    assert p.mmap(0, ps) == a + ps          # this one fits it
    assert spans(p) == [(a - 2 * ps, a), (a, a + ps), (a + ps, a + 2 * ps),
                        (a + 2 * ps, a + 4 * ps)]


def test_map_fixed_replaces_the_middle_of_a_mapping(p, m):
    ps = m.page_size
    a = p.mmap(0, 4 * ps)
    for i in range(4):
        p.store(a + i * ps, bytes([i + 1]))
    free = m.zone.nr_free
    assert p.mmap(a + ps, 2 * ps, PROT_READ, ANON | MAP_FIXED) == a + ps
    assert spans(p) == [(a, a + ps), (a + ps, a + 3 * ps), (a + 3 * ps, a + 4 * ps)]
    assert [v.vm_flags & (VM_READ | VM_WRITE) for v in p.mm.vmas] == [
        VM_READ | VM_WRITE, VM_READ, VM_READ | VM_WRITE]
    assert p.mm.vmas[2].vm_pgoff == 3  # split_vma advanced the upper part's pgoff
    assert m.zone.nr_free == free + 2 and p.mm.rss == 2  # the old pages were zapped
    assert p.load(a, 1) == b"\x01" and p.load(a + 3 * ps, 1) == b"\x04"
    assert p.load(a + ps, 1) == b"\x00"  # a fresh zero page
    assert p.mm.total_vm == 4


def test_munmap_splits_a_vma_in_two(p, m):
    ps = m.page_size
    a = p.mmap(0, 4 * ps)
    p.store(a, bytes(4 * ps))
    free = m.zone.nr_free
    assert p.munmap(a + ps, ps) == 0
    assert spans(p) == [(a, a + ps), (a + 2 * ps, a + 4 * ps)]
    assert [v.vm_pgoff for v in p.mm.vmas] == [0, 2]
    assert p.mm.rss == 3 and m.zone.nr_free == free + 1
    assert p.mm.pgtable.get(a + ps) == 0
    assert p.mm.total_vm == 3


def test_munmap_across_vmas_and_holes(p, m):
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    b = p.mmap(0, 2 * ps)
    assert b == a - 2 * ps
    assert p.munmap(b + ps, 2 * ps) == 0  # b's top page and a's bottom page
    assert spans(p) == [(b, b + ps), (a + ps, a + 2 * ps)]
    assert p.munmap(b - 8 * ps, 4 * ps) == 0  # nothing mapped there: still fine
    assert p.munmap(b, 4 * ps) == 0
    assert p.mm.vmas == [] and p.mm.total_vm == 0


def test_find_vma_and_vma_lookup(p, m):
    ps = m.page_size
    a = p.mmap(0, ps)
    b = p.mmap(0, ps)
    p.munmap(b, ps)
    assert p.mm.find_vma(b).vm_start == a  # the next vma above the hole
    assert p.mm.vma_lookup(b) is None
    assert p.mm.vma_lookup(a + ps - 1).vm_start == a
    assert p.mm.find_vma(a + ps) is None


@pytest.mark.parametrize("args, errno", [
    ((0, 0), EINVAL),                                  # length 0
    ((0, 4096, RW, MAP_ANONYMOUS), EINVAL),            # neither shared nor private
    ((0, 4096, RW, MAP_SHARED | MAP_PRIVATE | MAP_ANONYMOUS), EINVAL),
    ((0, 4096, RW, MAP_SHARED), EBADF),                # a file mapping without fd
    ((0, 4096, RW, MAP_SHARED, 5), EBADF),             # an fd that is not open
    ((0, 4096, RW, ANON, -1, 100), EINVAL),            # offset not page aligned
    ((0x1001, 4096, RW, ANON | MAP_FIXED), EINVAL),    # fixed address not aligned
    ((TASK_SIZE, 8192, RW, ANON | MAP_FIXED), ENOMEM),  # fixed, beyond TASK_SIZE
    ((TASK_SIZE + 1, 8192, RW, ANON | MAP_FIXED), ENOMEM),  # range is checked first
    ((-4096, 4096, RW, ANON | MAP_FIXED), ENOMEM),     # (an unsigned long: huge)
    ((0, TASK_SIZE + 4096), ENOMEM),                   # longer than the address space
    ((0, MMAP_BASE), ENOMEM),                          # no gap below mmap_base fits
])
def test_mmap_errors(p, args, errno):
    assert p.mmap(*args) == -errno
    assert p.mm.vmas == []
    assert isinstance(p.task.last_error, KernelError)
    assert p.task.last_error.errno == errno


@pytest.mark.parametrize("addr_off, length", [(1, 4096), (0, 0), (0, TASK_SIZE)])
def test_munmap_errors(p, m, addr_off, length):
    a = p.mmap(0, m.page_size)
    assert p.munmap(a + addr_off, length) == -EINVAL
    assert spans(p) == [(a, a + m.page_size)]


def test_munmap_beyond_task_size(p):
    assert p.munmap(TASK_SIZE + 4096, 4096) == -EINVAL


def test_mmap_of_a_file_without_mmap_is_enodev(p, m):
    with running(m.init_task):
        cdev_add(cdev(file_operations()), "/dev/nommap")
    fd = p.open("/dev/nommap")
    assert p.mmap(0, m.page_size, RW, MAP_SHARED, fd) == -ENODEV
    assert p.mm.vmas == []
    assert p.close(fd) == 0


def test_shared_writable_map_of_read_only_file_is_eacces(p, m):
    events: list = []
    add_device(m, "/dev/d", events)
    fd = p.open("/dev/d", O_RDONLY)
    assert p.mmap(0, m.page_size, RW, MAP_SHARED, fd) == -EACCES
    assert p.mmap(0, m.page_size, RW, MAP_PRIVATE, fd) > 0  # private: allowed
    assert p.mmap(0, m.page_size, PROT_READ, MAP_SHARED, fd) > 0
    assert p.mm.vmas[0].vm_flags & (VM_SHARED | VM_MAYSHARE) == VM_SHARED | VM_MAYSHARE
    assert p.close(fd) == 0
    assert events == []  # both VMAs still hold the file
    p.exit()
    assert [e[0] for e in events] == ["close", "close", "release"]


def test_failing_driver_mmap_unwinds(p, m):
    events: list = []
    pfn = m.alloc_mmio_window(1 << 20) >> m.page_shift

    def bad_mmap(f, vma):
        remap_pfn_range(vma, vma.vm_start, pfn, m.page_size, vma.vm_page_prot)
        raise KernelError(EINVAL, "bad_mmap: refusing after mapping one page")

    add_device(m, "/dev/bad", events, bad_mmap)
    fd = p.open("/dev/bad")
    free = m.zone.nr_free
    assert p.mmap(0, 2 * m.page_size, RW, MAP_SHARED, fd) == -EINVAL
    assert p.mm.vmas == [] and p.mm.total_vm == 0
    # the PTE the driver installed is gone (the table page it needed stays, as in Linux)
    top = MMAP_BASE - 2 * m.page_size
    assert p.mm.pgtable.get(top) == 0
    assert m.zone.nr_free == free - 3  # pud, pmd, pte tables for the top-down address
    f = p.task.files.fdt[fd]
    assert f.f_count == 1
    assert p.close(fd) == 0
    assert events == [("release", "/dev/bad")]


def test_split_calls_vm_ops_open_and_each_part_closes(p, m):
    events: list = []
    add_device(m, "/dev/d", events)
    ps = m.page_size
    fd = p.open("/dev/d")
    a = p.mmap(0, 3 * ps, RW, MAP_SHARED, fd)
    f = p.task.files.fdt[fd]
    assert f.f_count == 2
    assert p.munmap(a + ps, ps) == 0
    # two splits (at a+ps for the start, then a+2ps for the end); the middle goes
    assert events == [("open", a + ps), ("open", a + 2 * ps), ("close", a + ps)]
    assert f.f_count == 3  # each remaining part holds the file
    assert [v.vm_pgoff for v in p.mm.vmas] == [0, 2]
    assert p.close(fd) == 0
    assert p.munmap(a, 3 * ps) == 0
    assert events[3:] == [("close", a), ("close", a + 2 * ps), ("release", "/dev/d")]


def test_mmget_keeps_the_mappings_past_exit(p, m):
    mm = p.mm
    a = p.mmap(0, m.page_size)
    p.store(a, b"live")
    mmget(mm)
    p.exit()
    assert mm.mm_users == 1 and len(mm.vmas) == 1 and mm.rss == 1
    with running(m.init_task):
        mmput(mm)
    assert mm.vmas == [] and mm.rss == 0 and mm.pgd == 0
    assert mm not in m.mms


def test_mmgrab_keeps_the_struct_not_the_mappings(p, m):
    mm = p.mm
    p.mmap(0, m.page_size)
    mmgrab(mm)
    p.exit()
    assert mm.mm_users == 0 and mm.mm_count == 1
    assert mm.vmas == [] and mm in m.mms
    mmdrop(mm)
    assert mm.mm_count == 0 and mm not in m.mms
    mmdrop(mm)
    assert m.bugs == [f"WARNING: mmdrop: mm_count underflow on {mm!r}"]
    m.bugs.clear()


def test_exit_releases_every_page(p, m):
    free = m.zone.nr_free
    a = p.mmap(0, 64 * m.page_size)
    p.store(a, bytes(64 * m.page_size))
    assert m.zone.nr_free < free
    p.exit()
    assert m.zone.nr_free == free + 1  # the pgd spawn took comes back too


# -- munmap and MAP_FIXED are all or nothing (do_vmi_align_munmap) ---------------------------
def _refuse_split(vma, addr):
    raise KernelError(EINVAL, "refuse_split: this mapping cannot be split")


def unsplittable_below_anon(p, m):
    """An anonymous page holding bytes just below a 2-page mapping whose driver refuses
    splits (as a GPU mapping does); returns (anon, top)."""
    ps = m.page_size
    events: list = []
    add_device(m, "/dev/nosplit", events)
    fd = p.open("/dev/nosplit")
    top = p.mmap(0, 2 * ps, RW, MAP_SHARED, fd)
    p.mm.vma_lookup(top).vm_ops = vm_operations_struct(may_split=_refuse_split)
    anon = p.mmap(top - ps, ps, RW, ANON | MAP_FIXED)
    assert anon == top - ps
    p.store(anon, b"keep me!")
    assert p.close(fd) == 0
    return anon, top


def test_munmap_refused_by_may_split_changes_nothing(p, m):
    anon, top = unsplittable_below_anon(p, m)
    before = spans(p)
    assert p.munmap(anon, 2 * m.page_size) == -EINVAL  # would cut the device mapping
    assert "cannot be split" in str(p.task.last_error)
    assert spans(p) == before and p.load(anon, 8) == b"keep me!"
    assert p.munmap(anon, 3 * m.page_size) == 0  # whole VMAs need no split
    assert p.mm.vmas == []


def test_map_fixed_refused_by_may_split_keeps_the_old_mappings(p, m):
    anon, top = unsplittable_below_anon(p, m)
    before = spans(p)
    assert p.mmap(anon, 2 * m.page_size, RW, ANON | MAP_FIXED) == -EINVAL
    assert spans(p) == before and p.load(anon, 8) == b"keep me!"
    assert p.mmap(anon, 3 * m.page_size, RW, ANON | MAP_FIXED) == anon
    assert spans(p) == [(anon, anon + 3 * m.page_size)] and p.load(anon, 8) == bytes(8)


def test_munmap_never_fails_because_of_vm_ops_close(p, m):
    def failing_close(vma):
        raise KernelError(EINVAL, "failing_close: a driver bug")

    a = p.mmap(0, m.page_size, RW, ANON)
    p.mm.vma_lookup(a).vm_ops = vm_operations_struct(close=failing_close)
    assert p.munmap(a, m.page_size) == 0 and p.mm.vmas == []
    assert m.bugs == ["WARNING: remove_vma: vm_ops->close of "
                      f"{a:012x}-{a + m.page_size:012x} rw-p 00000000 [anon] failed: "
                      "failing_close: a driver bug (-EINVAL)"]
    m.bugs.clear()

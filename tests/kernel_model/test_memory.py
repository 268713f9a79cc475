"""Tests for kernel_model/memory.py: faults, zapping, remap_pfn_range, access_vm."""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model.current import running
from kernel_model.emu.machine import Machine
from kernel_model.emu.process import SegmentationFault
from kernel_model.errno import EBUSY, EINVAL, ENOMEM, KernelError
from kernel_model.fs import cdev, cdev_add, file_operations
from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast, unpin_user_pages
from kernel_model.memory import (
    VM_FAULT_SIGBUS,
    access_vm,
    follow_pte,
    remap_pfn_range,
    zap_vma_ptes,
)
from kernel_model.mm import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_PRIVATE,
    MAP_SHARED,
    PROT_READ,
    PROT_WRITE,
    VM_DONTDUMP,
    VM_DONTEXPAND,
    VM_IO,
    VM_PFNMAP,
    vm_operations_struct,
)
from kernel_model.page_alloc import (
    __GFP_ZERO,
    GFP_KERNEL,
    PAGE_POISON,
    PG_anon,
    PG_dirty,
    page,
    put_page,
)
from kernel_model.pgtable import _PAGE_DIRTY, _PAGE_PRESENT, _PAGE_RW, _PAGE_SPECIAL, pte_addr

RW = PROT_READ | PROT_WRITE
_IO_FLAGS = VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


@pytest.fixture
def p(m):
    return m.spawn("memtest")


def pfn_at(p, va: int) -> int:
    return pte_addr(p.mm.pgtable.get(va)) >> p.machine.page_shift


def add_mmap_device(m: Machine, path: str, mmap) -> list:
    """A char device whose ->mmap is `mmap(f, vma)`; returns the list of its VMAs."""
    vmas: list = []

    def dev_mmap(f, vma):
        vmas.append(vma)
        mmap(f, vma)

    with running(m.init_task):
        cdev_add(cdev(file_operations(mmap=dev_mmap)), path)
    return vmas


def test_first_touch_maps_a_zeroed_page(p, m):
    ps = m.page_size
    a = p.mmap(0, ps)
    p.store(a, b"\x11" * ps)
    old = pfn_at(p, a)
    p.munmap(a, ps)
    assert page(m.zone, old)._refcount == 0
    assert bytes(m.mem.ram[old * ps:(old + 1) * ps]) == bytes([PAGE_POISON]) * ps
    free = m.zone.nr_free
    b = p.mmap(0, ps)
    assert b == a and p.mm.pgtable.get(b) == 0  # nothing mapped until touched
    assert p.load(b + 100, 4) == bytes(4)
    pfn = pfn_at(p, b)
    assert pfn == old  # the poisoned page came back, zeroed by __GFP_ZERO
    pg = page(m.zone, pfn)
    assert (pg._refcount, pg._mapcount, pg._pincount) == (1, 1, 0)
    assert pg.flags & PG_anon
    assert bytes(m.mem.ram[pfn * ps:(pfn + 1) * ps]) == bytes(ps)
    assert m.zone.nr_free == free - 1 and p.mm.rss == 1
    owner = m.zone.owner_of(pfn)
    assert owner[1] == f"anon pid {p.pid}"


def test_read_fault_is_clean_write_fault_is_dirty(p, m):
    a = p.mmap(0, 2 * m.page_size)
    p.load(a, 1)
    p.store(a + m.page_size, b"w")
    assert not p.mm.pgtable.get(a) & _PAGE_DIRTY
    assert p.mm.pgtable.get(a + m.page_size) & _PAGE_DIRTY


def test_munmap_of_a_pinned_page_keeps_it_until_unpin(p, m):
    ps = m.page_size
    a = p.mmap(0, ps)
    p.store(a, b"pinned data")
    pfn = pfn_at(p, a)
    pfns = U64Array(1)
    with p.kernel():
        assert pin_user_pages_fast(a, 1, FOLL_WRITE, pfns) == 1
    assert pfns[0] == pfn
    assert p.munmap(a, ps) == 0
    pg = page(m.zone, pfn)
    assert (pg._refcount, pg._pincount, pg._mapcount) == (1, 1, 0)
    assert pg.flags & PG_dirty  # zap_pte_range passed the dirty PTE on
    assert pfn in m.zone.allocated and p.mm.rss == 0
    assert bytes(m.mem.ram[pfn * ps:pfn * ps + 11]) == b"pinned data"  # not poisoned
    with p.kernel():
        unpin_user_pages(pfns, 1)
    assert pg._refcount == 0 and pg._pincount == 0
    assert pfn not in m.zone.allocated
    assert bytes(m.mem.ram[pfn * ps:pfn * ps + 11]) == bytes([PAGE_POISON]) * 11


def test_remap_pfn_range_maps_special_ptes(p, m):
    ps = m.page_size
    base = m.alloc_mmio_window(1 << 20)
    vmas = add_mmap_device(m, "/dev/bar", lambda f, vma: remap_pfn_range(
        vma, vma.vm_start, base >> m.page_shift, vma.vm_end - vma.vm_start, vma.vm_page_prot))
    fd = p.open("/dev/bar")
    a = p.mmap(0, 3 * ps, RW, MAP_SHARED, fd)
    vma = vmas[0]
    assert vma.vm_flags & _IO_FLAGS == _IO_FLAGS
    for i in range(3):
        pte = p.mm.pgtable.get(a + i * ps)
        assert pte & (_PAGE_PRESENT | _PAGE_SPECIAL | _PAGE_RW) == (
            _PAGE_PRESENT | _PAGE_SPECIAL | _PAGE_RW)
        assert pte_addr(pte) == base + i * ps
        assert follow_pte(p.mm, a + i * ps) == pte
    assert p.mm.rss == 0
    free = m.zone.nr_free
    assert p.munmap(a, 3 * ps) == 0
    assert m.zone.nr_free == free  # no struct page behind an MMIO PFN to put
    assert p.close(fd) == 0


def test_remap_of_a_ram_page_does_not_touch_its_counts(p, m):
    """Special PTEs are invisible to the page's refcount and mapcount."""
    ps = m.page_size
    with running(m.init_task):
        kpage = m.zone.alloc(GFP_KERNEL | __GFP_ZERO, 0, "driver page")
    add_mmap_device(m, "/dev/shared", lambda f, vma: remap_pfn_range(
        vma, vma.vm_start, kpage.pfn, ps, vma.vm_page_prot))
    fd = p.open("/dev/shared")
    a = p.mmap(0, ps, RW, MAP_SHARED, fd)
    p.store(a + 8, b"from user")
    assert bytes(m.mem.ram[kpage.pfn * ps + 8:kpage.pfn * ps + 17]) == b"from user"
    assert (kpage._refcount, kpage._mapcount) == (1, 0)
    p.exit()
    assert (kpage._refcount, kpage._mapcount) == (1, 0)
    put_page(kpage)


def test_remap_over_a_present_pte_is_ebusy_and_undoes_itself(p, m):
    ps = m.page_size
    pfn = m.alloc_mmio_window(1 << 20) >> m.page_shift
    # the driver maps only the second page of a two-page VMA
    vmas = add_mmap_device(m, "/dev/bar", lambda f, vma: remap_pfn_range(
        vma, vma.vm_start + ps, pfn + 1, ps, vma.vm_page_prot))
    fd = p.open("/dev/bar")
    a = p.mmap(0, 2 * ps, RW, MAP_SHARED, fd)
    second = p.mm.pgtable.get(a + ps)
    with p.kernel(), pytest.raises(KernelError) as ei:
        remap_pfn_range(vmas[0], a, pfn, 2 * ps, vmas[0].vm_page_prot)
    assert ei.value.errno == EBUSY and ei.value.function == "remap_pfn_range"
    assert m.bugs == [f"WARNING: remap_pte_range: PTE at {a + ps:#x} already present"]
    m.bugs.clear()
    assert p.mm.pgtable.get(a) == 0  # the page this call mapped was taken back
    assert p.mm.pgtable.get(a + ps) == second  # the driver's own mapping is untouched
    assert p.close(fd) == 0


@pytest.mark.parametrize("off, size", [(1, 4096), (0, 100), (0, 0), (4096, 8192)])
def test_remap_pfn_range_einval(p, m, off, size):
    errors = []

    def mmap(f, vma):
        try:
            remap_pfn_range(vma, vma.vm_start + off, 1, size, vma.vm_page_prot)
        except KernelError as e:
            errors.append(e.errno)
            raise

    add_mmap_device(m, "/dev/bar", mmap)
    fd = p.open("/dev/bar")
    assert p.mmap(0, 2 * m.page_size, RW, MAP_SHARED, fd) == -EINVAL
    assert errors == [EINVAL]
    assert p.close(fd) == 0


def test_zap_vma_ptes(p, m):
    ps = m.page_size
    pfn = m.alloc_mmio_window(1 << 20) >> m.page_shift
    vmas = add_mmap_device(m, "/dev/bar", lambda f, vma: remap_pfn_range(
        vma, vma.vm_start, pfn, 2 * ps, vma.vm_page_prot))
    fd = p.open("/dev/bar")
    a = p.mmap(0, 2 * ps, RW, MAP_SHARED, fd)
    with p.kernel():
        zap_vma_ptes(vmas[0], a + ps, ps)
        assert p.mm.pgtable.get(a) != 0 and p.mm.pgtable.get(a + ps) == 0
        with pytest.raises(KernelError) as ei:
            zap_vma_ptes(vmas[0], a, 3 * ps)
        assert ei.value.errno == EINVAL
        anon = p.mm.vma_lookup(p.mmap(0, ps))
        with pytest.raises(KernelError):
            zap_vma_ptes(anon, anon.vm_start, ps)
    # the zapped page of a VM_PFNMAP vma without ->fault is SIGBUS (a SIGSEGV here)
    with pytest.raises(SegmentationFault):
        p.load(a + ps, 1)
    assert p.close(fd) == 0


def test_driver_fault_handler_is_asked(p, m):
    ps = m.page_size
    faults = []

    def fault(vmf):
        faults.append((vmf.address, vmf.pgoff, vmf.flags))
        return VM_FAULT_SIGBUS

    def mmap(f, vma):
        vma.vm_ops = vm_operations_struct(fault=fault)

    add_mmap_device(m, "/dev/faulty", mmap)
    fd = p.open("/dev/faulty")
    a = p.mmap(0, 4 * ps, RW, MAP_SHARED, fd, 2 * ps)
    with pytest.raises(SegmentationFault):
        p.load(a + ps + 5, 1)
    assert faults == [(a + ps, 3, 0)]
    assert p.close(fd) == 0


def test_access_vm_returns_bytes_done_before_a_hole(p, m):
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    p.munmap(a + ps, ps)
    pieces = []
    with p.kernel():
        done = access_vm(p.mm, a + ps - 10, 30, False,
                         lambda phys, off, n: pieces.append((off, n)))
    assert done == 10 and pieces == [(0, 10)]


def test_access_vm_force_writes_a_read_only_private_page(p, m):
    a = p.mmap(0, m.page_size, PROT_READ)
    p.load(a, 1)
    with p.kernel():
        chunk = lambda phys, off, n: m.phys_write(phys, b"forced"[off:off + n])  # noqa: E731
        assert access_vm(p.mm, a, 6, True, chunk) == 0
        assert access_vm(p.mm, a, 6, True, chunk, force=True) == 6
    assert p.load(a, 6) == b"forced"
    pte = p.mm.pgtable.get(a)
    assert pte & _PAGE_DIRTY and not pte & _PAGE_RW  # written, still read-only
    with pytest.raises(SegmentationFault):
        p.store(a, b"x")


def _hog(m: Machine) -> list:
    hog = []
    try:
        while True:
            hog.append(m.zone.alloc(GFP_KERNEL, 0, "hog"))
    except KernelError as e:
        assert e.errno == ENOMEM
    return hog


def test_out_of_memory_faults_fail_without_leaking(p, m):
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    b = p.mmap(1 << 40, ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)
    p.load(a, 1)  # a's page tables exist; b needs new ones
    hog = _hog(m)
    with pytest.raises(SegmentationFault):
        p.load(a + ps, 1)  # do_anonymous_page: no page
    with pytest.raises(SegmentationFault):
        p.load(b, 1)       # pte_alloc: no page-table page
    assert p.mm.pgtable.get(a + ps) == 0
    for pg in hog:
        put_page(pg)
    assert p.load(a + ps, 1) == b"\x00" and p.load(b, 1) == b"\x00"

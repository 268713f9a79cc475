"""Differential tests: every C loop in c_ext/pm.c against its Python twin.

The machine-level tests build two identical machines, one per backend, drive
both through the same random history - fragment physical memory, lay out
VMAs with holes and read-only or MMIO parts, fault pages in in a random order,
pin and unpin random ranges - and demand the same return values, PFN arrays
and struct page counters after every step.  The other tests feed the loops
random raw inputs (corrupt page tables, arbitrary pin states, scatterlists)
inside the domain their callers guarantee.
"""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import c_ext
from c_ext import U64Array, UnpinUnderflow
from kernel_model.current import running
from kernel_model.emu.machine import Machine
from kernel_model.emu.process import SegmentationFault
from kernel_model.errno import KernelError
from kernel_model.fs import cdev, cdev_add, file_operations
from kernel_model.gup import (
    FOLL_FORCE,
    FOLL_LONGTERM,
    FOLL_WRITE,
    pin_user_pages_fast,
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
from kernel_model.page_alloc import GFP_KERNEL, put_page
from kernel_model.pgtable import (
    _PAGE_DIRTY,
    _PAGE_PRESENT,
    _PAGE_RW,
    _PAGE_SPECIAL,
    _PAGE_USER,
    pte_addr,
)

RAM = 32 << 20
BACKENDS = ("c", "python")
LAYOUT_BASE = 0x7000_0000_0000  # aligned to every page-table span
PTE_BITS = (_PAGE_PRESENT, _PAGE_RW, _PAGE_USER, _PAGE_DIRTY, _PAGE_SPECIAL)
TWIN = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

pytestmark = pytest.mark.skipif(c_ext.lib is None, reason="c_ext._pm is not built")


def flag_sets(bits: tuple[int, ...]) -> st.SearchStrategy[int]:
    return st.lists(st.sampled_from(bits), unique=True).map(sum)


def assert_same_pages(mc: Machine, mp: Machine, step: str) -> None:
    """Both machines' mem_maps (flags, refcount, pincount, mapcount) are byte-equal."""
    if mc.mem.pages != mp.mem.pages:
        diff = [pfn for pfn in range(mc.nr_pages)
                if mc.mem.pages[pfn * 4:pfn * 4 + 4] != mp.mem.pages[pfn * 4:pfn * 4 + 4]]
        raise AssertionError(f"{step}: mem_maps differ at pfns {diff[:10]}")


def finish(machines: list[Machine]) -> None:
    """The per-example leak check (the suite's fixture runs only once per test)."""
    for m in machines:
        m.check_leaks()
        m.leak_check_expected = False


# -- whole machines: fragmentation, VMA layouts, touches, pins, unpins, scans ------------
REGION_KINDS = ("rw", "rw", "rw", "rw", "ro", "ro", "none", "shared_ro", "io")
PIN_FLAGS = (0, FOLL_WRITE, FOLL_WRITE | FOLL_LONGTERM, FOLL_WRITE | FOLL_FORCE, FOLL_FORCE)


@st.composite
def histories(draw):
    page_size = draw(st.sampled_from([4096, 4096, 65536]))
    nfrag = draw(st.integers(0, 200 if page_size == 4096 else 20))
    pattern = draw(st.sampled_from(["alternate", "random", "none"]))
    if pattern == "alternate":
        free_mask = [i % 2 == 1 for i in range(nfrag)]
    elif pattern == "random":
        free_mask = draw(st.lists(st.booleans(), min_size=nfrag, max_size=nfrag))
    else:
        free_mask = [False] * nfrag
    regions = draw(st.lists(st.tuples(st.integers(1, 10), st.sampled_from(REGION_KINDS),
                                      st.sampled_from([0, 0, 0, 1, 3])), min_size=1, max_size=5))
    total = sum(n + gap for n, _, gap in regions)
    # start a few pages below a PTE-table boundary so walks cross tables
    lead = draw(st.integers(0, min(total, 12)))
    # a random fault order scatters the pages physically; some are left for gup to fault
    touches = draw(st.lists(st.tuples(st.integers(0, total - 1), st.booleans()),
                            min_size=total // 2, max_size=2 * total))
    pins = draw(st.lists(st.tuples(st.integers(-2, total - 1), st.integers(0, total + 2),
                                   st.sampled_from(PIN_FLAGS)), min_size=1, max_size=8))
    unpin_modes = draw(st.lists(st.sampled_from(["pages", "dirty", "ranges", "keep"]),
                                min_size=len(pins), max_size=len(pins)))
    scans = draw(st.lists(st.tuples(st.integers(0, RAM // page_size), st.integers(1, 40)),
                          max_size=4))
    return dict(page_size=page_size, free_mask=free_mask, regions=regions, lead=lead,
                touches=touches, pins=pins, unpin_modes=unpin_modes, scans=scans)


class Host:
    """One machine of the pair and the history's state on it."""

    def __init__(self, backend: str, h: dict):
        self.m = m = Machine(ram_size=RAM, page_size=h["page_size"], backend=backend)
        ps = m.page_size
        self.frag = [m.zone.alloc(GFP_KERNEL, 0, "frag") for _ in h["free_mask"]]
        for pg, free in zip(self.frag, h["free_mask"], strict=True):
            if free:
                put_page(pg)
        self.frag = [pg for pg, free in zip(self.frag, h["free_mask"], strict=True)
                     if not free]
        bar = m.alloc_mmio_window(1 << 20)

        def bar_mmap(f, vma):
            remap_pfn_range(vma, vma.vm_start, bar >> m.page_shift,
                            vma.vm_end - vma.vm_start, vma.vm_page_prot)

        with running(m.init_task):
            cdev_add(cdev(file_operations(mmap=bar_mmap)), "/dev/bar")
        self.p = p = m.spawn("twin")
        fd = p.open("/dev/bar")
        span = ps << (m.page_shift - 3)
        self.base = LAYOUT_BASE + span - h["lead"] * ps
        addr = self.base
        self.io: set[int] = set()
        for npages, kind, gap in h["regions"]:
            length = npages * ps
            if kind == "io":
                r = p.mmap(addr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd)
            else:
                prot = {"rw": PROT_READ | PROT_WRITE, "ro": PROT_READ, "none": PROT_NONE,
                        "shared_ro": PROT_READ}[kind]
                share = MAP_SHARED if kind == "shared_ro" else MAP_PRIVATE
                r = p.mmap(addr, length, prot, share | MAP_ANONYMOUS | MAP_FIXED)
            assert r == addr
            if kind == "io":
                first = (addr - self.base) // ps
                self.io.update(range(first, first + npages))
            addr += length + gap * ps
        assert p.close(fd) == 0
        self.pinned: list[tuple[U64Array, int]] = []

    def va(self, idx: int) -> int:
        return self.base + idx * self.m.page_size

    def touch(self, idx: int, write: bool) -> str:
        if idx in self.io:
            return "bar"  # nothing decodes the BAR: an access would be a MachineCheck
        try:
            if write:
                self.p.store(self.va(idx) + 8, b"w")
            else:
                self.p.load(self.va(idx), 1)
            return "ok"
        except SegmentationFault:
            return "segv"

    def pin(self, idx: int, nr: int, flags: int) -> tuple[int, list[int]]:
        pfns = U64Array(max(nr, 1))
        with self.p.kernel():
            try:
                n = pin_user_pages_fast(self.va(idx), nr, flags, pfns)
            except KernelError as e:
                return -e.errno, []
        if n > 0:
            self.pinned.append((pfns, n))
        return n, pfns[:n]

    def unpin(self, i: int, mode: str) -> None:
        pfns, n = self.pinned[i]
        with running(self.m.init_task):
            if mode == "pages":
                unpin_user_pages(pfns, n)
            elif mode == "dirty":
                unpin_user_pages_dirty_lock(pfns, n, True)
            else:  # "ranges": physically consecutive runs, as ib_umem_release passes them
                runs: list[list[int]] = []
                for pfn in pfns[:n]:
                    if runs and runs[-1][0] + runs[-1][1] == pfn:
                        runs[-1][1] += 1
                    else:
                        runs.append([pfn, 1])
                firsts, counts = U64Array(len(runs)), U64Array(len(runs))
                for k, (first, count) in enumerate(runs):
                    firsts[k], counts[k] = first, count
                unpin_user_page_range_dirty_lock(firsts, counts, len(runs), False)
        self.pinned[i] = (pfns, 0)

    def scan(self, start: int, cap: int) -> list[int]:
        out = U64Array(cap)
        k = self.m.ops.scan_pages(self.m.mem, start, out)
        return out[:k]

    def scan_all(self, cap: int) -> list[int]:
        found, start = [], 0
        while True:
            chunk = self.scan(start, cap)
            found += chunk
            if len(chunk) < cap:
                return found
            start = chunk[-1] + 1

    def teardown(self) -> None:
        self.p.exit()
        with running(self.m.init_task):
            for pfns, n in self.pinned:
                if n:
                    unpin_user_pages(pfns, n)
        for pg in self.frag:
            put_page(pg)


@TWIN
@given(h=histories())
def test_machines_agree_through_a_random_history(h):
    hosts = [Host(b, h) for b in BACKENDS]
    c, py = hosts
    mc, mp = c.m, py.m
    assert_same_pages(mc, mp, "after layout")
    for idx, write in h["touches"]:
        assert c.touch(idx, write) == py.touch(idx, write), (idx, write)
    assert_same_pages(mc, mp, "after touches")
    assert mc.mem.ram == mp.mem.ram  # page tables and data, word for word
    for idx, nr, flags in h["pins"]:
        rc, rp = c.pin(idx, nr, flags), py.pin(idx, nr, flags)
        assert rc == rp, (idx, nr, flags)
        assert_same_pages(mc, mp, f"after pin {idx} {nr} {flags:#x}")
    # scan_pages, in random windows and paged through with a small buffer
    for start, cap in h["scans"]:
        assert c.scan(start, cap) == py.scan(start, cap)
    every = c.scan_all(37)
    pages = mc.mem.pages
    assert every == [pfn for pfn in range(mc.nr_pages)
                     if pages[pfn * 4 + 1] or pages[pfn * 4 + 2] or pages[pfn * 4 + 3]]
    assert py.scan_all(4096) == every
    for i, mode in enumerate(h["unpin_modes"][:len(c.pinned)]):
        if mode != "keep":
            c.unpin(i, mode)
            py.unpin(i, mode)
            assert_same_pages(mc, mp, f"after unpin {i} {mode}")
    for host in hosts:
        host.teardown()  # exit with pins held; the last unpins free the pages
    assert_same_pages(mc, mp, "after teardown")
    assert [sorted(a) for a in mc.zone.free_area] == [sorted(a) for a in mp.zone.free_area]
    assert mc.vmstat == mp.vmstat
    finish([mc, mp])


# -- gup_fast on corrupt page tables ---------------------------------------------------
@st.composite
def corruptions(draw):
    page_size = draw(st.sampled_from([4096, 65536]))
    nr_pages = RAM // page_size
    targets = st.sampled_from(["pte", "pte", "pte", "table"])
    pfn_kinds = st.sampled_from(["data", "free", "zero", "end", "beyond", "huge"])
    edits = draw(st.lists(st.tuples(targets, st.integers(0, 7), st.integers(1, 2), pfn_kinds,
                                    st.integers(0, 7), flag_sets(PTE_BITS),
                                    st.integers(0, (1 << 12) - 1), st.integers(0, 4095)),
                          max_size=6))
    words = draw(st.lists(st.integers(0, (1 << 64) - 1), min_size=8, max_size=8))
    calls = draw(st.lists(st.tuples(st.integers(-2, 9), st.integers(0, 12),
                                    flag_sets(PTE_BITS), flag_sets(PTE_BITS),
                                    st.integers(0, 3)), min_size=1, max_size=4))
    return dict(page_size=page_size, nr_pages=nr_pages, edits=edits, words=words,
                calls=calls)


def _slot_of(m: Machine, pgd: int, va: int, level: int) -> int:
    """Physical address of va's entry at `level` (0 = the PTE)."""
    bits = m.page_shift - 3
    table = pgd
    for lv in range(m.levels - 1, level, -1):
        e = m.mem.ram_q[(table >> 3) + ((va >> (m.page_shift + lv * bits)) & ((1 << bits) - 1))]
        table = e & 0x000FFFFFFFFFF000
    return table + 8 * ((va >> (m.page_shift + level * bits)) & ((1 << bits) - 1))


@TWIN
@given(k=corruptions())
def test_gup_fast_agrees_on_corrupt_page_tables(k):
    machines, procs, data_pfns = [], [], []
    for b in BACKENDS:
        m = Machine(ram_size=RAM, page_size=k["page_size"], backend=b)
        p = m.spawn("corrupt")
        ps = m.page_size
        base = LAYOUT_BASE + (ps << (m.page_shift - 3)) - 4 * ps  # 4 pages below a table edge
        assert p.mmap(base, 8 * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == base
        garbage = b"".join(w.to_bytes(8, "little") for w in k["words"]) * (ps // 64)
        for i in range(8):  # data pages full of random words: garbage tables to point at
            p.store(base + i * ps, garbage)
        machines.append(m)
        procs.append(p)
        data_pfns.append([(p.mm.pgtable.get(base + i * ps) & 0x000FFFFFFFFFF000) >> m.page_shift
                          for i in range(8)])
    assert data_pfns[0] == data_pfns[1]
    mc, mp = machines
    ps, nr_pages, pfns_of_data = mc.page_size, k["nr_pages"], data_pfns[0]
    va0 = LAYOUT_BASE + (ps << (mc.page_shift - 3)) - 4 * ps
    # where each edit lands, from the pristine tables (both machines' are identical)
    slots = [_slot_of(mc, procs[0].mm.pgd, va0 + page_idx * ps, 0 if t == "pte" else level)
             for t, page_idx, level, *_ in k["edits"]]
    saved = [(slot, mc.mem.ram_q[slot >> 3]) for slot in slots]  # restored in reverse
    for slot, (target, _, _, kind, which, bits, low, high) in zip(slots, k["edits"],
                                                                   strict=True):
        pfn = {"data": pfns_of_data[which], "free": nr_pages - 1 - which, "zero": 0,
               "end": nr_pages, "beyond": nr_pages + which, "huge": (1 << 40) - 1}[kind]
        if target == "pte":
            word = (pfn << mc.page_shift) | bits | (low << 3 & 0xFF8) | (high << 52)
        else:  # point an upper-level entry somewhere odd, even unaligned near RAM's end
            addr = (pfn << mc.page_shift) if kind != "end" else mc.ram_size - 4096
            word = addr | bits | _PAGE_PRESENT
        for m in machines:
            m.mem.ram_q[slot >> 3] = word
    for start, nr, need, deny, off in k["calls"]:
        results = []
        for m, p in zip(machines, procs, strict=True):
            pfns = U64Array(nr + off)
            n = m.ops.gup_fast(m.mem, p.mm.pgd, va0 + start * ps, nr, need, deny, pfns, off)
            results.append((n, pfns.tolist()))
        assert results[0] == results[1], (start, nr, need, deny, off)
        assert_same_pages(mc, mp, "after gup_fast")
        n, got = results[0]
        for m in machines:  # give the pins back so both machines can be torn down
            pinned, freed = U64Array(n), U64Array(n)
            for i in range(n):
                pinned[i] = got[off + i]
            assert m.ops.unpin(m.mem, pinned, None, n, False, freed) == 0
        assert_same_pages(mc, mp, "after unpin")
    for slot, old in reversed(saved):
        for m in machines:
            m.mem.ram_q[slot >> 3] = old
    finish(machines)


# -- unpin on arbitrary pin states -----------------------------------------------------
@TWIN
@given(state=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), min_size=1, max_size=24),
       entries=st.lists(st.tuples(st.integers(-1, 26), st.integers(0, 3)), min_size=1,
                        max_size=10),
       ranged=st.booleans(), dirty=st.booleans(), short=st.one_of(st.none(), st.integers(0, 4095)))
def test_unpin_agrees_including_underflow(state, entries, ranged, dirty, short):
    """state: (base reference, pins) per page; entries: (page index, count) to unpin;
    short not None: the counts go as byte lengths that many bytes short of whole
    pages (len_shift: the unpin rounds each up, as __ib_umem_release's entries)."""
    machines, results = [], []
    for b in BACKENDS:
        m = Machine(ram_size=RAM, backend=b)
        pages = [m.zone.alloc(GFP_KERNEL, 0, "pinned") for _ in state]
        for pg, (ref, pins) in zip(pages, state, strict=True):
            pg._refcount, pg._pincount = ref + pins, pins
        n = len(entries)
        pfns, counts = U64Array(n), U64Array(n)
        for i, (idx, cnt) in enumerate(entries):
            # -1: a free page; past the list: pages after them (free) or past RAM
            pfns[i] = (pages[idx].pfn if 0 <= idx < len(pages)
                       else m.nr_pages - 1 if idx < 0 else pages[-1].pfn + idx)
            counts[i] = cnt if short is None else max(0, (cnt << m.page_shift) - short)
        shift = -1 if short is None else m.page_shift
        if short is not None:
            assert m.ops.count_pages(counts, n, shift) == sum(c for _, c in entries)
        freed = U64Array(sum(c for _, c in entries) if ranged else n)
        try:
            r = m.ops.unpin(m.mem, pfns, counts if ranged else None, n, dirty, freed, shift)
            results.append(("ok", r, freed[:r]))
        except UnpinUnderflow as e:
            results.append(("underflow", e.pfn))
        machines.append((m, pages))
    assert results[0] == results[1]
    assert_same_pages(machines[0][0], machines[1][0], "after unpin")
    for _, pages in machines:  # back to one plain reference each, then free
        for pg in pages:
            pg._refcount, pg._pincount = 1, 0
            put_page(pg)
    finish([m for m, _ in machines])


def test_unpin_range_past_ram_is_an_underflow():
    for b in BACKENDS:
        m = Machine(ram_size=RAM, backend=b)
        pfns, counts, freed = U64Array(1), U64Array(1), U64Array(2)
        pfns[0], counts[0] = m.nr_pages - 1, 2
        with pytest.raises(UnpinUnderflow) as ei:
            m.ops.unpin(m.mem, pfns, counts, 1, False, freed)
        assert ei.value.pfn == m.nr_pages - 1  # a free page: no pin
        finish([m])


# -- scatterlist and DMA loops: pure functions ------------------------------------------
@st.composite
def page_runs(draw, max_pages: int = 40) -> list[int]:
    runs = draw(st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(1, 8)), min_size=1,
                         max_size=8))
    pfns = [start + i for start, n in runs for i in range(n)]
    return pfns[:max_pages]


def _arr(values: list[int], n: int | None = None) -> U64Array:
    a = U64Array(len(values) if n is None else n)
    for i, v in enumerate(values):
        a[i] = v
    return a


@TWIN
@given(shift=st.sampled_from([12, 16]), first=page_runs(), second=page_runs(),
       offset_frac=st.floats(0, 1, exclude_max=True), trim=st.integers(0, 1 << 17),
       max_pages=st.sampled_from([1, 2, 3, 16, 1 << 20]), second_batch=st.booleans())
def test_sg_append_agrees(shift, first, second, offset_frac, trim, max_pages, second_batch):
    ps = 1 << shift
    offset = int(offset_frac * ps)
    size = max(1, len(first) * ps - offset - trim)
    max_seg = max_pages * ps
    out = []
    for b in BACKENDS:
        ops = c_ext.backend(b)
        cap = len(first) + len(second)
        sg_pfn, sg_off, sg_len = U64Array(cap), U64Array(cap), U64Array(cap)
        n = ops.sg_append(shift, _arr(first), 0, len(first), offset, size, max_seg,
                          sg_pfn, sg_off, sg_len, 0)
        if second_batch:  # an append batch: may extend the last entry
            n = ops.sg_append(shift, _arr(second), 0, len(second), 0, len(second) * ps,
                              max_seg, sg_pfn, sg_off, sg_len, n)
        out.append((n, sg_pfn[:n], sg_off[:n], sg_len[:n]))
    assert out[0] == out[1]


@st.composite
def sg_entries(draw, shift: int):
    ps = 1 << shift
    n = draw(st.integers(1, 12))
    pfn = draw(st.lists(st.integers(0, 1 << 30), min_size=n, max_size=n))
    # mostly page-aligned, whole-page entries (what pinned user pages give), so that
    # neighbours merge; some ragged ones
    off = draw(st.lists(st.just(0) | st.integers(0, ps - 1), min_size=n, max_size=n))
    length = draw(st.lists(st.integers(1, 8).map(lambda k: k * ps) | st.integers(1, 4 * ps),
                           min_size=n, max_size=n))
    return pfn, off, length


@TWIN
@given(data=st.data(), shift=st.sampled_from([12, 16]),
       mask_bits=st.sampled_from([32, 36, 40, 64]))
def test_dma_map_direct_agrees(data, shift, mask_bits):
    pfn, off, length = data.draw(sg_entries(shift))
    n = len(pfn)
    out = []
    for b in BACKENDS:
        addr, dlen = U64Array(n), U64Array(n)
        r = c_ext.backend(b).dma_map_direct(shift, _arr(pfn), _arr(off), _arr(length), n,
                                            (1 << mask_bits) - 1, addr, dlen)
        out.append((r, addr.tolist(), dlen.tolist()))
    assert out[0] == out[1]


@TWIN
@given(data=st.data(), shift=st.sampled_from([12, 16]), granule=st.sampled_from([12, 16]),
       iova_pages=st.integers(0, 1 << 24), max_seg=st.sampled_from([1 << 16, 1 << 20,
                                                                    (1 << 32) - 1]))
def test_dma_map_iova_agrees(data, shift, granule, iova_pages, max_seg):
    pfn, off, length = data.draw(sg_entries(shift))
    n = len(pfn)
    out = []
    for b in BACKENDS:
        seg, addr, dlen = U64Array(n), U64Array(n), U64Array(n)
        count = c_ext.backend(b).dma_map_iova(shift, granule, _arr(pfn), _arr(off),
                                              _arr(length), n, iova_pages << granule,
                                              max_seg, seg, addr, dlen)
        out.append((count, seg.tolist(), addr[:count], dlen[:count]))
    assert out[0] == out[1]


def test_dma_map_iova_entry_longer_than_max_seg():
    """Regression: the twin once compared a negative (max_seg - cur_len) where C wraps."""
    out = []
    for b in BACKENDS:
        seg, addr, dlen = U64Array(2), U64Array(2), U64Array(2)
        count = c_ext.backend(b).dma_map_iova(12, 12, _arr([10, 100]), _arr([0, 0]),
                                              _arr([3 << 12, 1 << 12]), 2, 1 << 20, 2 << 12,
                                              seg, addr, dlen)
        out.append((count, seg.tolist(), addr[:count], dlen[:count]))
    assert out[0] == out[1] == (1, [1 << 20, (1 << 20) + (3 << 12)], [1 << 20], [4 << 12])


@pytest.mark.parametrize("page_size", [4096, 65536])
def test_walk_ignores_sub_page_bits_of_a_table_address(page_size):
    """Regression: an upper entry pointing inside RAM's last page, not page aligned,
    once made C read past the end of RAM (and the twin raise IndexError)."""
    results = []
    for b in BACKENDS:
        m = Machine(ram_size=RAM, page_size=page_size, backend=b)
        p = m.spawn()
        ps = m.page_size
        va = LAYOUT_BASE + (ps << (m.page_shift - 3)) - ps  # the last PTE of its table
        p.mmap(va, ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)
        p.store(va, b"x")
        slot = _slot_of(m, p.mm.pgd, va, 1)
        old = m.mem.ram_q[slot >> 3]
        m.mem.ram_q[slot >> 3] = (m.ram_size - 4096) | _PAGE_PRESENT
        pfns = U64Array(1)
        results.append(m.ops.gup_fast(m.mem, p.mm.pgd, va, 1, _PAGE_PRESENT, 0, pfns, 0))
        m.mem.ram_q[slot >> 3] = old
        finish([m])
    # 4 KiB: the last RAM page is a table of zero PTEs; 64 KiB: the address rounds
    # down to the last page, zero too
    assert results == [0, 0]


# -- the wrapper checks what C would trust --------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_wrapper_refuses_what_would_overflow_c(backend):
    m = Machine(ram_size=RAM, backend=backend)
    ops = m.ops
    with pytest.raises(ValueError, match="overflow"):
        ops.gup_fast(m.mem, 0, 0, 4, 0, 0, U64Array(3), 0)
    with pytest.raises(ValueError, match="overflow"):
        ops.gup_fast(m.mem, 0, 0, 2, 0, 0, U64Array(3), 2)
    with pytest.raises(TypeError):
        ops.gup_fast(m.mem, 0, 0, 1, 0, 0, [0], 0)
    counts = _arr([3])
    with pytest.raises(ValueError, match="freed"):
        ops.unpin(m.mem, _arr([1]), counts, 1, False, U64Array(2))
    with pytest.raises(ValueError, match="freed"):          # 3 pages of 4 KiB: 3 freed
        ops.unpin(m.mem, _arr([1]), _arr([2 * 4096 + 1]), 1, False, U64Array(2), 12)
    with pytest.raises(ValueError, match="page shift"):
        ops.unpin(m.mem, _arr([1]), counts, 1, False, U64Array(3), 64)
    with pytest.raises(ValueError, match="page shift"):
        ops.count_pages(counts, 1, -1)
    with pytest.raises(ValueError, match="overflow"):
        ops.count_pages(counts, 2, 12)
    with pytest.raises(ValueError, match="max_seg below one page"):
        ops.sg_append(12, _arr([1]), 0, 1, 0, 4096, 100, U64Array(1), U64Array(1),
                      U64Array(1), 0)
    with pytest.raises(ValueError):
        c_ext.backend("fortran")
    arr = U64Array(2)
    with pytest.raises(IndexError):
        arr[2] = 1
    with pytest.raises(IndexError):
        arr[-3]
    arr[-1] = 7
    assert arr[1] == 7 and arr[:] == [0, 7] and len(arr) == 2
    finish([m])


# -- DMA blocks for an MTT/PAS (iter.c's walk, fused with the store) ---------------------
U64 = (1 << 64) - 1


@st.composite
def dma_tables(draw):
    n = draw(st.integers(0, 8))
    # mostly page-sized segments, some ragged or empty, some addresses near the top of u64
    addr = st.integers(0, 1 << 40).map(lambda a: a << 12) | st.integers(0, U64)
    length = st.integers(0, 16).map(lambda k: k << 12) | st.integers(0, 1 << 20)
    return draw(st.lists(addr, min_size=n, max_size=n)), draw(st.lists(length, min_size=n,
                                                                       max_size=n))


@TWIN
@given(table=dma_tables(), advance=st.integers(0, 1 << 16) | st.integers(0, U64),
       pg_bit=st.integers(0, 63), nblocks=st.integers(0, 64), or_flags=st.integers(0, U64),
       big_endian=st.booleans())
def test_dma_blocks_agrees(table, advance, pg_bit, nblocks, or_flags, big_endian):
    addrs, lens = table
    n = len(addrs)
    out = []
    for b in BACKENDS:
        blocks = U64Array(nblocks + 2)
        r = c_ext.backend(b).dma_blocks(_arr(addrs, max(n, 1)), _arr(lens, max(n, 1)), n,
                                        advance, 1 << pg_bit, nblocks, blocks, or_flags,
                                        big_endian)
        out.append((r, blocks.tolist()))
    assert out[0] == out[1]
    assert out[0][0] <= nblocks and out[0][1][nblocks:] == [0, 0]


@pytest.mark.parametrize("big_endian", [False, True])
def test_dma_blocks_known_answer(big_endian):
    """One segment of 2.5 pages from 0x1800, 4 KiB blocks, OR-ed flags."""
    want = [0x1005, 0x2005, 0x3005]
    if big_endian:
        want = [int.from_bytes(v.to_bytes(8, "big"), sys.byteorder) for v in want]
    for b in BACKENDS:
        out = U64Array(4)
        assert c_ext.backend(b).dma_blocks(_arr([0x1000]), _arr([0x2800]), 1, 0x800, 4096, 4,
                                           out, 5, big_endian) == 3
        assert out.tolist() == want + [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dma_blocks_wrapper_validates(backend):
    ops = c_ext.backend(backend)
    one = _arr([0x1000])
    with pytest.raises(ValueError, match="overflow"):
        ops.dma_blocks(one, one, 2, 0, 4096, 1, U64Array(1))
    with pytest.raises(ValueError, match="out"):
        ops.dma_blocks(one, one, 1, 0, 4096, 2, U64Array(1))
    for pgsz in (0, 3, 1 << 64, -4096):
        with pytest.raises(ValueError, match="power of two"):
            ops.dma_blocks(one, one, 1, 0, pgsz, 1, U64Array(1))
    with pytest.raises(ValueError, match="u64"):
        ops.dma_blocks(one, one, 1, -1, 4096, 1, U64Array(1))
    with pytest.raises(ValueError, match="u64"):
        ops.dma_blocks(one, one, 1, 0, 4096, 1, U64Array(1), 1 << 64)
    with pytest.raises(TypeError):
        ops.dma_blocks([0x1000], one, 1, 0, 4096, 1, U64Array(1))


@given(table=dma_tables(), va=st.integers(0, U64), pgoff=st.integers(0, 1 << 16))
def test_pgsz_mask_agrees(table, va, pgoff):
    addrs, lens = table
    n = len(addrs)
    got = {c_ext.backend(b).pgsz_mask(_arr(addrs, max(n, 1)), _arr(lens, max(n, 1)), n, va,
                                      pgoff) for b in BACKENDS}
    assert len(got) == 1


def test_pgsz_mask_known_answer():
    """Two runs: [0x200000, +0x200000) and [0x600000, +0x1000) at va 0x7f0000200000.
    The first run's DMA and VA agree below bit 21; the second starts a new run,
    so va of that run (0x7f0000400000) joins the mask: nothing below 4 MiB agrees
    with a 4 MiB page, 2 MiB still does."""
    for b in BACKENDS:
        mask = c_ext.backend(b).pgsz_mask(_arr([0x200000, 0x600000]), _arr([0x200000, 0x1000]),
                                          2, 0x7F0000200000, 0)
        assert mask == (0x200000 ^ 0x7F0000200000) | (0x600000 ^ 0x7F0000400000) | \
            0x7F0000400000
        assert (mask & -mask) == 1 << 21


@pytest.mark.parametrize("backend", BACKENDS)
def test_pgsz_mask_wrapper_validates(backend):
    ops = c_ext.backend(backend)
    one = _arr([0x1000])
    with pytest.raises(ValueError, match="overflow"):
        ops.pgsz_mask(one, one, 2, 0, 0)
    with pytest.raises(ValueError, match="u64"):
        ops.pgsz_mask(one, one, 1, -1, 0)


# -- the step from one set entry of a sparse per-page table to the next ------------------

@given(entries=st.lists(st.sampled_from([0, 0, 0, 1, 1 << 63, (1 << 64) - 1]), max_size=40),
       data=st.data())
def test_next_set_agrees(entries, data):
    """Both backends find the first non-zero entry at or after `start` and before
    `stop`, or answer `stop`."""
    stop = data.draw(st.integers(0, len(entries)))
    start = data.draw(st.integers(0, stop))
    a = _arr(entries, max(len(entries), 1))
    got = [c_ext.backend(b).next_set(a, start, stop) for b in BACKENDS]
    want = next((i for i in range(start, stop) if entries[i]), stop)
    assert got[0] == got[1] == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_next_set_wrapper_validates(backend):
    ops = c_ext.backend(backend)
    a = _arr([0, 5, 0])
    assert [ops.next_set(a, i, 3) for i in range(4)] == [1, 1, 3, 3]
    with pytest.raises(ValueError, match="overflow"):
        ops.next_set(a, 0, 4)
    with pytest.raises(ValueError, match="bad range"):
        ops.next_set(a, 2, 1)


# -- an implicit ODP parent's KSM entries on one key (populate_klm) ----------------------

@given(first=st.integers(0, (1 << 64) - 1), n=st.integers(0, 12),
       size=st.integers(0, (1 << 32) - 1), key=st.integers(0, (1 << 32) - 1),
       shift=st.integers(0, 63))
def test_ksm_fill_agrees(first, n, size, key, shift):
    """Both backends write the big-endian struct mlx5_ksm of each slice - size, key,
    (first + i) << shift modulo 2^64 - and nothing after the n entries."""
    outs = []
    for b in BACKENDS:
        out = _arr([7] * (2 * n + 2))
        c_ext.backend(b).ksm_fill(out, first, n, size, key, shift)
        outs.append(bytes(out.view[: 2 * n + 2].cast("B")))
    want = b"".join(struct.pack(">IIQ", size, key, ((first + i) << shift) % (1 << 64))
                    for i in range(n)) + bytes(_arr([7, 7]).view.cast("B"))
    assert outs[0] == outs[1] == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_ksm_fill_wrapper_validates(backend):
    ops = c_ext.backend(backend)
    with pytest.raises(ValueError, match="overflow"):
        ops.ksm_fill(_arr([0, 0, 0]), 0, 2, 1, 1, 30)
    with pytest.raises(ValueError, match="u32"):
        ops.ksm_fill(_arr([0, 0]), 0, 1, 1 << 32, 1, 30)


# -- the firmware's present-bit check of an MTT (page-fault-enabled mkeys) ----------------

def _be(x: int) -> int:
    """An MTT entry as stored: x's bytes most significant first, read as a native u64."""
    return int.from_bytes(x.to_bytes(8, "big"), sys.byteorder)


@given(entries=st.lists(st.integers(0, (1 << 64) - 1), max_size=40), data=st.data())
def test_mtt_absent_agrees(entries, data):
    """Both backends answer as the rule says: some entry among the first n has one
    of its two lowest bits (read, write) clear."""
    n = data.draw(st.integers(0, len(entries)))
    mtt = _arr([_be(e) for e in entries], max(len(entries), 1))
    got = [c_ext.backend(b).mtt_absent(mtt, n) for b in BACKENDS]
    assert got[0] == got[1] == any(e & 3 != 3 for e in entries[:n])


def test_mtt_absent_known_answer():
    """Entries 0x...03 are present; one 0x...01 (read only) among them is absent, and
    is not seen when n stops before it; bits above the lowest two do not count."""
    present, read_only = _be(0x1000 | 3), _be(0x2000 | 1)
    for b in BACKENDS:
        ops = c_ext.backend(b)
        mtt = _arr([present, present, read_only, _be(0xFFFF_FFFF_FFFF_FFFC | 3)])
        assert ops.mtt_absent(mtt, 4) and ops.mtt_absent(mtt, 3)
        assert not ops.mtt_absent(mtt, 2) and not ops.mtt_absent(mtt, 0)
        assert not ops.mtt_absent(_arr([_be(0xFFFF_FFFF_FFFF_FFFF)]), 1)
        with pytest.raises(ValueError, match="overflow"):
            ops.mtt_absent(mtt, 5)


# -- the peer layout rule's walk (ib_peer_sgt_violation) ----------------------------------

@given(entries=st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, (1 << 64) - 1)),
                        max_size=12),
       shift=st.integers(0, 40), va=st.integers(0, (1 << 64) - 1))
def test_sg_congruent_agrees(entries, shift, va):
    """Both backends find the same first incongruent entry (or the same entry whose
    length runs past 2^64) and the same coverage, on any table - lengths up to 2^64
    included."""
    n = len(entries)
    dma, lens = _arr([e[0] for e in entries], max(n, 1)), _arr([e[1] for e in entries],
                                                             max(n, 1))
    got = [c_ext.backend(b).sg_congruent(dma, lens, n, va, 1 << shift) for b in BACKENDS]
    assert got[0] == got[1]
    bad, total = got[0]
    # the same walk, by the rule's definition
    at, want = va, (-1, None)
    for i, (d, k) in enumerate(entries):
        if (d - at) % (1 << shift):
            want = (i, at - va)
            break
        if at + k >= 1 << 64:
            want = (-(i + 2), at - va)
            break
        at += k
    if want[1] is None:
        want = (-1, at - va)
    assert (bad, total) == want


def test_sg_congruent_known_answer():
    """64 KiB pages from VA 0x10000: entries at 0x7_0000 (64 KiB) and 0x9_0000 (128 KiB)
    are congruent and cover 192 KiB; an entry at 0x4_1000 is not (index 1)."""
    for b in BACKENDS:
        ops = c_ext.backend(b)
        assert ops.sg_congruent(_arr([0x70000, 0x90000]), _arr([0x10000, 0x20000]), 2,
                                0x10000, 0x10000) == (-1, 0x30000)
        assert ops.sg_congruent(_arr([0x70000, 0x41000]), _arr([0x10000, 0x20000]), 2,
                                0x10000, 0x10000) == (1, 0x10000)
        assert ops.sg_congruent(_arr([0, 0]), _arr([1 << 63, 1 << 63]), 2, 0, 1) == \
            (-3, 1 << 63)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sg_congruent_wrapper_validates(backend):
    ops = c_ext.backend(backend)
    one = _arr([0x1000])
    with pytest.raises(ValueError, match="overflow"):
        ops.sg_congruent(one, one, 2, 0, 0x1000)
    with pytest.raises(ValueError, match="page size"):
        ops.sg_congruent(one, one, 1, 0, 0x3000)
    with pytest.raises(ValueError, match="page size or VA"):
        ops.sg_congruent(one, one, 1, -1, 0x1000)


# -- the data path's loops: an mkey's MTT walk and the DMA byte copy ----------------------

def _be(v: int) -> int:
    """cpu_to_be64(v) as a native u64, the way an MTT entry is stored."""
    return int.from_bytes(v.to_bytes(8, "big"), sys.byteorder)


@given(pages=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=24),
       pg_bit=st.sampled_from([12, 16, 21]), data=st.data())
def test_mtt_pieces_agrees(pages, pg_bit, data):
    mtt = _arr([_be(p << pg_bit | 3) for p in pages])
    span = len(pages) << pg_bit
    offset = data.draw(st.integers(0, span))
    length = data.draw(st.integers(0, span - offset + (1 << pg_bit)))
    cap = data.draw(st.integers(1, 30))
    got = []
    for b in BACKENDS:
        a, n = U64Array(cap), U64Array(cap)
        k = c_ext.backend(b).mtt_pieces(mtt, len(pages), pg_bit, offset, length, a, n)
        got.append((k, a[:max(k, 0)], n[:max(k, 0)]))
    assert got[0] == got[1]
    k, addrs, lens = got[0]
    if k >= 0:
        assert sum(lens) == length
        # byte i of the range lands where a page-by-page walk puts it
        starts = [sum(lens[:j]) for j in range(k)]
        for i in range(0, length, 997):
            j = max(j for j in range(k) if starts[j] <= i)
            o = offset + i
            assert addrs[j] + i - starts[j] == \
                (pages[o >> pg_bit] << pg_bit) + (o & ((1 << pg_bit) - 1))


def test_mtt_pieces_known_answer():
    """Pages 0x10, 0x11 contiguous then 0x20: 0x2800 bytes from offset 0x800 are one
    piece of 0x1800 and one of 0x1000; the permission bits never reach an address;
    running past the table is -1."""
    mtt = _arr([_be(0x10000 | 3), _be(0x11000 | 3), _be(0x20000 | 3)])
    for b in BACKENDS:
        a, n = U64Array(4), U64Array(4)
        ops = c_ext.backend(b)
        assert ops.mtt_pieces(mtt, 3, 12, 0x800, 0x2800, a, n) == 2
        assert (a[:2], n[:2]) == ([0x10800, 0x20000], [0x1800, 0x1000])
        assert ops.mtt_pieces(mtt, 3, 12, 0x800, 0x3000, a, n) == -1
        assert ops.mtt_pieces(mtt, 3, 12, 0x800, 0x2800, U64Array(1), U64Array(1)) == -1


@given(src_pieces=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 96)), max_size=8),
       dst_pieces=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 96)), max_size=8))
def test_dma_copy_agrees(src_pieces, dst_pieces):
    src = bytes((i * 7 + 3) & 0xFF for i in range(4096))
    out = []
    for b in BACKENDS:
        dst = bytearray(4096)
        n = c_ext.backend(b).dma_copy(
            dst, _arr([p[0] for p in dst_pieces], max(len(dst_pieces), 1)),
            _arr([p[1] for p in dst_pieces], max(len(dst_pieces), 1)), len(dst_pieces),
            src, _arr([p[0] for p in src_pieces], max(len(src_pieces), 1)),
            _arr([p[1] for p in src_pieces], max(len(src_pieces), 1)), len(src_pieces))
        out.append((n, bytes(dst)))
    assert out[0] == out[1]
    n, dst = out[0]
    assert n == min(sum(p[1] for p in src_pieces), sum(p[1] for p in dst_pieces))
    gathered = b"".join(src[a:a + ln] for a, ln in src_pieces)[:n]
    scattered = b"".join(dst[a:a + ln] for a, ln in dst_pieces)[:n]
    if len({a for a, _ in dst_pieces}) == len(dst_pieces) and all(
            a1 + l1 <= a2 or a2 + l2 <= a1 for i, (a1, l1) in enumerate(dst_pieces)
            for (a2, l2) in dst_pieces[i + 1:]):
        assert scattered == gathered   # overlapping destinations keep the last write


@pytest.mark.parametrize("backend", BACKENDS)
def test_dma_copy_refuses_pieces_outside_their_buffer(backend):
    ops = c_ext.backend(backend)
    dst = bytearray(64)
    with pytest.raises(ValueError, match="outside"):
        ops.dma_copy(dst, _arr([60]), _arr([8]), 1, b"x" * 64, _arr([0]), _arr([8]), 1)
    assert dst == bytearray(64)   # nothing moved
    with pytest.raises(ValueError, match="overflow"):
        ops.dma_copy(dst, _arr([0]), _arr([8]), 2, b"x" * 64, _arr([0]), _arr([8]), 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dma_copy_into_a_machines_ram(backend):
    """A MemCtx side is the machine's physical memory: offsets are physical addresses."""
    m = Machine(ram_size=1 << 20, backend=backend)
    ops = c_ext.backend(backend)
    assert ops.dma_copy(m.mem, _arr([0x3000, 0x8000]), _arr([4, 4]), 2,
                        b"abcdefgh", _arr([0]), _arr([8]), 1) == 8
    assert m.phys_read(0x3000, 4) == b"abcd" and m.phys_read(0x8000, 4) == b"efgh"
    with pytest.raises(ValueError):
        ops.dma_copy(m.mem, _arr([(1 << 20) - 2]), _arr([4]), 1, b"abcd", _arr([0]),
                     _arr([4]), 1)
    m.check_leaks()


# -- nv-p2p's BAR1 bookkeeping (bar1_map / bar1_unmap) -------------------------------------
def _bar1_state(npg: int, nwin: int) -> tuple[U64Array, ...]:
    win_of_page, refs, bar1_pte = U64Array(npg), U64Array(npg), U64Array(nwin)
    stack, top = U64Array(nwin), U64Array(1)
    for i in range(nwin):
        stack.view[i] = nwin - 1 - i
    top.view[0] = nwin
    return win_of_page, refs, stack, top, bar1_pte


def _u64s(values: list[int]) -> U64Array:
    a = U64Array(max(len(values), 1))
    for i, x in enumerate(values):
        a.view[i] = x
    return a


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 6)),
                    min_size=1, max_size=30), max_new=st.integers(0, 12))
def test_bar1_map_unmap_agree(ops, max_new):
    """A random history of maps and unmaps of page ranges gives the same results,
    windows and arrays on the C loop and on its twin."""
    npg, nwin = 12, 10
    results = {}
    for name in BACKENDS:
        b = c_ext.backend(name)
        st_ = _bar1_state(npg, nwin)
        mapped: list[list[int]] = []
        log = []
        for is_map, first, n in ops:
            if is_map or not mapped:
                pages = list(range(first, min(first + n, npg)))
                out = U64Array(len(pages))
                r = b.bar1_map(_u64s(pages), 0, len(pages), *st_, max_new, out)
                if r >= 0:
                    mapped.append(pages)
                log.append((r, out.tolist()[:len(pages)]))
            else:
                pages = mapped.pop(first % len(mapped))
                log.append((b.bar1_unmap(_u64s(pages), 0, len(pages), *st_), None))
        results[name] = (log, [a.tolist() for a in st_])
    assert results["c"] == results["python"]


def test_bar1_known_answer_and_refusals():
    b = c_ext.backend("c")
    st_ = _bar1_state(8, 4)
    win_of_page, refs, stack, top, pte = st_
    out = U64Array(3)
    assert b.bar1_map(_u64s([5, 6, 7]), 0, 3, *st_, 10, out) == 3
    assert out.tolist() == [0, 1, 2] and pte.tolist() == [6, 7, 8, 0] and top.view[0] == 1
    # two already mapped, one new: only the new one takes a window
    assert b.bar1_map(_u64s([6, 7, 4]), 0, 3, *st_, 10, out) == 1
    assert out.tolist() == [1, 2, 3] and refs.view[6] == 2 and refs.view[4] == 1
    # no room (max_new 0 or no window left): nothing changes
    before = [a.tolist() for a in st_]
    assert b.bar1_map(_u64s([0, 1]), 0, 2, *st_, 0, out) == -3
    assert b.bar1_map(_u64s([0, 1]), 0, 2, *st_, 10, out) == -3
    assert [a.tolist() for a in st_] == before
    with pytest.raises(ValueError, match="beyond"):
        b.bar1_map(_u64s([8]), 0, 1, *st_, 10, out)
    with pytest.raises(ValueError, match="not mapped"):
        b.bar1_unmap(_u64s([5, 0]), 0, 2, *st_)
    assert [a.tolist() for a in st_] == before
    # unmapping: windows nobody uses any more come back, the last page's first
    assert b.bar1_unmap(_u64s([5, 6, 7]), 0, 3, *st_) == 1
    assert pte.tolist() == [0, 7, 8, 5] and top.view[0] == 1
    assert b.bar1_unmap(_u64s([6, 7, 4]), 0, 3, *st_) == 3
    assert pte.tolist() == [0, 0, 0, 0] and top.view[0] == 4
    assert stack.tolist()[:4] == [0, 3, 2, 1]


# -- the MMU's walk: PageTable.get through ops.pte_get ----------------------------------------

@pytest.mark.parametrize("page_size", [4096, 1 << 16])
def test_pte_get_agrees_with_the_table_walk(page_size):
    """Both backends read the PTE the Python walker (pte_slot) finds, for mapped,
    unmapped and unfaulted addresses, and 0 where no table covers the address - one
    beyond 64 bits or below 0 included; a root table outside RAM is refused."""
    for b in BACKENDS:
        m = Machine(ram_size=RAM, page_size=page_size, backend=b)
        p = m.spawn("walk")
        ps = m.page_size
        assert p.mmap(LAYOUT_BASE, 4 * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == \
            LAYOUT_BASE
        p.store(LAYOUT_BASE, b"x")
        p.store(LAYOUT_BASE + 2 * ps, b"y")
        pt = p.mm.pgtable
        vas = [LAYOUT_BASE, LAYOUT_BASE + ps, LAYOUT_BASE + 2 * ps + 5, LAYOUT_BASE + 3 * ps,
               0, 1 << 47, (1 << 64) - 1]
        want = []
        for va in vas:
            slot = pt.pte_slot(va, False)
            want.append(0 if slot is None else m.mem.ram_q[slot >> 3])
        got = [m.ops.pte_get(m.mem, pt.pgd, va) for va in vas]
        assert got == want
        assert [bool(g & _PAGE_PRESENT) for g in got[:4]] == [True, False, True, False]
        assert pt.get(LAYOUT_BASE + 2 * ps) == got[2]
        assert m.ops.pte_get(m.mem, pt.pgd, 1 << 64) == m.ops.pte_get(m.mem, pt.pgd, -1) == 0
        with pytest.raises(ValueError, match="outside RAM"):
            m.ops.pte_get(m.mem, m.ram_size, LAYOUT_BASE)
        p.exit(0)
        m.check_leaks()


def test_pte_get_survives_a_corrupt_upper_table():
    """An upper-level entry pointing beyond RAM, or at address 0, ends the walk with 0
    on both backends, where indexing RAM with it would fail."""
    for b in BACKENDS:
        m = Machine(ram_size=RAM, backend=b)
        p = m.spawn("corrupt")
        ps = m.page_size
        assert p.mmap(LAYOUT_BASE, ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == \
            LAYOUT_BASE
        p.store(LAYOUT_BASE, b"x")
        slot = _slot_of(m, p.mm.pgd, LAYOUT_BASE, 1)       # the PMD entry
        saved = m.mem.ram_q[slot >> 3]
        for bad in ((m.ram_size + ps) | _PAGE_PRESENT, _PAGE_PRESENT):
            m.mem.ram_q[slot >> 3] = bad
            assert m.ops.pte_get(m.mem, p.mm.pgd, LAYOUT_BASE) == 0
        m.mem.ram_q[slot >> 3] = saved
        assert m.ops.pte_get(m.mem, p.mm.pgd, LAYOUT_BASE) & _PAGE_PRESENT
        p.exit(0)
        m.check_leaks()


@pytest.mark.parametrize("page_size", [4096, 1 << 16])
def test_page_at_is_the_tlb_hit_on_both_backends(page_size):
    """ops.page_at (pm_page_at and its twin) gives the physical address of a range
    inside one page whose PTE has the bits asked for, and -1 for every other case:
    an empty range, a range crossing the page's end, one at or beyond task_size, a
    read-only or unfaulted page asked for write or read, integers at 64 bits; the
    backends agree case by case, and memory.page_at, the callers' entry, agrees with
    both.  A root table outside RAM is refused."""
    from kernel_model.memory import page_at
    got = {}
    for b in BACKENDS:
        m = Machine(ram_size=RAM, page_size=page_size, backend=b)
        p = m.spawn("tlb")
        ps = m.page_size
        base = LAYOUT_BASE
        assert p.mmap(base, 3 * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == base
        p.store(base, b"w")                                  # faulted, writable
        assert p.mmap(base + 3 * ps, ps, prot=PROT_READ,
                      flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == base + 3 * ps
        p.load(base + 3 * ps, 1)                             # faulted, read-only
        mm, pgd, ts = p.mm, p.mm.pgtable.pgd, p.mm.task_size
        phys0 = pte_addr(mm.pgtable.get(base))
        R, W = _PAGE_PRESENT, _PAGE_PRESENT | _PAGE_RW
        cases = [
            ((base + 5, 8, W), phys0 + 5),                   # inside a writable page
            ((base, ps, R), phys0),                          # the whole page
            ((base + ps - 4, 4, W), phys0 + ps - 4),         # ends at the page's end
            ((base + ps - 4, 5, W), -1),                     # crosses into the next
            ((base, 0, R), -1),                              # empty
            ((base + ps, 8, R), -1),                         # not faulted in yet
            ((base + 3 * ps, 8, R), None),                   # read-only, read: a hit
            ((base + 3 * ps, 8, W), -1),                     # read-only, write
            ((ts - 8, 8, R), -1),                            # nothing mapped there
            ((ts, 8, R), -1),                                # at task_size
            ((ts - 4, 8, R), -1),                            # runs past it
            (((1 << 64) - 1, 1, R), -1),                     # the last 64-bit address
            ((base, (1 << 64) - 1, R), -1),                  # a 64-bit length
            ((base, 1 << 64, R), -1),                        # beyond 64 bits
            ((-1, 8, R), -1),
        ]
        out = []
        for (va, n, need), want in cases:
            hit = m.ops.page_at(m.mem, pgd, va, n, need, ts)
            if want is None:
                want = pte_addr(mm.pgtable.get(base + 3 * ps))
            assert hit == want, (b, hex(va), n, need)
            if need in (R, W):
                assert page_at(mm, va, n, need == W) == hit, (b, hex(va), n)
            out.append(hit - phys0 if hit >= 0 else hit)
        got[b] = out
        with pytest.raises(ValueError, match="outside RAM"):
            m.ops.page_at(m.mem, m.ram_size, base, 8, R, ts)
        # the machine's own TLB hit follows its backend, also when it is swapped
        other = "python" if b == "c" else "c"
        want_fn = {"c": c_ext.lib.pm_page_at, "python": c_ext.twins.page_at}
        assert m.page_at_fn.func is want_fn[b]
        m.ops = c_ext.backend(other)
        assert m.page_at_fn.func is want_fn[other]
        assert page_at(mm, base + 5, 8, True) == phys0 + 5
        m.ops = c_ext.backend(b)
        p.exit(0)
        m.check_leaks()
    assert got["c"] == got["python"]

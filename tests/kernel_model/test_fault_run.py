"""memory.fault_anon_run: a run of first-touch faults in one loop.

The batch (access_vm, __get_user_pages) must leave the machine exactly as one
handle_mm_fault per page would: the same pages in the same order, the same PTEs,
page flags, counts, allocation records, free lists and rss.  Each test does the
same thing on two machines - one as it is, one with the batch switched off - and
compares the whole state; then checks the batch really ran, and that it stays off
where it must (a tracer running, an access ending in the page, a VMA with
vm_ops, memory running out part-way).
"""

from __future__ import annotations

import pytest

from c_ext import U64Array
from kernel_model import gup, memory
from kernel_model.emu.machine import Machine
from kernel_model.emu.process import SegmentationFault
from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast, unpin_user_pages
from kernel_model.mm import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, PROT_READ, PROT_WRITE
from kernel_model.mm_types import VM_PFNMAP
from kernel_model.pgtable import _PAGE_PRESENT, pte_addr
from kernel_model.trace import Tracer

BASE = 0x7F00_0000_0000
MiB = 1 << 20


def _state(m: Machine, p, va: int, npages: int) -> tuple:
    """Everything a fault changes: the range's PTEs, the mem_map words of what they
    map, the allocator's records, free lists and count, and the process's rss."""
    ps = m.page_size
    ptes = [p.mm.pgtable.get(va + i * ps) for i in range(npages)]
    words = [tuple(m.mem.pages[4 * (pte_addr(pte) >> m.page_shift) + k] for k in range(4))
             for pte in ptes if pte & _PAGE_PRESENT]
    return (ptes, words, dict(m.zone.allocated), [list(a) for a in m.zone.free_area],
            m.zone.nr_free, p.mm.rss)


def _twins(monkeypatch, page_size: int = 4096, ram: int = 32 * MiB):
    """Two like machines, each with a process: the first batches, the second does not."""
    calls = []
    real = memory.fault_anon_run

    def counting(vma, va, end, write):           # the runs that faulted something
        before = vma.vm_mm.rss
        real(vma, va, end, write)
        if vma.vm_mm.rss != before:
            calls.append(va)

    machines = [Machine(ram_size=ram, page_size=page_size) for _ in range(2)]
    procs = [m.spawn("toucher") for m in machines]
    return machines, procs, calls, counting, real


def _on(monkeypatch, fn) -> None:
    monkeypatch.setattr(memory, "fault_anon_run", fn)
    monkeypatch.setattr(gup, "fault_anon_run", fn)


@pytest.mark.parametrize("page_size", [4096, 1 << 16])
@pytest.mark.parametrize("write", [True, False])
def test_a_store_or_load_over_fresh_pages_faults_as_page_by_page(monkeypatch, page_size, write):
    """A store (or load) over fresh memory, already touched in places and crossing a
    PTE table's end: the same state as faulting page by page."""
    (ma, mb), (pa, pb), calls, counting, real = _twins(monkeypatch, page_size)
    ps = page_size
    span = ps << (ma.page_shift - 3)                      # what one PTE table maps
    va = (BASE + span) - 5 * ps                           # five pages before a table's end
    npages = 40
    for p in (pa, pb):
        assert p.mmap(va, npages * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == va
        p.store(va + 2 * ps, b"x")                        # touched already: not faulted again
        p.store(va + 9 * ps, b"y")
    states = []
    for fn, m, p in ((counting, ma, pa), (lambda *a: None, mb, pb)):
        _on(monkeypatch, fn)
        if write:
            p.store(va + 100, bytes(range(256)) * ((npages - 1) * ps // 256))
        else:
            assert p.load(va + 100, (npages - 1) * ps) == \
                (b"\0" * (2 * ps - 100) + b"x" + b"\0" * (7 * ps - 1) + b"y").ljust(
                    (npages - 1) * ps, b"\0")
        states.append(_state(m, p, va, npages))
    assert states[0] == states[1]
    assert calls, "the batch never ran"
    assert states[0][5] == npages                          # every page came in, once
    for m, p in ((ma, pa), (mb, pb)):
        p.exit(0)
        m.check_leaks()


def test_pinning_fresh_pages_faults_as_page_by_page(monkeypatch):
    """pin_user_pages_fast over fresh memory (the slow path's faults), for write and for
    read: the same pages pinned, the same state as one fault per lap."""
    (ma, mb), (pa, pb), calls, counting, real = _twins(monkeypatch)
    ps = ma.page_size
    npages = 64
    got = []
    for fn, m, p in ((counting, ma, pa), (lambda *a: None, mb, pb)):
        _on(monkeypatch, fn)
        assert p.mmap(BASE, npages * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == BASE
        p.store(BASE + 7 * ps, b"z")
        pfns = U64Array(npages)
        with p.kernel():
            assert pin_user_pages_fast(BASE, 32, FOLL_WRITE, pfns) == 32
            assert pin_user_pages_fast(BASE + 32 * ps, 32, 0, pfns, 32) == 32
        got.append((pfns.tolist(), _state(m, p, BASE, npages)))
        with p.kernel():
            unpin_user_pages(pfns, npages)
    assert got[0] == got[1]
    assert calls
    for m, p in ((ma, pa), (mb, pb)):
        p.exit(0)
        m.check_leaks()


def test_the_batch_stays_off_under_a_tracer_for_one_page_and_off_anonymous(monkeypatch):
    """Under a tracer every fault is its own event, so no batch runs (and the trace
    has a fault per page); an access within one page has nothing to batch; a VMA
    with vm_ops (its own ->fault) or VM_PFNMAP is no anonymous memory."""
    (ma, _mb), (pa, _pb), calls, counting, real = _twins(monkeypatch)
    _on(monkeypatch, counting)
    ps = ma.page_size
    assert pa.mmap(BASE, 8 * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == BASE
    tracer = Tracer()
    tracer.start()
    try:
        pa.store(BASE, bytes(8 * ps))
    finally:
        tracer.stop()
    assert [c.func for c in tracer.trace.calls()].count("do_anonymous_page") == 8
    assert pa.mmap(BASE + 16 * ps, 4 * ps, flags=MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == \
        BASE + 16 * ps
    pa.store(BASE + 16 * ps + 10, b"in one page")
    assert calls == []
    vma = pa.mm.vma_lookup(BASE + 16 * ps)
    before = _state(ma, pa, BASE + 16 * ps, 4)
    for attr, value in (("vm_ops", object()), ("vm_flags", vma.vm_flags | VM_PFNMAP)):
        saved = getattr(vma, attr)
        setattr(vma, attr, value)
        real(vma, BASE + 16 * ps, BASE + 20 * ps, True)
        setattr(vma, attr, saved)
        assert _state(ma, pa, BASE + 16 * ps, 4) == before
    real(vma, BASE + 16 * ps, BASE + 20 * ps, True)          # and anonymous: it runs
    assert _state(ma, pa, BASE + 16 * ps, 4)[5] == before[5] + 3
    pa.exit(0)
    ma.check_leaks()


def test_out_of_memory_part_way_stops_where_page_by_page_stops(monkeypatch):
    """A store bigger than what is free: both ways fault the same pages before
    memory runs out, and the store fails at the same address."""
    (ma, mb), (pa, pb), calls, counting, real = _twins(monkeypatch, ram=4 * MiB)
    ps = ma.page_size
    npages = ma.nr_pages
    out = []
    for fn, m, p in ((counting, ma, pa), (lambda *a: None, mb, pb)):
        _on(monkeypatch, fn)
        assert p.mmap(BASE, npages * ps, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == BASE
        with pytest.raises(SegmentationFault) as ei:
            p.store(BASE, bytes(npages * ps))
        out.append((str(ei.value), _state(m, p, BASE, npages)))
    assert out[0] == out[1]
    assert out[0][1][5] > 0 and calls
    for m, p in ((ma, pa), (mb, pb)):
        p.exit(0)
        m.check_leaks()

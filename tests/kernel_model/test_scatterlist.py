"""Tests for kernel_model/scatterlist.py: the coalescing rules of lib/scatterlist.c."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c_ext import U64Array
from kernel_model.emu.machine import Machine
from kernel_model.errno import EINVAL, KernelError
from kernel_model.scatterlist import (
    for_each_sgtable_dma_sg,
    for_each_sgtable_sg,
    sg_alloc_append_table_from_pages,
    sg_alloc_table_from_pages,
    sg_alloc_table_from_pages_segment,
    sg_append_table,
    sg_dma_address,
    sg_dma_len,
    sg_free_append_table,
    sg_free_table,
    sg_page,
    sg_phys,
    sg_table,
)

P = 4096
GiB2 = 2 << 30


def pfn_array(pfns: list[int]) -> U64Array:
    a = U64Array(len(pfns))
    for i, p in enumerate(pfns):
        a[i] = p
    return a


def build(m: Machine, pfns: list[int], max_seg: int = GiB2, offset: int = 0,
          size: int | None = None) -> sg_table:
    sgt = sg_table(m)
    size = len(pfns) * P - offset if size is None else size
    sg_alloc_table_from_pages_segment(sgt, pfn_array(pfns), len(pfns), offset, size, max_seg)
    return sgt


def test_discontiguous_pfns_make_one_entry_per_run(machine):
    sgt = build(machine, [10, 11, 12, 20, 21, 5])
    assert sgt.cpu_entries() == [(10, 0, 3 * P), (20, 0, 2 * P), (5, 0, P)]
    assert sgt.orig_nents == sgt.nents == 3


def test_max_segment_cuts_runs(machine):
    sgt = build(machine, [1, 2, 3, 4, 5], max_seg=8192)
    assert sgt.cpu_entries() == [(1, 0, 2 * P), (3, 0, 2 * P), (5, 0, P)]


def test_max_segment_rounds_down_to_pages(machine):
    sgt = build(machine, [1, 2, 3, 4, 5], max_seg=10000)
    assert sgt.cpu_entries() == [(1, 0, 2 * P), (3, 0, 2 * P), (5, 0, P)]


def test_max_segment_below_a_page_is_einval(machine):
    sgt = sg_table(machine)
    with pytest.raises(KernelError) as e:
        sg_alloc_table_from_pages_segment(sgt, pfn_array([1, 2]), 2, 0, 2 * P, P - 1)
    assert e.value.errno == EINVAL
    assert sgt.orig_nents == 0
    assert machine.bugs == ["WARNING: sg_alloc_append_table_from_pages: max_segment 0x0 "
                            "below PAGE_SIZE"]
    machine.bugs.clear()


def test_two_batches_of_consecutive_pages_make_one_entry(machine):
    app = sg_append_table(machine)
    pages = pfn_array(list(range(3000, 4000)))
    sg_alloc_append_table_from_pages(app, pages, 512, 0, 512 * P, GiB2, 488)
    assert app.sgt.cpu_entries() == [(3000, 0, 512 * P)]
    assert not app.end_marked
    sg_alloc_append_table_from_pages(app, pages, 488, 0, 488 * P, GiB2, 0, pages_off=512)
    assert app.sgt.cpu_entries() == [(3000, 0, 1000 * P)]
    assert app.prv == 0 and app.end_marked
    sg_free_append_table(app)
    assert app.sgt.orig_nents == 0 and app.prv is None


def test_second_batch_extends_previous_entry_up_to_max_segment(machine):
    app = sg_append_table(machine)
    sg_alloc_append_table_from_pages(app, pfn_array([1, 2]), 2, 0, 2 * P, 12288, 3)
    sg_alloc_append_table_from_pages(app, pfn_array([3, 4, 5]), 3, 0, 3 * P, 12288, 0)
    assert app.sgt.cpu_entries() == [(1, 0, 3 * P), (4, 0, 2 * P)]
    assert app.prv == 1


def test_append_with_offset_is_einval(machine):
    app = sg_append_table(machine)
    sg_alloc_append_table_from_pages(app, pfn_array([1]), 1, 0, P, GiB2, 1)
    with pytest.raises(KernelError) as e:
        sg_alloc_append_table_from_pages(app, pfn_array([2]), 1, 0x10, P - 0x10, GiB2, 0)
    assert e.value.errno == EINVAL
    assert app.sgt.cpu_entries() == [(1, 0, P)]
    assert len(machine.bugs) == 1
    machine.bugs.clear()


def test_offset_and_size_trim_first_and_last_entries(machine):
    # 0x100 bytes into pfn 7, 0x2000 bytes long: pages 7, 8 and part of 9; 40 a new run
    sgt = build(machine, [7, 8, 9, 40], offset=0x100, size=0x3000)
    assert sgt.cpu_entries() == [(7, 0x100, 3 * P - 0x100), (40, 0, 0x100)]
    sg = next(for_each_sgtable_sg(sgt))
    assert sg_phys(sg) == 7 * P + 0x100
    assert sg_page(sg).pfn == 7


def test_bad_arguments(machine):
    sgt = sg_table(machine)
    with pytest.raises(KernelError) as e:
        sg_alloc_table_from_pages_segment(sgt, pfn_array([1]), 2, 0, P, GiB2)
    assert e.value.errno == EINVAL
    with pytest.raises(KernelError):
        sg_alloc_table_from_pages_segment(sgt, pfn_array([1]), 1, P, P, GiB2)
    with pytest.raises(KernelError):
        sg_alloc_table_from_pages_segment(sgt, pfn_array([]), 0, 0, 0, GiB2)
    build_into = build(machine, [1])
    with pytest.raises(KernelError):  # already holds entries
        sg_alloc_table_from_pages(build_into, pfn_array([2]), 1, 0, P)


def test_capacity_grows_and_keeps_entries(machine):
    pfns = list(range(100, 100 + 2 * 300, 2))  # 300 discontiguous pages
    app = sg_append_table(machine)
    arr = pfn_array(pfns)
    for i in range(0, 300, 50):
        sg_alloc_append_table_from_pages(app, arr, 50, 0, 50 * P, GiB2, 300 - i - 50,
                                         pages_off=i)
    sgt = app.sgt
    assert sgt.orig_nents == 300 and sgt.capacity >= 300
    assert [sg.pfn for sg in for_each_sgtable_sg(sgt)] == pfns
    assert {sg.length for sg in for_each_sgtable_sg(sgt)} == {P}
    sg_free_table(sgt)
    assert sgt.orig_nents == sgt.nents == 0 and list(for_each_sgtable_sg(sgt)) == []


def test_dma_iteration_reads_dma_columns(machine):
    sgt = build(machine, [10, 11, 30])
    sgt.dma_addr[0], sgt.dma_len[0] = 0x1000, 0x3000
    sgt.nents = 1  # what a merging dma_map_sgtable leaves
    segs = [(sg_dma_address(sg), sg_dma_len(sg)) for sg in for_each_sgtable_dma_sg(sgt)]
    assert segs == [(0x1000, 0x3000)]
    assert len(list(for_each_sgtable_sg(sgt))) == 2


# -- the C loop and its Python twin agree ------------------------------------
_twins: dict[str, Machine] = {}


def _twin(name: str) -> Machine:
    if name not in _twins:
        _twins[name] = Machine(ram_size=64 << 20, backend=name)
    return _twins[name]


runs = st.lists(st.tuples(st.integers(1, 200), st.integers(1, 6)), min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(runs=runs, max_pages=st.integers(1, 8), slack=st.integers(0, P - 1),
       offset=st.integers(0, P - 1), split=st.integers(0, 40), appending=st.booleans())
def test_c_and_python_twin_build_identical_tables(runs, max_pages, slack, offset, split,
                                                  appending):
    pfns = [start + k for start, length in runs for k in range(length)]
    split = min(split, len(pfns) - 1) if appending else len(pfns)
    offset = 0 if appending else offset
    max_seg = max_pages * P + slack
    results = []
    for name in ("c", "python"):
        m = _twin(name)
        app = sg_append_table(m)
        arr = pfn_array(pfns)
        for lo, hi in ((0, split), (split, len(pfns))):
            if hi > lo:
                size = (hi - lo) * P - (offset if lo == 0 else 0)
                sg_alloc_append_table_from_pages(app, arr, hi - lo, offset if lo == 0 else 0,
                                                 size, max_seg, len(pfns) - hi, pages_off=lo)
        results.append(app.sgt.cpu_entries())
        sg_free_append_table(app)
    assert results[0] == results[1]
    total = sum(length for _, _, length in results[0])
    assert total == len(pfns) * P - offset
    assert all(length <= max_pages * P for _, _, length in results[0])

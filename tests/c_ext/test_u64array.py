"""c_ext.U64Array's allocators: small arrays from cffi, large ones (64 KiB and more) from
pm_pool_alloc's cache of freed blocks, lazy ones from their own mapping.

The cache exists so that the registration paths, which make and drop the same large
columns on every call, reuse warm memory instead of faulting in fresh pages; what
must hold is that a reused block is cleared when the array is to be zeroed, that
sizes are matched, and that a registration stops faulting once the cache is warm.
"""

from __future__ import annotations

import resource

import pytest

import c_ext
from c_ext import U64Array, pool_stats

BIG = 16384            # entries: 128 KiB, a 1 GiB GPU registration's column


def test_a_freed_large_array_is_reused_and_comes_back_zeroed():
    a = U64Array(BIG)
    a.view[: BIG] = memoryview(bytes(range(256)) * (8 * BIG // 256)).cast("Q")
    addr = int(c_ext.ffi.cast("uintptr_t", a.ptr))
    del a                                   # its block goes to the cache
    before = pool_stats()
    b = U64Array(BIG)
    after = pool_stats()
    assert after["hits"] == before["hits"] + 1
    assert int(c_ext.ffi.cast("uintptr_t", b.ptr)) == addr      # the same block, warm
    assert not any(b.view[: BIG])           # cleared: nothing of its last user shows


def test_an_array_about_to_be_filled_reuses_a_block_without_clearing_it():
    a = U64Array(BIG, zero=False)
    a.view[0] = 0xDEAD
    addr = int(c_ext.ffi.cast("uintptr_t", a.ptr))
    del a
    b = U64Array(BIG, zero=False)
    assert int(c_ext.ffi.cast("uintptr_t", b.ptr)) == addr


def test_sizes_are_matched_to_the_page_and_small_arrays_bypass_the_cache():
    a = U64Array(BIG)
    del a
    before = pool_stats()
    bigger = U64Array(BIG + 512)            # 4 KiB more: another size, a miss
    small = U64Array(1024)                  # 8 KiB: not the cache's
    after = pool_stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"] + 1)
    assert len(bigger) == BIG + 512 and not any(bigger.view[: BIG + 512])
    assert len(small) == 1024


def test_the_cache_is_bounded():
    """It keeps at most 128 MiB: 40 freed 4 MiB arrays leave at most 32 in it."""
    arrays = [U64Array(1 << 19) for _ in range(40)]
    del arrays
    s = pool_stats()
    assert s["bytes"] <= 128 << 20 and s["blocks"] <= 256


@pytest.fixture
def gpu_reg():
    from tests.benchmarks.test_peer_bench import GpuReg
    r = GpuReg(True)
    yield r
    r.drop()
    r.p.exit(0)
    r.m.check_leaks()


def test_a_warm_gpu_registration_takes_its_columns_from_the_cache(gpu_reg):
    """1 GiB of GPU memory registered again and again: after the first time its
    thirteen 16,384-entry columns (page table, DMA mapping, scatterlist, MTT, the
    firmware's copy) come from the cache, and it faults in no fresh memory (in a
    fresh process it took 195 page faults per registration before)."""
    gpu_reg.reg()
    gpu_reg.drop()
    faults, hits = [], []
    for _ in range(3):
        before, h = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, pool_stats()["hits"]
        gpu_reg.reg()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        hits.append(pool_stats()["hits"] - h)
        gpu_reg.drop()
    assert min(hits) >= 13, hits
    assert min(faults) < 40, faults

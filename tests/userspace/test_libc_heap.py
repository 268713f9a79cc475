"""userspace.libc's heap: small blocks without a mapping each.

posix_memalign serves blocks of at most HEAP_MAX bytes and alignment at most 16
from per-process arenas (what glibc's malloc does for the bounce buffers of
read_sysfs, the runtimes' ioctl arguments, the devx command arrays); larger or
page-aligned ones keep a mapping of their own.
"""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.platform import rdma_host
from userspace import libc
from userspace.libc import HEAP_ARENA, HEAP_MAX, SysError, free, heap_arenas, posix_memalign
from userspace.libibverbs import verbs as v


@pytest.fixture
def proc():
    m = rdma_host(ram_size=64 << 20)
    p = m.spawn("heap")
    yield p
    p.exit(0)
    m.check_leaks()


def _vmas(p) -> list[tuple[int, int]]:
    return [(vma.vm_start, vma.vm_end) for vma in p.mm.vmas]


def test_small_blocks_share_one_arena_are_aligned_and_zeroed(proc):
    before = _vmas(proc)
    a = posix_memalign(proc, 0, 100)
    b = posix_memalign(proc, 8, 100)
    c = posix_memalign(proc, 16, 1)
    (arena,) = heap_arenas(proc)
    assert len(_vmas(proc)) == len(before) + 1               # one mapping: the arena
    for addr, size in ((a, 100), (b, 100), (c, 1)):
        assert arena <= addr < arena + HEAP_ARENA and addr % 16 == 0
        assert proc.load(addr, size) == bytes(size)
    assert len({a, b, c}) == 3 and abs(a - b) >= 128          # 100 bytes: a 128-byte class
    proc.store(a, b"\xff" * 100)
    free(proc, a, 100)
    again = posix_memalign(proc, 0, 120)                    # the same class: the freed block
    assert again == a and proc.load(a, 128) == bytes(128)    # handed out zeroed again
    for addr, size in ((again, 120), (b, 100), (c, 1)):
        free(proc, addr, size)
    assert len(_vmas(proc)) == len(before) + 1              # the heap keeps its arena


def test_large_or_page_aligned_blocks_get_a_mapping_of_their_own(proc):
    ps = proc.machine.page_size
    for align, size in ((0, HEAP_MAX + 1), (ps, 64), (64, 64)):
        before = _vmas(proc)
        addr = posix_memalign(proc, align, size)
        assert addr % ps == 0 and proc.mm.vma_lookup(addr) is not None
        assert (addr, addr + -(-size // ps) * ps) in _vmas(proc)
        free(proc, addr, size)
        assert _vmas(proc) == before                         # unmapped again
    assert heap_arenas(proc) == []                          # none of them touched the heap


def test_a_full_arena_is_followed_by_another(proc):
    n = HEAP_ARENA // HEAP_MAX
    blocks = [posix_memalign(proc, 0, HEAP_MAX) for _ in range(n)]
    assert len(heap_arenas(proc)) == 1
    extra = posix_memalign(proc, 0, HEAP_MAX)
    first, second = heap_arenas(proc)
    assert second <= extra < second + HEAP_ARENA
    assert all(first <= b < first + HEAP_ARENA for b in blocks)
    for b in blocks + [extra]:
        free(proc, b, HEAP_MAX)


def test_an_arena_that_cannot_be_mapped_is_a_sys_error(proc, monkeypatch):
    monkeypatch.setattr(proc, "mmap", lambda *a: -errno.ENOMEM)
    with pytest.raises(SysError) as ei:
        posix_memalign(proc, 0, 64)
    assert ei.value.errno == errno.ENOMEM
    assert heap_arenas(proc) == []


def test_sysfs_reads_map_nothing_per_call(proc):
    """ibv_query_gid reads sysfs through a heap block: a hundred queries leave the
    address space as the first one left it."""
    proc.machine.load_module("mlx5_ib")
    ctx = v.ibv_open_device(proc, v.ibv_get_device_list(proc)[0])
    gid = v.ibv_query_gid(ctx, 1, 0)
    after_one = _vmas(proc)
    mmaps = []
    real = proc.mmap
    proc.mmap = lambda *a: mmaps.append(a) or real(*a)
    try:
        assert all(v.ibv_query_gid(ctx, 1, 0) == gid for _ in range(100))
    finally:
        del proc.mmap
    assert mmaps == [] and _vmas(proc) == after_one
    assert len(heap_arenas(proc)) == 1
    v.ibv_close_device(ctx)


def test_freeing_a_block_twice_is_refused_and_the_arena_stays(proc):
    """A heap block freed twice is no live block the second time: free refuses it
    (EINVAL; glibc aborts) instead of unmapping a page of the arena under the other
    blocks - which stay readable, and the free lists unchanged."""
    a = posix_memalign(proc, 0, 24)
    b = posix_memalign(proc, 0, 24)
    free(proc, a, 24)
    with pytest.raises(SysError) as ei:
        free(proc, a, 24)
    assert ei.value.errno == errno.EINVAL and "double free" in str(ei.value)
    with pytest.raises(SysError):
        free(proc, a + 8, 24)                                # inside a block: no block
    assert proc.load(b, 24) == bytes(24)
    assert posix_memalign(proc, 0, 24) == a                  # freed once, reused once
    assert libc._size_class(24) == 32 and libc._size_class(0) == 16

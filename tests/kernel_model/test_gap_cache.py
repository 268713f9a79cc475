"""get_unmapped_area's gap cache: the address is always the one the walk from the top
finds.

The cache (mm.gap_cache) lets a request bigger than every gap above the last
allocation resume the walk there.  Random histories of mmap, munmap (whole, or
splitting a mapping) and MAP_FIXED maps check each placement against the plain walk
over the VMA list as it is just before the call.
"""

from __future__ import annotations

import random

import pytest

from kernel_model.emu.machine import Machine
from kernel_model.mm import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, PROT_READ, PROT_WRITE

RW = PROT_READ | PROT_WRITE


def _walk_from_the_top(mm, length: int) -> int | None:
    """The placement without the cache: the highest gap below mmap_base that fits."""
    end = mm.mmap_base
    for vma in reversed(mm.vmas):
        if vma.vm_start >= end:
            continue
        if vma.vm_end + length <= end:
            return end - length
        end = min(end, vma.vm_start)
    return end - length if end - length >= mm.machine.page_size * 16 else None


@pytest.mark.parametrize("seed", range(12))
def test_every_placement_is_the_walk_from_the_top(seed):
    rnd = random.Random(seed)
    m = Machine(ram_size=16 << 20)
    p = m.spawn("mapper")
    ps = m.page_size
    live: list[tuple[int, int]] = []
    used = 0
    for _ in range(150):
        op = rnd.random()
        if op < 0.5 or not live:
            length = rnd.choice([1, 1, 2, 3, 5, 8, 16, 40]) * ps
            want = _walk_from_the_top(p.mm, length)
            got = p.mmap(0, length, RW, MAP_PRIVATE | MAP_ANONYMOUS)
            assert got == want, (seed, length)
            live.append((got, length))
            used += p.mm.gap_cache is not None
        elif op < 0.85:
            i = rnd.randrange(len(live))
            addr, length = live[i]
            pages = length // ps
            first = rnd.randrange(pages)
            n = rnd.randrange(1, pages - first + 1)
            assert p.munmap(addr + first * ps, n * ps) == 0
            del live[i]
            if first:
                live.append((addr, first * ps))
            if first + n < pages:
                live.append((addr + (first + n) * ps, (pages - first - n) * ps))
        else:                                   # MAP_FIXED over part of a mapping
            addr, length = rnd.choice(live)
            pages = length // ps
            first = rnd.randrange(pages)
            n = rnd.randrange(1, pages - first + 1)
            at = addr + first * ps
            assert p.mmap(at, n * ps, RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED) == at
    assert used > 20                            # the cache was there to be used
    p.exit(0)
    m.check_leaks()


def test_an_unmap_above_the_cached_end_forgets_it():
    """After a munmap of a mapping above where the last walk stopped, the gap it
    leaves is the highest that fits, and the next mmap of its size lands there."""
    m = Machine(ram_size=16 << 20)
    p = m.spawn("mapper")
    ps = m.page_size
    maps = [p.mmap(0, 4 * ps) for _ in range(6)]
    assert maps == sorted(maps, reverse=True)          # top down, packed
    assert p.mm.gap_cache is not None and p.mm.gap_cache[1] == maps[-2]
    assert p.munmap(maps[1], 4 * ps) == 0
    assert p.mm.gap_cache is None
    assert p.mmap(0, 4 * ps) == maps[1]
    assert p.mmap(0, 8 * ps) == maps[-1] - 8 * ps     # below the packed ones again
    p.exit(0)
    m.check_leaks()

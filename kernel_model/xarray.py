"""Mirrors lib/xarray.c, reduced: an ID allocator with cyclic allocation and xa_lock.

Only what its users need: xa_alloc_cyclic() hands out the lowest free ID at
or after the last one given (wrapping within the limit), so a freed ID is
not reused at once - peer_mem relies on that to ignore a stale
core_context; xa_load() and xa_erase() under the array's spinlock.
"""

from __future__ import annotations

import itertools
from typing import Any

from kernel_model.errno import EBUSY, KernelError
from kernel_model.locking import spin_lock_init
from kernel_model.sched import Named, touch

U32_MAX = 0xFFFFFFFF


class xarray(Named):
    """Mirrors struct xarray (XA_FLAGS_ALLOC): index -> entry, and its xa_lock."""

    def __init__(self, name: str = "xa_lock"):
        self.entries: dict[int, Any] = {}
        self.xa_lock = spin_lock_init(name)

    def __repr__(self) -> str:
        return f"xarray {sorted(self.entries)}"


def xa_alloc_cyclic(xa: xarray, entry: Any, limit: tuple[int, int], nxt: list[int]) -> int:
    """Mirrors xa_alloc_cyclic() with the lock taken by the caller's xa_lock (__xa_alloc_cyclic
    semantics): the first free index in [nxt[0], limit_max], then from limit_min; nxt[0]
    moves past it.  EBUSY when the range is full."""
    touch(xa)
    lo, hi = limit
    start = min(max(nxt[0], lo), hi)
    for idx in itertools.chain(range(start, hi + 1), range(lo, start)):
        if idx not in xa.entries:
            xa.entries[idx] = entry
            nxt[0] = lo if idx == hi else idx + 1
            return idx
    raise KernelError(EBUSY, "xa_alloc_cyclic: no free index")


def xa_load(xa: xarray, index: int) -> Any:
    """Mirrors xa_load(): the entry at index, or None."""
    touch(xa, False)
    return xa.entries.get(index)


def xa_erase(xa: xarray, index: int) -> Any:
    """Mirrors xa_erase(): remove and return the entry (None if there was none)."""
    touch(xa)
    return xa.entries.pop(index, None)

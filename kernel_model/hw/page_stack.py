"""A device's free-page stack that starts full without building the list.

Emulator-level.  The GPU drivers' models (drivers/nvidia/rm.py, drivers/amdgpu) keep
their free VRAM pages as a stack, lowest page on top, and hand pages back on top of it.
`list(range(n - 1, -1, -1))` for a 16 GiB card is 262,144 integers - about 17 ms of
every machine a race exploration builds, once per schedule - while a run touches a
handful of them.  PageStack gives the same pops in the same order: the pages handed back
first (last back, first out), then the pages never handed out, lowest first.
"""

from __future__ import annotations

from collections.abc import Iterable


class PageStack:
    """The free pages 0 .. n - 1: `pop()` the top, `extend()` pages back onto it."""

    def __init__(self, n: int):
        self._n = n
        self._fresh = 0                  # the lowest page never handed out
        self._back: list[int] = []       # pages handed back, the last one on top

    def __len__(self) -> int:
        return len(self._back) + self._n - self._fresh

    def pop(self) -> int:
        if self._back:
            return self._back.pop()
        if self._fresh >= self._n:
            raise IndexError("pop from an empty PageStack")
        self._fresh += 1
        return self._fresh - 1

    def extend(self, pages: Iterable[int]) -> None:
        self._back.extend(pages)

    def pop_scrubbed(self, n: int, vidmem: memoryview, page_shift: int) -> list[int]:
        """pop() n pages and zero each in `vidmem`, as a driver scrubs VRAM before
        handing it out.  # EMU: a page never handed out is left as it is - still the
        zeroes the memory was made with (it is only reachable once allocated) - so a
        fresh 1 GiB allocation does not write 1 GiB of zeroes."""
        fresh = self._fresh                # every page below was handed out before
        pages = [self.pop() for _ in range(n)]
        size = 1 << page_shift
        zero = None
        for p in pages:
            if p < fresh:
                if zero is None:
                    zero = bytes(size)
                vidmem[p << page_shift:(p << page_shift) + size] = zero
        return pages

    def __repr__(self) -> str:
        return f"PageStack({len(self)} of {self._n} free)"

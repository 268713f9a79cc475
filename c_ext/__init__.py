"""c_ext: the per-page loops in C, each with a pure-Python twin.

The C side (pm.c, behind pm.h) never calls Python and its loops never allocate
(pm_calloc/pm_free are only U64Array's allocator); this
wrapper validates every argument first (types, counts against array sizes) so
C cannot write outside a buffer, then calls the selected backend:

    ops = c_ext.backend("c")        # or "python", or None: $PEERMEM_BACKEND
    n = ops.gup_fast(mem, pgd, start, nr, need, deny, pfns, 0)

Arrays that cross the boundary are `U64Array`s: one buffer that C reaches
through a cached pointer and Python through a memoryview, so results (PFNs,
segments, DMA addresses) stay in C memory and never become lists of tuples.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
from collections.abc import Callable

from c_ext import twins

try:
    from c_ext._pm import ffi, lib
except ImportError:  # pragma: no cover - only when the build was skipped
    ffi = lib = None

_alloc = ffi.new if ffi is not None else None
# a large sparse array (lazy=True) is its own anonymous mapping (pm_calloc): the
# kernel zeroes its pages when first touched, where ffi.new would memset all of it -
# and glibc, once one such block is freed, serves the next from its heap and clears
# it all (a GPU's 262,144-entry bookkeeping arrays, made for every machine, of which
# a run touches a few entries).  An array about to be written whole stays with
# ffi.new: warm heap memory cleared is cheaper than a page fault per page.
_alloc_big = (ffi.new_allocator(alloc=lib.pm_calloc, free=lib.pm_free,
                                should_clear_after_alloc=False) if ffi is not None else None)
_BIG = 1 << 17      # entries (1 MiB): below that, a mapping of its own costs more
# arrays of 64 KiB and more come from pm_pool_alloc's cache of freed blocks: the
# registration paths make and drop the same large columns on every call, and
# fresh memory costs a page fault per page (see pm.c)
_POOLED = (64 << 10) // 8          # entries
_pool = (ffi.new_allocator(alloc=lib.pm_pool_alloc, free=lib.pm_pool_free,
                           should_clear_after_alloc=True) if ffi is not None else None)
_pool_noclear = (ffi.new_allocator(alloc=lib.pm_pool_alloc, free=lib.pm_pool_free,
                                   should_clear_after_alloc=False) if ffi is not None else None)


def pool_stats() -> dict[str, int]:
    """The large-array cache (pm_pool_alloc): blocks and bytes it holds, hits, misses
    (all 0 without the C extension, whose arrays are bytearrays)."""
    if ffi is None:
        return dict.fromkeys(("blocks", "bytes", "hits", "misses"), 0)
    out = ffi.new("uint64_t[4]")
    lib.pm_pool_stats(out)
    return dict(zip(("blocks", "bytes", "hits", "misses"), out, strict=True))

__all__ = ["U64Array", "MemCtx", "backend", "default_backend_name", "UnpinUnderflow", "pool_stats"]

PTE_PRESENT = 1 << 0
PTE_RW = 1 << 1
PTE_USER = 1 << 2
PTE_SPECIAL = 1 << 9
PTE_ADDR_MASK = 0x000FFFFFFFFFF000
PG_RESERVED = 1 << 0
PG_BUDDY = 1 << 1
PG_DIRTY = 1 << 2
PAGE_STRUCT_WORDS = 4  # struct page: flags, refcount, pincount, mapcount (int32 each)


class UnpinUnderflow(Exception):
    """An unpin hit a page that holds no pin (the kernel would WARN).

    `nfreed` pages (the first entries of the freed array) and `done` unpins
    happened before it; the caller must still account for them.
    """

    def __init__(self, pfn: int, nfreed: int, done: int):
        super().__init__(f"unpin of pfn {pfn:#x} which holds no pin")
        self.pfn, self.nfreed, self.done = pfn, nfreed, done


#: mmap(2)'s MAP_NORESERVE: Python's mmap module exports it only from 3.12 on
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux")
                        else 0)


def anon_map(size: int) -> mmap.mmap:
    """A private anonymous mapping of `size` bytes that commits no memory until it is
    touched (MAP_NORESERVE): emulated RAM, VRAM and BARs of gigabytes of which a run
    touches a little.  Without NORESERVE each counted against the host's commit
    limit in full, and a process holding a few could no longer fork (the explorer's
    workers and snapshots: ENOMEM)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | MAP_NORESERVE)


class U64Array:
    """A fixed-size array of uint64 shared by C (``ptr``) and Python (``view``)."""

    __slots__ = ("buf", "view", "ptr", "n")

    def __init__(self, n: int, zero: bool = True, lazy: bool = False):
        """n entries, zeroed unless zero=False (for arrays about to be filled:
        skipping the clear saves a pass over megabytes on the 1 GiB paths).
        lazy=True: a large zeroed array of which few entries will be touched,
        zeroed by the kernel page by page as they are (see _alloc_big)."""
        self.n = n
        if n < _POOLED and ffi is not None:
            # the common case, first; zeroed even when it need not be: under 64 KiB
            # the clear costs less than going through a non-clearing allocator
            self.ptr = ptr = _alloc("uint64_t[]", n or 1)
            self.view = memoryview(buf := ffi.buffer(ptr)).cast("Q")
            self.buf = buf
            return
        if ffi is None:
            self.buf = bytearray(8 * max(n, 1))
            self.ptr = None
        else:
            if lazy and n >= _BIG:
                alloc = _alloc_big
            else:
                alloc = _pool if zero else _pool_noclear
            self.ptr = alloc("uint64_t[]", max(n, 1))
            self.buf = ffi.buffer(self.ptr)
        self.view = memoryview(self.buf).cast("Q")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.view[: self.n][i].tolist()
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.view[i]

    def __setitem__(self, i: int, v: int) -> None:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        self.view[i] = v

    def tolist(self) -> list[int]:
        return self.view[: self.n].tolist()


class MemCtx:
    """One machine's RAM and mem_map as both backends see them."""

    def __init__(self, ram, mem_map, nr_pages: int, page_shift: int, levels: int):
        self.nr_pages = nr_pages
        self.page_shift = page_shift
        self.levels = levels
        self.ram = memoryview(ram)
        self.ram_q = self.ram.cast("Q")
        self.pages = memoryview(mem_map).cast("i")
        if len(self.pages) < nr_pages * PAGE_STRUCT_WORDS:
            raise ValueError("mem_map too small")
        self.c = None
        if ffi is not None:
            c = ffi.new("struct pm_mem *")
            self._keep = (ffi.from_buffer(ram), ffi.from_buffer(mem_map))
            c.ram = ffi.cast("uint8_t *", self._keep[0])
            c.mem_map = ffi.cast("struct page *", self._keep[1])
            c.nr_pages = nr_pages
            c.page_shift = page_shift
            c.levels = levels
            self.c = c


def _check(arr: U64Array, off: int, n: int, what: str) -> None:
    if not isinstance(arr, U64Array):
        raise TypeError(f"{what} must be a U64Array")
    if off < 0 or n < 0 or off + n > arr.n:
        raise ValueError(f"{what}: {n} entries at {off} overflow an array of {arr.n}")


class _Backend:
    """Validates, then runs a loop in C or in its Python twin."""

    def __init__(self, name: str):
        if name not in ("c", "python"):
            raise ValueError(f"PEERMEM_BACKEND must be 'c' or 'python', not {name!r}")
        if name == "c" and lib is None:
            raise RuntimeError("c_ext._pm is not built: reinstall with `pip install -e .`")
        self.name = name

    def __repr__(self) -> str:
        return f"<c_ext backend {self.name}>"

    def pte_get(self, mem: MemCtx, pgd: int, va: int) -> int:
        """The PTE mapping va under the root table at pgd, 0 when no table covers
        it (an address beyond 64 bits has none)."""
        if not 0 <= va < 1 << 64:
            return 0
        if not 0 <= pgd < mem.nr_pages << mem.page_shift:
            raise ValueError(f"pte_get: root table {pgd:#x} outside RAM")
        if self.name == "python":
            return twins.pte_get(mem, pgd, va)
        return lib.pm_pte_get(mem.c, pgd, va)

    def page_at(self, mem: MemCtx, pgd: int, va: int, n: int, need: int,
                task_size: int) -> int:
        """The physical address of [va, va + n) when it lies in one page below
        task_size whose PTE under pgd has every bit of need, else -1: the TLB hit
        of a load or store (kernel_model.memory.page_at)."""
        if not (0 <= va < 1 << 64 and 0 <= n < 1 << 64 and 0 <= need < 1 << 64
                and 0 <= task_size < 1 << 64):
            return -1
        if not 0 <= pgd < mem.nr_pages << mem.page_shift:
            raise ValueError(f"page_at: root table {pgd:#x} outside RAM")
        return self.page_at_fn(mem)(pgd, va, n, need, task_size)

    def page_at_fn(self, mem: MemCtx) -> Callable[[int, int, int, int, int], int]:
        """page_at bound to one machine's memory, with no checks in Python: the
        caller passes a root table inside RAM and 64-bit unsigned integers (a
        load or store of the running process, many per system call)."""
        if self.name == "python":
            return functools.partial(twins.page_at, mem)
        return functools.partial(lib.pm_page_at, mem.c)

    def gup_fast(self, mem: MemCtx, pgd: int, start: int, nr: int, need: int, deny: int,
                 pfns: U64Array, off: int = 0) -> int:
        _check(pfns, off, nr, "pfns")
        if self.name == "python":
            return twins.gup_fast(mem, pgd, start, nr, need, deny, pfns.view, off)
        return lib.pm_gup_fast(mem.c, pgd, start, nr, need, deny, pfns.ptr + off)

    def pin_append(self, mem: MemCtx, pgd: int, start: int, npages: int, need: int,
                   deny: int, page_list: U64Array, max_seg: int, sg_pfn: U64Array,
                   sg_off: U64Array, sg_len: U64Array, nents: int) -> tuple[int, int]:
        """ib_umem_get's batches, page_list.n pages each, pinned by the fast path and
        appended to the sg table (offset 0) until npages are in, a batch comes
        back short, or the columns lack room for the next batch's worst case (one
        entry per page): (pages pinned and appended, the table's new count)."""
        batch = page_list.n
        if npages < 0 or batch < 1:
            raise ValueError(f"pin_append: {npages} pages in batches of {batch}")
        if max_seg < (1 << mem.page_shift):
            raise ValueError("max_seg below one page")
        for arr, name in ((sg_pfn, "sg_pfn"), (sg_off, "sg_off"), (sg_len, "sg_len")):
            _check(arr, 0, nents, name)
        cap = min(sg_pfn.n, sg_off.n, sg_len.n)
        if self.name == "python":
            done, nents = twins.pin_append(mem, pgd, start, npages, batch, need, deny,
                                           page_list.view, max_seg, sg_pfn.view, sg_off.view,
                                           sg_len.view, nents, cap)
        else:
            nents_p = ffi.new("long *", nents)
            done = lib.pm_pin_append(mem.c, pgd, start, npages, batch, need, deny,
                                     page_list.ptr, max_seg, sg_pfn.ptr, sg_off.ptr,
                                     sg_len.ptr, nents_p, cap)
            nents = nents_p[0]
        if done < 0:
            raise ValueError("pin_append: the sg table overflowed")
        return done, nents

    def count_pages(self, lens: U64Array, n: int, shift: int) -> int:
        """The pages n byte lengths cover, each rounded up to 2^shift bytes."""
        _check(lens, 0, n, "lens")
        if not 0 <= shift < 64:
            raise ValueError(f"page shift {shift} out of range")
        if self.name == "python":
            return twins.count_pages(lens.view, n, shift)
        return lib.pm_count_pages(lens.ptr, n, shift)

    def unpin(self, mem: MemCtx, pfns: U64Array, counts: U64Array | None, n: int, dirty: bool,
              freed: U64Array, len_shift: int = -1) -> int:
        """Drop a pin from each page of n runs (first pfn, count); counts None: one
        page each; len_shift >= 0: counts are byte lengths, rounded up to pages of
        2^len_shift bytes.  The pages freed go to `freed`; their number returned."""
        _check(pfns, 0, n, "pfns")
        total = n
        if counts is not None:
            if not -1 <= len_shift < 64:
                raise ValueError(f"page shift {len_shift} out of range")
            _check(counts, 0, n, "counts")
            total = sum(counts.view[:n]) if len_shift < 0 else \
                self.count_pages(counts, n, len_shift)
        _check(freed, 0, total, "freed")
        if self.name == "python":
            r, err = twins.unpin(mem, pfns.view, counts.view if counts else None, n,
                                 len_shift if counts is not None else -1, dirty, freed.view)
        else:
            errp = ffi.new("uint64_t[3]")
            r = lib.pm_unpin(mem.c, pfns.ptr, counts.ptr if counts else ffi.NULL, n,
                             len_shift if counts is not None else -1, int(dirty), freed.ptr,
                             errp)
            err = tuple(errp)
        if r < 0:
            raise UnpinUnderflow(*err)
        return r

    def sg_append(self, page_shift: int, pfns: U64Array, off: int, n: int, offset: int,
                  size: int, max_seg: int, sg_pfn: U64Array, sg_off: U64Array,
                  sg_len: U64Array, nents: int) -> int:
        """Coalesce n PFNs onto an sg table of nents entries; the new entry count.

        A fill that would overflow the arrays raises ValueError, having written
        nothing past them (callers reserve room for one entry per page).
        """
        _check(pfns, off, n, "pfns")
        for arr, name in ((sg_pfn, "sg_pfn"), (sg_off, "sg_off"), (sg_len, "sg_len")):
            _check(arr, 0, nents, name)
        if max_seg < (1 << page_shift):
            raise ValueError("max_seg below one page")
        cap = min(sg_pfn.n, sg_off.n, sg_len.n)
        if self.name == "python":
            r = twins.sg_append(page_shift, pfns.view[off:], n, offset, size, max_seg,
                                sg_pfn.view, sg_off.view, sg_len.view, nents, cap)
        else:
            r = lib.pm_sg_append(page_shift, pfns.ptr + off, n, offset, size, max_seg,
                                 sg_pfn.ptr, sg_off.ptr, sg_len.ptr, nents, cap)
        if r < 0:
            raise ValueError(f"sg_append: table of {cap} entries too small")
        return r

    def dma_map_direct(self, page_shift: int, sg_pfn: U64Array, sg_off: U64Array,
                       sg_len: U64Array, n: int, dma_mask: int, dma_addr: U64Array,
                       dma_len: U64Array) -> int:
        for arr, name in ((sg_pfn, "sg_pfn"), (sg_off, "sg_off"), (sg_len, "sg_len"),
                          (dma_addr, "dma_addr"), (dma_len, "dma_len")):
            _check(arr, 0, n, name)
        if self.name == "python":
            return twins.dma_map_direct(page_shift, sg_pfn.view, sg_off.view, sg_len.view, n,
                                        dma_mask, dma_addr.view, dma_len.view)
        return lib.pm_dma_map_direct(page_shift, sg_pfn.ptr, sg_off.ptr, sg_len.ptr, n,
                                     dma_mask, dma_addr.ptr, dma_len.ptr)

    def dma_map_iova(self, page_shift: int, granule_shift: int, sg_pfn: U64Array,
                     sg_off: U64Array, sg_len: U64Array, n: int, iova: int, max_seg: int,
                     seg_iova: U64Array, dma_addr: U64Array, dma_len: U64Array) -> int:
        for arr, name in ((sg_pfn, "sg_pfn"), (sg_off, "sg_off"), (sg_len, "sg_len"),
                          (seg_iova, "seg_iova"), (dma_addr, "dma_addr"),
                          (dma_len, "dma_len")):
            _check(arr, 0, n, name)
        if self.name == "python":
            return twins.dma_map_iova(page_shift, granule_shift, sg_pfn.view, sg_off.view,
                                      sg_len.view, n, iova, max_seg, seg_iova.view,
                                      dma_addr.view, dma_len.view)
        return lib.pm_dma_map_iova(page_shift, granule_shift, sg_pfn.ptr, sg_off.ptr,
                                   sg_len.ptr, n, iova, max_seg, seg_iova.ptr, dma_addr.ptr,
                                   dma_len.ptr)

    def scan_pages(self, mem: MemCtx, start: int, out: U64Array) -> int:
        _check(out, 0, out.n, "out")
        if self.name == "python":
            return twins.scan_pages(mem, start, out.view, out.n)
        return lib.pm_scan_pages(mem.c, start, out.ptr, out.n)

    def dma_blocks(self, dma_addr: U64Array, dma_len: U64Array, nents: int, advance: int,
                   pgsz: int, nblocks: int, out: U64Array, or_flags: int = 0,
                   big_endian: bool = False) -> int:
        """Split nents DMA segments into pgsz blocks from `advance` bytes into the
        first; write up to nblocks `block | or_flags` (big-endian if asked) to out.
        Returns the count written."""
        _check(dma_addr, 0, nents, "dma_addr")
        _check(dma_len, 0, nents, "dma_len")
        _check(out, 0, nblocks, "out")
        if pgsz <= 0 or pgsz & (pgsz - 1) or pgsz > 1 << 63:
            raise ValueError(f"dma_blocks: pgsz {pgsz:#x} is not a power of two below 2^64")
        if not 0 <= advance < 1 << 64 or not 0 <= or_flags < 1 << 64:
            raise ValueError("dma_blocks: advance and or_flags must be u64")
        pg_bit = pgsz.bit_length() - 1
        if self.name == "python":
            return twins.dma_blocks(dma_addr.view, dma_len.view, nents, advance, pg_bit, nblocks,
                                    or_flags, bool(big_endian), out.view)
        return lib.pm_dma_blocks(dma_addr.ptr, dma_len.ptr, nents, advance, pg_bit, nblocks,
                                 or_flags, int(bool(big_endian)), out.ptr)

    def pgsz_mask(self, dma_addr: U64Array, dma_len: U64Array, nents: int, va: int,
                  pgoff: int) -> int:
        """ib_umem_find_best_pgsz()'s walk over nents DMA segments: the bits in which
        device and DMA addresses differ at each contiguous run's start (and va at
        each run after the first)."""
        _check(dma_addr, 0, nents, "dma_addr")
        _check(dma_len, 0, nents, "dma_len")
        if not 0 <= va < 1 << 64 or not 0 <= pgoff < 1 << 64:
            raise ValueError("pgsz_mask: va and pgoff must be u64")
        if self.name == "python":
            return twins.pgsz_mask(dma_addr.view, dma_len.view, nents, va, pgoff)
        return lib.pm_pgsz_mask(dma_addr.ptr, dma_len.ptr, nents, va, pgoff)

    def mtt_pieces(self, mtt: U64Array, nmtt: int, pg_bit: int, offset: int, length: int,
                   addr: U64Array, plen: U64Array) -> int:
        """The HCA's walk of a memory key's MTT: `length` bytes at `offset` into
        the region -> merged DMA pieces in addr/plen; -1 if the table is too
        short or the pieces do not fit."""
        _check(mtt, 0, nmtt, "mtt")
        if addr.n != plen.n:
            raise ValueError("mtt_pieces: addr and plen differ in size")
        if not 0 < pg_bit < 64 or offset < 0 or length < 0 or offset + length >= 1 << 64:
            raise ValueError("mtt_pieces: bad page shift, offset or length")
        if self.name == "python":
            return twins.mtt_pieces(mtt.view, nmtt, pg_bit, offset, length, addr.view,
                                    plen.view, addr.n)
        return lib.pm_mtt_pieces(mtt.ptr, nmtt, pg_bit, offset, length, addr.ptr, plen.ptr,
                                 addr.n)

    def next_set(self, a: U64Array, start: int, stop: int) -> int:
        """The first index in [start, stop) whose entry is not 0, else stop (a walk
        over a sparse per-page table steps from set entry to set entry)."""
        if not 0 <= start <= stop:
            raise ValueError(f"next_set: bad range [{start}, {stop})")
        _check(a, 0, stop, "a")
        if self.name == "python":
            return twins.next_set(a.view, start, stop)
        return lib.pm_next_set(a.ptr, start, stop)

    def ksm_fill(self, out: U64Array, first: int, n: int, size: int, key: int,
                 shift: int) -> None:
        """n big-endian KSM entries (size, key, address) into out[:2n], entry i for
        the slice at (first + i) << shift."""
        _check(out, 0, 2 * n, "out")
        if not (0 <= size < 1 << 32 and 0 <= key < 1 << 32 and 0 <= shift < 64
                and 0 <= first < 1 << 64):
            raise ValueError("ksm_fill: size and key must be u32, shift below 64")
        if self.name == "python":
            twins.ksm_fill(out.view, first, n, size, key, shift)
            return
        lib.pm_ksm_fill(out.ptr, first, n, size, key, shift)

    def mtt_absent(self, mtt: U64Array, n: int) -> bool:
        """Does any of the first n (big-endian) MTT entries lack a present bit
        (read, write: its two lowest bits)?"""
        _check(mtt, 0, n, "mtt")
        if self.name == "python":
            return twins.mtt_absent(mtt.view, n)
        return bool(lib.pm_mtt_absent(mtt.ptr, n))

    def sg_congruent(self, dma_addr: U64Array, dma_len: U64Array, nents: int, va: int,
                     pps: int) -> tuple[int, int]:
        """The peer layout rule's walk (ib_peer_sg_violation): from VA `va`, is each
        entry's DMA address congruent with its VA modulo `pps` (a power of two)?
        (index of the first entry that is not, or -1; bytes covered before it);
        -(index + 2) for an entry whose length runs past 2^64."""
        _check(dma_addr, 0, nents, "dma_addr")
        _check(dma_len, 0, nents, "dma_len")
        if pps <= 0 or pps & (pps - 1) or not 0 <= va < 1 << 64:
            raise ValueError("sg_congruent: bad page size or VA")
        if self.name == "python":
            return twins.sg_congruent(dma_addr.view, dma_len.view, nents, va, pps)
        total = _alloc("uint64_t *")
        bad = lib.pm_sg_congruent(dma_addr.ptr, dma_len.ptr, nents, va, pps, total)
        return bad, total[0]

    def dma_copy(self, dst, dst_addr: U64Array, dst_len: U64Array, ndst: int,
                 src, src_addr: U64Array, src_len: U64Array, nsrc: int) -> int:
        """Copy a DMA transfer's bytes between two piece lists.  `dst`/`src` are
        a MemCtx (a machine's RAM) or a writable/readable buffer (a payload);
        pieces are offsets into them.  Returns the bytes moved; ValueError if a
        piece lies outside its buffer (nothing is copied then)."""
        _check(dst_addr, 0, ndst, "dst_addr")
        _check(dst_len, 0, ndst, "dst_len")
        _check(src_addr, 0, nsrc, "src_addr")
        _check(src_len, 0, nsrc, "src_len")
        dview, dsize = _flat(dst)
        sview, ssize = _flat(src)
        if self.name == "python":
            n = twins.dma_copy(dview, dsize, dst_addr.view, dst_len.view, ndst,
                               sview, ssize, src_addr.view, src_len.view, nsrc)
        else:
            n = lib.pm_dma_copy(_cptr(dst, dview), dsize, dst_addr.ptr, dst_len.ptr, ndst,
                                _cptr(src, sview), ssize, src_addr.ptr, src_len.ptr, nsrc)
        if n < 0:
            raise ValueError("dma_copy: a piece lies outside its buffer")
        return n

    def baseline_pin_map(self, mem: MemCtx, pgd: int, start: int, nr: int, max_seg: int,
                         pfns: U64Array, sg_pfn: U64Array, sg_len: U64Array,
                         dma_addr: U64Array) -> int:
        """Benchmark-only fused loop; C only (it is the yardstick, not a feature)."""
        for arr, name in ((pfns, "pfns"), (sg_pfn, "sg_pfn"), (sg_len, "sg_len"),
                          (dma_addr, "dma_addr")):
            _check(arr, 0, nr, name)
        return lib.pm_baseline_pin_map(mem.c, pgd, start, nr, max_seg, pfns.ptr, sg_pfn.ptr,
                                       sg_len.ptr, dma_addr.ptr)


    def bar1_map(self, pages: U64Array, off: int, n: int, win_of_page: U64Array,
                 refs: U64Array, free_stack: U64Array, free_top: U64Array, bar1_pte: U64Array,
                 max_new: int, win_out: U64Array) -> int:
        """nv-p2p's BAR1 windows for n GPU pages (pages[off:off+n]): see pm.c.  The new
        window count, or -(needed) - 1 with nothing changed when they do not fit;
        ValueError (nothing changed) for a page beyond the per-page arrays."""
        self._check_bar1(pages, off, n, win_of_page, refs, free_stack, free_top, bar1_pte)
        _check(win_out, 0, n, "win_out")
        if self.name == "python":
            r = twins.bar1_map(pages.view[off:], n, win_of_page.n, win_of_page.view, refs.view,
                               free_stack.view, free_top.view, bar1_pte.view, max_new,
                               win_out.view)
        else:
            r = lib.pm_bar1_map(pages.ptr + off, n, win_of_page.n, win_of_page.ptr, refs.ptr,
                                free_stack.ptr, free_top.ptr, bar1_pte.ptr, max_new,
                                win_out.ptr)
        if r == twins.BAR1_BAD_PAGE:
            raise ValueError("bar1_map: a GPU page beyond the per-page arrays")
        return r

    def bar1_unmap(self, pages: U64Array, off: int, n: int, win_of_page: U64Array,
                   refs: U64Array, free_stack: U64Array, free_top: U64Array,
                   bar1_pte: U64Array) -> int:
        """The reverse of bar1_map: the windows freed.  ValueError (nothing changed) if a
        page is not mapped."""
        self._check_bar1(pages, off, n, win_of_page, refs, free_stack, free_top, bar1_pte)
        if self.name == "python":
            r = twins.bar1_unmap(pages.view[off:], n, win_of_page.n, win_of_page.view,
                                 refs.view, free_stack.view, free_top.view, bar1_pte.view)
        else:
            r = lib.pm_bar1_unmap(pages.ptr + off, n, win_of_page.n, win_of_page.ptr,
                                  refs.ptr, free_stack.ptr, free_top.ptr, bar1_pte.ptr)
        if r == twins.BAR1_BAD_PAGE:
            raise ValueError("bar1_unmap: a page that is not mapped")
        return r

    @staticmethod
    def _check_bar1(pages: U64Array, off: int, n: int, win_of_page: U64Array, refs: U64Array,
                    free_stack: U64Array, free_top: U64Array, bar1_pte: U64Array) -> None:
        _check(pages, off, n, "pages")
        if refs.n != win_of_page.n or free_stack.n != bar1_pte.n or free_top.n != 1:
            raise ValueError("bar1: per-page, per-window or top arrays differ in size")
        if free_top.view[0] > free_stack.n:
            raise ValueError("bar1: free_top beyond the stack")

    def baseline_peer_table(self, gpu_pages: U64Array, n: int, bar1_pte: U64Array,
                            first_window: int, bar1_base: int, gpu_page_shift: int,
                            phys: U64Array, sg_len: U64Array, dma_addr: U64Array,
                            dma_len: U64Array) -> int:
        """Benchmark-only fused loop for a GPU registration; C only (the yardstick)."""
        _check(gpu_pages, 0, n, "gpu_pages")
        _check(bar1_pte, first_window, n, "bar1_pte")
        for arr, name in ((phys, "phys"), (sg_len, "sg_len"), (dma_addr, "dma_addr"),
                          (dma_len, "dma_len")):
            _check(arr, 0, n, name)
        return lib.pm_baseline_peer_table(gpu_pages.ptr, n, bar1_pte.ptr, first_window,
                                          bar1_base, gpu_page_shift, phys.ptr, sg_len.ptr,
                                          dma_addr.ptr, dma_len.ptr)


def _flat(buf) -> tuple[memoryview, int]:
    """A dma_copy side as (byte view, size): a MemCtx's RAM or any buffer."""
    view = buf.ram if isinstance(buf, MemCtx) else memoryview(buf).cast("B")
    return view, len(view)


def _cptr(buf, view: memoryview):
    """The C pointer of a dma_copy side (the RAM pointer a MemCtx keeps)."""
    if isinstance(buf, MemCtx):
        return buf.c.ram
    return ffi.cast("uint8_t *", ffi.from_buffer(view))


_backends: dict[str, _Backend] = {}


def default_backend_name() -> str:
    """The backend named by $PEERMEM_BACKEND (default "c")."""
    return os.environ.get("PEERMEM_BACKEND", "c")


def backend(name: str | None = None) -> _Backend:
    """Return the (shared) backend object for `name`, or the default one."""
    name = name or default_backend_name()
    if name not in _backends:
        _backends[name] = _Backend(name)
    return _backends[name]

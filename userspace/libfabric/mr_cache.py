"""Mirrors libfabric's registration cache (prov/util/src/util_mr_cache.c) and its memory
monitors (util_mem_monitor.c, util_mem_hooks.c, cuda_mem_monitor.c).

Registering memory costs a pin, an IOMMU/BAR1 mapping and a firmware command, so
a provider keeps registrations after the application closes them (lazy
unpinning) and hands the same one back when the same range is registered
again.  The danger is the one real caches have shipped: handing back a
registration whose pages no longer back the address (free + reallocate,
munmap + mmap, cudaFree + cudaMalloc at the same address).  Monitors guard
against it:

  memhooks    the process's munmap is intercepted before it runs (libfabric
              patches the ELF relocations of mmap/munmap/...; # EMU: here
              Process.munmap calls the installed hooks) and the cache drops
              every entry overlapping the range
  userfaultfd the kernel reports unmaps: each cached range is registered with
              a userfaultfd (UFFDIO_REGISTER), a munmap queues
              UFFD_EVENT_UNMAP, and the monitor reads the queue (# EMU: before
              each search, where libfabric has a thread reading it) and drops
              the entries it names
  disabled    no cache: every fi_mr_reg registers, every fi_close deregisters
  cuda        tag-based (the GPUDirect RDMA guide's buffer ID tag check): an
              entry for CUDA memory remembers CU_POINTER_ATTRIBUTE_BUFFER_ID;
              a search compares it with the address's current one, and a
              different ID (cudaFree + cudaMalloc reused the address) makes
              the entry stale - dropped, and registered anew

Configuration, read from the environment given to the domain, as libfabric
reads its own:
  FI_MR_CACHE_MAX_COUNT   entries kept (default 1024); 0 disables the cache
  FI_MR_CACHE_MAX_SIZE    bytes kept (default: unlimited)
  FI_MR_CACHE_MONITOR     memhooks (default here), userfaultfd or disabled
  FI_MR_CUDA_CACHE_MONITOR_ENABLED   1 (default) or 0: CUDA memory not cached

Entries not in use sit on an LRU list; going over either limit evicts from
its cold end, and a registration failing for lack of resources (ENOMEM,
EAGAIN; for CUDA memory also EFAULT, which is how BAR1 exhaustion reaches
verbs through nv_peer_mem's acquire probe) flushes the whole list and
retries once.  CUDA ranges are cached on 64 KiB GPU-page boundaries.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable
from typing import Any

from kernel_model.trace import traced
from kernel_model.uapi.userfaultfd import (
    UFFD_API,
    UFFD_EVENT_REMOVE,
    UFFD_EVENT_UNMAP,
    UFFD_FEATURE_EVENT_REMAP,
    UFFD_FEATURE_EVENT_REMOVE,
    UFFD_FEATURE_EVENT_UNMAP,
    UFFD_MSG_FMT,
    UFFD_MSG_SIZE,
    UFFD_USER_MODE_ONLY,
    UFFDIO_API,
    UFFDIO_API_FMT,
    UFFDIO_RANGE_FMT,
    UFFDIO_REGISTER,
    UFFDIO_REGISTER_FMT,
    UFFDIO_REGISTER_MODE_MISSING,
    UFFDIO_UNREGISTER,
)
from userspace.cuda.runtime import CU_POINTER_ATTRIBUTE_BUFFER_ID
from userspace.libc import O_CLOEXEC, O_NONBLOCK
from userspace.libfabric.fabric import FI_HMEM_CUDA, FI_HMEM_SYSTEM

GPU_PAGE = 1 << 16
GPU_MASK = GPU_PAGE - 1
DEFAULT_MAX_COUNT = 1024
MONITORS = ("memhooks", "userfaultfd", "disabled")
RETRY_ERRNOS = (errno.ENOMEM, errno.EAGAIN)


class ofi_mr_entry:
    """Mirrors struct ofi_mr_entry: one cached registration."""

    __slots__ = ("start", "end", "iface", "device", "mr", "access", "use_cnt", "buffer_id",
                 "dead")

    def __init__(self, start: int, end: int, iface: int, device: int, mr: Any,
                 buffer_id: int | None):
        self.start, self.end = start, end
        self.iface, self.device = iface, device
        self.mr = mr                        # the fid_mr the domain registered
        self.access = mr.access             # what it grants (fixed at registration)
        self.use_cnt = 1
        self.buffer_id = buffer_id          # the CUDA tag, None for host memory
        self.dead = False                   # invalidated while in use

    def __repr__(self) -> str:
        return (f"ofi_mr_entry [{self.start:#x}, {self.end:#x}) iface {self.iface} "
                f"use {self.use_cnt}{' dead' if self.dead else ''}")


class ofi_mr_cache:
    """Mirrors struct ofi_mr_cache: storage, LRU list, limits, monitors, statistics."""

    def __init__(self, domain: Any, env: dict[str, str] | None,
                 add_region: Callable[..., tuple[int, Any]], delete_region: Callable[[Any], int]):
        env = env or {}
        self.domain = domain
        # the provider's registration and deregistration (ofi_mr_cache's add_region /
        # delete_region): (addr, length, access, iface, device) -> (ret, mr); mr -> ret
        self.add_region, self.delete_region = add_region, delete_region
        try:
            self.max_cached_cnt = int(env.get("FI_MR_CACHE_MAX_COUNT", DEFAULT_MAX_COUNT))
            size = env.get("FI_MR_CACHE_MAX_SIZE")
            self.max_cached_size = int(size) if size is not None else None   # unlimited
        except ValueError:
            raise ValueError("FI_MR_CACHE_MAX_COUNT/SIZE: not a number") from None
        self.monitor = env.get("FI_MR_CACHE_MONITOR", "memhooks")
        if self.monitor not in MONITORS:
            raise ValueError(f"FI_MR_CACHE_MONITOR={self.monitor!r}: one of {MONITORS}")
        self.cuda_monitor = env.get("FI_MR_CUDA_CACHE_MONITOR_ENABLED", "1") != "0"
        # exact (iface, device, start, end) -> entry; then a scan for containing ones
        self.entries: dict[tuple[int, int, int, int], ofi_mr_entry] = {}
        # EMU: libfabric finds entries in a tree ordered by start address; the hit
        # path here probes start -> the last cached system-memory entry (device 0)
        # starting there (an int key hashes in a fraction of the 4-tuple's time);
        # only under memhooks, whose notifications arrive before the munmap returns
        self.starts: dict[int, ofi_mr_entry] = {}
        # the LRU list of unused entries, coldest first (a dict keeps insertion order;
        # its delete + insert is cheaper than an OrderedDict's).  EMU: the newest one
        # (lru_tail) stays on it while a hit uses it: given back, it is the newest
        # again, so the commonest hit (the same range again and again) moves nothing.
        # It is then the only entry in use on the list; eviction never takes it.
        self.lru: dict[ofi_mr_entry, None] = {}
        self.lru_tail: ofi_mr_entry | None = None
        self.cached_cnt = 0
        self.cached_size = 0
        self.uffd: uffd_monitor | None = None
        # the counters of struct ofi_mr_cache (hit_cnt, ...); `stats` names them
        self.hit_cnt = self.miss_cnt = self.evict_cnt = 0
        self.notify_cnt = self.stale_cnt = self.uncached_cnt = self.retry_cnt = 0

    @property
    def search_cnt(self) -> int:
        """Searches so far: every search ends in a hit or a miss, so their sum (the
        hit path saves the third counter)."""
        return self.hit_cnt + self.miss_cnt

    @property
    def stats(self) -> dict[str, int]:
        """The counters by name, as libfabric's FI_LOG_MR dump prints them."""
        return {"search": self.search_cnt, "hit": self.hit_cnt, "miss": self.miss_cnt,
                "evict": self.evict_cnt, "notify": self.notify_cnt, "stale": self.stale_cnt,
                "uncached": self.uncached_cnt, "retry": self.retry_cnt,
                "bytes_pinned": self.cached_size}

    @property
    def enabled(self) -> bool:
        return self.max_cached_cnt > 0 and self.monitor != "disabled"

    def __repr__(self) -> str:
        return (f"ofi_mr_cache {self.cached_cnt} entries {self.cached_size} bytes, "
                f"{len(self.lru) - self._tail_in_use()} unused")

    # -- storage ---------------------------------------------------------------------------
    def _find(self, iface: int, device: int, start: int, end: int) -> ofi_mr_entry | None:
        e = self.entries.get((iface, device, start, end))
        if e is not None:
            return e
        for e in self.entries.values():        # a larger entry holding the range
            if e.iface == iface and e.device == device and e.start <= start and end <= e.end:
                return e
        return None

    def _insert(self, e: ofi_mr_entry) -> bool:
        """Store e, subscribed with the monitor; False if the monitor cannot watch it."""
        if self.uffd is not None and e.iface != FI_HMEM_CUDA and \
                not self.uffd.subscribe(e.start, e.end):
            return False
        self.entries[(e.iface, e.device, e.start, e.end)] = e
        if e.iface == FI_HMEM_SYSTEM and e.device == 0 and self.uffd is None:
            self.starts[e.start] = e
        self.cached_cnt += 1
        self.cached_size += e.end - e.start
        return True

    def _remove(self, e: ofi_mr_entry) -> None:
        if self.starts.get(e.start) is e:
            del self.starts[e.start]
        if self.entries.pop((e.iface, e.device, e.start, e.end), None) is e:
            self.cached_cnt -= 1
            self.cached_size -= e.end - e.start
            if self.uffd is not None and e.iface != FI_HMEM_CUDA:
                self.uffd.unsubscribe(self, e.start, e.end)
        self.lru.pop(e, None)
        if self.lru_tail is e:
            self.lru_tail = None

    def _free(self, e: ofi_mr_entry) -> None:
        """Deregister an entry (the pin and the mkey go)."""
        self.delete_region(e.mr)

    def _full(self, extra: int) -> bool:
        """No room to add an entry of `extra` bytes."""
        if self.cached_cnt + 1 > self.max_cached_cnt:
            return True
        return self.max_cached_size is not None and self.cached_size + extra > \
            self.max_cached_size

    def _tail_in_use(self) -> bool:
        t = self.lru_tail
        return t is not None and t.use_cnt > 0

    def _has_unused(self) -> bool:
        """Is an unused entry on the LRU list?  (The one in use there is its tail: if
        the coldest is in use, it is the only one.)"""
        return bool(self.lru) and not next(iter(self.lru)).use_cnt

    def _evict_one(self) -> bool:
        if not self._has_unused():
            return False
        e = next(iter(self.lru))                     # the coldest unused entry
        self._remove(e)                              # (off the list, and the tail)
        self._free(e)
        self.evict_cnt += 1
        return True


def _buffer_id(domain: Any, addr: int) -> int | None:
    try:
        return domain.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, addr)
    except OSError:
        return None


@traced
def ofi_mr_cache_search(cache: ofi_mr_cache, addr: int, length: int, access: int,
                        iface: int, device: int) -> tuple[int, ofi_mr_entry | None]:
    """Mirrors ofi_mr_cache_search(): a cached registration holding the range (a hit:
    its use count goes up and it leaves the LRU list), or a new one (a miss).
    Returns (0, entry) or (-errno, None); a CUDA entry whose buffer ID no longer
    matches the address is stale - dropped and registered anew.

    The hit path is the cache's reason to exist, so it is kept short: one dict
    probe for the exact system-memory range, no call out; everything else (a CUDA
    range, a larger entry holding the range, more access than cached) goes on to
    _search_rest.  A userfaultfd cache has no such entries (`starts` stays empty):
    it must read its event queue before it may trust any entry."""
    try:
        e = cache.starts[addr]
    except KeyError:                    # (raising costs nothing next to a registration)
        return _search_rest(cache, addr, length, access, iface, device)
    if e.end == addr + length and not iface | device | access & ~e.access:
        cache.hit_cnt += 1
        n = e.use_cnt
        if not n and e is not cache.lru_tail:
            del cache.lru[e]                # (the newest stays: see ofi_mr_cache.lru)
        e.use_cnt = n + 1
        return 0, e
    return _search_rest(cache, addr, length, access, iface, device)


def _search_rest(cache: ofi_mr_cache, addr: int, length: int, access: int, iface: int,
                 device: int) -> tuple[int, ofi_mr_entry | None]:
    """ofi_mr_cache_search past the exact host hit: CUDA ranges (64 KiB-aligned,
    tag-checked), containing entries, access upgrades, misses."""
    if cache.uffd is not None:
        uffd_drain(cache)
    if iface == FI_HMEM_CUDA:
        start, end = addr & ~GPU_MASK, (addr + length + GPU_MASK) & ~GPU_MASK
    else:
        start, end = addr, addr + length
    e = cache._find(iface, device, start, end)
    tag = None
    if iface == FI_HMEM_CUDA:
        tag = _buffer_id(cache.domain, addr)
        if e is not None and e.buffer_id != tag:      # the address was freed and reused
            cache.stale_cnt += 1
            ofi_mr_cache_notify(cache, e.start, e.end - e.start, iface)
            e = None
    if e is not None:
        if not access & ~e.access:
            cache.hit_cnt += 1
            if not e.use_cnt and e is not cache.lru_tail:
                del cache.lru[e]
            e.use_cnt += 1
            return 0, e
        # more access than the cached registration gives: it leaves the cache (its
        # users keep it) and the new one covers both (util_mr_uncache_entry)
        access |= e.access
        if e.start <= start and end <= e.end:
            start, end = e.start, e.end
        cache._remove(e)
        if e.use_cnt == 0:
            cache._free(e)
        else:
            e.dead = True
    cache.miss_cnt += 1
    return ofi_mr_cache_miss(cache, start, end, access, iface, device, tag)


@traced
def ofi_mr_cache_miss(cache: ofi_mr_cache, start: int, end: int, access: int, iface: int,
                      device: int, tag: int | None) -> tuple[int, ofi_mr_entry | None]:
    """The miss path: make room (evict from the LRU list), register, insert - or hand
    back an entry not kept when every cached one is in use."""
    while cache._full(end - start) and cache._evict_one():
        pass
    ret, mr = _register(cache, start, end - start, access, iface, device)
    if ret:
        return ret, None
    e = ofi_mr_entry(start, end, iface, device, mr, tag)
    if cache._full(end - start) or not cache._insert(e):
        cache.uncached_cnt += 1       # every entry in use, or the monitor can't watch
        e.dead = True
    return 0, e



def _register(cache: ofi_mr_cache, addr: int, length: int, access: int, iface: int,
              device: int) -> tuple[int, Any]:
    """The provider's registration; out of resources, flush the LRU list, retry once."""
    ret, mr = cache.add_region(addr, length, access, iface, device)
    retry = RETRY_ERRNOS + ((errno.EFAULT,) if iface == FI_HMEM_CUDA else ())
    if ret and -ret in retry and cache._has_unused():
        cache.retry_cnt += 1
        ofi_mr_cache_flush(cache)
        ret, mr = cache.add_region(addr, length, access, iface, device)
    return ret, mr


@traced
def ofi_mr_cache_delete(cache: ofi_mr_cache, e: ofi_mr_entry) -> None:
    """Mirrors ofi_mr_cache_delete(): the user is done with it.  The last user puts a
    live entry on the LRU list (the pin stays); a dead one is deregistered now."""
    n = e.use_cnt - 1
    e.use_cnt = n
    if n:
        return
    if e.dead:
        cache._free(e)
        return
    if e is cache.lru_tail:         # the newest never left: it is the newest again
        return
    t = cache.lru_tail
    if t is not None and t.use_cnt:  # it stops being the newest while in use: it leaves
        del cache.lru[t]
    cache.lru[e] = None             # no eviction: _full keeps every insert within the limits
    cache.lru_tail = e


@traced
def ofi_mr_cache_notify(cache: ofi_mr_cache, addr: int, length: int,
                        iface: int = 0) -> None:
    """Mirrors ofi_mr_cache_notify(): the monitor of memory `iface` (system memory for
    memhooks) says [addr, addr + length) changed.  Every overlapping entry of that
    iface leaves the cache; unused ones are deregistered now, ones in use when their
    last user closes them."""
    end = addr + length
    for e in [e for e in cache.entries.values()
              if e.iface == iface and e.start < end and addr < e.end]:
        cache.notify_cnt += 1
        cache._remove(e)
        if e.use_cnt == 0:
            cache._free(e)
        else:
            e.dead = True


@traced
def ofi_mr_cache_flush(cache: ofi_mr_cache) -> int:
    """Mirrors ofi_mr_cache_flush(): deregister every unused entry; how many went."""
    n = 0
    while cache._evict_one():
        n += 1
    return n


def ofi_mr_cache_cleanup(cache: ofi_mr_cache) -> int:
    """Mirrors ofi_mr_cache_cleanup(): flush; entries still in use are left to their
    users (how many, as libfabric warns of them)."""
    ofi_mr_cache_flush(cache)
    return sum(1 for e in cache.entries.values() if e.use_cnt)


# -- the memhooks monitor ------------------------------------------------------------------------
def memhooks_subscribe(proc: Any, cache: ofi_mr_cache) -> None:
    """Install the cache's munmap hook in the process (ofi_memhooks_start)."""
    hooks = proc.__dict__.setdefault("memhooks", [])
    hooks.append(lambda addr, length: ofi_mr_cache_notify(cache, addr, length, 0))
    cache.hook = hooks[-1]


def memhooks_unsubscribe(proc: Any, cache: ofi_mr_cache) -> None:
    hooks = proc.__dict__.get("memhooks", [])
    if getattr(cache, "hook", None) in hooks:
        hooks.remove(cache.hook)


# -- the userfaultfd monitor ------------------------------------------------------------------
class uffd_monitor:
    """Mirrors libfabric's uffd monitor (util_mem_monitor.c): one userfaultfd asking for
    unmap/remove/remap events, each cached range registered with it."""

    def __init__(self, proc: Any, fd: int, scratch: int):
        self.proc, self.fd, self.scratch = proc, fd, scratch

    @classmethod
    def start(cls, proc: Any) -> uffd_monitor | None:
        """ofi_uffd_start: the fd and UFFDIO_API; None if the kernel refuses."""
        fd = proc.userfaultfd(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)
        if fd < 0:
            return None
        scratch = proc.mmap(0, proc.machine.page_size)
        features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | \
            UFFD_FEATURE_EVENT_REMAP
        proc.store(scratch, struct.pack(UFFDIO_API_FMT, UFFD_API, features, 0))
        if proc.ioctl(fd, UFFDIO_API, scratch) < 0:
            proc.munmap(scratch, proc.machine.page_size)
            proc.close(fd)
            return None
        return cls(proc, fd, scratch)

    def _pages(self, start: int, end: int) -> tuple[int, int]:
        ps = self.proc.machine.page_size
        return start & ~(ps - 1), -(-end // ps) * ps

    def subscribe(self, start: int, end: int) -> bool:
        """ofi_uffd_subscribe: UFFDIO_REGISTER the pages of [start, end)."""
        lo, hi = self._pages(start, end)
        self.proc.store(self.scratch, struct.pack(UFFDIO_REGISTER_FMT, lo, hi - lo,
                                                  UFFDIO_REGISTER_MODE_MISSING, 0))
        return self.proc.ioctl(self.fd, UFFDIO_REGISTER, self.scratch) == 0

    def unsubscribe(self, cache: ofi_mr_cache, start: int, end: int) -> None:
        """ofi_uffd_unsubscribe: UFFDIO_UNREGISTER, unless another cached entry still
        covers those pages (ofi_uffd_can_unsubscribe)."""
        lo, hi = self._pages(start, end)
        for e in cache.entries.values():
            if e.iface != FI_HMEM_CUDA and e.start < hi and lo < e.end:
                return
        self.proc.store(self.scratch, struct.pack(UFFDIO_RANGE_FMT, lo, hi - lo))
        self.proc.ioctl(self.fd, UFFDIO_UNREGISTER, self.scratch)

    def stop(self) -> None:
        self.proc.close(self.fd)
        self.proc.munmap(self.scratch, self.proc.machine.page_size)


def uffd_drain(cache: ofi_mr_cache) -> None:
    """ofi_uffd_handler's loop: read every queued event; an unmap (or remove) drops
    the cached entries of its range."""
    mon = cache.uffd
    while mon.proc.read(mon.fd, mon.scratch, UFFD_MSG_SIZE) == UFFD_MSG_SIZE:
        event, _, _, _, start, end, _ = struct.unpack(
            UFFD_MSG_FMT, mon.proc.load(mon.scratch, UFFD_MSG_SIZE))
        if event in (UFFD_EVENT_UNMAP, UFFD_EVENT_REMOVE):     # arg.remove {start, end}
            ofi_mr_cache_notify(cache, start, end - start, 0)

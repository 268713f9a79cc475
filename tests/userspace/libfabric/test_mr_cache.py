"""The registration cache behind fi_mr_reg: lazy unpinning, LRU eviction by count and
size, the memhooks and CUDA monitors, retry when pinning runs out, and never a stale
registration after free + reallocate at the same address.  The suite's leak check
after each test proves every cached pin was released."""

from __future__ import annotations

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.mm import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE
from userspace.cuda.runtime import cudart
from userspace.libfabric.fi_errno import FI_EFAULT, FI_EINVAL
from userspace.libfabric.fi_mr import (
    FI_HMEM,
    FI_HMEM_CUDA,
    FI_MR_ALLOCATED,
    FI_MR_LOCAL,
    FI_MR_PROV_KEY,
    FI_MR_VIRT_ADDR,
    FI_REMOTE_READ,
    FI_REMOTE_WRITE,
    fi_close,
    fi_domain,
    fi_mr_key,
    fi_mr_reg,
)

BASIC = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY
K4, K64 = 1 << 12, 1 << 16
RW = MAP_PRIVATE | MAP_ANONYMOUS


@pytest.fixture
def host():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem")
    yield m


def mkeys(m) -> int:
    return len(m.hcas[0].fw.mkeys)


def phys_page(p, va) -> int:
    """The physical page the CPU reaches at va (the identity IOMMU: the DMA address)."""
    got = []
    p._access(va, 1, False, lambda phys, off, k: got.append(phys))
    return got[0] & ~(K4 - 1)


def mtt_page(m, mr) -> int:
    """The page the HCA's translation table (big-endian MTT entries, each a block of
    2^log_page_size bytes) gives for the MR's first page."""
    mk = m.hcas[0].fw.mkeys[mr.ibv_mr.lkey >> 8]
    raw = int(mk.pas.view[0])
    block = int.from_bytes(raw.to_bytes(8, "little"), "big") & ~(K4 - 1)
    return (block + (mk.mkc["start_addr"] & ((1 << mk.mkc["log_page_size"]) - 1))) & ~(K4 - 1)


def reg(dom, addr, n=K64, access=FI_REMOTE_WRITE):
    ret, mr = fi_mr_reg(dom, addr, n, access, 0, 0, 0)
    assert ret == 0, ret
    return mr


def test_a_closed_registration_stays_pinned_and_is_found_again(host):
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = p.mmap(0, K64)
        a = reg(dom, buf)
        key = fi_mr_key(a)
        fi_close(a)
        assert mkeys(host) == 1 and dom.cache.cached_cnt == 1     # lazily: still there
        b = reg(dom, buf)                                          # a hit
        c = reg(dom, buf + K4, 2 * K4)                             # inside it
        assert fi_mr_key(b) == fi_mr_key(c) == key and mkeys(host) == 1
        st = dom.cache.stats
        assert (st["search"], st["hit"], st["miss"]) == (3, 2, 1)
        assert st["bytes_pinned"] == K64 == dom.cache.cached_size
        assert fi_close(dom) < 0                                   # MRs still open
        fi_close(b)
        fi_close(c)
        assert fi_close(dom) == 0 and mkeys(host) == 0             # the cache is flushed
    p.run(go)
    p.exit(0)


def test_a_wider_access_is_a_miss(host):
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = p.mmap(0, K64)
        fi_close(reg(dom, buf, access=FI_REMOTE_READ))
        b = reg(dom, buf, access=FI_REMOTE_WRITE)
        # the read-only entry leaves the cache; the new one covers both accesses
        assert dom.cache.stats["miss"] == 2 and mkeys(host) == 1
        assert dom.cache.cached_cnt == 1 == len(dom.cache.entries)
        mkc = host.hcas[0].fw.mkeys[b.ibv_mr.lkey >> 8].mkc
        assert mkc["rr"] == 1 and mkc["rw"] == 1
        c = reg(dom, buf, access=FI_REMOTE_READ)                  # now a hit
        assert dom.cache.stats["hit"] == 1 and c.key == b.key
        fi_close(c)
        fi_close(b)
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_entries_sharing_a_start_each_hit_their_own_registration(host):
    """The hit path probes by start address; two cached ranges starting at the same
    address each still hit their own registration, before and after the other goes."""
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = p.mmap(0, K64)
        small = reg(dom, buf, K4)
        k_small = fi_mr_key(small)
        fi_close(small)
        big = reg(dom, buf, K64)                                   # does not fit: a miss
        k_big = fi_mr_key(big)
        fi_close(big)
        assert k_small != k_big and dom.cache.cached_cnt == 2 and mkeys(host) == 2
        for n, key in ((K4, k_small), (K64, k_big), (K4, k_small)):
            mr = reg(dom, buf, n)
            assert fi_mr_key(mr) == key
            fi_close(mr)
        assert (dom.cache.stats["hit"], dom.cache.stats["miss"]) == (3, 2)
        big_entry = dom.cache.entries[(0, 0, buf, buf + K64)]
        dom.cache._remove(big_entry)                               # the one `starts` holds
        dom.cache._free(big_entry)
        mr = reg(dom, buf, K4)
        assert fi_mr_key(mr) == k_small and dom.cache.stats["hit"] == 4
        fi_close(mr)
        assert fi_close(dom) == 0 and mkeys(host) == 0
    p.run(go)
    p.exit(0)


@pytest.mark.parametrize("env", [{"FI_MR_CACHE_MAX_COUNT": "2"},
                                 {"FI_MR_CACHE_MAX_SIZE": str(2 * K64)}])
def test_the_coldest_unused_entry_is_evicted_past_either_limit(host, env):
    p = host.spawn("app", environ=env)

    def go():
        _, dom = fi_domain(p, BASIC)
        bufs = [p.mmap(0, K64) for _ in range(3)]
        keys = []
        for b in bufs:
            mr = reg(dom, b)
            keys.append(fi_mr_key(mr))
            fi_close(mr)
        assert dom.cache.stats["evict"] == 1 and mkeys(host) == 2
        assert [e.start for e in dom.cache.lru] == bufs[1:]       # the first one went
        again = reg(dom, bufs[2])                                 # still cached: a hit
        assert fi_mr_key(again) == keys[2] and dom.cache.stats["hit"] == 1
        fi_close(again)
        fi_close(dom)
    p.run(go)
    p.exit(0)


@pytest.mark.parametrize("env", [{"FI_MR_CACHE_MAX_COUNT": "0"},
                                 {"FI_MR_CACHE_MONITOR": "disabled"}])
def test_count_zero_or_no_monitor_disables_the_cache(host, env):
    p = host.spawn("app", environ=env)

    def go():
        _, dom = fi_domain(p, BASIC)
        assert dom.cache is None
        mr = reg(dom, p.mmap(0, K64))
        assert mkeys(host) == 1
        fi_close(mr)
        assert mkeys(host) == 0                                   # deregistered at once
        fi_close(dom)
    p.run(go)
    p.exit(0)


@pytest.mark.parametrize("env", [{"FI_MR_CACHE_MONITOR": "magic"},
                                 {"FI_MR_CACHE_MAX_COUNT": "many"}])
def test_a_bad_cache_setting_fails_the_domain(host, env):
    p = host.spawn("app", environ=env)
    assert p.run(fi_domain, p, BASIC) == (-FI_EINVAL, None)
    p.exit(0)


def test_munmap_then_mmap_at_the_same_address_is_never_served_stale(host):
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = p.mmap(0, K64)
        p.store(buf, b"old")                               # the pages exist
        a = reg(dom, buf)
        old_key = fi_mr_key(a)
        assert mtt_page(host, a) == phys_page(p, buf)
        fi_close(a)
        p.munmap(buf, K64)                                 # memhooks: the entry goes
        assert dom.cache.stats["notify"] == 1 and mkeys(host) == 0
        assert p.mmap(buf, K64, 3, RW | MAP_FIXED) == buf  # new pages, same address
        p.store(buf, b"new")
        b = reg(dom, buf)
        assert dom.cache.stats["miss"] == 2 and fi_mr_key(b) != old_key
        # the new registration maps the new pages: the HCA sees what the CPU wrote now
        # a new mkey over the pages that back buf now (the allocator may hand back the
        # same physical page; what matters is that the old registration is gone)
        assert mtt_page(host, b) == phys_page(p, buf)
        fi_close(b)
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_munmap_of_a_registration_in_use_deregisters_it_at_its_close(host):
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = p.mmap(0, 2 * K64)
        a = reg(dom, buf, 2 * K64)
        p.munmap(buf + K64, K64)                  # half of it: the entry leaves the cache
        assert dom.cache.cached_cnt == 0 and mkeys(host) == 1 and a.entry.dead
        fi_close(a)
        assert mkeys(host) == 0
        p.munmap(buf, K64)
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_cuda_memory_is_cached_by_64k_pages_and_checked_by_buffer_id(host):
    p = host.spawn("app")

    def go():
        cu = cudart(p)
        _, dom = fi_domain(p, BASIC, FI_HMEM)
        d = cu.cudaMalloc(1 << 20)
        a = reg(dom, d + K4, 2 * K4)
        assert a.iface == FI_HMEM_CUDA and (a.entry.start, a.entry.end) == (d, d + K64)
        key = fi_mr_key(a)
        fi_close(a)
        b = reg(dom, d + 8 * K4, K4)                      # same GPU page: a hit
        assert fi_mr_key(b) == key
        fi_close(b)
        cu.cudaFree(d)                                    # the driver invalidates the MR
        d2 = cu.cudaMalloc(1 << 20)
        assert d2 == d                                    # the address comes back
        c = reg(dom, d2 + K4, 2 * K4)
        st = dom.cache.stats
        assert st["stale"] == 1 and fi_mr_key(c) != key  # a new buffer ID: registered anew
        fi_close(c)
        fi_close(dom)
        cu.cudaFree(d2)
    p.run(go)
    p.exit(0)


def test_without_the_cuda_monitor_cuda_memory_is_not_cached(host):
    p = host.spawn("app", environ={"FI_MR_CUDA_CACHE_MONITOR_ENABLED": "0"})

    def go():
        cu = cudart(p)
        _, dom = fi_domain(p, BASIC, FI_HMEM)
        d = cu.cudaMalloc(1 << 20)
        a = reg(dom, d)
        assert a.entry is None and dom.cache.cached_cnt == 0
        fi_close(a)
        assert mkeys(host) == 0
        fi_close(dom)
        cu.cudaFree(d)
    p.run(go)
    p.exit(0)


def test_out_of_locked_memory_the_cache_flushes_and_retries(host):
    p = host.spawn("app", rlimit_memlock=2 * K64)

    def go():
        _, dom = fi_domain(p, BASIC)
        bufs = [p.mmap(0, K64) for _ in range(3)]
        for b in bufs[:2]:
            fi_close(reg(dom, b))                         # 128 KiB pinned, unused
        c = reg(dom, bufs[2])                             # ENOMEM, flush, retry: works
        st = dom.cache.stats
        assert st["retry"] == 1 and st["evict"] == 2 and mkeys(host) == 1
        fi_close(c)
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_with_every_entry_in_use_a_registration_is_not_kept(host):
    p = host.spawn("app", environ={"FI_MR_CACHE_MAX_COUNT": "1"})

    def go():
        _, dom = fi_domain(p, BASIC)
        a = reg(dom, p.mmap(0, K64))
        b = reg(dom, p.mmap(0, K64))                      # no room, nothing to evict
        assert dom.cache.stats["uncached"] == 1 and dom.cache.cached_cnt == 1
        fi_close(b)
        assert mkeys(host) == 1                           # gone at its close
        fi_close(a)
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_the_userfaultfd_monitor_sees_the_kernel_report_an_unmap(host):
    p = host.spawn("app", environ={"FI_MR_CACHE_MONITOR": "userfaultfd"})

    def go():
        _, dom = fi_domain(p, BASIC)
        assert dom.cache.uffd is not None
        buf = p.mmap(0, 2 * K64)
        fi_close(reg(dom, buf, 2 * K64))
        vma = p.mm.find_vma(buf)
        assert vma.vm_userfaultfd_ctx is not None            # UFFDIO_REGISTER'd
        p.munmap(buf + K64, K64)                             # the kernel queues UNMAP
        assert dom.cache.cached_cnt == 1                     # not read yet
        assert p.mmap(buf + K64, K64, 3, RW | MAP_FIXED) == buf + K64
        b = reg(dom, buf, 2 * K64)                           # reads it first: a miss
        st = dom.cache.stats
        assert (st["notify"], st["miss"], st["hit"]) == (1, 2, 0)
        assert mtt_page(host, b) == phys_page(p, buf)
        fi_close(b)
        fi_close(dom)
        assert p.mm.find_vma(buf).vm_userfaultfd_ctx is None  # unregistered at close
        p.munmap(buf, 2 * K64)
    p.run(go)
    p.exit(0)


def test_an_unwatchable_range_is_registered_but_not_kept(host):
    """A PFN mapping (CUDA memory as system memory, in a domain without FI_HMEM) cannot
    be registered with a userfaultfd (EINVAL): the registration works, uncached."""
    p = host.spawn("app", environ={"FI_MR_CACHE_MONITOR": "userfaultfd"})

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(1 << 20)
        _, dom = fi_domain(p, BASIC)
        a = reg(dom, d, K64)
        assert dom.cache.stats["uncached"] == 1 and a.entry.dead
        fi_close(a)
        assert mkeys(host) == 0
        fi_close(dom)
        cu.cudaFree(d)
    p.run(go)
    p.exit(0)


def test_out_of_bar1_space_the_cache_flushes_and_retries():
    """BAR1 exhausted: nv_peer_mem's probe fails, ibv_reg_mr falls back to gup's EFAULT;
    for CUDA memory the cache takes that as out-of-resources, flushes, retries."""
    from kernel_model.hw.nvgpu import GpuConfig
    m = rdma_host(ram_size=64 << 20, nr_gpus=1, gpu=GpuConfig(bar1_size=64 << 20))
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem")
    p = m.spawn("app", rlimit_memlock=1 << 40)   # BAR1 room above the 36 MiB reserve: 28 MiB

    def go():
        cu = cudart(p)
        _, dom = fi_domain(p, BASIC, FI_HMEM)
        a, b = cu.cudaMalloc(16 << 20), cu.cudaMalloc(16 << 20)
        fi_close(reg(dom, a, 16 << 20))   # cached, unused: 16 MiB of BAR1 kept mapped
        _, plain = fi_domain(p, BASIC, FI_HMEM, env={"FI_MR_CACHE_MONITOR": "disabled"})
        assert fi_mr_reg(plain, b, 16 << 20, FI_REMOTE_WRITE, 0, 0, 0) == (-FI_EFAULT, None)
        fi_close(plain)
        c = reg(dom, b, 16 << 20)         # through the cache: EFAULT, flush, retry
        st = dom.cache.stats
        assert st["retry"] == 1 and st["evict"] == 1 and c.iface == FI_HMEM_CUDA
        fi_close(c)
        fi_close(dom)
        cu.cudaFree(a)
        cu.cudaFree(b)
    p.run(go)
    p.exit(0)


def test_mmap_fixed_over_a_cached_range_is_a_change_memhooks_hear(host):
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = p.mmap(0, K64)
        p.store(buf, b"old")
        fi_close(reg(dom, buf))
        assert p.mmap(buf, K64, 3, RW | MAP_FIXED) == buf    # replaces it, no munmap
        p.store(buf, b"new")
        b = reg(dom, buf)
        assert dom.cache.stats["notify"] == 1 and dom.cache.stats["hit"] == 0
        assert mtt_page(host, b) == phys_page(p, buf)
        fi_close(b)
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_without_virt_addr_there_is_no_cache(host):
    """A cached registration of a larger range would give offsets from its start."""
    p = host.spawn("app")

    def go():
        _, dom = fi_domain(p, FI_MR_ALLOCATED | FI_MR_PROV_KEY)
        assert dom.cache is None
        fi_close(dom)
    p.run(go)
    p.exit(0)


def test_cuda_memory_in_a_process_without_a_gpu_is_enosys():
    from userspace.libfabric.fi_errno import FI_ENOSYS
    from userspace.libfabric.fi_mr import fi_mr_attr, fi_mr_regattr
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib")
    p = m.spawn("app")

    def go():
        _, dom = fi_domain(p, BASIC, FI_HMEM)
        buf = p.mmap(0, K64)
        attr = fi_mr_attr([(buf, K64)], FI_REMOTE_WRITE, iface=FI_HMEM_CUDA)
        assert fi_mr_regattr(dom, attr) == (-FI_ENOSYS, None)
        fi_close(dom)
    p.run(go)
    p.exit(0)


class _FakeMr:
    access = FI_REMOTE_WRITE


def test_the_lru_list_is_in_release_order_and_never_evicts_an_entry_in_use():
    """The LRU list keeps its newest entry in place while a hit uses it (so the same
    range registered again and again moves nothing); released entries still line up
    in the order they were released, and eviction takes only unused ones."""
    from userspace.libfabric.mr_cache import (
        ofi_mr_cache,
        ofi_mr_cache_delete,
        ofi_mr_cache_flush,
        ofi_mr_cache_search,
    )

    freed = []
    cache = ofi_mr_cache(None, {"FI_MR_CACHE_MAX_COUNT": "2"},
                         lambda *region: (0, _FakeMr()), lambda mr: freed.append(mr) or 0)

    def get(addr):
        ret, e = ofi_mr_cache_search(cache, addr, K4, FI_REMOTE_WRITE, 0, 0)
        assert ret == 0
        return e

    def order():
        return [e.start for e in cache.lru if not e.use_cnt]

    a = get(0x10000)
    ofi_mr_cache_delete(cache, a)
    b = get(0x20000)
    ofi_mr_cache_delete(cache, b)
    assert order() == [0x10000, 0x20000] and cache.lru_tail is b
    assert get(0x10000) is a and get(0x20000) is b       # hits: a leaves, b stays put
    assert list(cache.lru) == [b] and cache.stats["hit"] == 2
    ofi_mr_cache_delete(cache, a)                         # a is released first ...
    assert list(cache.lru) == [a]                         # ... b, in use, left the list
    ofi_mr_cache_delete(cache, b)
    assert order() == [0x10000, 0x20000]
    assert get(0x20000) is b                              # the newest, in use, stays
    c = get(0x30000)                                      # a miss past the limit:
    assert cache.stats["evict"] == 1 and freed == [a.mr]             # a went, not b
    assert cache.entries.get((0, 0, 0x20000, 0x20000 + K4)) is b
    assert ofi_mr_cache_flush(cache) == 0                 # nothing unused to flush
    ofi_mr_cache_delete(cache, c)
    ofi_mr_cache_delete(cache, b)
    assert order() == [0x30000, 0x20000]
    assert ofi_mr_cache_flush(cache) == 2 and freed == [a.mr, c.mr, b.mr]
    assert not cache.lru and cache.lru_tail is None and cache.cached_cnt == 0

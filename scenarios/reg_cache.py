"""The registration cache in front of fi_mr_reg (userspace/libfabric), traced."""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from scenarios import scenario
from userspace.cuda.runtime import cudart
from userspace.libfabric.fi_mr import (
    FI_HMEM,
    FI_MR_ALLOCATED,
    FI_MR_LOCAL,
    FI_MR_PROV_KEY,
    FI_MR_VIRT_ADDR,
    FI_REMOTE_WRITE,
    fi_close,
    fi_domain,
    fi_mr_reg,
)

KiB64, MiB = 1 << 16, 1 << 20
BASIC = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY


def reg_and_close(dom, addr: int, length: int) -> int:
    """fi_mr_reg, then fi_close (the cache keeps the registration); the key."""
    ret, mr = fi_mr_reg(dom, addr, length, FI_REMOTE_WRITE, 0, 0, 0)
    assert ret == 0, ret
    key = mr.key
    fi_close(mr)
    return key


@scenario("reg-cache", "fi_mr_reg through a registration cache of two entries: a miss, "
          "hits, an eviction, cudaFree invalidating a cached GPU MR, the address reused")
def reg_cache() -> str:
    m = rdma_host(nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem", persistent_api_support=0)
    p = m.spawn("app", environ={"FI_MR_CACHE_MAX_COUNT": "2"})

    def story() -> dict[str, int]:
        cu = cudart(p)
        _, dom = fi_domain(p, BASIC, FI_HMEM)
        a, b = p.mmap(0, KiB64), p.mmap(0, KiB64)
        d = cu.cudaMalloc(MiB)
        reg_and_close(dom, a, KiB64)              # miss: registered, kept
        reg_and_close(dom, a, KiB64)              # hit
        reg_and_close(dom, a + 4096, 8192)        # hit: inside the cached range
        reg_and_close(dom, b, KiB64)              # miss
        reg_and_close(dom, d, MiB)                # miss: the coldest (a) is evicted
        cu.cudaFree(d)                            # the driver revokes the cached GPU MR
        d2 = cu.cudaMalloc(MiB)                   # the same address, a new buffer ID
        reg_and_close(dom, d2, MiB)               # stale: dropped, registered anew
        stats = dict(dom.cache.stats)
        fi_close(dom)                             # the cache is flushed
        cu.cudaFree(d2)
        return stats

    stats = p.run(story)
    p.exit(0)
    m.check_leaks()
    return "  ".join(f"{k} {v}" for k, v in stats.items()) + "\n"

"""ib_peer_umem_get refuses a dma_map table that breaks the layout rule (# EMU: the real
core trusts it): get_page_size a power of two, the entries covering exactly the range
at that page size, each DMA address congruent with the VA it maps.  A refusal is
EINVAL naming the function and the rule, with everything unwound: dma_unmap,
put_pages, release, the id, the client's use count - no pin left.
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.device import ib_device_get_by_name
from drivers.ib_core.peer_mem import IB_PEER_MEM_INVAL_SUPP, ib_peer_sg_violation
from drivers.ib_core.umem import IB_ACCESS_LOCAL_WRITE, ib_umem_get_peer
from kernel_model.errno import KernelError
from kernel_model.refcount import refcount_read
from tests.drivers.ib_core.fake_peer import K64, PeerEnv
from userspace.libibverbs.cmd import VerbsError

UNWOUND = ["acquire", "get_pages", "dma_map", "get_page_size", "dma_unmap", "put_pages",
           "release"]


@pytest.fixture(params=["25.04", "4.9"])
def env(request):
    e = PeerEnv(ofed=request.param)
    yield e
    e.close()


def _short(fp):
    """dma_map's table one client page short of the range."""
    real = fp.dma_map

    def dma_map(sg_head, ctx, dev, dmasync, nmap):
        ret = real(sg_head, ctx, dev, dmasync, nmap)
        nmap[0] -= 1
        sg_head.nents = nmap[0]
        return ret
    fp.client.dma_map = dma_map


def _page_size(fp, size):
    fp.client.get_page_size = lambda ctx: fp.get_page_size(ctx) and size


def _shifted(fp, by):
    """Every DMA address `by` bytes off the client page it should start."""
    real = fp.dma_map

    def dma_map(sg_head, ctx, dev, dmasync, nmap):
        ret = real(sg_head, ctx, dev, dmasync, nmap)
        for i in range(nmap[0]):
            sg_head.dma_addr.view[i] += by
        return ret
    fp.client.dma_map = dma_map


def _refused(env, fp, va, size) -> KernelError:
    def get():
        return ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, size,
                                IB_ACCESS_LOCAL_WRITE, IB_PEER_MEM_INVAL_SUPP)
    with pytest.raises(KernelError) as ei:
        env.p.run(get)
    assert ei.value.errno == errno.EINVAL
    assert str(ei.value).startswith("ib_peer_umem_get: fake_peer: ")
    assert fp.names() == UNWOUND
    ctx = fp.called("get_pages")[0].ctx
    assert fp.live_ctx == [] and ctx.pinned == [] and ctx.released   # no pin left
    assert fp.reg.umem_xa.entries == {} and fp.reg.core_ticket_list == {}
    assert refcount_read(fp.reg.usecnt) == 1
    assert fp.reg.stats["num_alloc_mrs"] == 0
    assert env.p.mm.pinned_vm == 0
    return ei.value


def test_a_short_table_is_refused(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    _short(fp)
    e = _refused(env, fp, va + 0x1000, 3 * K64)
    assert f"sg_table covers {3 * K64} bytes of the {4 * K64}-byte range" in str(e)


def test_a_page_size_not_a_power_of_two_is_refused(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    _page_size(fp, 48 << 10)
    e = _refused(env, fp, va + 0x1000, 3 * K64)
    assert "page size 48 KiB is not a power of two (get_page_size)" in str(e)


def test_incongruent_addresses_are_refused(env):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    _shifted(fp, 0x1000)
    e = _refused(env, fp, va, 2 * K64)
    assert (f"VA {va:#x} and DMA address {fp.phys(va) + 0x1000:#x} not congruent "
            "modulo page size 64 KiB") in str(e)


def test_lengths_that_wrap_past_2_64_are_refused(env):
    """Entries of 2^63 and 2^63 + 128 KiB, then 64 KiB: summed modulo 2^64 they would
    cover exactly the 192 KiB range, every address congruent; the walk stops where
    the VA would pass 2^64."""
    fp = env.peer()
    va = env.gpu(3 * K64, fp)
    real = fp.dma_map

    def dma_map(sg_head, ctx, dev, dmasync, nmap):
        ret = real(sg_head, ctx, dev, dmasync, nmap)
        sg_head.dma_len.view[0] = 1 << 63
        sg_head.dma_len.view[1] = (1 << 63) + 2 * K64
        return ret
    fp.client.dma_map = dma_map
    e = _refused(env, fp, va, 3 * K64)
    assert f"entry 1 of {(1 << 63) + 2 * K64:#x} bytes runs past the end of the address " \
        "space" in str(e)


def test_a_page_size_the_addresses_disagree_with_is_refused(env):
    """64 KiB-aligned blocks declared as 128 KiB pages: the first entry's address need
    not be 128 KiB-aligned, or the table covers the wrong span."""
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    _page_size(fp, 2 * K64)
    e = _refused(env, fp, va + K64, K64)
    assert "not congruent" in str(e) or "sg_table covers" in str(e)


def test_through_verbs_the_registration_fails_einval_and_the_client_stays_usable(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    real = fp.client.dma_map
    _short(fp)
    with pytest.raises(VerbsError) as ei:
        env.reg_mr(va, 4 * K64)
    assert ei.value.errno == errno.EINVAL
    fp.client.dma_map = real                  # a fixed client registers the same range
    mr = env.reg_mr(va, 4 * K64)
    env.dereg(mr)
    assert fp.reg.stats["num_alloc_mrs"] == fp.reg.stats["num_dealloc_mrs"] == 1


def test_correct_tables_pass_the_rule():
    assert ib_peer_sg_violation([(0x10000, 0x20000)], 0x5123, 0x10000, 0x10000) is None
    assert ib_peer_sg_violation([(0x7000, 0x1000), (0x3000, 0x2000)], 0x1010, 0x2000,
                                0x1000) is None
    # page size below the entries' alignment, DMA addresses at any page boundary
    assert ib_peer_sg_violation([(0x9000, 0x1000)], 0x4000, 0x1000, 0x1000) is None


@pytest.mark.parametrize("entries, addr, size, pps, text", [
    ([(0x10000, 0x10000)], 0x5123, 0x10000, 0x10000, "covers 65536 bytes of the 131072"),
    ([(0x10000, 0x30000)], 0x5123, 0x10000, 0x10000, "covers 196608 bytes of the 131072"),
    ([], 0x0, 0x1000, 0x1000, "covers 0 bytes of the 4096"),
    ([(0x10000, 0x20000)], 0x0, 0x10000, 0xC000, "48 KiB is not a power of two"),
    ([(0x10000, 0x20000)], 0x0, 0x10000, 0, "0 bytes is not a power of two"),
    ([(0x10000, 0x8000), (0x30000, 0x8000)], 0x0, 0x10000, 0x10000,
     "VA 0x8000 and DMA address 0x30000 not congruent"),
    # lengths that wrap a u64 past the range's size: refused, not summed modulo 2^64
    ([(0x0, 1 << 63), (0x0, 1 << 63), (0x0, 0x1000)], 0x0, 0x1000, 0x1000,
     "entry 1 of 0x8000000000000000 bytes runs past the end of the address space"),
])
def test_each_rule_names_itself(entries, addr, size, pps, text):
    assert text in ib_peer_sg_violation(entries, addr, size, pps)

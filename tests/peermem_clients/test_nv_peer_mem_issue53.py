"""The proposed fixes the race corpus's fixed configurations and the default ladder use:
nv_peer_mem's issue53_fix (Mellanox/nv_peer_memory issue 53, open upstream) and
ib_core's late_invalidate_fix (MLNX_OFED peer_mem.c's ib_invalidate_peer_memory, 5.1b
to 25.04), each 0 or 1, the released behaviour kept selectable (docs/race-testing.md).

The races themselves are explored in tests/scenarios/test_race_corpus.py and
tests/peermem_testing/test_race_ladder_baseline.py; here each part of the fix is
checked by calling the client's callbacks the way ib_core and the GPU driver do.
"""

from __future__ import annotations

import errno

import pytest

from kernel_model.current import current
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.trace import Tracer
from tests.peermem_clients.test_nv_peer_mem import (
    K64,
    calls_named,
    free_spying,
    gpu_host,
    hca_dma_device,
    mapped_context,
    refcnt,
    state,
)
from userspace.cuda.runtime import cudart

FIXED = {"persistent_api_support": 0, "issue53_fix": 1}


@pytest.mark.parametrize("value", [2, -1])
def test_issue53_fix_takes_0_or_1(value):
    m = gpu_host(load=False)
    with pytest.raises(KernelError) as ei:
        m.load_module("nv_peer_mem", persistent_api_support=0, issue53_fix=value)
    assert ei.value.errno == errno.EINVAL and "issue53_fix" in str(ei.value)
    assert "nv_peer_mem" not in m.modules
    m.load_module("nv_peer_mem", **FIXED)              # a good value loads
    assert state(m).issue53_fix == 1


@pytest.mark.parametrize("value", [2, -1])
def test_late_invalidate_fix_takes_0_or_1(value):
    m = rdma_host(modules=())
    with pytest.raises(KernelError) as ei:
        m.load_module("ib_core", late_invalidate_fix=value)
    assert ei.value.errno == errno.EINVAL and "late_invalidate_fix" in str(ei.value)
    assert "ib_core" not in m.modules
    m.load_module("ib_core", late_invalidate_fix=0)
    assert m.modules["ib_core"].state.peer.late_invalidate_fix is False


def test_the_defaults_are_the_released_client_and_the_fixed_core():
    m = gpu_host(persistent_api_support=0)
    assert state(m).issue53_fix == 0
    assert m.modules["ib_core"].state.peer.late_invalidate_fix is True


@pytest.mark.parametrize("fix", [0, 1])
def test_dma_unmap_leaves_the_mappings_to_put_pages_only_with_the_fix(fix):
    """With the fix nv_dma_unmap calls nothing in the driver; put_pages unmaps the
    mapping (nv_p2p_free_page_table), so nothing is left mapped either way."""
    m = gpu_host(persistent_api_support=0, issue53_fix=fix)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st, ctx, sgt = mapped_context(m, p, d, 4)
    with Tracer() as t, p.kernel():
        assert st.nv_dma_unmap(sgt, ctx, hca_dma_device(m)) == 0
        st.nv_mem_put_pages(sgt, ctx)
        st.nv_mem_release(ctx)
    assert len(calls_named(t.trace, "nvidia_p2p_dma_unmap_pages")) == 1 - fix
    assert len(calls_named(t.trace, "nvidia_p2p_put_pages")) == 1
    assert refcnt(m) == 0 and m.gpus[0].bar1_ptes == {}
    cudart(p).cudaFree(d)
    p.exit(0)


def test_with_the_fix_the_teardown_after_a_callback_touches_nothing_freed():
    """The issue 53 window: the callback ran and the driver freed the page table; the
    teardown's dma_unmap, put_pages and release then come - 580 as released reads
    the freed table in nvidia_p2p_dma_unmap_pages (test_nv_peer_mem.py,
    test_free_callback_clears_callback_task)."""
    m = gpu_host(**FIXED)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st, ctx, sgt = mapped_context(m, p, d, 9)
    seen = []

    def spy(real, reg_handle, core_context):
        seen.append(core_context)
        return real(reg_handle, core_context)
    free_spying(p, d, st, spy)
    assert seen == [9]
    with Tracer() as t, p.kernel():
        assert st.nv_dma_unmap(sgt, ctx, hca_dma_device(m)) == 0
        st.nv_mem_put_pages(sgt, ctx)
        st.nv_mem_release(ctx)
    assert calls_named(t.trace, "nvidia_p2p_dma_unmap_pages") == []
    assert refcnt(m) == 0 and m.gpus[0].bar1_ptes == {}
    p.exit(0)


@pytest.mark.parametrize("fix", [0, 1])
def test_a_callback_before_dma_map_invalidates_only_with_the_fix(fix):
    """get_pages pinned, dma_map has not stored the mapping yet: 580 as released logs
    'invalid dma_mapping' and drops the invalidation (issues 53/112); the fix calls
    ib_core's invalidate, which the core's mapping_lock holds until activation."""
    m = gpu_host(persistent_api_support=0, issue53_fix=fix)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st = state(m)
    with p.kernel():
        cc = [None]
        assert st.nv_mem_acquire(d, K64, None, None, cc) == 1
        ctx = cc[0]
        assert st.nv_mem_get_pages(d, K64, 1, 0, None, ctx, 5) == 0
    seen = []
    free_spying(p, d, st, lambda real, reg, core_context: seen.append(core_context))
    dropped = any("invalid dma_mapping" in line for line in m.dmesg)
    assert (seen, dropped) == (([5], False) if fix else ([], True))
    with p.kernel():
        st.nv_mem_put_pages(None, ctx)      # a sg_table dma_map never filled
        st.nv_mem_release(ctx)
    assert refcnt(m) == 0
    p.exit(0)


def test_with_the_fix_the_callback_leaves_a_context_released_during_the_invalidation():
    """A deregistration of the invalidated MR may finish - release() frees the context -
    before the callback resumes after ib_core's invalidate: the callback must not
    write to it (580 as released resets callback_task there)."""
    m = gpu_host(**FIXED)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st, ctx, sgt = mapped_context(m, p, d, 2)
    tasks = []

    def spy(real, reg_handle, core_context):
        ret = real(reg_handle, core_context)
        tasks.append(ctx.callback_task is current())
        st.nv_mem_release(ctx)              # the concurrent dereg's release, here
        return ret
    free_spying(p, d, st, spy)              # no KASAN report: nothing written after
    assert tasks == [True]
    assert refcnt(m) == 0 and m.gpus[0].bar1_ptes == {}
    p.exit(0)


def test_with_the_fix_release_puts_a_pin_no_put_pages_undid():
    """An UNMAPS umem invalidated through the core alone (not by the client's callback)
    is released without put_pages: release puts the pin, so the later cudaFree calls
    no callback into the freed context."""
    m = gpu_host(**FIXED)
    p = m.spawn("app")
    d = cudart(p).cudaMalloc(K64)
    st, ctx, sgt = mapped_context(m, p, d, 6)
    with Tracer() as t, p.kernel():
        st.nv_mem_release(ctx)
    assert len(calls_named(t.trace, "nvidia_p2p_put_pages")) == 1
    assert m.gpus[0].bar1_ptes == {}
    called = []
    free_spying(p, d, st, lambda real, reg, core_context: called.append(core_context))
    assert called == [] and refcnt(m) == 0
    p.exit(0)

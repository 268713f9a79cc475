"""Tests for peermem_clients/amdp2p.py (ROCnRDMA's amdp2p) on the emulated AMD GPU.

Asserted: the registration (an invalidating "amdp2p" 1.0), ibv_reg_mr of VRAM
through it and an RDMA WRITE landing in VRAM, every callback's errno, the
module reference (acquire to release, none in the free callback), the
c2f76a7 behaviour (put_pages ignored after the callback) and what each
release does on each core: the B17 write into a freed context with c2f76a7
on a 4.9 core, and lockdep's report on a 5.1+ core, where ib_core holds
mapping_lock across get_pages (KFD takes the process mutex) while KFD holds
the process mutex across the free callback (ib_core takes mapping_lock).
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.peer_mem import peer_clients
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.slab import UseAfterFree
from kernel_model.trace import Tracer
from peermem_clients.amdp2p import amd_mem_context
from userspace.hip.runtime import hiprt
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, PD, Context, SendWR
from userspace.tools.write_bw import connect, setup

MiB = 1 << 20
K64 = 1 << 16


def amd_host(ofed: str = "25.04", **params):
    m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=1, modules=())
    m.load_module("ib_core", ofed=ofed)
    m.load_module("mlx5_ib")
    m.load_module("amdp2p", **params)
    return m


def state(m):
    return m.modules["amdp2p"].state


def pinned_by_hand(m, p, d: int):
    """amdp2p's acquire and get_pages of [d, d + 64K) called as ib_core would, with
    ib_core's invalidate callback replaced by a no-op (no umem behind this pin)."""
    st = state(m)
    with p.kernel():
        cc = [None]
        assert st.amd_acquire(d, K64, None, None, cc) == 1
        ctx = cc[0]
        assert st.amd_get_pages(d, K64, 1, 0, None, ctx, 0) == 0
    st.ib_invalidate_callback[0] = lambda handle, core_context: 0
    return st, ctx


def test_registers_one_invalidating_amdp2p_1_0():
    m = amd_host()
    with m.kernel():
        (client,) = peer_clients()
    assert client.peer_mem.name == "amdp2p" and client.peer_mem.version == "1.0"
    assert client.invalidation_required and state(m).ib_invalidate_callback[0] is not None
    m.unload_module("amdp2p")
    with m.kernel():
        assert peer_clients() == []


def test_bad_parameter_and_missing_kfd_fail_the_load():
    m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=1, modules=())
    m.load_module("mlx5_ib")
    with pytest.raises(KernelError) as ei:
        m.load_module("amdp2p", ignore_put_after_free=2)
    assert ei.value.errno == errno.EINVAL and "amdp2p" not in m.modules
    with m.kernel():
        assert peer_clients() == []


@pytest.mark.parametrize("ofed", ["4.9", "25.04"])
def test_rdma_write_lands_in_vram_through_an_amdp2p_mr(ofed):
    m = amd_host(ofed, ignore_put_after_free=0)
    p = m.spawn("app")
    hip = hiprt(p)
    a = p.run(setup, p, K64, 4, 0x100)
    b = p.run(setup, p, 4096, 4, 0x200)
    p.run(connect, a, b.dest())
    p.run(connect, b, a.dest())
    d = p.run(hip.hipMalloc, MiB)
    mr = p.run(MR, b.pd, MiB, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, d)
    assert m.modules["amdp2p"].refcnt == 1            # the MR's context holds the module
    data = bytes((i * 7 + 3) & 0xFF for i in range(K64))
    p.run(a.mr.write, data)

    def write() -> str:
        a.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(a.mr.buf, K64, a.mr.lkey)],
                              opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                              remote_addr=d + 0x3000, rkey=mr.rkey))
        (wc,) = a.cq.poll_until(1)
        return v.ibv_wc_status_str(wc.status)
    assert p.run(write) == "SUCCESS"
    kp = m.modules["amdgpu"].state.processes[0]
    (bo,) = kp.bos.values()
    gpu = m.gpus[0]
    first = bo.pages[0] << 16
    assert bytes(gpu.vidmem[first + 0x3000:first + 0x10000]) == data[:0xD000]
    p.run(mr.close)
    assert m.modules["amdp2p"].refcnt == 0
    p.run(hip.hipFree, d)
    p.exit(0)


def test_get_pages_and_dma_map_errors():
    m = amd_host()
    p = m.spawn("app")
    d = hiprt(p).hipMalloc(K64)
    st = state(m)
    with p.kernel():
        cc = [None]
        assert st.amd_acquire(d, K64, None, None, cc) == 1
        ctx = cc[0]
        assert m.modules["amdp2p"].refcnt == 1
        assert st.amd_get_pages(d, K64 // 2, 1, 0, None, ctx, 5) == -errno.EINVAL  # not acquired
        assert st.amd_get_pages(d, K64, 1, 0, None, None, 5) == -errno.EINVAL
        assert st.amd_dma_map(None, ctx, None, 0, [0]) == -errno.EINVAL       # no p2p_info
        assert st.amd_get_page_size(ctx) == m.page_size
        st.amd_release(ctx)
        assert m.modules["amdp2p"].refcnt == 0
        assert st.amd_acquire(d + K64, K64, None, None, cc) == 0             # not GPU memory
    p.exit(0)


def test_free_callback_takes_no_module_reference():
    m = amd_host("4.9", ignore_put_after_free=0)
    p = m.spawn("app")
    hip = hiprt(p)
    ctx = p.run(Context, p)
    d = p.run(hip.hipMalloc, K64)
    mr = p.run(MR, p.run(PD, ctx), K64, v.IBV_ACCESS_LOCAL_WRITE, d)
    refs = []
    st = state(m)
    real = st.ib_invalidate_callback[0]

    def spy(handle, core_context):
        refs.append(m.modules["amdp2p"].refcnt)
        return real(handle, core_context)
    st.ib_invalidate_callback[0] = spy
    try:
        with Tracer() as t:
            p.run(hip.hipFree, d)
    finally:
        st.ib_invalidate_callback[0] = real
    assert refs == [1]                                 # only the MR's
    assert m.modules["amdp2p"].refcnt == 0             # 4.x: released inside the callback
    # the MR's teardown unmaps inside the invalidation; KFD's put_pages then unlinks
    # the pin before KFD's loop would
    names = [c.func for c in t.trace.calls()]
    assert names.index("free_callback") < names.index("amd_put_pages")
    p.run(mr.close)
    p.run(ctx.close)
    p.exit(0)


def test_c2f76a7_put_pages_after_the_callback_is_ignored():
    m = amd_host(ignore_put_after_free=1)
    p = m.spawn("app")
    d = hiprt(p).hipMalloc(K64)
    st, ctx = pinned_by_hand(m, p, d)    # nobody registered
    hiprt(p).hipFree(d)                      # KFD calls back, then drops the pin itself
    assert ctx.free_callback_called == 1
    with Tracer() as t, p.kernel():
        st.amd_put_pages(None, ctx)          # ignored: KFD is not called
        st.amd_release(ctx)
    assert [c.func for c in t.trace.calls() if c.func == "put_pages"] == []
    p.exit(0)


def test_before_c2f76a7_put_pages_after_the_callback_uses_the_freed_pin():
    """B12: KFD released the pin (and its amd_p2p_info) after the callback; the old
    client's put_pages hands KFD the stale pointer."""
    m = amd_host(ignore_put_after_free=0)
    p = m.spawn("app")
    d = hiprt(p).hipMalloc(K64)
    st, ctx = pinned_by_hand(m, p, d)
    hiprt(p).hipFree(d)
    with p.kernel():
        with pytest.raises(UseAfterFree, match="amd_p2p_info"):
            st.amd_put_pages(None, ctx)
        st.amd_release(ctx)
    p.exit(0)


def test_c2f76a7_on_a_4_9_core_writes_into_the_context_release_freed():
    """B17 for amdp2p: mlx5 4.x deregisters the MR inside the invalidation (release()
    frees the context); the callback then sets free_callback_called in it."""
    m = amd_host("4.9", ignore_put_after_free=1)
    p = m.spawn("app")
    hip = hiprt(p)
    ctx = p.run(Context, p)
    d = p.run(hip.hipMalloc, K64)
    p.run(MR, p.run(PD, ctx), K64, v.IBV_ACCESS_LOCAL_WRITE, d)
    with pytest.raises(UseAfterFree, match="free_callback_called") as ei:
        p.run(hip.hipFree, d)
    assert amd_mem_context.__name__ in str(ei.value) and "amd_release" in str(ei.value)


def test_a_5_x_core_gets_a_lockdep_report_from_kfd_and_mapping_lock():
    """ib_core 5.1+ holds mapping_lock across get_pages, and KFD's get_pages takes the
    process mutex; KFD's free holds that mutex across the free callback, whose
    invalidation takes mapping_lock.  Lockdep reports the cycle (by lock class: the
    two mapping_locks are of different umems, so no deadlock was seen)."""
    m = amd_host("25.04", ignore_put_after_free=1)
    p = m.spawn("app")
    hip = hiprt(p)
    ctx = p.run(Context, p)
    d = p.run(hip.hipMalloc, K64)
    mr = p.run(MR, p.run(PD, ctx), K64, v.IBV_ACCESS_LOCAL_WRITE, d)
    assert m.bugs == []
    p.run(hip.hipFree, d)                  # completes: the report is a warning
    (report,) = m.bugs
    assert "circular locking" in report and "kfd_process.mutex" in report
    assert "mapping_lock" in report and "get_pages" in report
    m.bugs.clear()                         # seen; the rest of the run is clean
    p.run(mr.close)
    p.run(ctx.close)
    p.exit(0)

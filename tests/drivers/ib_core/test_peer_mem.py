"""Tests for drivers/ib_core/peer_mem.py (MLNX_OFED PeerDirect core) and the peer fallback
of ib_umem_get_peer (drivers/ib_core/umem.py).

A fake client (fake_peer.FakePeer) owns cudaMalloc'd addresses - which gup refuses,
the GPU's VMA being VM_IO|VM_PFNMAP - and backs them with host RAM of its own; it
records every callback call.  Registrations go through the real verbs path
(ibv_reg_mr -> ib_uverbs_reg_mr -> mlx5_ib_reg_user_mr -> ib_umem_get_peer), or call
ib_umem_get_peer directly in the process's context where the caller's flags matter.
The rules checked are peermem_facts.md sections 1 and 2 (OFED 25.x, with the sysfs
statistics of the releases before 24.04).
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.device import ib_device_get_by_name
from drivers.ib_core.peer_mem import (
    IB_PEER_MEM_ALLOW,
    IB_PEER_MEM_INVAL_SUPP,
    MANDATORY,
    PEER_MEM_INVALIDATE_UNMAPS,
    PEER_NO_INVALIDATION_ID,
    PEER_UMEM_TRANSITIONS,
    STATS,
    UMEM_PEER_INVALIDATED,
    UMEM_PEER_MAPPED,
    UMEM_PEER_UNMAPPED,
    ib_invalidate_peer_memory,
    ib_peer_unmap_on_invalidate,
    ib_umem_activate_invalidation_notifier,
    ib_umem_stop_invalidation_notifier,
    ib_unmap_peer_client,
    ib_unregister_peer_memory_client,
    peer_clients,
)
from drivers.ib_core.umem import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_REMOTE_READ,
    ib_umem_get,
    ib_umem_get_peer,
    ib_umem_release,
)
from kernel_model.errno import KernelError
from kernel_model.kthread import kthread_run
from kernel_model.locking import mutex_is_locked, mutex_unlock
from kernel_model.sched import SCHED
from kernel_model.sysfs import list_dir
from kernel_model.xarray import U32_MAX
from tests.drivers.ib_core.fake_peer import K64, FakePeer, PeerEnv
from userspace.libc import MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE
from userspace.libibverbs.cmd import VerbsError

PAGE = 4096
SYSFS = "/sys/kernel/mm/memory_peers"
INVAL_FLAGS = IB_PEER_MEM_INVAL_SUPP
# the four ways a client can be declared: (FakePeer kwargs, unmaps on invalidate?)
KINDS = {
    "plain": ({}, False),
    "ex_size0": ({"ex": True, "ex_size": 0, "ex_flags": PEER_MEM_INVALIDATE_UNMAPS}, False),
    "ex_flags0": ({"ex": True, "ex_flags": 0}, False),
    "unmaps": ({"unmaps": True}, True),
}


@pytest.fixture
def env():
    e = PeerEnv()
    yield e
    e.close()


def zero_stats() -> dict[str, int]:
    return dict.fromkeys(STATS, 0)


def in_kernel(env, fn, *args):
    """Run fn as kernel code of the test (init_task's context)."""
    with env.m.kernel():
        return fn(*args)


def get_umem(env, va, size, flags, access=IB_ACCESS_LOCAL_WRITE, then=None):
    """ib_umem_get_peer in the process's context; `then(umem)` runs in the same task
    (an invalidating client's mapping_lock belongs to the task that got the umem)."""
    def fn():
        umem = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, size, access, flags)
        return then(umem) if then is not None else umem
    return env.p.run(fn)


def finish(umem):
    """The owner's teardown: stop the notifier, release."""
    ib_umem_stop_invalidation_notifier(umem)
    ib_umem_release(umem)


def recorder(log):
    def func(umem, priv):
        log.append((umem, priv))
    return func


# -- registration ---------------------------------------------------------------------------
@pytest.mark.parametrize("missing", MANDATORY)
def test_missing_mandatory_callback_refuses_registration(env, missing):
    fp = FakePeer(env.m, omit=(missing,))
    assert fp.register() is None
    assert env.m.dmesg[-1] == (f"ib_core: Peer memory fake_peer is missing mandatory "
                               f"function {missing}")
    assert in_kernel(env, peer_clients) == []
    assert fp.inval_cb == [None]                  # the callback slot is not filled
    assert list_dir(env.m, SYSFS) == []


def test_registration_fills_the_invalidate_slot_and_publishes_sysfs(env):
    fp = env.peer(version="2.5-rc1")
    nc = env.peer("fake_nc", invalidating=False)
    assert fp.inval_cb == [ib_invalidate_peer_memory]
    assert fp.reg.invalidation_required and not nc.reg.invalidation_required
    assert in_kernel(env, peer_clients) == [fp.reg, nc.reg]          # registration order
    assert list_dir(env.m, SYSFS) == ["fake_nc", "fake_peer"]
    assert sorted(list_dir(env.m, f"{SYSFS}/fake_peer")) == sorted(("version",) + STATS)
    assert env.sysfs(f"{SYSFS}/fake_peer/version") == "2.5-rc1\n"
    for name in STATS:
        assert env.sysfs(f"{SYSFS}/fake_peer/{name}") == "0\n"
    fp.unregister()
    assert env.sysfs(f"{SYSFS}/fake_peer/version") is None
    assert env.sysfs(f"{SYSFS}/fake_peer/num_alloc_mrs") is None
    assert list_dir(env.m, SYSFS) == ["fake_nc"]
    assert in_kernel(env, peer_clients) == [nc.reg]
    nc.unregister()
    assert list_dir(env.m, SYSFS) == []


def test_version_string_limit():
    # char version[16]: 15 characters and the NUL; an _ex client keeps the last byte for
    # its marker (the clients' BUG_ON(strlen(version) > IB_PEER_MEMORY_VER_MAX - 2))
    from drivers.ib_core.peer_mem import peer_memory_client, peer_memory_client_ex
    peer_memory_client("x", "123456789012345")
    with pytest.raises(ValueError):
        peer_memory_client("x", "1234567890123456")
    peer_memory_client_ex(peer_memory_client("x", "12345678901234"))
    with pytest.raises(ValueError):
        peer_memory_client_ex(peer_memory_client("x", "123456789012345"))
    with pytest.raises(ValueError):
        peer_memory_client("n" * 64, "1")


def test_a_client_without_get_page_size_registers_and_crashes_on_first_use(env):
    """The core checks five callbacks, not get_page_size, but calls it after dma_map
    (peermem_facts 1.3): registering works, the first MR oopses."""
    fp = env.peer(omit=("get_page_size",))
    assert fp.reg is not None
    va = env.gpu(2 * K64, fp)
    with pytest.raises(TypeError):
        env.reg_mr(va, 2 * K64)
    assert fp.names() == ["acquire", "get_pages", "dma_map"]
    # an oopsed kernel: mapping_lock stays held and the client busy for ever, so no
    # teardown can finish; the machine is abandoned, not checked
    env.m.leak_check_expected = False
    env.close = lambda: None
    SCHED.abandon()                        # its workers are unwound, as after a panic


@pytest.mark.parametrize("omit", [("release",)])
def test_get_page_size_and_release_are_optional(env, omit):
    fp = env.peer(omit=omit)
    assert fp.reg is not None
    va = env.gpu(2 * K64, fp)
    mr = env.reg_mr(va, 2 * K64)
    env.dereg(mr)
    expect = ["acquire", "get_pages", "dma_map", "get_page_size", "dma_unmap", "put_pages",
              "release"]
    assert fp.names() == [n for n in expect if n not in omit]
    st = fp.reg.stats
    assert (st["num_alloc_mrs"], st["num_dealloc_mrs"]) == (1, 1)
    assert st["num_reg_pages"] == st["num_dereg_pages"] == 2
    if "release" in omit:                  # nobody released the context: drop it ourselves
        fp.live_ctx.clear()


@pytest.mark.parametrize("kind", KINDS)
def test_unmap_on_invalidate_detection(env, kind):
    kw, unmaps = KINDS[kind]
    fp = env.peer(**kw)
    assert ib_peer_unmap_on_invalidate(fp.reg) is unmaps
    assert fp.client.version_ex == (0 if kind == "plain" else 1)
    if kind != "plain":
        assert fp.client.container is fp.client_ex


def test_ex_size_below_flags_is_old_style(env):
    fp = env.peer(ex=True, ex_size=1, ex_flags=PEER_MEM_INVALIDATE_UNMAPS)
    assert not ib_peer_unmap_on_invalidate(fp.reg)


def test_duplicate_name_registration_fails_cleanly(env):
    first = env.peer("dup")
    second = FakePeer(env.m, "dup")
    try:
        handle = second.register()
    except KernelError:
        handle = "raised"
    state = _peer_state(env)
    locked = mutex_is_locked(state.peer_memory_mutex)
    listed = [c for c in state.peer_memory_list if c.peer_mem is second.client]
    # undo what the failed registration left behind, so the leak check passes
    if locked:
        with env.m.kernel():
            mutex_unlock(state.peer_memory_mutex)
    state.peer_memory_list[:] = [first.reg]
    assert (handle, locked, listed) == (None, False, [])
    assert env.sysfs(f"{SYSFS}/dup/version") == "1.0\n"    # the first one's files stay


def _peer_state(env):
    from drivers.ib_core.peer_mem import _peer_state as ps
    with env.m.kernel():
        return ps()


# -- which client: ib_get_peer_client -----------------------------------------------------
def test_first_registered_client_wins(env):
    a, b = env.peer("peer_a"), env.peer("peer_b")
    va = env.gpu(K64, a, b)
    mr = env.reg_mr(va, K64)
    assert a.names() == ["acquire", "get_pages", "dma_map", "get_page_size"]
    assert b.names() == []                    # never asked
    assert a.calls[0].args == (va, K64, None, None)    # acquire(addr, size, NULL, NULL, &ctx)
    env.dereg(mr)
    assert b.names() == []
    assert a.reg.stats["num_alloc_mrs"] == 1 and b.reg.stats == zero_stats()


def test_declining_client_is_passed_over_without_release(env):
    a, b = env.peer("peer_a"), env.peer("peer_b")
    va = env.gpu(K64, a, b)
    a.claim = False
    mr = env.reg_mr(va, K64)
    env.dereg(mr)
    assert a.names() == ["acquire"]           # "not mine": no release either
    assert b.names() == ["acquire", "get_pages", "dma_map", "get_page_size", "dma_unmap",
                         "put_pages", "release"]


def test_acquire_error_counts_as_not_mine(env):
    a, b = env.peer("peer_a"), env.peer("peer_b")
    va = env.gpu(K64, a, b)
    a.fail["acquire"] = errno.EIO
    env.dereg(env.reg_mr(va, K64))
    assert a.names() == ["acquire"] and b.names()[0] == "acquire" and b.live_ctx == []


def test_invalidating_client_needs_inval_supp(env):
    inv = env.peer("inv")
    nc = env.peer("nc", invalidating=False)
    va = env.gpu(2 * K64, inv, nc)
    # a caller that cannot take invalidations (a CQ buffer, say): the invalidating
    # client is skipped without being asked
    umem = get_umem(env, va, K64, 0)
    assert umem.is_peer and umem.ib_peer_client is nc.reg
    assert umem.xa_id == PEER_NO_INVALIDATION_ID == U32_MAX
    assert inv.names() == []
    assert nc.called("get_pages")[0].core_context == U32_MAX
    assert not mutex_is_locked(umem.mapping_lock)     # no id: unlocked at once
    assert not nc.reg.umem_xa.entries
    env.p.run(ib_umem_release, umem)           # no notifier to stop
    assert nc.names() == ["acquire", "get_pages", "dma_map", "get_page_size", "dma_unmap",
                          "put_pages", "release"]
    # with IB_PEER_MEM_INVAL_SUPP the first registered (invalidating) client wins
    got = get_umem(env, va, K64, INVAL_FLAGS, then=lambda u: (u.ib_peer_client, u.xa_id,
                                                               finish(u)))
    assert got[:2] == (inv.reg, 0)
    assert len(nc.called("acquire")) == 1


def test_no_client_for_a_plain_caller_gives_efault(env):
    inv = env.peer("inv")
    va = env.gpu(K64, inv)
    with pytest.raises(KernelError) as ei:
        get_umem(env, va, K64, 0)
    assert ei.value.errno == errno.EFAULT
    assert inv.names() == [] and env.p.mm.pinned_vm == 0


def test_plain_ib_umem_get_never_tries_peers(env):
    nc = env.peer("nc", invalidating=False)
    va = env.gpu(K64, nc)
    with pytest.raises(KernelError) as ei:
        env.p.run(lambda: ib_umem_get(ib_device_get_by_name("mlx5_0"), va, K64,
                                      IB_ACCESS_LOCAL_WRITE))
    assert ei.value.errno == errno.EFAULT
    assert nc.names() == [] and env.p.mm.pinned_vm == 0


def test_host_memory_never_reaches_the_peers(env):
    nc = env.peer("nc", invalidating=False)
    buf = env.p.run(env.p.mmap, 0, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
    umem = get_umem(env, buf, 4 * PAGE, IB_PEER_MEM_ALLOW)
    assert not umem.is_peer and nc.names() == []
    env.p.run(ib_umem_release, umem)


def test_no_client_claims_returns_gups_efault(env):
    fp = env.peer()
    va = env.gpu(K64)                              # fp does not own it
    with pytest.raises(VerbsError) as ei:
        env.reg_mr(va, K64)
    assert ei.value.errno == errno.EFAULT
    assert fp.names() == ["acquire"]
    assert env.p.mm.pinned_vm == 0
    assert fp.reg.stats == zero_stats()


def test_no_client_at_all_returns_efault(env):
    va = env.gpu(K64)
    with pytest.raises(VerbsError) as ei:
        env.reg_mr(va, K64)
    assert ei.value.errno == errno.EFAULT and env.p.mm.pinned_vm == 0


def test_unmapped_range_is_offered_to_the_peers(env):
    # every pin failure takes the peer path, not only VM_PFNMAP
    fp = env.peer()
    fp.claim = False
    with pytest.raises(VerbsError) as ei:
        env.reg_mr(0x10_0000_0000, K64)
    assert ei.value.errno == errno.EFAULT
    assert fp.names() == ["acquire"]


@pytest.mark.parametrize("claims", [False, True])
def test_range_half_host_half_gpu(env, claims):
    # gup pins the host pages, then fails at the GPU mapping: it unpins what it pinned
    # and offers the whole range to the peers
    fp = env.peer()
    va = env.gpu(K64, fp)
    host = va - 2 * PAGE
    assert env.p.run(env.p.mmap, host, 2 * PAGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | 0x10) == host        # MAP_FIXED
    if claims:
        fp.own(host, 2 * PAGE)
    else:
        fp.claim = False
    vm = env.m.vmstat
    if not claims:
        with pytest.raises(VerbsError) as ei:
            env.reg_mr(host, 2 * PAGE + K64)
        assert ei.value.errno == errno.EFAULT
    else:
        mr = env.reg_mr(host, 2 * PAGE + K64)
        assert env.p.mm.pinned_vm == 2 + K64 // PAGE
        assert [a for a, _ in umem_entries(fp)] == [fp.phys(host), fp.phys(va)]
        env.dereg(mr)
    assert fp.calls[0].args[:2] == (host, 2 * PAGE + K64)
    assert vm["nr_foll_pin_acquired"] == vm["nr_foll_pin_released"] >= 2
    assert env.p.mm.pinned_vm == 0


def umem_entries(fp):
    return fp.reg.umem_xa.entries[0].sgt_append.sgt.dma_entries()


def test_checks_before_pinning_do_not_reach_the_peers(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    with pytest.raises(KernelError) as ei:
        get_umem(env, va, 0, INVAL_FLAGS)             # no page: EINVAL
    assert ei.value.errno == errno.EINVAL
    small = env.m.spawn("small", rlimit_memlock=K64)
    from userspace.cuda.runtime import cudart
    sva = small.run(cudart(small).cudaMalloc, 4 * K64)
    fp.own(sva, 4 * K64)

    def reg():
        from userspace.libibverbs.pyverbs import MR, PD, Context
        ctx = Context(small)
        try:
            MR(PD(ctx), 4 * K64, IB_ACCESS_LOCAL_WRITE, sva)
        finally:
            ctx.close()
    with pytest.raises(VerbsError) as vi:
        small.run(reg)
    assert vi.value.errno == errno.ENOMEM          # RLIMIT_MEMLOCK, before gup and peers
    assert fp.names() == []
    small.exit(0)


def test_peer_umem_keeps_the_pinned_vm_charge(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    mr = env.reg_mr(va + 0x1000, 0x12000)
    assert env.p.mm.pinned_vm == 0x12000 // PAGE     # PAGE_SIZE pages of the range
    env.dereg(mr)
    assert env.p.mm.pinned_vm == 0


# -- failures in the middle ----------------------------------------------------------------------
def test_get_pages_failure(env):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    fp.fail["get_pages"] = errno.ENOSPC
    with pytest.raises(VerbsError) as ei:
        env.reg_mr(va, 2 * K64)
    assert ei.value.errno == errno.ENOSPC
    assert fp.names() == ["acquire", "get_pages", "release"]      # no put_pages
    assert fp.calls[1].core_context == 0 and fp.calls[1].lock_mine
    assert fp.calls[2].lock_held is False                  # release after the unlock
    assert fp.live_ctx == []
    from kernel_model.refcount import refcount_read
    assert refcount_read(fp.reg.usecnt) == 1
    assert fp.reg.umem_xa.entries == {}
    assert fp.reg.stats == zero_stats()
    assert env.p.mm.pinned_vm == 0
    # the id was used once: cyclic allocation hands out the next one
    del fp.fail["get_pages"]
    mr = env.reg_mr(va, 2 * K64)
    assert fp.called("get_pages")[-1].core_context == 1
    env.dereg(mr)


def test_get_pages_failure_through_ib_umem_get_peer(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    fp.fail["get_pages"] = errno.EAGAIN
    with pytest.raises(KernelError) as ei:
        get_umem(env, va, K64, INVAL_FLAGS)
    assert ei.value.errno == errno.EAGAIN
    assert fp.names() == ["acquire", "get_pages", "release"]


def test_dma_map_failure_calls_put_pages(env):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    fp.fail["dma_map"] = errno.ENOMEM
    with pytest.raises(VerbsError) as ei:
        env.reg_mr(va, 2 * K64)
    assert ei.value.errno == errno.ENOMEM
    assert fp.names() == ["acquire", "get_pages", "dma_map", "put_pages", "release"]
    assert [c.lock_mine for c in fp.calls[1:4]] == [True] * 3
    assert fp.live_ctx == [] and fp.reg.umem_xa.entries == {}
    assert fp.reg.stats == zero_stats()
    from kernel_model.refcount import refcount_read
    assert refcount_read(fp.reg.usecnt) == 1
    assert env.p.mm.pinned_vm == 0


@pytest.mark.parametrize("access, force", [(IB_ACCESS_LOCAL_WRITE, 0),
                                           (IB_ACCESS_REMOTE_READ, 1), (0, 1)])
def test_callback_arguments(env, access, force):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    mr = env.reg_mr(va + 0x123, 0x14567, access)
    # get_pages(addr, size, write=1, force=!writable, sg_head=NULL, ctx, core_context):
    # the raw user range, not aligned
    assert fp.called("get_pages")[0].args == (va + 0x123, 0x14567, 1, force, None)
    dev = in_kernel(env, ib_device_get_by_name, "mlx5_0")
    assert fp.called("dma_map")[0].args == (dev.dma_device, 0)
    ctx = fp.live_ctx[0]
    assert (ctx.addr, ctx.size) == (va + 0x123, 0x14567)
    env.dereg(mr)
    assert fp.called("dma_unmap")[0].args == (dev.dma_device,)
    assert {c.ctx for c in fp.calls[1:]} == {ctx}          # the context acquire gave


# -- core_context ids ----------------------------------------------------------------------------
def test_core_context_ids_are_cyclic(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    mrs = [env.reg_mr(va + i * K64, K64) for i in range(2)]
    assert [c.core_context for c in fp.called("get_pages")] == [0, 1]
    assert sorted(fp.reg.umem_xa.entries) == [0, 1]
    env.dereg(mrs[0])
    assert sorted(fp.reg.umem_xa.entries) == [1]
    mrs[0] = env.reg_mr(va, K64)                    # id 0 is free, but not reused at once
    assert fp.called("get_pages")[-1].core_context == 2
    for mr in mrs:
        env.dereg(mr)
    assert fp.reg.umem_xa.entries == {}
    # the limit is U32_MAX - 1 (U32_MAX means "no invalidation"); then it wraps
    fp.reg.xa_cyclic_next[0] = U32_MAX - 1
    mrs = [env.reg_mr(va + i * K64, K64) for i in range(2)]
    assert [c.core_context for c in fp.called("get_pages")[-2:]] == [U32_MAX - 1, 0]
    for mr in mrs:
        env.dereg(mr)


def test_non_invalidating_client_gets_u32_max(env):
    nc = env.peer("nc", invalidating=False)
    va = env.gpu(K64, nc)
    mr = env.reg_mr(va, K64)          # mlx5 passes INVAL_SUPP; a non-invalidating client serves it
    assert nc.called("get_pages")[0].core_context == U32_MAX
    assert nc.reg.umem_xa.entries == {}
    assert in_kernel(env, ib_invalidate_peer_memory, nc.reg, U32_MAX) == 0   # nothing there
    assert nc.names() == ["acquire", "get_pages", "dma_map", "get_page_size"]
    env.dereg(mr)                     # stop takes the lock itself (xa_id == U32_MAX, OFED 25.04)
    assert nc.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    assert env.m.bugs == []


# -- invalidation -------------------------------------------------------------------------------
def test_invalidate_unknown_id(env):
    fp = env.peer()
    assert in_kernel(env, fp.inval_cb[0], fp.reg, 12345) == 0
    assert fp.reg.stats == dict(zero_stats(), num_free_callbacks=1)
    va = env.gpu(K64, fp)
    env.dereg(env.reg_mr(va, K64))
    before = fp.names()
    assert fp.invalidate(0) == 0                    # stale: the MR is gone
    assert fp.names() == before
    assert fp.reg.stats["num_free_callbacks"] == 2
    assert env.sysfs(f"{SYSFS}/fake_peer/num_free_callbacks") == "2\n"


@pytest.mark.parametrize("kind", KINDS)
def test_invalidate_after_activate(env, kind):
    kw, unmaps = KINDS[kind]
    fp = env.peer(**kw)
    va = env.gpu(2 * K64, fp)
    log: list = []
    umem = get_umem(env, va, 2 * K64, INVAL_FLAGS, then=lambda u: (
        ib_umem_activate_invalidation_notifier(u, recorder(log), "priv"), u)[1])
    assert umem.mapped_state == UMEM_PEER_MAPPED and not mutex_is_locked(umem.mapping_lock)
    ctx = fp.live_ctx[0]
    n_before = len(fp.calls)
    assert fp.invalidate(ctx) == 0
    assert log == [(umem, "priv")]
    during = fp.calls[n_before:]
    st = fp.reg.stats
    if unmaps:
        assert umem.mapped_state == UMEM_PEER_INVALIDATED
        assert during == []                          # the client tears down itself
        assert (st["num_dealloc_mrs"], st["num_dereg_pages"], st["num_dereg_bytes"]) == (1, 0, 0)
    else:
        assert umem.mapped_state == UMEM_PEER_UNMAPPED
        assert [c.name for c in during] == ["dma_unmap", "put_pages"]
        # ... inside the invalidation, on the invalidating task, under mapping_lock
        assert all(c.lock_mine for c in during)
        assert (st["num_dealloc_mrs"], st["num_dereg_pages"], st["num_dereg_bytes"]) == (
            1, 2, 2 * K64)
    assert umem.sgt_append.sgt.nents == 0          # the core's table is cleared either way
    # a second invalidation of the same id finds nothing to do
    assert fp.invalidate(ctx.core_context) == 0
    assert len(log) == 1 and st["num_free_callbacks"] == 2
    # the owner's teardown does not unmap again
    n_before = len(fp.calls)
    env.p.run(finish, umem)
    assert fp.names()[n_before:] == ["release"]
    assert st["num_alloc_mrs"] == st["num_dealloc_mrs"] == 1
    assert st["num_reg_pages"] == st["num_dereg_pages"] == 2
    assert st["num_reg_bytes"] == st["num_dereg_bytes"] == 2 * K64
    assert fp.reg.umem_xa.entries == {} and env.p.mm.pinned_vm == 0


def test_invalidation_before_activate_waits_for_it(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    log: list = []
    events: list = []

    def gpu_free(ctx):
        events.append(("start", ctx.umem.mapping_lock.owner.label))
        fp.invalidate(ctx)
        events.append(("done", ctx.umem.mapped_state))

    def owner():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64, IB_ACCESS_LOCAL_WRITE,
                             INVAL_FLAGS)
        assert mutex_is_locked(u.mapping_lock)       # held from get until activate
        t = kthread_run(gpu_free, fp.live_ctx[0], name="gpu_free")
        SCHED.yield_("test")                         # it runs and blocks on mapping_lock
        assert events == [("start", env.p.task.comm + f"-{env.p.pid}")] and not t.done
        assert log == [] and u.mapped_state == UMEM_PEER_MAPPED
        events.append("activate")
        ib_umem_activate_invalidation_notifier(u, recorder(log), None)
        t.join()
        return u
    umem = env.p.run(owner)
    assert events[1:] == ["activate", ("done", UMEM_PEER_UNMAPPED)]
    assert log == [(umem, None)]
    env.p.run(finish, umem)
    assert fp.names().count("dma_unmap") == 1


@pytest.mark.parametrize("fix", [0, 1], ids=["as-released", "late_invalidate_fix"])
@pytest.mark.parametrize("kind", ["plain", "unmaps"])
def test_invalidation_pending_when_owner_stops_without_activate(env, kind, fix):
    # a registration error path: stop without activate, then release; the invalidation
    # that took its kref and waited on mapping_lock runs after release cleared
    # ib_peer_client and, in the core as released (late_invalidate_fix=0), dereferences
    # it - peermem_facts B15 (code-derived, unreported), which the model reproduces as
    # the NULL dereference it is; the proposed fix (the default) finds the umem
    # UNMAPPED and returns
    env.m.modules["ib_core"].state.peer.late_invalidate_fix = bool(fix)
    fp = env.peer(**KINDS[kind][0])
    va = env.gpu(K64, fp)
    events: list = []

    def gpu_free(ctx):
        fp.invalidate(ctx)
        events.append("inval-done")

    def owner():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64, IB_ACCESS_LOCAL_WRITE,
                             INVAL_FLAGS)
        t = kthread_run(gpu_free, fp.live_ctx[0], name="gpu_free")
        SCHED.yield_("test")
        ib_umem_stop_invalidation_notifier(u)
        events.append("stopped")
        ib_umem_release(u)
        events.append("released")
        if fix:
            t.join()
        else:
            with pytest.raises(AttributeError, match="peer_mem"):    # the oops of B15
                t.join()
    env.p.run(owner)
    assert events == ["stopped", "released"] + ["inval-done"] * fix
    assert fp.names() == ["acquire", "get_pages", "dma_map", "get_page_size", "dma_unmap",
                          "put_pages", "release"]
    st = fp.reg.stats
    assert st["num_free_callbacks"] == 1
    assert st["num_alloc_mrs"] == st["num_dealloc_mrs"] == 1
    assert st["num_reg_pages"] == st["num_dereg_pages"] == 1
    assert env.m.bugs == []


@pytest.mark.parametrize("kind", ["plain", "unmaps"])
def test_stop_unmaps_outside_mapping_lock_only_for_unmaps_clients(env, kind):
    kw, unmaps = KINDS[kind]
    fp = env.peer(**kw)
    va = env.gpu(K64, fp)

    def owner(u):
        ib_umem_activate_invalidation_notifier(u, recorder([]), None)
        finish(u)
    get_umem(env, va, K64, INVAL_FLAGS, then=owner)
    unmap, put = fp.called("dma_unmap")[0], fp.called("put_pages")[0]
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    if unmaps:      # the lock-inversion fix: the client may take its own lock in there
        assert not unmap.lock_held and not put.lock_held
    else:
        assert unmap.lock_mine and put.lock_mine


def test_release_without_stop_warns(env):
    fp = env.peer()
    va = env.gpu(K64, fp)

    def owner():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64, IB_ACCESS_LOCAL_WRITE,
                             INVAL_FLAGS)
        ib_umem_activate_invalidation_notifier(u, recorder([]), None)
        ib_umem_release(u)
    env.p.run(owner)
    assert len(env.m.bugs) == 1 and "ib_peer_umem_release" in env.m.bugs[0]
    env.m.bugs.clear()
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]


def test_activate_on_a_host_umem_warns(env):
    buf = env.p.run(env.p.mmap, 0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)

    def owner():
        u = ib_umem_get(ib_device_get_by_name("mlx5_0"), buf, PAGE, IB_ACCESS_LOCAL_WRITE)
        ib_umem_activate_invalidation_notifier(u, recorder([]), None)
        ib_umem_release(u)
    env.p.run(owner)
    assert len(env.m.bugs) == 1 and "not a peer umem" in env.m.bugs[0]
    env.m.bugs.clear()


def test_activate_is_a_no_op_for_a_non_invalidating_umem(env):
    nc = env.peer("nc", invalidating=False)
    va = env.gpu(K64, nc)
    log: list = []

    def owner():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64, IB_ACCESS_LOCAL_WRITE,
                             INVAL_FLAGS)
        ib_umem_activate_invalidation_notifier(u, recorder(log), None)
        assert u.invalidation_func is None and not mutex_is_locked(u.mapping_lock)
        finish(u)
    env.p.run(owner)
    assert log == [] and env.m.bugs == []


# -- the transition table ------------------------------------------------------------------------
def test_transition_table():
    M, U, inv = UMEM_PEER_MAPPED, UMEM_PEER_UNMAPPED, UMEM_PEER_INVALIDATED
    assert PEER_UMEM_TRANSITIONS == {
        (M, U): (True, True, True),
        (M, inv): (False, True, False),
        (inv, U): (False, False, True),
    }


def test_other_transitions_only_record_the_state(env):
    fp = env.peer()
    va = env.gpu(K64, fp)

    def owner():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64, IB_ACCESS_LOCAL_WRITE,
                             INVAL_FLAGS)
        before = (list(fp.names()), dict(fp.reg.stats))
        for cur, to in [(UMEM_PEER_UNMAPPED, UMEM_PEER_INVALIDATED),
                        (UMEM_PEER_INVALIDATED, UMEM_PEER_INVALIDATED),
                        (UMEM_PEER_UNMAPPED, UMEM_PEER_MAPPED)]:
            ib_unmap_peer_client(u, cur, to)
            assert u.mapped_state == to
        after = (list(fp.names()), dict(fp.reg.stats))
        u.mapped_state = UMEM_PEER_MAPPED
        finish(u)
        return before, after
    before, after = env.p.run(owner)
    assert before == after


# -- unregistration ------------------------------------------------------------------------------
def test_unregister_waits_for_outstanding_mrs(env):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    mr = env.reg_mr(va, K64)
    events: list = []
    reg = fp.reg

    def unregister():
        events.append("unreg-start")
        ib_unregister_peer_memory_client(reg)
        events.append("unreg-done")

    def owner():
        from userspace.libibverbs.pyverbs import MR
        t = kthread_run(unregister, name="rmmod")
        SCHED.yield_("test")
        assert events == ["unreg-start"] and not t.done       # waiting for usecnt_zero
        assert reg not in peer_clients()                      # no new acquires
        with pytest.raises(VerbsError) as ei:
            MR(env.pd, K64, IB_ACCESS_LOCAL_WRITE, va + K64)
        assert ei.value.errno == errno.EFAULT
        assert fp.names().count("acquire") == 1
        # the sysfs files stay until the wait is over
        from userspace.libc import read_sysfs
        assert read_sysfs(env.p, f"{SYSFS}/fake_peer/num_alloc_mrs") == "1\n"
        events.append("dereg")
        mr.close()
        t.join()
        events.append("joined")
    env.p.run(owner)
    fp.reg = None
    assert events == ["unreg-start", "dereg", "unreg-done", "joined"]
    assert fp.names()[-1] == "release"
    assert env.sysfs(f"{SYSFS}/fake_peer/num_alloc_mrs") is None


def test_unregister_after_process_exit(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    env.reg_mr(va, K64)
    env.p.exit(0)                    # uverbs cleanup deregisters the MR
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    fp.unregister()                  # returns at once
    assert fp.live_ctx == []


# -- statistics ----------------------------------------------------------------------------------
def test_statistics_in_sysfs(env):
    fp = env.peer()
    va = env.gpu(8 * K64, fp)

    def stats():
        return {n: int(env.sysfs(f"{SYSFS}/fake_peer/{n}")) for n in STATS}
    a = env.reg_mr(va, 3 * K64)                      # 3 entries
    b = env.reg_mr(va + 4 * K64 + 0x1000, 0x800)     # 1 entry, 2 KiB
    assert stats() == dict(zero_stats(), num_alloc_mrs=2, num_reg_pages=4,
                           num_reg_bytes=3 * K64 + 0x800)
    fp.invalidate(fp.live_ctx[1])                    # old-style: unmapped now
    assert stats() == dict(zero_stats(), num_alloc_mrs=2, num_reg_pages=4,
                           num_reg_bytes=3 * K64 + 0x800, num_dealloc_mrs=1,
                           num_dereg_pages=1, num_dereg_bytes=0x800, num_free_callbacks=1)
    env.dereg(a)
    env.dereg(b)
    assert stats() == dict(num_alloc_mrs=2, num_dealloc_mrs=2, num_reg_pages=4,
                           num_dereg_pages=4, num_reg_bytes=3 * K64 + 0x800,
                           num_dereg_bytes=3 * K64 + 0x800, num_free_callbacks=1)
    assert stats() == fp.reg.stats


# -- fix_peer_sgls --------------------------------------------------------------------------------
def test_fix_peer_sgls_trims_to_page_size_and_restores_for_unmap(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    start, length = va + 0x3000, 2 * K64 + 0x1800      # ends 0x4800 into the third page
    mr = env.reg_mr(start, length)
    umem = fp.reg.umem_xa.entries[0]
    p0, p1, p2 = (fp.phys(va + i * K64) for i in range(3))
    assert umem.sgt_append.sgt.nents == 3
    assert [(a, n) for a, n in umem.sgt_append.sgt.dma_entries()] == [
        (p0 + 0x3000, K64 - 0x3000), (p1, K64), (p2, 0x5000)]
    assert list(umem.sgt_append.sgt.sg_len.view[:3]) == [K64 - 0x3000, K64, 0x5000]
    env.dereg(mr)
    # dma_unmap sees the table exactly as dma_map made it
    assert fp.called("dma_unmap")[0].sg == [(p0, K64, K64), (p1, K64, K64), (p2, K64, K64)]


def test_fix_peer_sgls_single_entry(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va + 0x2100, 0x3000)                # [0x2100, 0x5100) in one 64 KiB page
    umem = fp.reg.umem_xa.entries[0]
    assert umem.sgt_append.sgt.dma_entries() == [(fp.phys(va) + 0x2000, 0x4000)]
    env.dereg(mr)
    assert fp.called("dma_unmap")[0].sg == [(fp.phys(va), K64, K64)]


def test_client_with_page_size_equal_to_page_size_is_not_trimmed(env):
    fp = env.peer(page_size=PAGE)
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va + 0x3000, 0x2000)
    umem = fp.reg.umem_xa.entries[0]
    assert umem.saved is None
    assert umem.sgt_append.sgt.dma_entries() == [(fp.phys(va + 0x3000), PAGE),
                                                 (fp.phys(va + 0x4000), PAGE)]
    env.dereg(mr)

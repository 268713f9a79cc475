"""The peer-memory core of older MLNX_OFED releases (ib_core's `ofed` parameter).

OFED 4.x: the ticket design (peermem_facts §2.12) - tickets from 1 on the
client's list under its lock, no mapping_lock, an invalidation before
activation only marks the context and activation fails, release() always
unmaps, and mlx5 tears the whole MR down inside an invalidation after it.
OFED 5.1b-24.10: ib_umem_stop_invalidation_notifier's lock condition
inverted (B6).
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.device import ib_device_get_by_name
from drivers.ib_core.ib_verbs import IB_ACCESS_LOCAL_WRITE
from drivers.ib_core.peer_mem import (
    IB_PEER_MEM_INVAL_SUPP,
    ib_umem_activate_invalidation_notifier,
    ib_umem_stop_invalidation_notifier,
    parse_ofed_release,
    peer_ticket_design,
)
from drivers.ib_core.umem import ib_umem_get_peer, ib_umem_release
from drivers.mlx5_ib import mr as mr_mod
from drivers.mlx5_ib import umr as umr_mod
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelBug, KernelError
from kernel_model.locking import mutex_is_locked
from kernel_model.slab import kmem_is_freed
from tests.drivers.ib_core.fake_peer import K64, PeerEnv
from userspace.libibverbs.cmd import VerbsError


@pytest.fixture
def env49():
    e = PeerEnv(ofed="4.9")
    yield e
    e.close()


def _get(env, va, size, flags=IB_PEER_MEM_INVAL_SUPP, then=None):
    def fn():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, size, IB_ACCESS_LOCAL_WRITE,
                             flags)
        return then(u) if then is not None else u
    return env.p.run(fn)


def test_the_release_is_parsed_and_a_malformed_one_refused():
    assert parse_ofed_release("4.9") == (4, 9)
    assert parse_ofed_release("24.10-1.1.4") == (24, 10)
    m = rdma_host(ram_size=16 << 20, modules=())
    with pytest.raises(KernelError) as e:
        m.load_module("ib_core", ofed="four")
    assert e.value.errno == errno.EINVAL and "ib_core" in str(e.value)
    assert "ib_core" not in m.modules
    m.load_module("ib_core", ofed="4.9")
    with m.kernel():
        assert peer_ticket_design()


def test_tickets_count_from_one_for_any_caller_that_takes_invalidations(env49):
    fp = env49.peer()
    plain = env49.peer("fake_plain", invalidating=False)
    va = env49.gpu(K64, fp)
    vb = env49.gpu(K64, plain)
    ua = _get(env49, va, K64)
    ub = _get(env49, va, K64)
    # 4.x gives a ticket whenever the caller can take an invalidation, whatever the client
    uc = _get(env49, vb, K64)
    assert [c.core_context for c in fp.called("get_pages")] == [1, 2]
    assert plain.called("get_pages")[0].core_context == 1
    assert sorted(fp.reg.core_ticket_list) == [1, 2] and fp.reg.umem_xa.entries == {}
    # no mapping_lock is left held between get and activate
    assert not mutex_is_locked(ua.mapping_lock)
    for u in (ua, ub, uc):
        env49.p.run(ib_umem_release, u)
    assert fp.reg.core_ticket_list == {} and plain.reg.core_ticket_list == {}


def test_an_invalidation_before_activation_fails_it_and_release_still_unmaps(env49):
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    seen = []

    def owner(u):
        ctx = fp.live_ctx[0]
        assert fp.invalidate(ctx) == 0                   # only marks the context
        seen.append(ib_umem_activate_invalidation_notifier(u, lambda *a: None, None))
        n = len(fp.calls)
        ib_umem_release(u)
        return fp.names()[n:]
    after = _get(env49, va, 2 * K64, then=owner)
    assert seen == [-errno.EINVAL]
    assert "pages were invalidated by peer" in env49.m.dmesg[-1]
    # B3: nothing recorded the invalidation - the pages are unmapped and put again
    assert after == ["dma_unmap", "put_pages", "release"]
    st = fp.reg.stats
    assert st["num_free_callbacks"] == 1 and st["num_dealloc_mrs"] == 1
    assert st["num_reg_bytes"] == 2 * K64 and fp.reg.core_ticket_list == {}


def test_an_invalidation_after_activation_calls_the_owner_under_the_client_lock(env49):
    fp = env49.peer()
    va = env49.gpu(K64, fp)
    calls = []

    def func(cookie, umem, addr, size):
        # as mlx5 4.x does: the whole teardown inside the invalidation
        calls.append((cookie, umem, addr, size, fp.reg.lock.owner is not None))
        umem.invalidation_ctx.peer_callback = 1
        ib_umem_release(umem)
    u = _get(env49, va, K64, then=lambda u: (
        ib_umem_activate_invalidation_notifier(u, func, "cookie"), u)[1])
    ctx = u.invalidation_ctx
    n = len(fp.calls)
    assert fp.invalidate(1) == 0
    assert calls == [("cookie", u, 0, 0, True)]
    assert fp.names()[n:] == ["dma_unmap", "put_pages", "release"]
    assert kmem_is_freed(ctx)                  # the invalidation frees its context
    assert fp.invalidate(7) == 0               # an unknown ticket is ignored, and counted
    assert fp.reg.stats["num_free_callbacks"] == 2 and fp.reg.core_ticket_list == {}


def test_stop_does_not_exist_in_4x(env49):
    fp = env49.peer()
    va = env49.gpu(K64, fp)
    u = _get(env49, va, K64)
    env49.p.run(ib_umem_stop_invalidation_notifier, u)
    assert len(env49.m.bugs) == 1 and "added in 5.1b" in env49.m.bugs[0]
    env49.m.bugs.clear()
    env49.p.run(ib_umem_release, u)


def test_mlx5_4x_tears_the_mr_down_inside_the_invalidation(env49):
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    mr = env49.reg_mr(va, 2 * K64)
    assert fp.called("get_pages")[0].core_context == 1
    key = mr.lkey
    mkey = env49.hca.fw.mkeys[key >> 8]
    assert mkey.mkc["free"] == 0 and mkey.mkc["len"] == 2 * K64   # the UMR enabled it
    n = len(fp.calls)
    fp.invalidate(fp.live_ctx[0])
    # unreg_umr disables the cached mkey, then the umem's unmap, put and release - all
    # inside the callback; the mkey stays with the MR until the user's dereg
    assert fp.names()[n:] == ["dma_unmap", "put_pages", "release"]
    assert mkey.mkc["free"] == 1 and fp.reg.core_ticket_list == {}
    n = len(fp.calls)
    env49.dereg(mr)                 # frees the MR, gives the mkey back to the cache
    assert fp.names()[n:] == [] and (key >> 8) not in env49.hca.fw.mkeys


def test_mlx5_4x_uncached_mr_is_destroyed_inside_the_invalidation(env49, monkeypatch):
    monkeypatch.setattr(mr_mod, "MLX5_MAX_UMR_SHIFT", -1)     # no MR fits the cache
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    mr = env49.reg_mr(va, 2 * K64)
    key = mr.lkey
    assert (key >> 8) in env49.hca.fw.mkeys
    n = len(fp.calls)
    fp.invalidate(fp.live_ctx[0])
    # clean_mr: DESTROY_MKEY, then the umem's unmap, put and release
    assert fp.names()[n:] == ["dma_unmap", "put_pages", "release"]
    assert (key >> 8) not in env49.hca.fw.mkeys and fp.reg.core_ticket_list == {}
    n = len(fp.calls)
    env49.dereg(mr)                            # the user's dereg only frees the MR
    assert fp.names()[n:] == []


def test_mlx5_4x_invalidation_before_the_enable_umr_oopses(env49, monkeypatch):
    """Between complete(peer_id->comp) and mlx5_ib_update_xlt: the invalidation
    releases the umem and clears mr->umem; populate_xlt dereferences it."""
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    update = mr_mod.mlx5_ib_update_xlt

    def invalidate_first(mr):
        fp.invalidate(fp.live_ctx[0])
        assert mr.umem is None and mr.free      # unreg_umr had nothing to disable
        return update(mr)
    monkeypatch.setattr(mr_mod, "mlx5_ib_update_xlt", invalidate_first)
    with pytest.raises(AttributeError, match="NoneType"):
        env49.reg_mr(va, 2 * K64)
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    env49.m.leak_check_expected = False
    with pytest.raises(Exception, match="mlx5_ib_mr"):   # the oops left the MR behind
        env49.m.check_leaks()
    env49.peers.clear()                                 # gone with the machine


def test_mlx5_4x_invalidation_inside_update_xlt_enables_a_dead_mkey(env49, monkeypatch):
    """While the ENABLE UMR's poster waits for its completion: mr->free is still set,
    so the invalidation posts no disable, and gives the pages back - the mkey stays
    on over them and registration succeeds."""
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    monkeypatch.setattr(umr_mod, "schedule_timeout", lambda t: fp.invalidate(fp.live_ctx[0]))
    mr = env49.reg_mr(va, 2 * K64)
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    mkey = env49.hca.fw.mkeys[mr.lkey >> 8]
    assert mkey.mkc["free"] == 0, "the mkey is live over pages the peer took back"
    assert mkey.pas.n >= 2 and mkey.pas.view[0] != 0
    monkeypatch.undo()
    env49.dereg(mr)                  # invalidated already: the cache takes the mkey back
    assert (mr.lkey >> 8) not in env49.hca.fw.mkeys


def test_mlx5_4x_registration_invalidated_before_activation_fails_einval(env49):
    fp = env49.peer()
    va = env49.gpu(K64, fp)
    fp.hooks["dma_map"] = lambda ctx: fp.invalidate(1)    # the peer revokes mid-registration
    with pytest.raises(VerbsError) as e:
        env49.reg_mr(va, K64)
    assert e.value.errno == errno.EINVAL
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    assert fp.reg.core_ticket_list == {} and not env49.hca.fw.mkeys


# -- OFED 5.1b up to 24.10: stop's lock condition inverted (B6) ------------------------------
def _abandon(env):
    """After the kernel bug the umem is stuck half torn down: the machine leaks it (the
    check says so), and the suite's own check skips the machine."""
    env.m.leak_check_expected = False
    with pytest.raises(Exception, match="leak"):
        env.m.check_leaks()

@pytest.mark.parametrize("invalidating, report", [
    (True, "recursive locking"),    # stop without activate: the registration's error path
    (False, "held by nobody"),      # a non-invalidating umem: every dereg of such an MR
])
def test_b6_stop_takes_the_mapping_lock_on_the_wrong_condition(invalidating, report):
    env = PeerEnv(ofed="24.10")
    try:
        fp = env.peer(invalidating=invalidating)
        va = env.gpu(K64, fp)

        def owner():
            u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64,
                                 IB_ACCESS_LOCAL_WRITE, IB_PEER_MEM_INVAL_SUPP)
            ib_umem_stop_invalidation_notifier(u)
        with pytest.raises(KernelBug) as e:
            env.p.run(owner)
        assert report in str(e.value) and "mapping_lock" in str(e.value)
    finally:
        _abandon(env)


def test_b6_is_fixed_in_25_04():
    env = PeerEnv(ofed="25.04")
    fp = env.peer(invalidating=False)
    va = env.gpu(K64, fp)

    def owner():
        u = ib_umem_get_peer(ib_device_get_by_name("mlx5_0"), va, K64, IB_ACCESS_LOCAL_WRITE,
                             IB_PEER_MEM_INVAL_SUPP)
        ib_umem_stop_invalidation_notifier(u)
        ib_umem_release(u)
    env.p.run(owner)
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    env.close()


def test_4x_counts_registered_and_deregistered_bytes_alike(env49):
    fp = env49.peer()
    va = env49.gpu(K64, fp)
    u = _get(env49, va, 4096)                 # a 4 KiB umem of one 64 KiB peer page
    env49.p.run(ib_umem_release, u)
    st = fp.reg.stats
    assert st["num_reg_bytes"] == st["num_dereg_bytes"] == K64   # nmap << page_shift


def test_mlx5_4x_failed_enable_umr_unwinds_the_whole_registration(env49):
    """mlx5_ib_update_xlt failing (the UMR's completion in error): 4.x calls dereg_mr -
    the umem released through the peer, the cached mkey given back, the MR freed."""
    from drivers.mlx5_core.ifc import MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY
    from kernel_model.hw.mlx5_ifc import MLX5_CMD_STAT_INT_ERR
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    env49.hca.fw.inject(MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY, MLX5_CMD_STAT_INT_ERR)
    with pytest.raises(VerbsError) as e:
        env49.reg_mr(va, 2 * K64)
    assert e.value.errno == errno.EIO
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    assert not env49.hca.fw.mkeys and fp.reg.core_ticket_list == {}
    assert env49.p.mm.pinned_vm == 0


def test_umr_update_of_a_cached_mkey_checks_its_pd_and_translation(env49):
    """EMU_UMR_UPDATE_MKEY: BAD_PARAM (EINVAL) for a PD that does not exist, BAD_INP_LEN
    (EIO) for a translation shorter than the range; the mkey - every field, its PD
    reference, its translation - is left as it was."""
    from drivers.mlx5_core.cmd import mlx5_cmd_exec
    from drivers.mlx5_core.ifc import (
        MLX5_ADDR_OF,
        MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY,
        MLX5_SET,
        MLX5_SET64,
        IfcStruct,
    )
    from drivers.mlx5_ib.mlx5_ib import to_mdev
    from userspace.libibverbs.pyverbs import PD
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)
    mr = env49.reg_mr(va, 2 * K64)
    other = env49.p.run(PD, env49.ctx)                 # a second PD of the same context
    index = mr.lkey >> 8
    fw = env49.hca.fw
    mkey = fw.mkeys[index]
    fields = ("pd", "start_addr", "len", "lw", "lr", "rw", "rr", "a", "free",
              "log_page_size", "translations_octword_size")

    def snapshot() -> tuple:
        return ({f: mkey.mkc[f] for f in fields}, [r.num for r in mkey.refs],
                {n: d.users for n, d in fw.pds.items()}, list(mkey.pas.view[:mkey.pas.n]))
    before = snapshot()

    def update(pd: int, entries: int) -> int:
        in_ = IfcStruct("emu_umr_update_mkey_in", klm_pas_mtt=entries)
        MLX5_SET("emu_umr_update_mkey_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY)
        MLX5_SET("emu_umr_update_mkey_in", in_, "mkey_index", index)
        mkc = MLX5_ADDR_OF("emu_umr_update_mkey_in", in_, "memory_key_mkey_entry")
        MLX5_SET("mkc", mkc, "pd", pd)
        MLX5_SET("mkc", mkc, "log_page_size", 16)
        MLX5_SET64("mkc", mkc, "len", 2 * K64)
        try:
            mdev = to_mdev(ib_device_get_by_name("mlx5_0")).mdev
            mlx5_cmd_exec(mdev, in_, IfcStruct("emu_umr_update_mkey_out"))
        except KernelError as e:
            return e.errno
        return 0
    with env49.p.kernel():
        assert update(0x7777, 2) == errno.EINVAL        # no such PD
        assert snapshot() == before
        # another PD, 2 pages, 1 entry: BAD_INP_LEN, and nothing moved
        newest = max(fw.pds)                           # the second PD's number
        assert fw.pds[newest].users == 0
        assert update(newest, 1) == errno.EIO
        assert snapshot() == before
    env49.p.run(other.close)
    env49.dereg(mr)


def test_mlx5_4x_failed_enable_after_an_invalidation_tears_down_twice(env49, monkeypatch):
    """The 4.x unwind of a failed ENABLE UMR calls dereg_mr without looking at
    mr->invalidated: if an invalidation already tore the MR down while the UMR was
    outstanding, the peer_id is freed a second time (kept as 4.x has it)."""
    from kernel_model.slab import DoubleFree
    fp = env49.peer()
    va = env49.gpu(2 * K64, fp)

    def umr_completes_in_error(mdev, in_, out):
        fp.invalidate(fp.live_ctx[0])         # while the UMR is outstanding
        raise KernelError(errno.EIO, "mlx5_cmd_exec: UMR completion in error")
    monkeypatch.setattr(umr_mod, "mlx5_cmd_exec", umr_completes_in_error)
    with pytest.raises(DoubleFree, match="mlx5_ib_peer_id"):
        env49.reg_mr(va, 2 * K64)
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    monkeypatch.undo()
    env49.m.leak_check_expected = False
    with pytest.raises(Exception, match="mlx5_ib_mr"):     # the oops left the MR behind
        env49.m.check_leaks()
    env49.peers.clear()

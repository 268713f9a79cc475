"""The public testing API of a race-test author (peermem_testing/api.py and the ladder's
options): an older core by `ofed=`, the GPU driver's `release=`, client parameters,
an MR's core_context, the core's invalidation fired for it, the call recorder, and
a client unload that reaches ib_unregister_peer_memory_client's wait while an MR is
outstanding (rmmod -f)."""

from __future__ import annotations

import errno
import pathlib
import sys

import pytest

from drivers.ib_core.peer_mem import PEER_NO_INVALIDATION_ID
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.sched import DeadlockError
from peermem_testing.api import (
    CALLBACKS,
    CallRecorder,
    PeerCall,
    core_context,
    fire_invalidation,
    invalidate_core_context,
    peer_client_of,
    registered_clients,
)
from peermem_testing.conformance import ClientUnderTest, build_host
from peermem_testing.ladder import build_ladder

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cmb_peer"
SMALL = 64 << 10


def _core(m) -> tuple[int, int]:
    return m.modules["ib_core"].state.peer.ofed


def test_configured_selects_core_driver_release_and_parameters():
    cut = ClientUnderTest.nv_peer_mem().configured("4.9", "535.104.05",
                                                   {"peerdirect_support": 1})
    assert cut.host["ofed"] == "4.9" and cut.params["peerdirect_support"] == 1
    assert cut.params["persistent_api_support"] == 0        # kept, not replaced
    assert ClientUnderTest.nv_peer_mem().host == {"nr_gpus": 1}   # a copy
    m = build_host(cut)
    assert _core(m) == (4, 9)
    assert m.modules["nvidia"].state.release[:2] == (535, 104)
    m.check_leaks()
    with pytest.raises(ValueError, match="no nvidia"):
        ClientUnderTest.uio_mapping("io_peer_mem").configured(release="535.104.05")


def test_rdma_host_loads_the_older_core_first():
    m = rdma_host(ram_size=64 << 20, ofed="5.3", modules=("mlx5_ib",))
    assert list(m.modules)[0] == "ib_core" and _core(m) == (5, 3)
    m.check_leaks()
    with pytest.raises(KernelError) as e:
        rdma_host(ram_size=64 << 20, ofed="four")
    assert e.value.errno == errno.EINVAL


@pytest.mark.parametrize("ofed, cc", [("4.9", 1), ("25.04", 0)])
def test_core_context_and_the_recorder(ofed, cc):
    lad = build_ladder(ClientUnderTest.nv_peer_mem(), size=SMALL, ofed=ofed, record=True)
    assert isinstance(lad.recorder, CallRecorder)
    assert core_context(lad.mr) == lad.core_context() == cc
    calls = lad.recorder.log
    assert all(isinstance(c, PeerCall) and c.callback in CALLBACKS for c in calls)
    gp = next(c for c in calls if c.callback == "get_pages")
    assert gp.client == "nv_mem" and gp.detail == cc and gp.task == "app"
    assert lad.recorder.order("nv_mem")[:3] == ["acquire", "get_pages", "dma_map"]
    assert lad.recorder.order("no-such-client") == []
    assert peer_client_of(lad.mr) in registered_clients(lad.machine)
    lad.recorder.clear()
    lad.teardown()
    with pytest.raises(LookupError, match="no peer-memory umem"):
        core_context(lad.mr)                              # deregistered


def test_a_client_without_invalidation_gets_no_id():
    cut = ClientUnderTest.nv_peer_mem(persistent_api_support=1)
    lad = build_ladder(cut, size=SMALL)
    assert core_context(lad.mr) == PEER_NO_INVALIDATION_ID
    lad.teardown()


def test_firing_the_invalidation_on_the_49_core_deregisters_inside_the_call():
    lad = build_ladder(ClientUnderTest.nv_peer_mem(), size=SMALL, ofed="4.9", record=True)
    client = peer_client_of(lad.mr)
    before = client.stats["num_free_callbacks"]
    lad.recorder.clear()
    assert lad.proc.run(lad.invalidate) == 0
    assert client.stats["num_free_callbacks"] == before + 1
    # 4.x: the owner deregistered the MR inside the call, release() included
    assert lad.recorder.order() == ["dma_unmap", "put_pages", "release"]
    assert {c.task for c in lad.recorder.log} == {"app"}
    with pytest.raises(LookupError):
        core_context(lad.mr)
    lad.teardown()


def test_a_stale_id_is_ignored_and_counted():
    lad = build_ladder(ClientUnderTest.nv_peer_mem(peerdirect_support=1), size=SMALL,
                       record=True)
    client, cc = peer_client_of(lad.mr), core_context(lad.mr)
    lad.recorder.clear()
    assert fire_invalidation(lad.mr) == 0                  # from main: as the init task
    assert lad.recorder.order() == ["dma_unmap", "put_pages"]   # no UNMAPS: the core's
    lad.proc.run(lad.dereg)
    assert lad.recorder.order()[-1] == "release"
    before, n = client.stats["num_free_callbacks"], len(lad.recorder.log)
    assert lad.proc.run(invalidate_core_context, client, cc) == 0   # stale: ignored
    assert client.stats["num_free_callbacks"] == before + 1
    assert len(lad.recorder.log) == n
    lad.teardown()


@pytest.mark.parametrize("ofed", ["25.04", "4.9"])
def test_rmmod_f_reaches_the_cores_wait_for_the_outstanding_mr(ofed):
    lad = build_ladder(ClientUnderTest.nv_peer_mem(), size=SMALL, ofed=ofed, record=True)
    m = lad.machine
    rm = m.spawn("rmmod")
    with pytest.raises(KernelError) as e:               # the MR's module reference
        rm.run(lad.unload_client, False)
    assert e.value.errno == errno.EBUSY and "taints" not in m.__dict__
    t = rm.start(lad.unload_client)                     # rmmod -f
    lad.proc.run(lad.proc.sched_yield)
    assert not t.done and "usecnt_zero" in repr(t.blocked_on)   # in unregister's wait
    assert "nv_peer_mem" in m.modules and m.taints == {"TAINT_FORCED_RMMOD"}
    lad.recorder.clear()
    lad.proc.run(lad.dereg)
    t.join()
    assert lad.recorder.order() == ["dma_unmap", "put_pages", "release"]
    assert "nv_peer_mem" not in m.modules and "forced unload" in m.dmesg[-1]
    rm.exit(0)
    lad.teardown()


def test_a_forced_unload_still_stops_at_a_dependent_module():
    m = rdma_host(ram_size=64 << 20, modules=("mlx5_ib",))
    with pytest.raises(KernelError) as e:
        m.unload_module("ib_core", force=True)
    assert e.value.errno == errno.EWOULDBLOCK and "taints" not in m.__dict__
    m.check_leaks()


@pytest.mark.race(strategy="dfs", bound=1, max_schedules=30)
def test_forced_unload_races_deregistration_on_the_49_core(peermem_ladder):
    lad = peermem_ladder(ClientUnderTest.nv_peer_mem(), size=SMALL, ofed="4.9")
    rm = lad.machine.spawn("rmmod")
    unload = rm.start(lad.unload_client)
    dereg = lad.proc.thread(lad.dereg, name="dereg")
    dereg.join()
    unload.join()
    rm.exit(0)
    assert "nv_peer_mem" not in lad.machine.modules
    lad.teardown()


def test_modules_are_found_by_dotted_import_names_too():
    m = rdma_host(ram_size=64 << 20, modules=())
    with pytest.raises(KernelError) as e:
        m.load_module("tests.peermem_testing.no_such_driver")
    assert e.value.errno == errno.ENOENT
    m.load_module("tests.peermem_testing.byod_card")
    assert "tests.peermem_testing.byod_card" in m.modules
    m.check_leaks()


@pytest.fixture
def cmb_peer():
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import cmb_peer
    return cmb_peer


def _cmb_cut(cmb_peer) -> ClientUnderTest:
    def reset(m, proc, addr, size):
        with m.kernel():
            cmb_peer.cmb_peer_revoke_all()
    return ClientUnderTest.uio_mapping("cmb_peer", revoke=reset)


def test_the_example_client_survives_a_reset_on_the_49_core(cmb_peer):
    """docs/peer-clients.md's rule: on a 4.x core put_pages runs inside the client's own
    invalidate call, on its task - cmb_peer must not wait for itself there."""
    lad = build_ladder(_cmb_cut(cmb_peer), size=SMALL, ofed="4.9", record=True)
    lad.recorder.clear()
    lad.proc.run(lad.revoke)
    assert lad.recorder.order("cmb_peer") == ["dma_unmap", "put_pages", "release"]
    lad.teardown()


def test_a_put_pages_that_always_waits_deadlocks_there(cmb_peer, monkeypatch):
    """The example before the rule was written down: one MR, one reset, a deadlock."""
    def put_pages(self, sg_head, ctx):
        cmb_peer.mutex_lock(self.lock)
        if ctx in self.live:
            self.live.remove(ctx)
        revoking = ctx.revoking
        cmb_peer.mutex_unlock(self.lock)
        if revoking:
            cmb_peer.wait_event(self.revoke_wq, lambda: not ctx.revoking)
        cmb_peer.sg_free_table(sg_head)
    monkeypatch.setattr(cmb_peer.CmbPeer, "put_pages", put_pages)
    lad = build_ladder(_cmb_cut(cmb_peer), size=SMALL, ofed="4.9")
    with pytest.raises(DeadlockError, match="cmb_peer.revoke_wq"):
        lad.proc.run(lad.revoke)
    lad.machine.leak_check_expected = False     # a deadlocked host cannot shut down clean
    lad.machine.sched.abandon()

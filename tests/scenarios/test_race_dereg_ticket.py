"""dereg-vs-invalidate-ticket: the MLNX_OFED 4.x mlx5 frees mr->peer_id before the core
takes the MR's ticket off the client's list, and an invalidation in between calls
mlx5_invalidate_umem with the freed peer_id - for every client on a 4.9 core.

The corpus-wide tests (tests/scenarios/test_race_corpus.py) check that the legacy
configuration fails and replays and that the fixed one survives FIXED_BUDGET
schedules; these pin down which bug it is, and that it does not depend on the client.
"""

from __future__ import annotations

from kernel_model.emu.explore import explore, explore_dfs, schedule_trace
from kernel_model.emu.platform import rdma_host
from scenarios.races import RACES
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, PD, Context

RACE = RACES["dereg-vs-invalidate-ticket"]
MiB = 1 << 20


def test_legacy_the_invalidation_waits_on_the_peer_id_the_dereg_freed():
    f = explore(lambda: RACE.run(True), "dfs", bound=1).failure
    assert f is not None and f.check == "UseAfterFree" and f.preemptions == 1
    assert "of mlx5_ib_peer_id" in f.detail and "mlx5_invalidate_umem_ticket" in f.detail
    assert "freed by app-" in f.detail and "_dereg_mr_ticket" in f.detail
    # the window: the dereg won mr->invalidated, disabled the mkey and freed the peer_id
    # while its ib_umem_release had not yet taken the ticket off the list (it waits for
    # the client's lock); the free callback's invalidation found the ticket and called
    # in - before the free or while it ran, and used the peer_id after it
    calls = schedule_trace(lambda: RACE.run(True), f.schedule).calls()
    freed = next(c for c in calls if c.func == "kfree" and "mlx5_ib_peer_id" in c.args)
    inval = next(c for c in calls if c.func == "mlx5_invalidate_umem_ticket")
    untick = next(c for c in calls if c.func == "ib_peer_destroy_invalidation_ctx")
    assert freed.end < inval.end and inval.start < untick.end
    assert freed.track == untick.track != inval.track


def _amdp2p_dereg_vs_free() -> None:
    """The same race with amdp2p serving hipMalloc'd VRAM on the 4.9 core."""
    from userspace.hip.runtime import hiprt

    m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=1, modules=())
    m.load_module("ib_core", ofed="4.9")
    m.load_module("mlx5_ib")
    m.load_module("amdp2p")
    p = m.spawn("app")
    gpu = hiprt(p)

    def setup() -> tuple:
        ctx = Context(p)
        d = gpu.hipMalloc(MiB)
        return ctx, d, MR(PD(ctx), MiB, v.IBV_ACCESS_LOCAL_WRITE, addr=d)
    ctx, d, mr = p.run(setup)
    dereg = p.start(mr.close)
    free = p.thread(gpu.hipFree, d, name="free")
    dereg.join()
    free.join()
    p.run(ctx.close)
    p.exit(0)


def test_amdp2p_on_the_4_9_core_hits_the_same_freed_peer_id():
    """Not a client's bug: amdp2p's free callback reaches the freed peer_id the same
    way (amdp2p's own write into the context release() freed, B17, shows too)."""
    for run in explore_dfs(_amdp2p_dereg_vs_free, bound=1, max_schedules=100):
        f = run.failure
        if f is not None and "of mlx5_ib_peer_id" in f.detail:
            assert f.check == "UseAfterFree" and "mlx5_invalidate_umem_ticket" in f.detail
            assert "by free-" in f.detail and "freed by app-" in f.detail    # hipFree's task
            return
    raise AssertionError("amdp2p: no invalidation reached the freed peer_id")


def test_fixed_the_25_04_core_survives_every_single_preemption():
    ex = explore(lambda: RACE.run(False), "dfs", bound=1)
    assert ex.failure is None and ex.runs > 20

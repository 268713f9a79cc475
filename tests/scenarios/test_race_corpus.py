"""The race corpus (scenarios/races.py): every legacy configuration's bug is found by
the explorer and replays; every fixed configuration survives the schedules tried.

The suite tries the first FIXED_BUDGET schedules of each fixed configuration's
bound-2 search; the whole search is measured in tests/benchmarks/test_explore_bench.py.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.explore import explore, explore_dfs, explore_dpor, replay, schedule_trace
from scenarios.races import RACES, UNMAPS, UNMAPS_FIXED, invalidate_during_reg_with

FIXED_BUDGET = 120


@pytest.mark.parametrize("name", sorted(RACES))
def test_the_legacy_configuration_fails_with_its_bug_and_the_failure_replays(name):
    race = RACES[name]
    ex = explore(lambda: race.run(True), "dfs", bound=2)
    f = ex.failure
    assert f is not None, f"{name}: no failure in {ex.runs} schedules"
    assert f.check in race.finds, f
    assert f.preemptions <= 2
    again = replay(lambda: race.run(True), f.schedule)
    assert again.failure is not None and again.failure.check == f.check


@pytest.mark.parametrize("name", sorted(RACES))
def test_the_fixed_configuration_survives_the_schedules_tried(name):
    race = RACES[name]
    ex = explore(lambda: race.run(False), "dfs", bound=2, max_schedules=FIXED_BUDGET)
    assert ex.failure is None, ex.failure
    assert ex.runs == len(ex.schedules)
    assert ex.runs == FIXED_BUDGET or ex.frontier == 0      # the budget, or all of it


def test_every_scenario_names_its_configurations_and_its_bug():
    for race in RACES.values():
        assert race.fixed and race.legacy and race.finds
        assert race.fixed != race.legacy


def test_invalidate_during_reg_legacy_also_fails_in_the_window_before_activation():
    """The first failure is B17 (after activation, on the default schedule); a preemption
    between get_pages and activation gives B3: peer_umem_release's dma_unmap, on the
    registering task, of the page table the driver freed after the callback."""
    race = RACES["invalidate-during-reg"]
    details = [run.failure.detail for run in
               explore_dfs(lambda: race.run(True), bound=1, max_schedules=40)
               if run.failure is not None]
    assert any("nv_get_p2p_free_callback" in d and "callback_task" in d for d in details)
    assert any("nvidia_p2p_dma_unmap_pages" in d and "by app-" in d for d in details)


def test_exit_order_legacy_fails_only_for_the_process_that_closes_its_gpu_file_first():
    race = RACES["exit-order"]
    f = explore(lambda: race.run(True), "dfs", bound=0).failure
    assert f is not None and "nv_get_p2p_free_callback" in f.detail
    assert "nv_mem_release" in f.detail             # freed inside the invalidation


def test_the_25_04_core_alone_does_not_fix_invalidate_during_reg_for_nvidia_peermem():
    """The core holds mapping_lock until activation, but nvidia-peermem's free callback
    checks dma_mapping first: arriving before dma_map stored it, the callback logs
    'invalid dma_mapping' and drops the invalidation (the print of nv_peer_memory
    issues 53/112); the MR keeps pages the driver freed, and its dereg unmaps them."""
    ex = explore(lambda: invalidate_during_reg_with(UNMAPS), "dfs", bound=1)
    f = ex.failure
    assert f is not None and f.check == "UseAfterFree" and f.preemptions == 1
    assert "nvidia_p2p_dma_unmap_pages" in f.detail and "by app-" in f.detail


def test_the_proposed_issue_53_fix_closes_invalidate_during_reg_at_one_preemption():
    """The same race with nvidia-peermem's issue53_fix=1: the callback invalidates even
    before dma_map, the core's mapping_lock holds it until activation - every schedule
    with one preemption is clean."""
    ex = explore(lambda: invalidate_during_reg_with(UNMAPS_FIXED), "dfs", bound=1)
    assert ex.failure is None, ex.failure
    assert ex.runs > 20


def test_every_fixed_configuration_is_on_the_invalidating_path():
    """No scenario is fixed by nvidia-peermem's persistent mode (nothing invalidated)."""
    for race in RACES.values():
        assert "persistent_api_support=1" not in race.fixed, race.name
        assert "560+ defaults" not in race.fixed, race.name


def test_late_invalidate_legacy_dereferences_the_client_release_cleared():
    """MLNX_OFED as released: the invalidation holds its umem reference, gets
    mapping_lock after ib_peer_umem_release cleared umem_p->ib_peer_client, and
    ib_peer_unmap_on_invalidate dereferences it."""
    race = RACES["late-invalidate-vs-release"]
    f = explore(lambda: race.run(True), "dfs", bound=2).failure
    assert f is not None and f.check == "null-deref", f
    assert "ib_peer_unmap_on_invalidate" in f.detail, f.detail


def test_dma_vs_invalidate_legacy_enables_the_cached_mkey_over_freed_gpu_pages():
    """OFED 4.x: the invalidation runs while mlx5_ib_update_xlt's poster waits for the
    ENABLE UMR (mr->free still set): no disable, the pages go back, and the WRITE
    posted after the registration 'succeeded' lands in BAR1 windows nothing maps."""
    race = RACES["dma-vs-invalidate"]
    f = explore(lambda: race.run(True), "dfs", bound=0).failure
    assert f is not None and f.check == "warn" and f.preemptions == 0
    trace = schedule_trace(lambda: race.run(True), f.schedule)
    names = [c.func for c in trace.calls()]
    enable = names.index("mlx5_ib_post_send_wait_update")
    inval = names.index("mlx5_invalidate_umem_ticket", enable)
    assert "mlx5r_umr_revoke_mr" not in names[inval:names.index("ib_umem_release", inval)]
    assert "hca_execute" in names[inval:]             # the DMA after the pages went


def test_dma_vs_invalidate_fixed_writes_land_in_live_gpu_memory():
    race = RACES["dma-vs-invalidate"]
    assert replay(lambda: race.run(False), "").failure is None


def test_unregister_client_busy_legacy_frees_the_client_under_the_invalidation():
    race = RACES["unregister-client-busy"]
    f = explore(lambda: race.run(True), "dfs", bound=1).failure
    assert f is not None and f.check == "UseAfterFree" and f.preemptions == 1
    assert "of ib_peer_memory_client" in f.detail and "ib_invalidate_peer_memory" in f.detail
    assert "freed by rmmod-" in f.detail and "ib_unregister_peer_memory_client" in f.detail


def test_unregister_client_busy_fixed_survives_every_single_preemption():
    race = RACES["unregister-client-busy"]
    ex = explore(lambda: race.run(False), "dfs", bound=1)
    assert ex.failure is None and ex.runs > 1 and ex.frontier == 0    # the whole search


def test_the_reduction_meets_every_failure_the_plain_search_meets():
    """Partial-order reduction runs one schedule per class of equivalent ones; the
    classes must still hold every way the program can fail.  The legacy
    free-callback-vs-put-pages at bound 1: the plain search's 127 schedules fail with
    the use-after-free and, when the kworker's callback runs before the unpin frees
    the mapping, with the driver's double BAR1 unmap - so must the 36 the reduction
    runs."""
    race = RACES["free-callback-vs-put-pages"]

    def checks(por: bool) -> tuple[set[str], int]:
        runs = list(explore_dfs(lambda: race.run(True), bound=1) if not por else
                    explore_dpor(lambda: race.run(True), bound=1))
        return {r.failure.check for r in runs if r.failure is not None}, len(runs)
    plain, n_plain = checks(False)
    por, n_por = checks(True)
    assert plain == por == {"UseAfterFree", "exception"}
    # (the conservative branches that keep a bounded search whole cost some; the
    # plain search was 966 schedules while idle workers were runnable until they ran)
    assert n_por * 3 < n_plain


def test_a_branch_the_bound_moves_up_is_not_lost():
    """An alternative that would cost a preemption the bound cannot pay moves to the
    last decision where the CPU was free; when the task is not runnable there, every
    task that is must be tried (Coons et al.'s conservative branch).  Trying none lost
    the legacy dereg-vs-invalidate's use-after-free at bound 1, which the plain search
    (1,674 schedules) finds.  So did a deadlock that cut runs short: the task left
    runnable never showed what it would race with, and is now tried at the last
    decision and the last free one (explore._dpor_step)."""
    race = RACES["dereg-vs-invalidate"]
    runs = list(explore_dpor(lambda: race.run(True), bound=1))
    assert {r.failure.check for r in runs if r.failure is not None} == \
        {"UseAfterFree", "deadlock"}
    assert len(runs) < 200

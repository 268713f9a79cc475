"""The race corpus (scenarios/races.py): every legacy configuration's bug is found by
the explorer and replays; every fixed configuration survives the schedules tried.

The suite tries the first FIXED_BUDGET schedules of each fixed configuration's
bound-2 search; the whole search is measured in tests/benchmarks/test_explore_bench.py.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.explore import explore, explore_dfs, replay, schedule_trace
from scenarios.races import RACES, UNMAPS, invalidate_during_reg_with

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
    assert ex.runs == FIXED_BUDGET == len(ex.schedules)


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
    assert ex.failure is None and ex.runs > 50

"""The race corpus (scenarios/races.py): every legacy configuration's bug is found by
the explorer and replays; every fixed configuration survives the schedules tried.

The suite tries the first FIXED_BUDGET schedules of each fixed configuration's
bound-2 search; the whole search is measured in tests/benchmarks/test_explore_bench.py.
"""

from __future__ import annotations

import pytest

from kernel_model.explore import explore, replay
from scenarios.races import RACES

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

"""The race explorer: schedules per second, its overhead per schedule, and PCT's reach.

Overhead.  One schedule of free-callback-vs-put-pages (fixed) under the
explorer (a Recording strategy logging every decision, then the judge: the
leak check and the scheduler's reset) against one plain run of the same
scenario with the default strategy and the suite's own leak check - the
issue's goal is at most 3x.

PCT's reach.  For the legacy scenarios, how many PCT schedules (seeds
0..99, depth 3) it takes to hit the bug - printed as a distribution, with
the goal of within 1,000 for 95 of 100 seeds - and the size of the
exhaustive search at bound 2 for each fixed configuration.
Ratios go in the closing notes; the counts are asserted only to be found.
"""

from __future__ import annotations

import math
import statistics

from kernel_model.emu.explore import PCT, Recording, explore, explore_dfs, run_once
from kernel_model.emu.machine import Machine, live_machines
from kernel_model.sched import SCHED
from scenarios.races import RACES

FREE = RACES["free-callback-vs-put-pages"]


def _plain() -> None:
    first = Machine.next_serial
    FREE.run(False)
    for m in [m for m in live_machines if m.serial >= first]:
        m.leak_check_expected = False
        m.check_leaks()
    SCHED.abandon()


def test_plain_run(benchmark):
    benchmark(_plain)


def test_one_explored_schedule(benchmark):
    run = benchmark(lambda: run_once(lambda: FREE.run(False), Recording([])))
    assert run.failure is None and run.points


def test_dfs_schedules_per_second(benchmark):
    def forty() -> int:
        return sum(1 for _ in explore_dfs(lambda: FREE.run(False), bound=2, max_schedules=40))
    assert benchmark.pedantic(forty, rounds=3, iterations=1) == 40


def _pct_hits(name: str, seeds: int = 100, budget: int = 1000) -> list[int]:
    race = RACES[name]
    hits = []
    for seed in range(seeds):
        for n in range(1, budget + 1):
            if run_once(lambda: race.run(True), PCT(seed * 100_003 + n, depth=3)).failure:
                hits.append(n)
                break
        else:
            hits.append(budget + 1)
    return hits


def test_pct_schedules_to_find_each_legacy_bug(benchmark):
    seeds = 4 if benchmark.disabled else 100        # the suite's smoke run: 4 seeds
    out = {}

    def all_races() -> None:
        for name in RACES:
            out[name] = _pct_hits(name, seeds)
    benchmark.pedantic(all_races, rounds=1, iterations=1)
    for name, hits in out.items():
        found = sum(h <= 1000 for h in hits)
        p95 = sorted(hits)[math.ceil(0.95 * len(hits)) - 1]       # nearest rank
        print(f"\n{name}: PCT schedules to the bug over {seeds} seeds: median "
              f"{statistics.median(hits)}, 95th percentile {p95}, max {max(hits)}, "
              f"within 1,000: {found}/{seeds}")
        assert found > 0


def test_exhaustive_search_size_at_bound_2(benchmark):
    limit = 20 if benchmark.disabled else None       # the suite's smoke run: 20 schedules
    out = {}

    def all_races() -> None:
        for name, race in RACES.items():
            out[name] = explore(lambda r=race: r.run(False), "dfs", bound=2,
                                max_schedules=limit)
    benchmark.pedantic(all_races, rounds=1, iterations=1)
    for name, ex in out.items():
        print(f"\n{name} fixed: {ex.runs} schedules at bound 2, up to {ex.decisions} "
              f"decision points, failure: {ex.failure}")
        assert ex.failure is None

"""PCT and random that behave (kernel_model/emu/explore.py): fair at sched_yield, a
shrinker bounded by time that cuts long schedules short, and `--pct-depth`.

The toy: a poller spins with sched_yield until a setter, a few scheduling points
into its work, raises a flag - a busy poll like CQ.poll_until's, with a poll limit
that makes starvation a failure.  Under PCT without the fairness the poller keeps
the CPU whenever it drew the higher priority, and polls out.
"""

from __future__ import annotations

import time

import pytest

from kernel_model.emu import explore as explore_mod
from kernel_model.emu.explore import (
    PCT,
    FairRandom,
    Recording,
    explore_pct,
    replay,
    run_once,
    shrink,
)
from kernel_model.emu.machine import Machine
from kernel_model.kthread import kthread_run
from kernel_model.locking import cond_resched
from kernel_model.sched import SCHED, RandomStrategy
from peermem.cli import main
from scenarios.races import RACES

POLLS = 200


def busy_poll() -> None:
    m = Machine(ram_size=16 << 20, name="toy")
    flag = [False]

    def poller() -> None:
        for _ in range(POLLS):
            if flag[0]:
                return
            SCHED.yield_("poll")
        raise AssertionError(f"poll timed out: {POLLS} empty polls")

    def setter() -> None:
        for _ in range(5):
            cond_resched()
        flag[0] = True

    with m.kernel():
        a, b = kthread_run(poller, name="poller"), kthread_run(setter, name="setter")
    a.join()
    b.join()


class UnfairPCT(PCT):
    """PCT as it was: the yielder competes at its own yield like at any other point."""

    def choose(self, sched, candidates, reason):
        return self.pick(sched, candidates, reason)


def test_pct_without_yield_fairness_starves_the_task_a_poll_waits_for():
    """The rule can fail: without it, some seeds poll out (a false alarm)."""
    checks = [run_once(busy_poll, UnfairPCT(s, 3, steps=20)).failure for s in range(20)]
    assert any(f is not None and "poll timed out" in f.detail for f in checks)


def test_pct_and_random_are_fair_at_a_yield():
    for seed in range(30):
        for strategy in (PCT(seed, 3, steps=20), FairRandom(seed)):
            run = run_once(busy_poll, strategy)
            assert run.failure is None, (seed, type(strategy).__name__, run.failure)
            assert len(run.points) < 40             # the setter went on at each yield


def test_fair_random_is_random_wherever_nobody_yields():
    """FairRandom makes RandomStrategy's choices when no task yields."""
    for seed in range(5):
        assert run_once(long_lost_update, FairRandom(seed)).schedule == \
            run_once(long_lost_update, RandomStrategy(seed)).schedule


def test_the_fixed_dma_vs_invalidate_raises_no_false_alarm_under_pct():
    """The issue's figure: 8 of 100 PCT seeds polled out (CQ.poll_until ... timed out)
    on the fixed configuration, the HCA engine starved by the busy-polling app.  The
    suite runs 20 seeds (13 and 16 were two of the 8); the issue's 100 are the
    benchmark's."""
    r = RACES["dma-vs-invalidate"]
    failures = [run_once(lambda: r.run(False), PCT(seed, depth=3)).failure
                for seed in range(20)]
    assert failures == [None] * 20


def test_explore_pct_takes_k_from_the_default_schedule(monkeypatch):
    """PCT's k (steps) is the number of decision points a run makes; explore_pct
    estimates it from the default schedule, so each seed's schedule is the same in
    any shard, and a change point can fall anywhere in the run."""
    seen: list[int] = []
    real = explore_mod.PCT

    def spy(seed: int, depth: int = 3, steps: int = 200) -> PCT:
        seen.append(steps)
        return real(seed, depth, steps)
    default = len(run_once(busy_poll, Recording([])).points)
    monkeypatch.setattr(explore_mod, "PCT", spy)
    runs = list(explore_pct(busy_poll, seed=4, max_schedules=5))
    assert seen == [default] * 5
    seen.clear()
    list(explore_pct(busy_poll, seed=4, max_schedules=2, steps=77))
    assert seen == [77, 77]
    monkeypatch.undo()
    assert [r.schedule for r in runs] == \
        [run_once(busy_poll, PCT(4 + i, 3, default)).schedule for i in range(5)]


# -- shrinking -------------------------------------------------------------------------------
def long_lost_update() -> None:
    """A lost update after a long stretch of scheduling points: a random schedule that
    finds it has dozens of preemptions, one of which matters."""
    m = Machine(ram_size=16 << 20, name="toy")
    counter = [0]

    def inc() -> None:
        for _ in range(60):
            cond_resched()
        v = counter[0]
        cond_resched()             # the window
        counter[0] = v + 1

    with m.kernel():
        a, b = kthread_run(inc, name="inc_a"), kthread_run(inc, name="inc_b")
    a.join()
    b.join()
    assert counter[0] == 2, f"lost update: counter is {counter[0]}"


def _long_failure():
    for seed in range(60):
        run = run_once(long_lost_update, RandomStrategy(seed))
        if run.failure is not None and run.failure.preemptions > explore_mod.SHRINK_CUT_OVER:
            return run.failure
    pytest.skip("no random run with that many preemptions failed")


def test_shrink_cuts_a_long_schedule_short_and_then_drops_preemptions():
    big = _long_failure()
    t0 = time.monotonic()
    small = shrink(long_lost_update, big)
    assert time.monotonic() - t0 < 20
    assert small.check == big.check and small.preemptions == 1
    assert replay(long_lost_update, small.schedule).failure.check == big.check


def test_shrink_stops_at_its_deadline_with_the_best_so_far(monkeypatch):
    big = _long_failure()
    runs = [0]
    real = explore_mod.run_once

    def counting(*a, **k):
        runs[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(explore_mod, "run_once", counting)
    same = shrink(long_lost_update, big, deadline=0)
    monkeypatch.undo()
    assert same == big and runs[0] == 1          # the one replay that lists the points
    assert shrink(long_lost_update, big, deadline=None).preemptions == 1


# -- the command line ------------------------------------------------------------------------
def test_cli_pct_on_the_fixed_dma_vs_invalidate_finishes_clean(capsys):
    """`peermem explore dma-vs-invalidate --strategy pct` once hung: a starved HCA, a
    poll timing out after ~100,000 decision points, then a shrinker at seconds a run."""
    t0 = time.monotonic()
    assert main(["explore", "dma-vs-invalidate", "--strategy", "pct",
                 "--max-schedules", "10"]) == 0
    assert time.monotonic() - t0 < 30
    assert "no failure found" in capsys.readouterr().out


def test_cli_pct_depth(capsys):
    name = "free-callback-vs-put-pages"
    assert main(["explore", name, "--legacy", "--strategy", "pct", "--pct-depth", "2",
                 "--max-schedules", "50", "--shrink-seconds", "0"]) == 1
    assert "FAILED: " in capsys.readouterr().out
    assert main(["explore", name, "--pct-depth", "2"]) == 2
    assert capsys.readouterr().err == \
        "peermem explore: error: --pct-depth needs --strategy pct, not dfs\n"


@pytest.mark.parametrize("value, message", [
    ("0", "must be at least 1, not 0"),
    ("21", "must be at most 20, not 21"),
    ("x", "'x' is not an integer"),
])
def test_cli_pct_depth_out_of_range_is_one_line(capsys, value, message):
    with pytest.raises(SystemExit) as e:
        main(["explore", "dma-vs-invalidate", "--strategy", "pct", "--pct-depth", value])
    assert e.value.code == 2
    assert capsys.readouterr().err == \
        f"peermem explore: error: argument --pct-depth: {message}\n"

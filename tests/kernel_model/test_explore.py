"""The race explorer (kernel_model/emu/explore.py) on a toy race and on a real one.

The toy: two kernel threads increment a shared counter with a scheduling
point between the read and the write (a lost update).  The default
schedule runs them one after the other and passes; one preemption at the
point loses an update.  The real one: scenarios/races.py's
free-callback-vs-put-pages, legacy (the R515-R535 driver) and fixed.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.explore import (
    PCT,
    Recording,
    explore,
    explore_dfs,
    interleaving,
    replay,
    run_once,
    shrink,
)
from kernel_model.emu.machine import Machine
from kernel_model.emu.platform import rdma_host
from kernel_model.kthread import kthread_run
from kernel_model.locking import cond_resched
from kernel_model.sched import RandomStrategy, ReplayDivergence, touch
from kernel_model.slab import kfree, kmalloc_obj
from peermem.cli import main
from scenarios.races import RACES, UNMAPS, dereg_vs_invalidate_with


def lost_update() -> None:
    m = Machine(ram_size=16 << 20, name="toy")
    counter = [0]

    def inc() -> None:
        touch(counter, False)      # shared state of the program's own: it says so
        v = counter[0]
        cond_resched()             # the window: read done, write not yet
        touch(counter)
        counter[0] = v + 1

    with m.kernel():
        a, b = kthread_run(inc, name="inc_a"), kthread_run(inc, name="inc_b")
    a.join()
    b.join()
    assert counter[0] == 2, f"lost update: counter is {counter[0]}"


def test_the_default_schedule_passes_and_one_preemption_finds_the_lost_update():
    assert run_once(lost_update, Recording([])).failure is None
    ex = explore(lost_update, "dfs", bound=0)
    assert ex.failure is None and ex.runs >= 1        # no preemption: no bug
    ex = explore(lost_update, "dfs", bound=1)
    assert ex.failure is not None
    assert ex.failure.check == "assertion" and "lost update" in ex.failure.detail
    assert ex.failure.preemptions == 1


def test_a_failure_replays_exactly():
    ex = explore(lost_update, "dfs", bound=1)
    again = replay(lost_update, ex.failure.schedule)
    assert again.failure is not None
    assert (again.failure.check, again.schedule) == ("assertion", ex.failure.schedule)


def test_dfs_respects_the_bound_and_never_repeats_a_schedule():
    runs = list(explore_dfs(lost_update, bound=2))
    schedules = [r.schedule for r in runs]
    assert len(schedules) == len(set(schedules))
    assert all(sum(p.preempts for p in r.points) <= 2 for r in runs)
    assert any(r.failure for r in runs) and not runs[0].failure


def test_shrink_drops_preemptions_the_failure_does_not_need():
    for seed in range(40):                  # a random failure with extra preemptions
        run = run_once(lost_update, RandomStrategy(seed))
        if run.failure is not None and run.failure.preemptions > 1:
            break
    else:
        pytest.skip("no random run with more than one preemption failed")
    small = shrink(lost_update, run.failure)
    assert small.check == run.failure.check and small.preemptions == 1
    assert replay(lost_update, small.schedule).failure is not None


def test_pct_and_random_are_repeatable_by_seed():
    a = [run_once(lost_update, PCT(seed, depth=2, steps=10)).schedule for seed in range(8)]
    b = [run_once(lost_update, PCT(seed, depth=2, steps=10)).schedule for seed in range(8)]
    assert a == b and len(set(a)) > 1
    r1 = [run_once(lost_update, RandomStrategy(s)).schedule for s in range(5)]
    assert r1 == [run_once(lost_update, RandomStrategy(s)).schedule for s in range(5)]


def test_a_prefix_naming_a_task_that_cannot_run_diverges():
    with pytest.raises(ReplayDivergence, match="wants task 9"):
        run_once(lost_update, Recording([9]))


def test_an_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="no strategy"):
        explore(lost_update, "bfs")


# -- the real race ---------------------------------------------------------------------------
RACE = RACES["free-callback-vs-put-pages"]


def test_the_legacy_driver_race_is_found_and_replays():
    ex = explore(lambda: RACE.run(True), "dfs", bound=2)
    f = ex.failure
    assert f is not None and f.check in ("UseAfterFree", "DoubleFree")
    assert "nv_p2p_free_platform_data" in f.detail
    assert replay(lambda: RACE.run(True), f.schedule).failure.check == f.check


def test_the_fixed_driver_survives_the_schedules_tried():
    ex = explore(lambda: RACE.run(False), "dfs", bound=2, max_schedules=40)
    assert ex.failure is None and ex.runs == 40 and len(ex.schedules) == 40


def test_pct_finds_the_legacy_race_too():
    ex = explore(lambda: RACE.run(True), "pct", seed=1, max_schedules=50)
    assert ex.failure is not None


def test_cli_exit_codes(capsys):
    assert main(["explore", RACE.name, "--legacy"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: " in out and f"replay: peermem explore {RACE.name} --legacy --replay" in out
    schedule = out.split("--replay '")[1].split("'")[0]
    assert main(["explore", RACE.name, "--legacy", "--replay", schedule]) == 1
    assert main(["explore", RACE.name, "--max-schedules", "5"]) == 0
    assert "no failure found" in capsys.readouterr().out
    assert main(["explore", "nosuch"]) == 2


def test_the_pre_unmaps_dereg_vs_invalidate_deadlock_is_found_and_not_in_the_fixed_design():
    r = RACES["dereg-vs-invalidate"]
    ex = explore(lambda: r.run(True), "dfs", bound=1)
    assert ex.failure is not None and ex.failure.check == "deadlock"
    # (a command is one step now: the schedule that needed a preemption inside the
    # command interface needs none)
    assert ex.failure.preemptions <= 1
    # with UNMAPS there is no deadlock in any schedule at bound 1 - but the explorer does
    # find nv_peer_memory issue 53: deregistration's dma_unmap, outside mapping_lock,
    # after the free callback returned and the driver freed the page table
    checks = {run.failure.check
              for run in explore_dfs(lambda: dereg_vs_invalidate_with(UNMAPS), bound=1,
                                     max_schedules=80)
              if run.failure is not None}
    assert "deadlock" not in checks and "UseAfterFree" in checks
    # the fixed configuration (persistent, never invalidated) has neither
    assert explore(lambda: r.run(False), "dfs", bound=1, max_schedules=80).failure is None


# -- sharding, the interleaved trace, the NULL-dereference verdict --------------------------
def test_dfs_shards_split_the_search_into_disjoint_parts_that_cover_it():
    whole = {r.schedule for r in explore_dfs(lost_update, bound=2)}
    parts = [[r.schedule for r in explore_dfs(lost_update, bound=2, shard=(i, 3))]
             for i in range(3)]
    flat = [s for p in parts for s in p]
    assert len(flat) == len(set(flat))                  # disjoint
    assert set(flat) == whole                           # and together the whole search
    assert all(parts)                                   # each shard got some


def test_seeded_strategies_shard_by_seed():
    for strategy in ("pct", "random"):
        whole = explore(lost_update, strategy, max_schedules=12, stop_at_failure=False)
        a = explore(lost_update, strategy, max_schedules=12, shard=(0, 2),
                    stop_at_failure=False)
        b = explore(lost_update, strategy, max_schedules=12, shard=(1, 2),
                    stop_at_failure=False)
        assert (a.runs, b.runs, whole.runs) == (6, 6, 12)
        assert a.schedules | b.schedules == whole.schedules


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_outside_its_range_is_refused(shard):
    with pytest.raises(ValueError, match="shard"):
        explore(lost_update, shard=shard)


def test_the_interleaving_shows_each_task_and_every_switch_up_to_the_failure():
    f = explore(lambda: RACE.run(True), "dfs", bound=2).failure
    text = interleaving(lambda: RACE.run(True), f.schedule, depth=3, lines=None)
    assert text.startswith("# tracer: function_graph")
    for task in ("app-2", "unpin-3", "kworker/nv_queue-1"):
        assert task in text
    assert "=>  unpin-3" in text and "nvidia_p2p_put_pages" in text
    assert "= !UseAfterFree" in text                    # where it went wrong
    assert "delete_module" not in text                   # not the leak check's teardown
    short = interleaving(lambda: RACE.run(True), f.schedule, depth=3, lines=10)
    assert "earlier lines left out" in short and len(short.splitlines()) <= 10 + 6


def test_a_none_dereference_is_reported_as_a_null_pointer_oops():
    def oops() -> None:
        Machine(ram_size=16 << 20, name="toy")
        client = None
        client.peer_mem                 # noqa: B018 - the NULL dereference under test
    f = run_once(oops, Recording([])).failure
    assert f.check == "null-deref" and "NULL pointer dereference" in f.detail
    assert "in oops() at kernel_model/test_explore.py" in f.detail


def test_cli_shard_and_trace(capsys):
    assert main(["explore", RACE.name, "--shard", "0/4", "--max-schedules", "3"]) == 0
    assert "dfs shard 0/4: 3 schedules" in capsys.readouterr().out
    assert main(["explore", RACE.name, "--legacy"]) == 1
    out = capsys.readouterr().out
    assert "interleaving of the failing schedule" in out and "=>  " in out
    schedule = out.split("--replay '")[1].split("'")[0]
    assert main(["explore", RACE.name, "--legacy", "--replay", schedule, "--trace"]) == 1
    out = capsys.readouterr().out
    assert "# tracer: function_graph" in out and "earlier lines" not in out
    assert "cudaMalloc" in out and "FAILED: UseAfterFree" in out
    with pytest.raises(SystemExit):
        main(["explore", RACE.name, "--shard", "4/4"])


def test_cli_lists_the_race_scenarios(capsys):
    assert main(["explore", "--list"]) == 0
    out = capsys.readouterr().out
    for name, race in RACES.items():
        assert name in out and race.legacy in out and race.fixed in out
    assert main(["explore"]) == 2                   # no scenario: the list, and usage's 2


def test_cli_replay_trace_in_the_tracers_other_formats(capsys, tmp_path):
    import json
    assert main(["explore", RACE.name, "--legacy"]) == 1
    schedule = capsys.readouterr().out.split("--replay '")[1].split("'")[0]
    out = tmp_path / "race.json"
    assert main(["explore", RACE.name, "--legacy", "--replay", schedule, "--trace",
                 "--format", "perfetto", "-o", str(out)]) == 1
    events = json.loads(out.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and
              e.get("name") == "thread_name"}
    assert {"app-2", "unpin-3", "kworker/nv_queue-1"} <= tracks       # a track per task
    capsys.readouterr()
    assert main(["explore", RACE.name, "--legacy", "--replay", schedule, "--trace",
                 "--format", "mermaid"]) == 1
    assert "sequenceDiagram" in capsys.readouterr().out


def test_a_task_that_died_of_a_kernel_bug_is_the_verdict():
    """A kworker oopses (a use-after-free) and the program only sees the aftermath: the
    oops is what the explorer reports, naming the task."""
    class thing:
        x = 0

    def program() -> None:
        m = rdma_host(ram_size=16 << 20, modules=())
        with m.kernel():
            obj = kmalloc_obj(thing())
            kfree(obj)
            kthread_run(lambda: obj.x, name="oopser")
        m.spawn("app").run(cond_resched)        # the kthread runs, and dies
        raise AssertionError("the program's own complaint")
    run = run_once(program, Recording([]))
    assert run.failure.check == "UseAfterFree"
    assert "oopser" in run.failure.detail and "died of it" in run.failure.detail


def spin_until_set() -> None:
    """A task spins with sched_yield until another sets a flag (a busy poll)."""
    from kernel_model.sched import SCHED
    m = Machine(ram_size=16 << 20, name="toy")
    flag = [False]
    spins = [0]

    def poller() -> None:
        while not flag[0]:
            spins[0] += 1
            SCHED.yield_("poll")

    def setter() -> None:
        cond_resched()
        flag[0] = True

    with m.kernel():
        a, b = kthread_run(poller, name="poller"), kthread_run(setter, name="setter")
    a.join()
    b.join()


def test_spinning_again_after_a_yield_costs_a_preemption():
    """CHESS's fairness for spin loops: a yield hands the CPU on by default, and taking
    it back is a preemption - so a bounded search of a busy poll is finite and small,
    instead of spinning for free at every yield."""
    run = run_once(spin_until_set, Recording([]))
    assert run.failure is None and not any(p.preempts for p in run.points)
    # without the rule every yield offers "spin again" for free: 1,000 schedules of
    # ever longer spins (3,000 decision points at 3,000 schedules)
    runs = list(explore_dfs(spin_until_set, bound=2, max_schedules=1000))
    assert all(r.failure is None for r in runs)
    assert len(runs) < 100 and max(len(r.points) for r in runs) <= len(run.points) + 4


def test_a_leak_verdict_keeps_the_whole_report():
    """The leak check's report is the verdict's detail, every line of it: the leaked
    pin with its page and where the page was made, not only "N leak(s):"."""
    from c_ext import U64Array
    from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast

    def program() -> None:
        m = Machine(ram_size=16 << 20, name="leaky")
        p = m.spawn("leaker")
        a = p.mmap(0, m.page_size)
        with p.kernel():
            assert pin_user_pages_fast(a, 1, FOLL_WRITE, U64Array(1)) == 1

    f = run_once(program, Recording([])).failure
    assert f.check == "leak"
    lines = f.detail.splitlines()
    assert lines[0] == "leaky: 2 leak(s):" and len(lines) == 3
    assert "refcount 1 pincount 1" in f.detail and "do_anonymous_page" in f.detail
    assert "nr_foll_pin_acquired 1 != nr_foll_pin_released 0" in f.detail
    assert str(f).startswith("leak: leaky: 2 leak(s):\n  pfn ")


def test_the_dfs_frontier_shrinks_to_zero_and_pct_counts_down():
    """Exploration.frontier: the prefixes a DFS has still to run (0 once the search is
    exhausted), the runs a PCT search has still to make."""
    seen: list[int] = []
    ex = explore(lost_update, "dfs", bound=1, stop_at_failure=False,
                 progress=lambda e: seen.append(e.frontier))
    assert ex.runs == len(seen) and seen[-1] == ex.frontier == 0 and max(seen) > 0
    seen.clear()
    ex = explore(lost_update, "pct", max_schedules=7, seed=3, stop_at_failure=False,
                 progress=lambda e: seen.append(e.frontier))
    assert seen == [6, 5, 4, 3, 2, 1, 0]
    seen.clear()
    explore(lost_update, "random", max_schedules=9, shard=(1, 2), stop_at_failure=False,
            progress=lambda e: seen.append(e.frontier))
    assert seen == [3, 2, 1, 0]                                # runs 1, 3, 5, 7 of 9


def test_explore_progress_lines(monkeypatch, capsys):
    """Off a terminal (CI), `peermem explore` prints a plain progress line every
    PROGRESS_EVERY_S: schedules run of the total (a lower bound for DFS), rate, time
    left, failures."""
    from types import SimpleNamespace

    import peermem.cli as cli
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.0)
    assert main(["explore", RACE.name, "--max-schedules", "30"]) == 0
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("explore: ")]
    assert len(lines) == 30 and "\r" not in "".join(err)
    assert lines[-1].startswith("explore: 30 of 30 schedules (30 distinct), ")
    assert lines[-1].endswith(", 0 s left, failures: 0")
    ex = SimpleNamespace(runs=40, frontier=12, schedules=set(range(40)), failure=None)
    assert cli.explore_progress_line(ex, "dfs", 2.0) == \
        "explore: 40 of >= 52 schedules (40 distinct), 20/s, >= 1 s left, failures: 0"
    assert cli.explore_progress_line(ex, "dfs", 2.0, max_schedules=45).startswith(
        "explore: 40 of 45 schedules")                      # the cap ends it: exact
    ex.failure = object()
    assert cli.explore_progress_line(ex, "pct", 4.0).endswith(
        "10/s, 1 s left, failures: 1")

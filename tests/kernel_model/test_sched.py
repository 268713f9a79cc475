"""Tests for kernel_model/sched.py, kthread.py and Process.thread: who runs when."""

from __future__ import annotations

import pytest

from kernel_model.current import current
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.emu.machine import Machine
from kernel_model.errno import EINTR
from kernel_model.kthread import kthread_run, kthread_should_stop, kthread_stop
from kernel_model.locking import (
    complete,
    cond_resched,
    init_completion,
    msleep,
    mutex_init,
    schedule_timeout,
    wait_for_completion,
)
from kernel_model.sched import (
    SCHED,
    DeadlockError,
    RandomStrategy,
    ReplayDivergence,
    ReplayStrategy,
    format_schedule,
    parse_schedule,
)

# -- the default order ----------------------------------------------------------

def test_default_order_is_run_to_block_then_fifo(m):
    log = []
    with m.kernel():
        go = init_completion("go")

        def a():
            log.append("a1")
            cond_resched()          # a point, but the default keeps the current task
            log.append("a2")
            wait_for_completion(go)
            log.append("a3")

        def b():
            log.append("b1")
            complete(go)            # wakes a; b goes on until it blocks or ends
            log.append("b2")

        ta, tb = kthread_run(a, name="a"), kthread_run(b, name="b")
        log.append("main")          # spawned tasks first run when main blocks
        ta.join()
        tb.join()
    assert log == ["main", "a1", "a2", "b1", "b2", "a3"]
    assert (ta.tid, tb.tid) == (1, 2)
    assert SCHED.schedule == "0*2,1*3,2"


def test_spawn_and_join_return_results(m):
    with m.kernel():
        ts = [SCHED.spawn(lambda x: x * x, i, name=f"sq{i}") for i in range(3)]
        assert [t.join() for t in ts] == [0, 1, 4]
        assert all(t.done for t in ts)
        assert ts[0].join() == 0  # joining an ended task returns at once


def test_join_reraises_the_tasks_exception(m):
    def boom():
        raise ValueError("boom")

    with m.kernel():
        t = kthread_run(boom, name="boom")
        with pytest.raises(ValueError, match="boom"):
            t.join()
    assert find_leaks(m) == []  # joined: the exception was delivered


def test_an_unjoined_failing_task_is_a_leak(m):
    def boom():
        raise ValueError("nobody listens")

    with m.kernel():
        t = kthread_run(boom, name="boom")
        msleep(1)  # main blocks; boom runs and dies
    assert t.done
    assert find_leaks(m) == [f"sched task {t.tid} boom-{t.ts.pid} died and nobody joined it: "
                             "ValueError('nobody listens')"]
    with pytest.raises(ValueError):
        t.join()
    assert find_leaks(m) == []


# -- user threads and kthreads ----------------------------------------------------

def test_process_thread_shares_the_mm_with_its_own_pid(m):
    p = m.spawn("app")

    def body():
        me = current()
        addr = p.mmap(0, m.page_size)
        p.store(addr, b"from thread")
        return me.pid, me.tgid, me.mm, addr

    t = p.thread(body, name="worker")
    pid, tgid, mm, addr = t.join()
    assert pid not in (p.pid, 0) and tgid == p.pid
    assert mm is p.mm
    assert p.load(addr, 11) == b"from thread"  # the leader sees the thread's mapping


def test_kthread_runs_until_stopped(m):
    log = []
    with m.kernel():
        def loop():
            n = 0
            while not kthread_should_stop():
                n += 1
                log.append(n)
                msleep(10)
            return n * 100

        t = kthread_run(loop, name="poller")
        assert t.ts.pid in m.kthreads
        msleep(25)              # the poller runs at jiffies +0, +10, +20
        assert kthread_stop(t) == 300
        assert log == [1, 2, 3]
        assert t.ts.pid not in m.kthreads


def test_kthread_stop_of_a_never_started_thread_returns_eintr(m):
    ran = []
    with m.kernel():
        t = kthread_run(lambda: ran.append(1), name="lazy")
        assert kthread_stop(t) == -EINTR
    assert ran == []


# -- schedules -----------------------------------------------------------------

def test_schedule_strings_round_trip():
    assert format_schedule([0, 0, 0, 1, 2, 2]) == "0*3,1,2*2"
    assert parse_schedule("0*3,1,2*2") == [0, 0, 0, 1, 2, 2]
    assert parse_schedule(" 1 , 2*2 ") == [1, 2, 2]
    assert format_schedule([]) == "" and parse_schedule("") == []
    for junk in ("a", "1*", "1*x", "-1", "1**2"):
        with pytest.raises(ValueError, match="parse_schedule: bad step"):
            parse_schedule(junk)


def _three_workers(strategy=None) -> tuple[list, str, list]:
    """Three kthreads taking turns at points; returns (log, schedule, switches)."""
    m = Machine(ram_size=64 << 20)
    SCHED.use(strategy)
    log, switches = [], []

    def on_switch(a, b, reason):
        switches.append((a.tid, b.tid, reason))

    SCHED.on_switch.append(on_switch)
    try:
        with m.kernel():
            lock = mutex_init("L")

            def work(tag):
                for i in range(3):
                    with lock:
                        log.append(f"{tag}{i}")
                    cond_resched()

            ts = [kthread_run(work, tag, name=tag) for tag in "xyz"]
            for t in ts:
                t.join()
    finally:
        SCHED.on_switch.remove(on_switch)
        SCHED.use(None)
    return log, SCHED.schedule, switches


def test_random_strategy_is_reproducible_from_its_seed():
    runs = {seed: _three_workers(RandomStrategy(seed)) for seed in range(4)}
    assert _three_workers(RandomStrategy(2)) == runs[2]
    assert len({tuple(log) for log, _, _ in runs.values()}) > 1  # seeds do differ
    default = _three_workers()[0]
    assert default == ["x0", "x1", "x2", "y0", "y1", "y2", "z0", "z1", "z2"]


def test_replay_reproduces_a_recorded_schedule_exactly():
    log, sched, switches = _three_workers(RandomStrategy(3))
    assert _three_workers(ReplayStrategy(sched)) == (log, sched, switches)


def test_replay_divergence_names_the_decision(m):
    with m.kernel():
        SCHED.use(ReplayStrategy("7"))
        with pytest.raises(ReplayDivergence, match=r"decision 0 wants task 7, which cannot run "
                           r"at this point \(wake_up_new_task\); runnable: 0:main, 1:t-1"):
            kthread_run(lambda: None, name="t")
        SCHED.use(ReplayStrategy("0"))
        with pytest.raises(ReplayDivergence, match=r"the schedule has 1 decisions but the run "
                           r"reached another \(wake_up_new_task\)"):
            kthread_run(lambda: None, name="u")
            kthread_run(lambda: None, name="v")
        SCHED.use(None)
        assert [t.name for t in SCHED.abandon()] == ["t", "u", "v"]
    assert m.kthreads == {}


# -- deadlocks ------------------------------------------------------------------

def _abba(strategy) -> tuple[Machine, list, str, str | None]:
    m = Machine(ram_size=64 << 20)
    SCHED.use(strategy)
    log, err = [], None
    with m.kernel():
        a, b = mutex_init("A"), mutex_init("B")

        def take(first, second):
            with first:
                log.append(f"{current().comm} {first.name}")
                cond_resched()
                with second:
                    log.append(f"{current().comm} {second.name}")

        t1, t2 = kthread_run(take, a, b, name="t1"), kthread_run(take, b, a, name="t2")
        try:
            t1.join()
            t2.join()
        except DeadlockError as e:
            err = str(e)
    SCHED.use(None)
    sched = SCHED.schedule
    SCHED.abandon()
    return m, log, sched, err


def test_abba_found_by_random_search_is_reported_and_replays():
    for seed in range(50):
        m, log, sched, err = _abba(RandomStrategy(seed))
        assert len(m.bugs) == 1 and "possible circular locking dependency" in m.bugs[0]
        m.bugs.clear()
        if err is not None:
            break
    else:
        pytest.fail("no seed deadlocked")
    assert log == ["t1 A", "t2 B"]
    lines = err.splitlines()
    assert lines[0] == "every task is blocked:"
    assert lines[1] == "  task 0 main waits for task 1 t1-1 to exit"
    assert lines[2] == ("  task 1 t1-1 waits for mutex B held by t2-2, 1 waiting "
                        "(owner: task 2 t2-2)")
    assert lines[3].startswith("      holding A (write) taken at tests/kernel_model/test_sched.py:")
    assert lines[4] == ("  task 2 t2-2 waits for mutex A held by t1-1, 1 waiting "
                        "(owner: task 1 t1-1)")
    assert lines[5].startswith("      holding B (write) taken at tests/kernel_model/test_sched.py:")
    assert lines[6] == "  cycle: 1:t1-1 -> 2:t2-2 -> 1:t1-1"
    m2, log2, sched2, err2 = _abba(ReplayStrategy(sched))
    assert (log2, sched2, err2) == (log, sched, err)
    m2.bugs.clear()


def test_abandon_unwinds_stuck_tasks(m):
    log = []
    with m.kernel():
        never = init_completion("never")

        def stuck(tag):
            try:
                wait_for_completion(never)
            finally:
                log.append(f"{tag} unwound as {current().comm}")

        ts = [kthread_run(stuck, tag, name=tag) for tag in ("p", "q")]
        with pytest.raises(DeadlockError, match="task 1 p-1 waits for wait queue never"):
            ts[0].join()
        assert SCHED.abandon() == ts
        assert current() is m.init_task   # main's context is given back
    assert log == ["p unwound as p", "q unwound as q"]
    assert all(t.done and t.killed for t in ts)
    assert SCHED.alive == {} and SCHED.dead is None


# -- virtual time ----------------------------------------------------------------

def test_virtual_time_wakes_sleepers_in_deadline_order(m):
    log = []
    t0 = SCHED.jiffies
    with m.kernel():
        def sleeper(ms):
            msleep(ms)
            log.append((ms, SCHED.jiffies - t0))
            assert schedule_timeout(5) == 0
            log.append((ms, SCHED.jiffies - t0))

        ts = [kthread_run(sleeper, ms, name=f"s{ms}") for ms in (30, 10, 20)]
        assert SCHED.jiffies == t0  # no time passes while anyone can run
        for t in ts:
            t.join()
    assert log == [(10, 10), (10, 15), (20, 20), (20, 25), (30, 30), (30, 35)]
    assert SCHED.jiffies == t0 + 35

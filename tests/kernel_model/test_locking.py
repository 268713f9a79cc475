"""Tests for kernel_model/locking.py and lockdep.py: locks, waits, and their debug checks."""

from __future__ import annotations

import pytest

from kernel_model.kthread import kthread_run
from kernel_model.lockdep import LockBug, lockdep_assert_held
from kernel_model.locking import (
    assert_spin_locked,
    complete,
    complete_all,
    completion_done,
    cond_resched,
    init_completion,
    init_waitqueue_head,
    msleep,
    mutex_init,
    mutex_is_locked,
    mutex_lock,
    mutex_trylock,
    mutex_unlock,
    reinit_completion,
    spin_lock,
    spin_lock_init,
    spin_lock_irqsave,
    spin_trylock,
    spin_unlock,
    spin_unlock_irqrestore,
    try_wait_for_completion,
    wait_event,
    wait_event_timeout,
    wait_for_completion,
    wait_for_completion_timeout,
    wake_up,
)
from kernel_model.sched import SCHED, Strategy

HERE = "tests/kernel_model/test_locking.py"


class OthersFirst(Strategy):
    """Switch away at every point where another task can run."""

    def choose(self, sched, candidates, reason):
        return candidates[-1]


# -- spinlocks and mutexes ----------------------------------------------------------

def test_spinlock_excludes_and_counts_preemption(m):
    log = []
    with m.kernel():
        lock = spin_lock_init("L")

        def crit(tag):
            spin_lock(lock)
            assert SCHED.current.preempt_count == 1
            log.append(f"{tag} in")
            SCHED.point("inside")
            log.append(f"{tag} out")
            spin_unlock(lock)
            assert SCHED.current.preempt_count == 0

        SCHED.use(OthersFirst())
        ts = [kthread_run(crit, tag, name=tag) for tag in "ab"]
        for t in ts:
            t.join()
        SCHED.use(None)
        assert log == ["b in", "b out", "a in", "a out"]
        flags = spin_lock_irqsave(lock)
        assert flags == 0 and not spin_trylock(lock)  # held (by us)
        assert_spin_locked(lock)
        spin_unlock_irqrestore(lock, flags)
        assert spin_trylock(lock)
        spin_unlock(lock)
        with pytest.raises(LockBug, match="assert_spin_locked: L is not locked at "
                           f"{HERE}:"):
            assert_spin_locked(lock)


def test_mutex_hands_over_in_fifo_order(m):
    log = []
    with m.kernel():
        lock = mutex_init("M")
        mutex_lock(lock)
        assert mutex_is_locked(lock) and not mutex_trylock(lock)

        def waiter(tag):
            with lock:
                log.append(tag)

        ts = [kthread_run(waiter, tag, name=tag) for tag in "abc"]
        msleep(1)           # all three queue behind main
        assert repr(lock) == "mutex M held by main, 3 waiting"
        mutex_unlock(lock)  # handed straight to a, then b, then c
        for t in ts:
            t.join()
        assert log == ["a", "b", "c"]
        assert not mutex_is_locked(lock) and repr(lock) == "mutex M unlocked"
        assert mutex_trylock(lock)
        mutex_unlock(lock)


# -- wait queues and completions ---------------------------------------------------

def test_wait_event_rechecks_its_condition_after_each_wake(m):
    log = []
    with m.kernel():
        wq = init_waitqueue_head("wq")
        state = {"n": 0}

        def waiter():
            wait_event(wq, lambda: state["n"] >= 2)
            log.append(("woke", state["n"]))

        t = kthread_run(waiter, name="w")
        for _ in range(2):
            msleep(1)
            state["n"] += 1
            log.append(("wake", wake_up(wq)))
        t.join()
    assert log == [("wake", 1), ("wake", 1), ("woke", 2)]


def test_wait_event_timeout_returns_jiffies_left_or_zero(m):
    with m.kernel():
        wq = init_waitqueue_head("wq")
        t0 = SCHED.jiffies
        assert wait_event_timeout(wq, lambda: False, 7) == 0
        assert SCHED.jiffies == t0 + 7
        assert wait_event_timeout(wq, lambda: True, 7) == 7
        flag = []

        def setter():
            msleep(3)
            flag.append(1)
            wake_up(wq)

        t = kthread_run(setter, name="s")
        assert wait_event_timeout(wq, lambda: flag, 10) == 7
        t.join()


def test_completion_complete_wakes_one_and_complete_all_every_waiter(m):
    log = []
    with m.kernel():
        done = init_completion("done")

        def waiter(tag):
            wait_for_completion(done)
            log.append(tag)

        ts = [kthread_run(waiter, tag, name=tag) for tag in "ab"]
        msleep(1)
        complete(done)
        msleep(1)
        assert log == ["a"] and not completion_done(done)
        complete_all(done)
        for t in ts:
            t.join()
        assert log == ["a", "b"]
        assert completion_done(done) and try_wait_for_completion(done)  # stays done
        reinit_completion(done)
        assert not completion_done(done) and not try_wait_for_completion(done)
        complete(done)
        assert try_wait_for_completion(done) and not completion_done(done)


def test_completion_timeouts(m):
    with m.kernel():
        done = init_completion("done")
        t0 = SCHED.jiffies
        assert wait_for_completion_timeout(done, 5) == 0
        assert SCHED.jiffies == t0 + 5

        def later():
            msleep(2)
            complete(done)

        t = kthread_run(later, name="later")
        assert wait_for_completion_timeout(done, 5) == 3
        t.join()


def test_cond_resched_is_a_scheduling_point(m):
    log = []
    with m.kernel():
        def chatty(tag):
            for i in range(2):
                log.append(f"{tag}{i}")
                cond_resched()

        ts = [kthread_run(chatty, tag, name=tag) for tag in "ab"]
        SCHED.use(OthersFirst())
        for t in ts:
            t.join()
        SCHED.use(None)
    assert log == ["b0", "a0", "b1", "a1"]


# -- debug checks --------------------------------------------------------------------

def test_lockdep_reports_an_inversion_without_deadlocking(m):
    with m.kernel():
        a, b = mutex_init("A"), mutex_init("B")
        with a, b:   # A -> B
            pass
        assert m.bugs == []
        with b, a:   # B -> A: could deadlock against the first order
            pass
    assert len(m.bugs) == 1
    lines = m.bugs[0].splitlines()
    assert lines[0] == "WARNING: lockdep: possible circular locking dependency detected"
    assert lines[1].startswith(f"main is trying to acquire A at {HERE}:")
    assert lines[2].startswith(f"but already holds B, taken at {HERE}:")
    assert lines[4].startswith(f"  A (held, taken at {HERE}:")
    assert "-> B (taken at" in lines[4] and lines[4].endswith(" by main")
    assert lines[5] == ("possible unsafe locking scenario: CPU0 lock(B); CPU1 lock(A); "
                        "CPU1 lock(B); CPU0 lock(A); *** DEADLOCK ***")
    m.bugs.clear()


def test_lockdep_is_quiet_for_a_consistent_order(m):
    with m.kernel():
        a, b = mutex_init("A"), mutex_init("B")

        def both():
            with a, b:
                cond_resched()

        ts = [kthread_run(both, name=f"t{i}") for i in range(3)]
        for t in ts:
            t.join()
    assert m.bugs == []


def test_recursive_locking_is_a_lockbug(m):
    with m.kernel():
        a = mutex_init("A")
        with a, pytest.raises(LockBug, match=f"possible recursive locking detected: main is "
                              f"trying to acquire A at {HERE}:.* but already holds it"):
            mutex_lock(a)
        assert not mutex_is_locked(a)


def test_unlocking_a_free_lock_is_a_lockbug(m):
    with m.kernel():
        a = mutex_init("A")
        with pytest.raises(LockBug, match=f"mutex_unlock: main releases A held by nobody at "
                           f"{HERE}:"):
            mutex_unlock(a)


def test_unlock_by_a_non_owner_is_a_lockbug(m):
    with m.kernel():
        a = mutex_init("A")
        t = kthread_run(mutex_lock, a, name="owner")
        t.join()
        with pytest.raises(LockBug, match=f"mutex_unlock: main releases A held by owner-1 at "
                           f"{HERE}:"):
            mutex_unlock(a)


def test_sleeping_under_a_spinlock_is_reported_with_the_spinlock(m):
    with m.kernel():
        s, mu = spin_lock_init("S"), mutex_init("MU")
        with s:
            mutex_lock(mu)
            mutex_unlock(mu)
    assert len(m.bugs) == 1
    assert m.bugs[0].startswith(f"WARNING: mutex_lock: BUG: sleeping function called from "
                                f"invalid context at {HERE}:")
    assert ": mutex_lock() by main, preempt_count 1, holding S (write) taken at " \
        f"{HERE}:" in m.bugs[0]
    m.bugs.clear()
    with m.kernel():   # the same sleep outside the spinlock is fine
        with s:
            pass
        with mu:
            cond_resched()
    assert m.bugs == []


def test_lockdep_assert_held(m):
    with m.kernel():
        a = mutex_init("A")
        with a:
            lockdep_assert_held(a)
        assert m.bugs == []
        lockdep_assert_held(a)
    assert len(m.bugs) == 1
    assert m.bugs[0].startswith(f"WARNING: lockdep_assert_held: A not held by main at {HERE}:")
    m.bugs.clear()


def test_trylock_adds_no_dependency(m):
    with m.kernel():
        a, b = mutex_init("A"), mutex_init("B")
        with a:
            assert mutex_trylock(b)   # A -> B is not recorded: a trylock cannot wait
            mutex_unlock(b)
        with b, a:
            pass
    assert m.bugs == []
    assert ("A", "B") not in m.lockdep.edges and ("B", "A") in m.lockdep.edges

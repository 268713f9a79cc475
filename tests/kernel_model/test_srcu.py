"""Tests for kernel_model/srcu.py: grace periods, the index, and the lockdep checks."""

from __future__ import annotations

import pytest

from kernel_model.kthread import kthread_run
from kernel_model.lockdep import LockBug
from kernel_model.locking import msleep, mutex_init
from kernel_model.sched import SCHED, DeadlockError
from kernel_model.srcu import (
    cleanup_srcu_struct,
    init_srcu_struct,
    srcu_read_lock,
    srcu_read_lock_held,
    srcu_read_unlock,
    synchronize_srcu,
)

HERE = "tests/kernel_model/test_srcu.py"


def _reader(ssp, log, tag, start, hold, mutex=None):
    def body():
        msleep(start)
        idx = srcu_read_lock(ssp)
        log.append((f"{tag} in", idx, SCHED.jiffies - body.t0))
        msleep(hold)
        if mutex is not None:
            with mutex:
                pass
        log.append((f"{tag} out", idx, SCHED.jiffies - body.t0))
        srcu_read_unlock(ssp, idx)
    body.t0 = SCHED.jiffies
    return body


def test_synchronize_waits_for_earlier_readers_only(m):
    log = []
    with m.kernel():
        ssp = init_srcu_struct("ss")
        ts = [kthread_run(_reader(ssp, log, "early", 0, 10), name="early"),
              kthread_run(_reader(ssp, log, "late", 2, 100), name="late")]
        t0 = SCHED.jiffies
        msleep(1)
        synchronize_srcu(ssp)
        log.append(("gp done", ssp.idx, SCHED.jiffies - t0))
        for t in ts:
            t.join()
        cleanup_srcu_struct(ssp)
    assert log == [("early in", 0, 0), ("late in", 1, 2), ("early out", 0, 10),
                   ("gp done", 1, 10), ("late out", 1, 102)]
    assert m.bugs == []


def test_synchronize_without_readers_returns_at_once(m):
    with m.kernel():
        ssp = init_srcu_struct("ss")
        t0 = SCHED.jiffies
        synchronize_srcu(ssp)
        synchronize_srcu(ssp)
        assert SCHED.jiffies == t0 and ssp.completed == 2 and ssp.idx == 0


def test_nested_sections_across_a_flip(m):
    with m.kernel():
        ssp = init_srcu_struct("ss")
        outer = srcu_read_lock(ssp)
        assert srcu_read_lock_held(ssp)
        ssp.idx ^= 1                    # as a grace period started elsewhere would
        inner = srcu_read_lock(ssp)
        assert (outer, inner) == (0, 1)
        srcu_read_unlock(ssp, outer)    # any order, as long as each idx is handed back
        srcu_read_unlock(ssp, inner)
        assert not srcu_read_lock_held(ssp) and ssp.inside == {}


# -- debug checks --------------------------------------------------------------------

def test_bad_idx_and_unbalanced_unlock_are_lockbugs(m):
    with m.kernel():
        ssp = init_srcu_struct("ss")
        with pytest.raises(LockBug, match=f"srcu_read_unlock: main is not in a read section of "
                           f"ss \\(unbalanced unlock at {HERE}:"):
            srcu_read_unlock(ssp, 0)
        idx = srcu_read_lock(ssp)
        with pytest.raises(LockBug, match=f"srcu_read_unlock: bad idx 1 for ss at {HERE}:.*: "
                           "main entered with idx 0"):
            srcu_read_unlock(ssp, 1)
        srcu_read_unlock(ssp, idx)


def test_synchronize_inside_own_read_section_is_a_lockbug(m):
    with m.kernel():
        ssp, other = init_srcu_struct("ss"), init_srcu_struct("other")
        idx = srcu_read_lock(ssp)
        synchronize_srcu(other)         # a different srcu_struct: fine
        with pytest.raises(LockBug, match="synchronize_srcu: illegal synchronize_srcu\\(\\) in "
                           "same-type SRCU read-side critical section: main is inside ss"):
            synchronize_srcu(ssp)
        srcu_read_unlock(ssp, idx)
    assert m.bugs == []


def test_mutex_across_synchronize_taken_by_a_reader_is_reported(m):
    log = []
    with m.kernel():
        ssp, mu = init_srcu_struct("ss"), mutex_init("M")
        kthread_run(_reader(ssp, log, "r", 0, 1, mutex=mu), name="r").join()  # ss -> M
        assert m.bugs == []
        with mu:
            synchronize_srcu(ssp)       # M -> ss: waits for readers that may want M
    assert len(m.bugs) == 1
    assert "main is trying to acquire ss at" in m.bugs[0]
    assert "but already holds M" in m.bugs[0]
    assert "  ss (held, taken at" in m.bugs[0] and "-> M (taken at" in m.bugs[0]
    m.bugs.clear()


def test_the_same_inversion_as_a_real_deadlock(m):
    log = []
    with m.kernel():
        ssp, mu = init_srcu_struct("ss"), mutex_init("M")
        r = kthread_run(_reader(ssp, log, "r", 0, 5, mutex=mu), name="r")
        msleep(1)
        with mu, pytest.raises(DeadlockError) as ei:
            synchronize_srcu(ssp)
        SCHED.abandon()
    lines = str(ei.value).splitlines()
    assert lines[1] == "  task 0 main waits for wait queue ss grace period (1 waiting) " \
                       "(owner: task 1 r-1)"
    assert lines[2].startswith(f"      holding M (write) taken at {HERE}:")
    assert lines[3] == "  task 1 r-1 waits for mutex M held by main, 1 waiting (owner: task 0 main)"
    assert lines[4].startswith(f"      holding ss (read) taken at {HERE}:")
    assert lines[5] == "  cycle: 0:main -> 1:r-1 -> 0:main"
    assert r.killed and len(m.bugs) == 1 and "circular locking dependency" in m.bugs[0]
    m.bugs.clear()


def test_entering_a_section_under_a_mutex_the_readers_take_is_fine(m):
    log = []
    with m.kernel():
        ssp, mu = init_srcu_struct("ss"), mutex_init("M")
        with mu:                        # M -> ss(recursive read): never waits
            idx = srcu_read_lock(ssp)
            srcu_read_unlock(ssp, idx)
        kthread_run(_reader(ssp, log, "r", 0, 1, mutex=mu), name="r").join()  # ss -> M
        synchronize_srcu(ssp)
    assert m.bugs == []


def test_cleanup_with_readers_inside_is_reported(m):
    with m.kernel():
        ssp = init_srcu_struct("ss")
        idx = srcu_read_lock(ssp)
        cleanup_srcu_struct(ssp)
        assert m.bugs == ["WARNING: cleanup_srcu_struct: ss cleaned up with 1 reader(s) "
                          "inside: main (idx 0)"]
        m.bugs.clear()
        srcu_read_unlock(ssp, idx)
        cleanup_srcu_struct(ssp)
    assert m.bugs == []

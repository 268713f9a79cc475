"""Tests for kernel_model/rwsem.py: sharing, writer preference, FIFO hand-over, checks."""

from __future__ import annotations

import pytest

from kernel_model.kthread import kthread_run
from kernel_model.lockdep import LockBug
from kernel_model.locking import complete, init_completion, msleep, mutex_init, wait_for_completion
from kernel_model.rwsem import (
    down_read,
    down_read_trylock,
    down_write,
    down_write_trylock,
    downgrade_write,
    init_rwsem,
    rwsem_is_locked,
    up_read,
    up_write,
)
from kernel_model.sched import SCHED, DeadlockError

HERE = "tests/kernel_model/test_rwsem.py"


def _reader(sem, log, tag, hold=1):
    def body():
        down_read(sem)
        log.append(f"{tag} in")
        msleep(hold)
        log.append(f"{tag} out")
        up_read(sem)
    return body


def _writer(sem, log, tag, hold=1):
    def body():
        with sem.write():
            log.append(f"{tag} in")
            msleep(hold)
            log.append(f"{tag} out")
    return body


def test_readers_share_and_a_writer_excludes(m):
    log = []
    with m.kernel():
        sem = init_rwsem("S")
        ts = [kthread_run(_reader(sem, log, "r1", 5), name="r1"),
              kthread_run(_reader(sem, log, "r2", 5), name="r2")]
        msleep(1)
        assert rwsem_is_locked(sem) and sem.owner is ts[0]
        assert repr(sem) == "rwsem S read-held by r1-1, r2-2"
        ts.append(kthread_run(_writer(sem, log, "w"), name="w"))
        for t in ts:
            t.join()
        assert not rwsem_is_locked(sem) and sem.owner is None
    assert log == ["r1 in", "r2 in", "r1 out", "r2 out", "w in", "w out"]


def test_a_waiting_writer_holds_back_new_readers(m):
    log = []
    with m.kernel():
        sem = init_rwsem("S")
        ts = [kthread_run(_reader(sem, log, "r1", 5), name="r1")]
        msleep(1)
        ts.append(kthread_run(_writer(sem, log, "w"), name="w"))
        msleep(1)   # w queued behind r1
        assert not down_read_trylock(sem)
        ts.append(kthread_run(_reader(sem, log, "r2"), name="r2"))
        for t in ts:
            t.join()
    assert log == ["r1 in", "r1 out", "w in", "w out", "r2 in", "r2 out"]


def test_waiters_are_granted_in_fifo_order_leading_readers_together(m):
    log = []
    with m.kernel():
        sem = init_rwsem("S")
        down_write(sem)
        ts = [kthread_run(_reader(sem, log, "r1"), name="r1"),
              kthread_run(_reader(sem, log, "r2"), name="r2"),
              kthread_run(_writer(sem, log, "w2"), name="w2"),
              kthread_run(_reader(sem, log, "r3"), name="r3")]
        msleep(1)
        assert [w.type for w in sem.wait_list] == ["read", "read", "write", "read"]
        up_write(sem)
        for t in ts:
            t.join()
    assert log == ["r1 in", "r2 in", "r1 out", "r2 out", "w2 in", "w2 out", "r3 in", "r3 out"]


def test_trylocks(m):
    with m.kernel():
        sem = init_rwsem("S")
        assert down_read_trylock(sem)
        assert not down_write_trylock(sem)
        up_read(sem)
        assert down_write_trylock(sem)
        assert not down_read_trylock(sem) and not down_write_trylock(sem)
        up_write(sem)
        assert not rwsem_is_locked(sem)


def test_downgrade_write_admits_queued_readers(m):
    log = []
    with m.kernel():
        sem = init_rwsem("S")
        down_write(sem)
        ts = [kthread_run(_reader(sem, log, "r1"), name="r1"),
              kthread_run(_writer(sem, log, "w2"), name="w2")]
        msleep(1)
        downgrade_write(sem)  # r1 joins us; w2 still waits for both
        assert sem.readers == [SCHED.current, ts[0]] and sem.writer is None
        msleep(5)
        assert log == ["r1 in", "r1 out"]
        up_read(sem)
        for t in ts:
            t.join()
    assert log == ["r1 in", "r1 out", "w2 in", "w2 out"]


def test_with_helpers(m):
    with m.kernel():
        sem = init_rwsem("S")
        with sem.read():
            assert sem.readers == [SCHED.current]
        with sem.write():
            assert sem.writer is SCHED.current
        assert not rwsem_is_locked(sem)


# -- debug checks --------------------------------------------------------------------

def test_read_recursion_with_a_waiting_writer_deadlocks(m):
    with m.kernel():
        sem = init_rwsem("S")
        go = init_completion("go")

        def recurse():
            with sem.read():
                wait_for_completion(go)   # meanwhile a writer queues
                with sem.read():          # behind that writer: never granted
                    pass

        def write():
            with sem.write():
                pass

        r = kthread_run(recurse, name="r")
        msleep(1)
        w = kthread_run(write, name="w")
        msleep(1)
        complete(go)
        with pytest.raises(DeadlockError) as ei:
            r.join()
        SCHED.abandon()
    lines = str(ei.value).splitlines()
    assert lines[2] == ("  task 1 r-1 waits for rwsem S read-held by r-1, 2 waiting for read "
                        "(owner: task 2 w-2)")
    assert lines[3].startswith(f"      holding S (read) taken at {HERE}:")
    assert lines[4] == ("  task 2 w-2 waits for rwsem S read-held by r-1, 2 waiting for write "
                        "(owner: task 1 r-1)")
    assert lines[5] == "  cycle: 1:r-1 -> 2:w-2 -> 1:r-1"
    assert len(m.bugs) == 1 and m.bugs[0].startswith(
        f"WARNING: lockdep: possible recursive locking detected: r-1 is trying to acquire S "
        f"at {HERE}:")
    assert w.killed
    m.bugs.clear()


def test_read_recursion_without_a_writer_runs_but_is_reported(m):
    with m.kernel():
        sem = init_rwsem("S")
        with sem.read(), sem.read():
            assert sem.readers == [SCHED.current] * 2
    assert len(m.bugs) == 1 and "possible recursive locking detected" in m.bugs[0]
    m.bugs.clear()


def test_a_reader_waiting_for_a_reader_behind_a_writer_deadlocks(m):
    with m.kernel():
        sem = init_rwsem("S")
        handoff = init_completion("handoff")

        def helper():
            with sem.read():      # queued behind w: never granted
                complete(handoff)

        down_read(sem)
        w = kthread_run(lambda: (down_write(sem), up_write(sem)), name="w")
        msleep(1)
        h = kthread_run(helper, name="h")
        with pytest.raises(DeadlockError, match=r"task 0 main waits for wait queue handoff"):
            wait_for_completion(handoff)
        SCHED.abandon()
        up_read(sem)
    assert w.killed and h.killed and m.bugs == []


def test_bad_releases_are_lockbugs(m):
    with m.kernel():
        sem = init_rwsem("S")
        with pytest.raises(LockBug, match=f"up_read: main releases S, which it does not hold "
                           f"for read \\(rwsem S unlocked\\) at {HERE}:"):
            up_read(sem)
        with pytest.raises(LockBug, match=f"up_write: main releases S held by no writer at "
                           f"{HERE}:"):
            up_write(sem)
        kthread_run(down_write, sem, name="owner").join()
        with pytest.raises(LockBug, match="up_write: main releases S held by owner-1"):
            up_write(sem)
        with pytest.raises(LockBug, match="downgrade_write: main releases S held by owner-1"):
            downgrade_write(sem)


def test_write_after_read_in_one_task_is_a_lockbug(m):
    with m.kernel():
        sem = init_rwsem("S")
        with sem.read(), pytest.raises(LockBug, match="possible recursive locking detected: "
                                       "main is trying to acquire S"):
            down_write(sem)
        assert not sem.wait_list
    assert not rwsem_is_locked(sem)


def test_lockdep_mutex_versus_rwsem_writer_inversion(m):
    with m.kernel():
        sem, mu = init_rwsem("S"), mutex_init("M")
        with sem.read(), mu:    # S(read) -> M
            pass
        assert m.bugs == []
        with mu, sem.write():   # M -> S(write): a writer can wait for the reader above
            pass
    assert len(m.bugs) == 1 and "trying to acquire S" in m.bugs[0]
    assert "but already holds M" in m.bugs[0]
    m.bugs.clear()


def test_lockdep_consistent_rwsem_order_is_quiet(m):
    with m.kernel():
        sem, mu = init_rwsem("S"), mutex_init("M")
        with sem.read(), mu:
            pass
        with sem.write(), mu:
            pass
    assert m.bugs == []

"""Tests for kernel_model/workqueue.py: queueing, flushing, cancelling, lockdep, teardown."""

from __future__ import annotations

import re

import pytest

from kernel_model.current import current
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.lockdep import LockBug
from kernel_model.locking import msleep, mutex_init
from kernel_model.sched import SCHED, DeadlockError
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.workqueue import (
    INIT_WORK,
    WQ_UNBOUND,
    alloc_ordered_workqueue,
    alloc_workqueue,
    cancel_work_sync,
    destroy_workqueue,
    flush_work,
    flush_workqueue,
    queue_work,
    schedule_work,
    system_wq,
    work_pending,
    work_struct,
)

HERE = "tests/kernel_model/test_workqueue.py"


def _logging_work(log, tag, sleep=0):
    def fn(work):
        log.append(f"{tag} start")
        if sleep:
            msleep(sleep)
        log.append(f"{tag} end")
    fn.__name__ = f"fn_{tag}"
    return INIT_WORK(fn)


def test_a_new_worker_sleeps_until_there_is_work(m):
    """alloc_workqueue's worker starts asleep on more_work (kthread_create's idle_on):
    no scheduling point, never a choice until the first item wakes it - then it runs
    from the top and takes the item."""
    seen = []
    with m.kernel():
        before = len(SCHED.decisions)
        wq = alloc_workqueue("idle")
        w = wq.worker
        assert w.state == "blocked" and w.blocked_on is wq.more_work
        assert w not in SCHED.runq and w in wq.more_work.sleepers
        assert len(SCHED.decisions) == before          # nothing new could run
        assert queue_work(wq, INIT_WORK(lambda work: seen.append(current().comm)))
        flush_workqueue(wq)
        assert seen == ["kworker/idle"] and w.blocked_on is wq.more_work   # idle again
        destroy_workqueue(wq)
        assert w.done and w.result is None


def test_a_worker_never_woken_is_stopped_without_running(m):
    """destroy_workqueue of a workqueue that never had an item: kthread_stop on a
    thread that never ran - its function is not called (-EINTR)."""
    with m.kernel():
        wq = alloc_workqueue("unused")
        w = wq.worker
        destroy_workqueue(wq)
        assert w.done and w.result == -4                # -EINTR


def test_items_run_in_fifo_order_on_the_worker(m):
    log = []
    with m.kernel():
        wq = alloc_workqueue("test")
        works = [_logging_work(log, tag) for tag in "abc"]
        seen = []
        who = INIT_WORK(lambda w: seen.append(current().comm))
        assert all(queue_work(wq, w) for w in works)
        assert queue_work(wq, who)
        assert not queue_work(wq, works[0])      # already pending
        assert work_pending(works[0]) and log == []
        flush_workqueue(wq)
        assert log == ["a start", "a end", "b start", "b end", "c start", "c end"]
        assert seen == ["kworker/test"] and not work_pending(works[0])
        assert wq.worker.name == "kworker/test"
        destroy_workqueue(wq)
        assert wq.worker.done


def test_a_work_may_requeue_itself(m):
    runs = []
    with m.kernel():
        wq = alloc_ordered_workqueue("ordered")
        assert wq.flags & WQ_UNBOUND and wq.max_active == 1

        def again(work):
            runs.append(work_pending(work))
            if len(runs) < 3:
                assert queue_work(wq, work)      # PENDING was cleared before the call

        w = INIT_WORK(again)
        queue_work(wq, w)
        assert flush_work(w)                     # waits for the last queued instance
        assert runs == [False, False, False]
        assert not flush_work(w)                 # idle now
        destroy_workqueue(wq)


def test_flush_work_waits_for_a_running_instance(m):
    log = []
    with m.kernel():
        wq = alloc_workqueue("test")
        w = _logging_work(log, "slow", sleep=10)
        assert not flush_work(w)                 # never queued
        queue_work(wq, w)
        msleep(1)                                # running now, no longer pending
        assert not work_pending(w) and log == ["slow start"]
        t0 = SCHED.jiffies
        assert flush_work(w)
        assert log == ["slow start", "slow end"] and SCHED.jiffies == t0 + 9
        destroy_workqueue(wq)


def test_cancel_work_sync(m):
    log = []
    with m.kernel():
        wq = alloc_workqueue("test")
        blocker = _logging_work(log, "blocker", sleep=10)
        victim = _logging_work(log, "victim")
        queue_work(wq, blocker)
        queue_work(wq, victim)
        assert cancel_work_sync(victim)          # pending: dequeued, never runs
        assert not work_pending(victim)
        msleep(1)
        assert not cancel_work_sync(blocker)     # running: waited for, was not pending
        assert log == ["blocker start", "blocker end"]
        assert not cancel_work_sync(victim)      # idle
        flush_workqueue(wq)
        assert log == ["blocker start", "blocker end"]
        destroy_workqueue(wq)


def test_queueing_fails_while_cancel_waits(m):
    results = []
    with m.kernel():
        wq = alloc_workqueue("test")

        def fn(work):
            msleep(5)

        w = INIT_WORK(fn)
        other = INIT_WORK(lambda _: results.append(queue_work(wq, w)))
        queue_work(wq, w)
        msleep(1)
        wq2 = alloc_workqueue("other")
        queue_work(wq2, other)                   # runs while we wait in cancel
        assert not cancel_work_sync(w)
        flush_workqueue(wq2)
        assert results == [False] and not work_pending(w)
        destroy_workqueue(wq2)
        destroy_workqueue(wq)


def test_flush_workqueue_waits_for_everything_queued_before(m):
    log = []
    with m.kernel():
        wq = alloc_workqueue("test")
        for tag in "ab":
            queue_work(wq, _logging_work(log, tag, sleep=3))
        flush_workqueue(wq)
        assert log == ["a start", "a end", "b start", "b end"]
        flush_workqueue(wq)                      # nothing queued: returns at once
        destroy_workqueue(wq)


def test_destroy_drains_chained_work_then_stops(m):
    runs = []
    with m.kernel():
        wq = alloc_workqueue("test")

        def chain(work):
            runs.append(1)
            if len(runs) < 4:
                queue_work(wq, work)             # chained work is allowed while draining

        queue_work(wq, INIT_WORK(chain))
        destroy_workqueue(wq)
        assert len(runs) == 4 and wq.worker.done and wq.destroyed
        assert not queue_work(wq, INIT_WORK(chain))
    assert m.bugs == [f"WARNING: __queue_work: queueing work chain idle on destroyed workqueue "
                      f"test at {HERE}:{chain.__code__.co_firstlineno + 8} "
                      "test_destroy_drains_chained_work_then_stops()"]
    m.bugs.clear()


def test_schedule_work_uses_the_system_workqueue_until_shutdown(m):
    log = []
    with m.kernel():
        w = _logging_work(log, "sys")
        assert schedule_work(w)
        wq = system_wq(m)
        assert wq.name == "events" and wq is system_wq()
        assert flush_work(w) and log == ["sys start", "sys end"]
    m.shutdown()
    assert wq.destroyed and wq.worker.done
    assert find_leaks(m) == []


def test_a_workqueue_never_destroyed_is_reported(m):
    with m.kernel():
        wq = alloc_workqueue("forgotten")
        line = test_a_workqueue_never_destroyed_is_reported.__code__.co_firstlineno + 2
    m.shutdown()
    assert wq.worker.done   # stopped at shutdown all the same
    assert find_leaks(m) == [f"workqueue forgotten allocated at {HERE}:{line} "
                             "test_a_workqueue_never_destroyed_is_reported() never destroyed"]
    m.leak_check_expected = False


def test_a_work_may_free_itself(m):
    class my_ctx(work_struct):
        pass

    with m.kernel():
        wq = alloc_workqueue("test")
        ctx = kmalloc_obj(my_ctx(kfree))         # the function frees its container
        queue_work(wq, ctx)
        flush_workqueue(wq)
        destroy_workqueue(wq)
    assert find_leaks(m) == []


# -- lockdep and failures -------------------------------------------------------------

def test_flush_work_under_a_mutex_the_work_takes_is_reported(m):
    with m.kernel():
        wq = alloc_workqueue("test")
        mu = mutex_init("M")

        def fn(work):
            with mu:
                pass

        w = INIT_WORK(fn)
        queue_work(wq, w)
        flush_workqueue(wq)                      # ran: (work) -> M recorded
        with mu:
            assert not flush_work(w)             # idle, so no deadlock this time...
        destroy_workqueue(wq)
    # ...but M -> (wq) and M -> (work) close cycles with (wq) -> M and (work) -> M
    assert len(m.bugs) == 2
    lines = m.bugs[0].splitlines()
    assert lines[1].startswith(f"main is trying to acquire (wq_completion)test at {HERE}:")
    assert lines[2].startswith(f"but already holds M, taken at {HERE}:")
    assert lines[4].startswith("  (wq_completion)test (held, taken at kernel_model/workqueue.py:")
    assert lines[4].endswith(f"-> M (taken at {HERE}:{fn.__code__.co_firstlineno + 1} fn()) "
                             "by kworker/test-1")
    lines = m.bugs[1].splitlines()
    assert lines[1].startswith(f"main is trying to acquire (work_completion)(fn) at {HERE}:")
    m.bugs.clear()


def test_flush_work_outside_the_mutex_is_quiet(m):
    with m.kernel():
        wq = alloc_workqueue("test")
        mu = mutex_init("M")

        def fn(work):
            with mu:
                pass

        w = INIT_WORK(fn)
        queue_work(wq, w)
        with mu:
            pass
        assert flush_work(w)
        destroy_workqueue(wq)
    assert m.bugs == []


def test_flush_work_under_the_mutex_can_really_deadlock(m):
    with m.kernel():
        wq = alloc_workqueue("test")
        mu = mutex_init("M")
        w = INIT_WORK(lambda work: (mu.__enter__(), mu.__exit__()))
        with mu:
            queue_work(wq, w)
            with pytest.raises(DeadlockError) as ei:
                flush_work(w)
            SCHED.abandon()
        destroy_workqueue(wq)
    lines = str(ei.value).splitlines()
    assert lines[1] == ("  task 0 main waits for wait queue flush of workqueue test (1 waiting) "
                        "(owner: task 1 kworker/test-1)")
    assert lines[3] == ("  task 1 kworker/test-1 waits for mutex M held by main, 1 waiting "
                        "(owner: task 0 main)")
    assert lines[4] == ("      holding (wq_completion)test (write) taken at "
                        "kernel_model/workqueue.py:"
                        f"{_line_of('lock_map_acquire(wq.lockdep_map)')} process_one_work()")
    assert lines[-1] == "  cycle: 0:main -> 1:kworker/test-1 -> 0:main"
    assert len(m.bugs) == 2 and all("circular locking dependency" in b for b in m.bugs)
    m.bugs.clear()


def _line_of(text: str) -> int:
    import kernel_model.workqueue as mod
    with open(mod.__file__) as f:
        lines = f.read().splitlines()
    return next(i + 1 for i, line in enumerate(lines)
                if line.strip() == text and "process_one_work" not in line)


@pytest.mark.parametrize("op,lock", [(flush_work, "(wq_completion)test"),
                                     (cancel_work_sync, "(work_completion)(<lambda>)")])
def test_flushing_a_work_from_itself_is_a_lockbug(m, op, lock):
    with m.kernel():
        wq = alloc_workqueue("test")
        w = INIT_WORK(lambda work: op(work))
        queue_work(wq, w)
        flush_workqueue(wq)                      # returns: the worker died
        with pytest.raises(LockBug, match=re.escape(
                "possible recursive locking detected: kworker/test-1 is trying to acquire "
                f"{lock} at {HERE}:")):
            wq.worker.join()
        destroy_workqueue(wq)
    assert find_leaks(m) == []


def test_a_raising_work_kills_its_worker_and_is_reported(m):
    ran = []
    with m.kernel():
        wq = alloc_workqueue("test")

        def bad(work):
            raise RuntimeError("work failed")

        queue_work(wq, INIT_WORK(bad))
        queue_work(wq, INIT_WORK(lambda work: ran.append(1)))
        flush_workqueue(wq)                      # does not hang on the dead worker
        destroy_workqueue(wq)
    assert ran == []
    assert find_leaks(m) == ["sched task 1 kworker/test-1 died and nobody joined it: "
                             "RuntimeError('work failed')"]
    with pytest.raises(RuntimeError):
        wq.worker.join()

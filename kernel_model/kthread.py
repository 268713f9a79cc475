"""Mirrors kernel/kthread.c: kernel threads on the one scheduler.

A kernel thread is a Task running as its own task_struct (PF_KTHREAD, no mm,
root credentials), so traces show it as `comm-pid` like ftrace does.
kthread_run() makes it runnable; it first runs at the creator's next
scheduling point (under the default strategy: when the creator blocks).
kthread_stop() sets the stop flag, wakes the thread and waits for it to
return, handing back its return value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_model.current import current
from kernel_model.errno import EINTR
from kernel_model.sched import BLOCKED, SCHED, Task
from kernel_model.task import PF_KTHREAD, cred, task_struct
from kernel_model.trace import traced

KTHREAD_SHOULD_STOP = 1


@traced
def kthread_create(threadfn: Callable[..., Any], *args: object, name: str,
                   idle_on: Any = None) -> Task:
    """Mirrors kthread_create() + wake_up_process() (kthread_run): a runnable kthread.

    With `idle_on` (a wait queue), a thread whose first act is to sleep there until
    there is work starts asleep on it instead: its first run - finding nothing and
    sleeping - changes nothing anyone sees, and as a runnable task it only made a
    choice of every scheduling point until it ran (a pool's idle worker, already
    asleep, as alloc_workqueue's workers are in the kernel).  Waking `idle_on`, or
    kthread_stop, runs it."""
    m = current().machine
    init = m.init_task
    ts = task_struct(m, m.alloc_pid(), name, None, None, cred(0, init.cred.cap_effective),
                     {k: list(v) for k, v in init.rlim.items()}, PF_KTHREAD)
    ts.kthread_flags = 0
    if idle_on is not None:
        t = SCHED.new_sleeping_task(threadfn, *args, name=name, ts=ts, on=idle_on)
    else:
        t = SCHED.new_task(threadfn, *args, name=name, ts=ts)
    ts.sched_task = t
    m.kthreads[ts.pid] = t
    t.on_exit.append(lambda: m.kthreads.pop(ts.pid, None))
    if idle_on is None:
        SCHED.point("wake_up_new_task")      # wake_up_process: set up, then runnable
    return t


kthread_run = kthread_create


def kthread_should_stop() -> bool:
    """Mirrors kthread_should_stop(): has kthread_stop() been called on current?"""
    return bool(getattr(current(), "kthread_flags", 0) & KTHREAD_SHOULD_STOP)


@traced
def kthread_stop(t: Task) -> Any:
    """Mirrors kthread_stop(): ask the thread to stop, wake it, wait; its return value.

    Returns -EINTR if the thread never ran (the kernel's answer when the
    thread function was never called).
    """
    t.ts.kthread_flags |= KTHREAD_SHOULD_STOP
    if t.greenlet is not None and not t.greenlet and not t.done:
        # never started: the kernel does not call threadfn at all
        t.fn, t.args = (lambda: -EINTR), ()
    if t.state == BLOCKED:
        SCHED.wake(t)
    return t.join()

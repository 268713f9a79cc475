"""Mirrors include/linux/workqueue.h (kernel/workqueue.c) on the one scheduler.

A work item (work_struct) is a function to run later in process context;
queue_work() puts it on a workqueue, whose worker kthread runs the items in
FIFO order.  An item is queued at most once at a time (the PENDING bit):
queueing a pending item does nothing and returns False.  PENDING is cleared
just before the function runs, so the function may queue its item again.

# EMU: one worker kthread per workqueue, named "kworker/<wq name>" (real
# workqueues share per-CPU and unbound worker pools with concurrency
# management, named like "kworker/u8:2").  Items of one workqueue therefore
# never run concurrently with each other, and max_active is recorded but
# has no effect.  Items of different workqueues do run concurrently.

Waiting for work.  flush_work() waits until the last queued instance of an
item has finished; cancel_work_sync() dequeues a pending item and waits for
a running one; flush_workqueue() waits for everything queued before it;
destroy_workqueue() drains the queue (items may still queue themselves
again from their own workqueue) and stops the worker.  The worker never
touches a work_struct after its function returned - the function may have
freed it - and flushing is decided by identity, as the kernel's
worker->current_work.

lockdep, as in the kernel: the worker holds a pseudo-lock for the
workqueue ("(wq_completion)<name>") and one for the item
("(work_completion)(<function name>)") around the function; flush_work() acquires and
releases both in the caller, cancel_work_sync() the item's only (it waits
for no other item).  So "flush_work while holding a mutex the work function
takes" is reported as a circular dependency even when this run does not
deadlock, and flush_work/cancel_work_sync of an item from inside itself
(or flush of another item of the same workqueue from an item) is a LockBug.

A work function that raises kills its worker: the exception leaves the
worker task, which dies; nothing on that workqueue runs again, waiters
stop waiting for it, and the machine's leak check reports the dead task.

The system workqueue ("events", for schedule_work) is made per machine on
first use and destroyed at machine shutdown.  A workqueue never destroyed
is destroyed at shutdown too, and reported by the leak check.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernel_model.current import running
from kernel_model.kthread import kthread_create, kthread_should_stop, kthread_stop
from kernel_model.lockdep import (
    call_site,
    lock_map_acquire,
    lock_map_release,
    lockdep_map,
    machine_now,
)
from kernel_model.locking import wait_event, wait_queue_head, wake_up
from kernel_model.sched import SCHED, Task
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

WQ_UNBOUND = 1 << 1
WQ_FREEZABLE = 1 << 2
WQ_MEM_RECLAIM = 1 << 3
WQ_HIGHPRI = 1 << 4
WQ_CPU_INTENSIVE = 1 << 5
WQ_SYSFS = 1 << 6
__WQ_ORDERED = 1 << 17
WQ_DFL_ACTIVE = 256


class work_struct:
    """Mirrors struct work_struct: fn(work) to run on a workqueue.

    Embed it by subclassing (the kernel's container_of): the function gets
    the work_struct, i.e. the containing object.
    """

    def __init__(self, func: Callable[[work_struct], object]):
        self.func = func
        self.lockdep_map = lockdep_map(f"(work_completion)({_fname(func)})")
        # protected by nothing: only the running task touches it
        self.pending = False            # WORK_STRUCT_PENDING
        self.wq: workqueue_struct | None = None   # where it was last queued
        self.seq = 0                    # instances queued so far
        self.canceling = False          # cancel_work_sync() in progress

    def __repr__(self) -> str:
        state = "pending" if self.pending else "idle"
        return f"work {_fname(self.func)} {state}"


def _fname(func: Callable) -> str:
    return getattr(func, "__name__", None) or repr(func)


def INIT_WORK(func: Callable[[work_struct], object]) -> work_struct:
    """Mirrors INIT_WORK(): a new idle work item running func(work)."""
    return work_struct(func)


class _queued:
    """One queued instance of a work item (the kernel links the work itself)."""

    __slots__ = ("work", "seq", "wq_seq")

    def __init__(self, work: work_struct, seq: int, wq_seq: int):
        self.work, self.seq, self.wq_seq = work, seq, wq_seq


class _flush_waitq(wait_queue_head):
    """Where flushers sleep; `owner` (for the deadlock report) is the worker."""

    def __init__(self, wq: workqueue_struct):
        super().__init__(f"flush of workqueue {wq.name}")
        self.wq = wq

    @property
    def owner(self) -> Task | None:
        w = self.wq.worker
        return w if w is not None and not w.done else None

    @owner.setter
    def owner(self, _value: object) -> None:
        pass  # wait_queue_head.__init__ sets None; ours is computed


class workqueue_struct:
    """Mirrors struct workqueue_struct: a FIFO of work items and its worker."""

    def __init__(self, name: str, flags: int, max_active: int):
        self.name = name
        self.flags = flags
        self.max_active = max_active or WQ_DFL_ACTIVE
        self.machine = machine_now()
        self.where = call_site()
        self.lockdep_map = lockdep_map(f"(wq_completion){name}", self.machine)
        # protected by nothing: only the running task touches it
        self.worklist: deque[_queued] = deque()
        self.current: _queued | None = None     # the instance the worker runs
        self.wq_seq = itertools.count(1)
        self.last_seq = 0                        # wq_seq of the newest queued instance
        self.more_work = wait_queue_head(f"workqueue {name}")
        self.flushers = _flush_waitq(self)
        self.draining = False
        self.destroyed = False
        self.worker: Task | None = None

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else f"{len(self.worklist)} queued"
        if self.current is not None:
            state += f", running {_fname(self.current.work.func)}"
        return f"workqueue {self.name} {state}"

    def idle_before(self, wq_seq: int) -> bool:
        """Has every instance queued up to `wq_seq` finished (or the worker died)?"""
        if self.worker is None or self.worker.done:
            return True
        if self.current is not None and self.current.wq_seq <= wq_seq:
            return False
        return not (self.worklist and self.worklist[0].wq_seq <= wq_seq)

    def finished(self, work: work_struct, seq: int) -> bool:
        """Has instance `seq` of `work` left this workqueue (run, or dequeued)?"""
        if self.worker is None or self.worker.done:
            return True
        cur = self.current
        if cur is not None and cur.work is work and cur.seq == seq:
            return False
        return not any(q.work is work and q.seq == seq for q in self.worklist)


# -- the worker ------------------------------------------------------------------

def worker_thread(wq: workqueue_struct) -> None:
    """The worker kthread: run queued items in order until kthread_stop()."""
    while True:
        wait_event(wq.more_work, lambda: wq.worklist or kthread_should_stop())
        if not wq.worklist:
            return
        process_one_work(wq, wq.worklist.popleft())


def process_one_work(wq: workqueue_struct, q: _queued) -> None:
    """Mirrors process_one_work(): clear PENDING, run the function under lockdep."""
    work = q.work
    work.pending = False
    wq.current = q
    func, wmap = work.func, work.lockdep_map   # the function may free `work`
    lock_map_acquire(wq.lockdep_map)
    lock_map_acquire(wmap)
    func(work)
    lock_map_release(wmap)
    lock_map_release(wq.lockdep_map)
    wq.current = None
    wake_up(wq.flushers)


def _wake_flushers_on_exit(wq: workqueue_struct) -> Callable[[], None]:
    def hook() -> None:
        # the worker is gone (stopped or died): nobody may wait for it any more.
        # No scheduling point here - this runs inside the scheduler's exit path.
        while wq.flushers.sleepers:
            SCHED.wake(wq.flushers.sleepers.popleft())
    return hook


# -- workqueues ------------------------------------------------------------------

def alloc_workqueue(name: str, flags: int = 0, max_active: int = 0) -> workqueue_struct:
    """Mirrors alloc_workqueue(): a workqueue and its worker kthread."""
    wq = workqueue_struct(name, flags, max_active)
    m = wq.machine
    # EMU: one worker per workqueue, asleep on more_work until the first item or
    # destroy_workqueue wakes it (kthread_create's idle_on)
    wq.worker = kthread_create(worker_thread, wq, name=f"kworker/{name}", idle_on=wq.more_work)
    wq.worker.on_exit.append(_wake_flushers_on_exit(wq))
    _registry(m).append(wq)
    return wq


def alloc_ordered_workqueue(name: str, flags: int = 0) -> workqueue_struct:
    """Mirrors alloc_ordered_workqueue(): one item at a time, in queueing order."""
    return alloc_workqueue(name, WQ_UNBOUND | __WQ_ORDERED | flags, 1)


@traced
def flush_workqueue(wq: workqueue_struct) -> None:
    """Mirrors flush_workqueue(): wait for every item queued before this call."""
    lock_map_acquire(wq.lockdep_map)
    lock_map_release(wq.lockdep_map)
    target = wq.last_seq
    wait_event(wq.flushers, lambda: wq.idle_before(target))


def drain_workqueue(wq: workqueue_struct) -> None:
    """Mirrors drain_workqueue(): flush until empty; only the wq's own items may requeue."""
    wq.draining = True
    while not wq.idle_before(wq.last_seq):
        flush_workqueue(wq)
    wq.draining = False


@traced
def destroy_workqueue(wq: workqueue_struct) -> None:
    """Mirrors destroy_workqueue(): drain, then stop and reap the worker."""
    drain_workqueue(wq)
    wq.destroyed = True
    w = wq.worker
    if w is not None and not w.done:
        kthread_stop(w)
    # a worker that died of an exception stays in SCHED.failed for the leak check
    reg = _registry(wq.machine)
    if wq in reg:
        reg.remove(wq)


# -- work items ------------------------------------------------------------------

@traced
def queue_work(wq: workqueue_struct, work: work_struct) -> bool:
    """Mirrors queue_work(): False if the item was already pending."""
    if work.pending or work.canceling:
        return False
    if wq.destroyed or (wq.draining and SCHED.current is not wq.worker):
        state = "destroyed" if wq.destroyed else "draining"
        (wq.machine or machine_now()).report_bug(
            "__queue_work", f"queueing {work!r} on {state} workqueue {wq.name} at {call_site()}")
        return False
    work.pending = True
    work.wq = wq
    work.seq += 1
    wq.last_seq = next(wq.wq_seq)
    wq.worklist.append(_queued(work, work.seq, wq.last_seq))
    wake_up(wq.more_work)
    return True


def work_pending(work: work_struct) -> bool:
    """Mirrors work_pending(): queued and not yet started."""
    return work.pending


@traced
def flush_work(work: work_struct) -> bool:
    """Mirrors flush_work(): wait for the last queued instance; False if it was idle."""
    wq = work.wq
    if wq is not None:
        lock_map_acquire(wq.lockdep_map)
        lock_map_release(wq.lockdep_map)
    lock_map_acquire(work.lockdep_map)
    lock_map_release(work.lockdep_map)
    if wq is None:
        return False
    if not work.pending and not _running(wq, work):
        return False
    seq = work.seq
    wait_event(wq.flushers, lambda: wq.finished(work, seq))
    return True


def _running(wq: workqueue_struct, work: work_struct) -> bool:
    return wq.current is not None and wq.current.work is work


@traced
def cancel_work_sync(work: work_struct) -> bool:
    """Mirrors cancel_work_sync(): dequeue if pending, wait if running.

    Returns True if the item was pending.  While it runs, queueing the item
    fails, as with the kernel's WORK_OFFQ_CANCELING.
    """
    lock_map_acquire(work.lockdep_map)
    lock_map_release(work.lockdep_map)
    wq = work.wq
    if wq is None:
        return False
    was_pending = work.pending
    if was_pending:
        for q in list(wq.worklist):
            if q.work is work:
                wq.worklist.remove(q)
        work.pending = False
        wake_up(wq.flushers)   # flush_workqueue() may have waited for it
    if _running(wq, work):
        seq = wq.current.seq
        work.canceling = True
        try:
            wait_event(wq.flushers, lambda: wq.finished(work, seq))
        finally:
            work.canceling = False
    return was_pending


# -- the system workqueue ----------------------------------------------------------

def system_wq(machine: Machine | None = None) -> workqueue_struct:
    """The machine's system_wq ("events"), made on first use."""
    m = machine or machine_now()
    wq = getattr(m, "system_wq", None)
    if wq is None or wq.destroyed:
        with running(m.init_task):
            wq = m.system_wq = alloc_workqueue("events")
    return wq


def schedule_work(work: work_struct) -> bool:
    """Mirrors schedule_work(): queue_work() on the current machine's system_wq."""
    return queue_work(system_wq(), work)


def _registry(m: Machine) -> list[workqueue_struct]:
    """The machine's live workqueues; the first call hooks shutdown and the leak check."""
    reg = getattr(m, "workqueues", None)
    if reg is None:
        reg = m.workqueues = []
        m.leaked_workqueues = []
        m.shutdown_hooks.append(_shutdown)
        m.leak_checks.append(lambda m: [f"workqueue {n} allocated at {where} never destroyed"
                                        for n, where in m.leaked_workqueues])
    return reg


def _shutdown(m: Machine) -> None:
    """Destroy what is left, newest first; all but the system workqueue were leaked."""
    with running(m.init_task):
        while m.workqueues:
            wq = m.workqueues[-1]
            if wq is not getattr(m, "system_wq", None):
                m.leaked_workqueues.append((wq.name, wq.where))
            destroy_workqueue(wq)

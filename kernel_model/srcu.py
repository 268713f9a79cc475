"""Mirrors include/linux/srcu.h (kernel/rcu/srcutree.c): sleepable RCU.

Readers enter and leave a read-side section with srcu_read_lock() /
srcu_read_unlock(); they never wait and may sleep inside.
synchronize_srcu() waits for a grace period: until every reader that was
inside when it was called has left.  Readers entering later do not hold it
up - which is what lets an updater unpublish an object, wait, and free it.

Each reader gets a ticket in entry order; a grace period started when the
next ticket was N ends when no ticket below N is still inside.  The index
srcu_read_lock returns is the kernel's (0 or 1, flipped by each grace
period); it must be handed back to srcu_read_unlock.
# EMU: the kernel counts readers per index on every CPU and flips the index
# twice per grace period; the tickets give the same guarantee exactly, and
# reader entry is atomic here, so no memory barriers are modelled.

lockdep, as the kernel's SRCU annotations: a read section is a recursive
read acquisition of the srcu_struct (so holding a mutex while entering one
is fine), and synchronize_srcu() acquires and releases it for write in the
caller.  So a mutex held across
synchronize_srcu() that some reader takes inside its section is reported as
a circular dependency, and synchronize_srcu() inside a read section of the
same srcu_struct is a LockBug (it would wait for itself forever).
"""

from __future__ import annotations

import itertools

from kernel_model.lockdep import (
    LockBug,
    call_site,
    lock_acquire,
    lock_is_held,
    lock_release,
    machine_now,
    might_sleep,
)
from kernel_model.locking import wait_event, wait_queue_head, wake_up
from kernel_model.sched import SCHED, Task
from kernel_model.trace import traced


class _gp_waitq(wait_queue_head):
    """Where synchronize_srcu() sleeps; its `owner` (for the deadlock report)
    is the task of the oldest reader still inside."""

    def __init__(self, ssp: srcu_struct):
        super().__init__(f"{ssp.name} grace period")
        self.ssp = ssp

    @property
    def owner(self) -> Task | None:
        inside = self.ssp.inside
        return inside[min(inside)][0] if inside else None

    @owner.setter
    def owner(self, _value: object) -> None:
        pass  # wait_queue_head.__init__ sets None; ours is computed


class srcu_struct:
    """Mirrors struct srcu_struct."""

    atomic = False

    def __init__(self, name: str | None = None):
        self.name = name or call_site()
        self.machine = machine_now()
        self.idx = 0                                   # srcu_idx: flipped per grace period
        self.inside: dict[int, tuple[Task, int]] = {}  # ticket -> (reader, idx)
        self._tickets = itertools.count()
        self.gp_wait = _gp_waitq(self)
        self.completed = 0                             # grace periods ended

    def __repr__(self) -> str:
        return f"srcu {self.name} idx={self.idx} readers={len(self.inside)}"


def init_srcu_struct(name: str | None = None) -> srcu_struct:
    """Mirrors init_srcu_struct(): a new srcu_struct of lock class `name`."""
    return srcu_struct(name)


@traced
def srcu_read_lock(ssp: srcu_struct) -> int:
    """Mirrors srcu_read_lock(): enter a read section; returns the index to hand back."""
    SCHED.point("srcu_read_lock")
    # a recursive read: lockdep records no dependency *into* it (trylock=True) -
    # the kernel's strong-path rule drops such edges from every cycle, since
    # srcu's only exclusive "holder", synchronize_srcu, takes nothing inside
    lock_acquire(ssp, read=True, recursive_ok=True, trylock=True)
    ssp.inside[next(ssp._tickets)] = (SCHED.current, ssp.idx)
    return ssp.idx


@traced
def srcu_read_unlock(ssp: srcu_struct, idx: int) -> None:
    """Mirrors srcu_read_unlock(): leave the newest section entered with `idx`."""
    t = SCHED.current
    mine = [k for k, (task, i) in ssp.inside.items() if task is t]
    if not mine:
        raise LockBug(f"srcu_read_unlock: {t.label} is not in a read section of {ssp.name} "
                      f"(unbalanced unlock at {call_site()})")
    match = [k for k in mine if ssp.inside[k][1] == idx]
    if not match:
        held = sorted({ssp.inside[k][1] for k in mine})
        raise LockBug(f"srcu_read_unlock: bad idx {idx!r} for {ssp.name} at {call_site()}: "
                      f"{t.label} entered with idx {', '.join(map(str, held))}")
    lock_release(ssp, "srcu_read_unlock")
    del ssp.inside[max(match)]
    if ssp.gp_wait.sleepers:
        wake_up(ssp.gp_wait)
    else:
        SCHED.point("srcu_read_unlock")


def srcu_read_lock_held(ssp: srcu_struct) -> bool:
    """Mirrors srcu_read_lock_held(): is current inside a read section of `ssp`?"""
    return lock_is_held(ssp)


@traced
def synchronize_srcu(ssp: srcu_struct) -> None:
    """Mirrors synchronize_srcu(): wait until every reader inside now has left."""
    if lock_is_held(ssp):
        raise LockBug(f"synchronize_srcu: illegal synchronize_srcu() in same-type SRCU "
                      f"read-side critical section: {SCHED.current.label} is inside "
                      f"{ssp.name} at {call_site()}")
    might_sleep("synchronize_srcu")
    lock_release(lock_acquire(ssp).lock, "synchronize_srcu")   # srcu_lock_sync()
    start = next(ssp._tickets)
    ssp.idx ^= 1
    wait_event(ssp.gp_wait, lambda: not ssp.inside or min(ssp.inside) > start)
    ssp.completed += 1


def cleanup_srcu_struct(ssp: srcu_struct) -> None:
    """Mirrors cleanup_srcu_struct(): WARN if a reader is still inside."""
    if not ssp.inside:
        return
    who = ", ".join(f"{t.label} (idx {i})" for t, i in ssp.inside.values())
    m = ssp.machine or machine_now()
    msg = f"{ssp.name} cleaned up with {len(ssp.inside)} reader(s) inside: {who}"
    if m is None:
        raise LockBug(f"cleanup_srcu_struct: {msg}")
    m.report_bug("cleanup_srcu_struct", msg)

"""Mirrors include/linux/rwsem.h (kernel/locking/rwsem.c) on the one scheduler.

A reader/writer semaphore: many readers or one writer.  Like the kernel's,
it prefers writers: once a writer waits, a new reader queues behind it
instead of joining the readers inside.  That is why taking the read side
twice in one task (or a reader waiting for another reader) can hang: the
second down_read waits for the queued writer, which waits for the first
read hold to go.  lockdep WARNs on read-after-read recursion for that
reason (kernel_model.lockdep).

Waiters queue in FIFO order, each as an rwsem_waiter.  A release hands the
semaphore to the head of the queue: a writer alone, or the run of readers
at the head together.
# EMU: since v5.3 the kernel also wakes readers queued behind a waiting
# writer, and readers may steal a reader-owned semaphore when no handoff is
# pending; here the queue is strict FIFO, so the schedule alone decides.

`owner` is the writer, or the first reader while it is read-held; the
scheduler's deadlock report follows it (and each waiter's own `owner`:
a reader queued behind a writer waits for that writer).

    sem = init_rwsem("&mm->mmap_lock")
    down_read(sem); ...; up_read(sem)
    with sem.write(): ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from kernel_model.lockdep import (
    LockBug,
    call_site,
    lock_acquire,
    lock_release,
    machine_now,
    might_sleep,
)
from kernel_model.sched import SCHED, Named, Task, touch
from kernel_model.trace import traced

RWSEM_WAITING_FOR_WRITE, RWSEM_WAITING_FOR_READ = "write", "read"


class rwsem_waiter:
    """Mirrors struct rwsem_waiter: one queued task and what it wants."""

    def __init__(self, sem: rw_semaphore, task: Task, type_: str):
        self.lock = sem          # the scheduler's report reads `.lock` and `.owner`
        self.task = task
        self.type = type_
        self.granted = False

    def __repr__(self) -> str:
        return f"{self.lock!r} for {self.type}"

    @property
    def owner(self) -> Task | None:
        """Whom this waiter waits for: the writer inside, the writer queued
        ahead of a reader, or the first reader inside."""
        sem = self.lock
        if sem.writer is not None:
            return sem.writer
        if self.type == RWSEM_WAITING_FOR_READ:
            for w in sem.wait_list:
                if w is self:
                    break
                if w.type == RWSEM_WAITING_FOR_WRITE:
                    return w.task
        return sem.readers[0] if sem.readers else None


class rw_semaphore(Named):
    """Mirrors struct rw_semaphore."""

    atomic = False

    def __init__(self, name: str | None = None):
        self.name = name or call_site()
        self.machine = machine_now()
        # protected by nothing: only the running task touches it
        self.writer: Task | None = None
        self.readers: list[Task] = []    # one entry per read hold, oldest first
        self.wait_list: deque[rwsem_waiter] = deque()

    def __repr__(self) -> str:
        if self.writer is not None:
            state = f" write-held by {self.writer.label}"
        elif self.readers:
            state = f" read-held by {', '.join(t.label for t in self.readers)}"
        else:
            state = " unlocked"
        wait = f", {len(self.wait_list)} waiting" if self.wait_list else ""
        return f"rwsem {self.name}{state}{wait}"

    @property
    def owner(self) -> Task | None:
        return self.writer or (self.readers[0] if self.readers else None)

    @contextmanager
    def read(self) -> Iterator[rw_semaphore]:
        """`with sem.read():` - down_read/up_read (the kernel's guard(rwsem_read))."""
        down_read(self)
        try:
            yield self
        finally:
            up_read(self)

    @contextmanager
    def write(self) -> Iterator[rw_semaphore]:
        """`with sem.write():` - down_write/up_write (guard(rwsem_write))."""
        down_write(self)
        try:
            yield self
        finally:
            up_write(self)

    # -- internals -------------------------------------------------------------
    def _can_read(self) -> bool:
        # writer preference: a reader does not pass anyone queued
        return self.writer is None and not self.wait_list

    def _can_write(self) -> bool:
        return self.writer is None and not self.readers and not self.wait_list

    def _wait(self, type_: str, entry: object) -> None:
        """Queue and sleep until a release grants us the semaphore."""
        t = SCHED.current
        w = rwsem_waiter(self, t, type_)
        self.wait_list.append(w)
        try:
            while not w.granted:
                SCHED.block(w)
        except BaseException:
            if w in self.wait_list:
                self.wait_list.remove(w)
            t.held_locks.remove(entry)
            raise

    def _wake(self) -> None:
        """Grant the head of the queue: one writer, or the leading readers."""
        if self.writer is not None or not self.wait_list:
            return
        head = self.wait_list[0]
        if head.type == RWSEM_WAITING_FOR_WRITE:
            if self.readers:
                return
            self.wait_list.popleft()
            self.writer = head.task
            self._grant(head)
            return
        while self.wait_list and self.wait_list[0].type == RWSEM_WAITING_FOR_READ:
            w = self.wait_list.popleft()
            self.readers.append(w.task)
            self._grant(w)

    @staticmethod
    def _grant(w: rwsem_waiter) -> None:
        w.granted = True
        SCHED.wake(w.task)


def init_rwsem(name: str | None = None) -> rw_semaphore:
    """Mirrors init_rwsem(): a new unlocked rwsem of lock class `name`."""
    return rw_semaphore(name)


@traced
def down_read(sem: rw_semaphore) -> None:
    """Mirrors down_read(): shared hold; waits behind a writer inside or queued."""
    might_sleep("down_read")
    SCHED.point("down_read")
    entry = lock_acquire(sem, read=True)
    if sem._can_read():
        sem.readers.append(SCHED.current)
        return
    sem._wait(RWSEM_WAITING_FOR_READ, entry)


@traced
def down_read_trylock(sem: rw_semaphore) -> bool:
    """Mirrors down_read_trylock(): 1 if read-held without waiting."""
    SCHED.point("down_read_trylock")
    touch(sem)
    if not sem._can_read():
        return False
    lock_acquire(sem, read=True, trylock=True)
    sem.readers.append(SCHED.current)
    return True


@traced
def up_read(sem: rw_semaphore) -> None:
    """Mirrors up_read(): drop one read hold of the current task."""
    t = SCHED.current
    if t not in sem.readers:
        raise LockBug(f"up_read: {t.label} releases {sem.name}, which it does not hold "
                      f"for read ({sem!r}) at {call_site()}")
    lock_release(sem, "up_read")
    sem.readers.remove(t)
    sem._wake()
    SCHED.point("up_read")


@traced
def down_write(sem: rw_semaphore) -> None:
    """Mirrors down_write(): exclusive hold."""
    might_sleep("down_write")
    SCHED.point("down_write")
    entry = lock_acquire(sem)
    if sem._can_write():
        sem.writer = SCHED.current
        return
    sem._wait(RWSEM_WAITING_FOR_WRITE, entry)


@traced
def down_write_trylock(sem: rw_semaphore) -> bool:
    """Mirrors down_write_trylock(): 1 if write-held without waiting."""
    SCHED.point("down_write_trylock")
    touch(sem)
    if not sem._can_write():
        return False
    lock_acquire(sem, trylock=True)
    sem.writer = SCHED.current
    return True


def _check_writer(sem: rw_semaphore, func: str) -> None:
    t = SCHED.current
    if sem.writer is not t:
        who = sem.writer.label if sem.writer is not None else "no writer"
        raise LockBug(f"{func}: {t.label} releases {sem.name} held by {who} at {call_site()}")


@traced
def up_write(sem: rw_semaphore) -> None:
    """Mirrors up_write(): only the writer may release."""
    _check_writer(sem, "up_write")
    lock_release(sem, "up_write")
    sem.writer = None
    sem._wake()
    SCHED.point("up_write")


@traced
def downgrade_write(sem: rw_semaphore) -> None:
    """Mirrors downgrade_write(): write hold -> read hold, admitting queued readers."""
    _check_writer(sem, "downgrade_write")
    for h in reversed(SCHED.current.held_locks):  # lock_downgrade()
        if h.lock is sem:
            h.read = True
            break
    sem.writer = None
    sem.readers.append(SCHED.current)
    sem._wake()
    SCHED.point("downgrade_write")


def rwsem_is_locked(sem: rw_semaphore) -> bool:
    """Mirrors rwsem_is_locked(): held by a writer or any reader."""
    return sem.writer is not None or bool(sem.readers)

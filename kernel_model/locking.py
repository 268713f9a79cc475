"""Mirrors include/linux/spinlock.h, mutex.h, wait.h and completion.h on the one scheduler.

Every blocking primitive in the model comes from here (and rwsem.py,
srcu.py, workqueue.py beside it); nothing in the model uses `threading`.
Each acquire and release is a scheduling point, so a strategy can
interleave tasks at exactly the places a real kernel could, and each
goes through lockdep (kernel_model.lockdep) first.

Waiting.  A task that cannot take a lock joins the lock's FIFO of waiters
and blocks; the releasing task hands the lock straight to the first waiter.
# EMU: real mutexes let a running task steal the lock (optimistic spinning)
# and a spinning CPU never sleeps; here every waiter blocks in FIFO order,
# so who gets a contended lock is decided only by the schedule - which is
# what makes a run replayable.  The emulated machine behaves like an SMP
# box whose CPUs take turns at scheduling points.

Atomic context.  Holding a spinlock raises the task's preempt_count (as
spin_lock's preempt_disable does); might_sleep() - called by mutex_lock,
wait_event, wait_for_completion and friends - reports a sleep in atomic
context, like CONFIG_DEBUG_ATOMIC_SLEEP.

Usage mirrors the kernel, plus `with lock:` for the lock/unlock pair
(the kernel's guard(mutex)(&lock)):

    lock = mutex("&bfregi->lock")
    mutex_lock(lock); ...; mutex_unlock(lock)
    with lock: ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

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


class _Lock(Named):
    """The owner/waiter machinery shared by spinlock_t and mutex."""

    atomic = False  # True: holding it is atomic context
    kind = "lock"

    def __init__(self, name: str | None = None):
        self.name = name or call_site()
        self.owner: Task | None = None
        self.waiters: deque[Task] = deque()
        self.machine = machine_now()

    def __repr__(self) -> str:
        held = f" held by {self.owner.label}" if self.owner is not None else " unlocked"
        wait = f", {len(self.waiters)} waiting" if self.waiters else ""
        return f"{self.kind} {self.name}{held}{wait}"

    def fp_state(self) -> tuple:
        """Emulator-level: what partial-order reduction compares to tell a lock taken
        and given back within one step (only read) from one that changed hands."""
        return (self.owner, tuple(self.waiters))

    def _take(self, func: str) -> None:
        """lockdep, then wait for the lock in FIFO order (the caller's point is done)."""
        t = SCHED.current
        entry = lock_acquire(self)
        if self.owner is None:
            self.owner = t
            return
        self.waiters.append(t)
        try:
            while self.owner is not t:
                SCHED.block(self)
        except BaseException:
            if t in self.waiters:
                self.waiters.remove(t)
            t.held_locks.remove(entry)
            raise

    def _try(self) -> bool:
        touch(self)
        if self.owner is not None:
            return False
        lock_acquire(self, trylock=True)
        self.owner = SCHED.current
        return True

    def _give(self, func: str) -> None:
        """Release: check ownership, hand over to the first waiter."""
        t = SCHED.current
        if self.owner is not t:
            who = self.owner.label if self.owner is not None else "nobody"
            raise LockBug(f"{func}: {t.label} releases {self.name} held by {who} "
                          f"at {call_site()}")
        lock_release(self, func)
        self.owner = None
        if self.waiters:
            self.owner = self.waiters.popleft()
            SCHED.wake(self.owner)


# -- spinlocks -----------------------------------------------------------------

class spinlock_t(_Lock):
    """Mirrors spinlock_t (raw_spinlock_t behaviour: never sleeps while held)."""

    atomic = True
    kind = "spinlock"

    def __enter__(self) -> spinlock_t:
        spin_lock(self)
        return self

    def __exit__(self, *exc: object) -> None:
        spin_unlock(self)


def spin_lock_init(name: str | None = None) -> spinlock_t:
    """Mirrors spin_lock_init(): a new unlocked spinlock of class `name`."""
    return spinlock_t(name)


@traced
def spin_lock(lock: spinlock_t) -> None:
    """Mirrors spin_lock(): take the lock, then run in atomic context."""
    SCHED.point("spin_lock")
    lock._take("spin_lock")
    SCHED.current.preempt_count += 1


@traced
def spin_trylock(lock: spinlock_t) -> bool:
    """Mirrors spin_trylock(): True if taken without waiting."""
    SCHED.point("spin_trylock")
    if not lock._try():
        return False
    SCHED.current.preempt_count += 1
    return True


@traced
def spin_unlock(lock: spinlock_t) -> None:
    """Mirrors spin_unlock(): release and leave atomic context."""
    lock._give("spin_unlock")
    SCHED.current.preempt_count -= 1
    SCHED.point("spin_unlock")


@traced
def spin_lock_irqsave(lock: spinlock_t) -> int:
    """Mirrors spin_lock_irqsave(); returns the `flags` to restore.

    # EMU: there are no interrupts to disable; the flags word is 0 and
    # only the atomic-context accounting is kept.
    """
    spin_lock(lock)
    return 0


@traced
def spin_unlock_irqrestore(lock: spinlock_t, flags: int) -> None:
    """Mirrors spin_unlock_irqrestore()."""
    spin_unlock(lock)


spin_lock_irq = spin_lock_bh = spin_lock
spin_unlock_irq = spin_unlock_bh = spin_unlock


def assert_spin_locked(lock: spinlock_t) -> None:
    """Mirrors assert_spin_locked(): BUG unless somebody holds it."""
    if lock.owner is None:
        raise LockBug(f"assert_spin_locked: {lock.name} is not locked at {call_site()}")


# -- mutexes -----------------------------------------------------------------

class mutex(_Lock):
    """Mirrors struct mutex: a sleeping lock with one owner."""

    kind = "mutex"

    def __enter__(self) -> mutex:
        mutex_lock(self)
        return self

    def __exit__(self, *exc: object) -> None:
        mutex_unlock(self)


def mutex_init(name: str | None = None) -> mutex:
    """Mirrors mutex_init(): a new unlocked mutex of class `name`."""
    return mutex(name)


@traced
def mutex_lock(lock: mutex) -> None:
    """Mirrors mutex_lock(): might_sleep, then take or wait in FIFO order."""
    might_sleep("mutex_lock")
    SCHED.point("mutex_lock")
    lock._take("mutex_lock")


def mutex_lock_interruptible(lock: mutex) -> int:
    """Mirrors mutex_lock_interruptible(); 0.  # EMU: no signals, never -EINTR."""
    mutex_lock(lock)
    return 0


@traced
def mutex_trylock(lock: mutex) -> bool:
    """Mirrors mutex_trylock(): 1 if taken without waiting."""
    SCHED.point("mutex_trylock")
    return lock._try()


@traced
def mutex_unlock(lock: mutex) -> None:
    """Mirrors mutex_unlock(): only the owner may release (DEBUG_MUTEXES)."""
    lock._give("mutex_unlock")
    SCHED.point("mutex_unlock")


def mutex_is_locked(lock: mutex) -> bool:
    """Mirrors mutex_is_locked()."""
    return lock.owner is not None


# -- wait queues ---------------------------------------------------------------

class wait_queue_head(Named):
    """Mirrors wait_queue_head_t: tasks sleeping until a condition holds."""

    def __init__(self, name: str | None = None):
        self.name = name or call_site()
        self.sleepers: deque[Task] = deque()
        self.owner = None  # nobody "holds" a wait queue: a wait-for edge ends here

    def __repr__(self) -> str:
        return f"wait queue {self.name}" + (f" ({len(self.sleepers)} waiting)"
                                            if self.sleepers else "")


def init_waitqueue_head(name: str | None = None) -> wait_queue_head:
    """Mirrors init_waitqueue_head()."""
    return wait_queue_head(name)


def wait_event_timeout(wq: wait_queue_head, condition: Callable[[], object],
                       timeout: int | None) -> int:
    """Mirrors wait_event_timeout(): sleep until condition() is true.

    Returns the jiffies left (at least 1) when the condition came true, or 0
    when `timeout` jiffies passed first; with timeout None it waits forever
    and returns 1.  The condition is re-checked after every wake-up, exactly
    as the kernel's macro loops around schedule().
    """
    might_sleep("wait_event")
    SCHED.point("wait_event")
    deadline = None if timeout is None else SCHED.jiffies + timeout
    t = SCHED.current
    while True:
        touch(wq)        # the condition's state: its writers wake this queue
        if condition():
            break
        left = None if deadline is None else deadline - SCHED.jiffies
        if left is not None and left <= 0:
            return 1 if condition() else 0
        wq.sleepers.append(t)
        try:
            SCHED.block(wq, left)
        finally:
            if t in wq.sleepers:
                wq.sleepers.remove(t)
    if deadline is None:
        return 1
    return max(1, deadline - SCHED.jiffies)


def wait_event(wq: wait_queue_head, condition: Callable[[], object]) -> None:
    """Mirrors wait_event(): sleep (uninterruptibly) until condition() is true."""
    wait_event_timeout(wq, condition, None)


@traced
def wake_up(wq: wait_queue_head) -> int:
    """Mirrors wake_up()/wake_up_all(): wake every sleeper to re-check; returns how many.

    # EMU: no exclusive waiters; every sleeper re-checks its condition.
    """
    touch(wq)
    n = 0
    while wq.sleepers:
        if SCHED.wake(wq.sleepers.popleft()):
            n += 1
    SCHED.point("wake_up")
    return n


wake_up_all = wake_up


# -- completions -----------------------------------------------------------------

class completion(Named):
    """Mirrors struct completion: a count of `complete()`s and a wait queue."""

    def __init__(self, name: str | None = None):
        self.name = name or call_site()
        self.done = 0
        self.wait = wait_queue_head(self.name)
        self.owner = None

    def __repr__(self) -> str:
        return f"completion {self.name} done={self.done}"


UINT_MAX = (1 << 32) - 1


def init_completion(name: str | None = None) -> completion:
    """Mirrors init_completion()."""
    return completion(name)


def reinit_completion(x: completion) -> None:
    """Mirrors reinit_completion(): done = 0."""
    x.done = 0


@traced
def complete(x: completion) -> None:
    """Mirrors complete(): one waiter may proceed."""
    if x.done != UINT_MAX:
        x.done += 1
    wake_up(x.wait)


@traced
def complete_all(x: completion) -> None:
    """Mirrors complete_all(): every waiter, now and later, proceeds."""
    x.done = UINT_MAX
    wake_up(x.wait)


def _consume(x: completion) -> bool:
    if x.done == 0:
        return False
    if x.done != UINT_MAX:
        x.done -= 1
    return True


@traced
def wait_for_completion_timeout(x: completion, timeout: int) -> int:
    """Mirrors wait_for_completion_timeout(): jiffies left (>= 1), or 0 on timeout."""
    got = []

    def ready() -> bool:
        if not got and _consume(x):
            got.append(1)
        return bool(got)

    left = wait_event_timeout(x.wait, ready, timeout)
    return left if got else 0


@traced
def wait_for_completion(x: completion) -> None:
    """Mirrors wait_for_completion(): sleep until complete() has been called."""
    wait_for_completion_timeout(x, None)  # type: ignore[arg-type]


def try_wait_for_completion(x: completion) -> bool:
    """Mirrors try_wait_for_completion(): consume a completion without sleeping."""
    touch(x.wait)
    return _consume(x)


def completion_done(x: completion) -> bool:
    """Mirrors completion_done(): would a wait return at once?"""
    touch(x.wait, False)
    return x.done != 0


# -- explicit preemption points ----------------------------------------------------

def cond_resched() -> None:
    """Mirrors cond_resched(): a place the kernel may reschedule (might_sleep too)."""
    might_sleep("cond_resched")
    SCHED.point("cond_resched")


@traced
def schedule_timeout(timeout: int) -> int:
    """Mirrors schedule_timeout_uninterruptible(): sleep `timeout` jiffies; 0."""
    might_sleep("schedule_timeout")
    SCHED.block("schedule_timeout", timeout)
    return 0


def msleep(ms: int) -> None:
    """Mirrors msleep() (HZ = 1000: one jiffy per millisecond)."""
    schedule_timeout(ms)

"""Mirrors kernel/locking/lockdep.c (the checks, not the implementation).

Every lock from kernel_model.locking belongs to a *lock class* (its name,
like "&mm->mmap_lock"; by default the file:line where it was initialised,
as the kernel keys a class by the static key at the init site).  Each Task
keeps the stack of locks it holds.  When a task acquires class B while
holding class A, the edge A -> B enters the machine's dependency graph with
where each lock was taken; if B -> ... -> A is already there, the two orders
can deadlock, and lockdep reports it *now*, whether or not this run
deadlocks - which is what makes it worth having.

The reports come in two kinds, as in the kernel:
  * warnings the kernel prints and survives (circular dependency, sleeping
    in atomic context, lockdep_assert_held failing) go to machine.bugs
    through report_bug, so the per-test leak check fails on them unless the
    test expected them (and they raise at once under panic_on_warn);
  * bugs after which the real kernel hangs or corrupts itself (recursive
    locking, unlocking a lock not held) raise LockBug in the offending task.

Read-side acquisitions (down_read, srcu_read_lock) are recorded like any
other.  # EMU: real lockdep tracks recursive-read dependencies more finely
(a cycle made only of read holds of an rwsem is not reported); here a
cycle is reported only if at least one of its edges ends in a write
acquisition, which covers the classic cases (mutex vs rwsem writer,
synchronize_srcu under a lock that a reader section takes).  Taking a
read lock again while holding it for read (down_read twice) is a WARN, not
a LockBug: it hangs only when a writer queues in between.
"""

from __future__ import annotations

import os
import sys
import types
from collections import deque
from typing import TYPE_CHECKING

from kernel_model.current import current_or_none
from kernel_model.errno import KernelBug
from kernel_model.sched import SCHED, Named, Task, touch

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

#: source files whose frames are skipped when naming where a lock was taken
_SKIP = ("kernel_model/lockdep.py", "kernel_model/locking.py", "kernel_model/workqueue.py",
         "kernel_model/refcount.py", "kernel_model/sched.py", "kernel_model/rwsem.py",
         "kernel_model/srcu.py", "kernel_model/slab.py", "contextlib.py")


class LockBug(KernelBug):
    """A locking bug the real kernel would hang on (recursion, bad unlock)."""


_TOPS = tuple({os.path.dirname(os.path.dirname(p)).replace("\\", "/") + "/"
               for p in (os.path.abspath(__file__), os.path.realpath(__file__))})


def call_site(skip: tuple[str, ...] = _SKIP) -> str:
    """"file.py:LINE func" of the nearest caller outside the locking code.

    Every lock acquire and every kmalloc/kfree names its caller, so the walk
    is cached: whether a code object's file is skipped, once per code object,
    and the formatted name, once per (code object, instruction).
    """
    if skip is not _SKIP:
        return _call_site_walk(sys._getframe(1), skip)
    f = sys._getframe(1)
    skipped = _SKIPPED
    while f is not None:
        co = f.f_code
        s = skipped.get(id(co))
        if s is None:
            s = skipped[id(co)] = co.co_filename.replace("\\", "/").endswith(_SKIP)
            _CODES.append(co)
        if not s:
            break
        f = f.f_back
    if f is None:
        return _call_site_walk(sys._getframe(1), skip)
    # keyed by the instruction, not the line: f_lineno scans the code's line table
    # on every read, f_lasti is a field
    key = (id(f.f_code), f.f_lasti)
    site = _SITES.get(key)
    if site is None:
        site = _SITES[key] = _site_name(f)    # f's code is in _CODES: it was checked
    return site


# Keyed by id(code object), not the code object: a code object's hash is computed
# afresh on every lookup from its name, bytecode, constants (nested code objects
# too) and names - 150-300 ns, several times per call_site.  _CODES holds every
# code object a key names, so no id is reused while it is a key.
#: id(code object) -> is its file one of _SKIP's; (id(code object), instruction
#: offset) -> its site name
_SKIPPED: dict[int, bool] = {}
_SITES: dict[tuple[int, int], str] = {}
_CODES: list[types.CodeType] = []


def _call_site_walk(first: types.FrameType, skip: tuple[str, ...]) -> str:
    """call_site() without its caches (another skip list, or only skipped frames)."""
    f: types.FrameType | None = first
    while f is not None and f.f_code.co_filename.replace("\\", "/").endswith(skip):
        f = f.f_back
    if f is None:  # only model code on the stack (a workqueue worker): name the
        f = first  # innermost frame outside lockdep itself
        while f is not None and f.f_code.co_filename.endswith("kernel_model/lockdep.py"):
            f = f.f_back
        if f is None:
            return "?"
    return _site_name(f)


def _site_name(f: types.FrameType) -> str:
    """"file.py:LINE func" of one frame, the file relative to the checkout."""
    path = f.f_code.co_filename.replace("\\", "/")
    for top in _TOPS:  # relative to the checkout: "tests/drivers/..." stays whole
        if path.startswith(top):
            path = path[len(top):]
            break
    else:
        for root in ("/kernel_model/", "/drivers/", "/peermem_clients/", "/userspace/",
                     "/tests/", "/scenarios/"):
            i = path.rfind(root)
            if i >= 0:
                path = path[i + 1:]
                break
        else:
            path = path.rsplit("/", 1)[-1]
    return f"{path}:{f.f_lineno} {f.f_code.co_name}()"


def machine_now() -> Machine | None:
    """The machine of the running context: current()'s, else the task's."""
    ts = current_or_none()
    if ts is not None:
        return ts.machine
    return SCHED.current.machine


class held_lock:
    """One entry of a task's held-lock stack (struct held_lock)."""

    __slots__ = ("lock", "read", "where")

    def __init__(self, lock: object, read: bool, where: str):
        self.lock, self.read, self.where = lock, read, where

    def __repr__(self) -> str:
        kind = "read" if self.read else "write"
        return f"{self.lock.name} ({kind}) taken at {self.where}"


class lockdep_graph:
    """The dependency graph of one machine: class -> class edges, first sighting kept."""

    def __init__(self, machine: Machine):
        self.machine = machine
        # (a, b) -> (where a was held, where b was taken, task label, b taken for write)
        self.edges: dict[tuple[str, str], tuple[str, str, str, bool]] = {}
        self.after: dict[str, set[str]] = {}
        self.reported: set[frozenset[str]] = set()

    def add(self, a: held_lock, b_name: str, b_where: str, b_write: bool, task: Task) -> None:
        """Record a -> b; report a cycle the new edge would close."""
        key = (a.lock.name, b_name)
        if key in self.edges or a.lock.name == b_name:
            return
        who = task.label  # formatted only for an edge seen for the first time
        path = self._path(b_name, a.lock.name)
        self.edges[key] = (a.where, b_where, who, b_write)
        self.after.setdefault(a.lock.name, set()).add(b_name)
        if path is None:
            return
        cycle = [*path, b_name]  # b -> ... -> a, then the new a -> b
        pairs = list(zip(cycle, cycle[1:], strict=False))
        if not any(self.edges[p][3] for p in pairs):
            return  # read-only cycle: see the EMU note in the module docstring
        ident = frozenset(pairs)
        if ident in self.reported:
            return
        self.reported.add(ident)
        self.machine.report_bug("lockdep", self._splat(a, b_name, b_where, who, path))

    def _path(self, src: str, dst: str) -> list[str] | None:
        """A chain of recorded edges src -> ... -> dst (breadth first), or None."""
        prev: dict[str, str | None] = {src: None}
        q = deque([src])
        while q:
            n = q.popleft()
            if n == dst:
                out = [n]
                while prev[out[-1]] is not None:
                    out.append(prev[out[-1]])
                return out[::-1]
            for m in sorted(self.after.get(n, ())):
                if m not in prev:
                    prev[m] = n
                    q.append(m)
        return None

    def _splat(self, a: held_lock, b_name: str, b_where: str, who: str,
               path: list[str]) -> str:
        lines = ["possible circular locking dependency detected",
                 f"{who} is trying to acquire {b_name} at {b_where}",
                 f"but already holds {a.lock.name}, taken at {a.where}",
                 "which lock already depends on the new lock; the existing dependency chain:"]
        for x, y in zip(path, path[1:], strict=False):
            wx, wy, by, _ = self.edges[(x, y)]
            lines.append(f"  {x} (held, taken at {wx}) -> {y} (taken at {wy}) by {by}")
        lines.append("possible unsafe locking scenario: "
                     + f"CPU0 lock({a.lock.name}); CPU1 lock({b_name}); "
                     + f"CPU1 lock({a.lock.name}); CPU0 lock({b_name}); *** DEADLOCK ***")
        return "\n".join(lines)


def lock_acquire(lock: object, *, read: bool = False, trylock: bool = False,
                 recursive_ok: bool = False) -> held_lock:
    """Check and record an acquisition by the current task, before it waits.

    Mirrors lock_acquire() -> __lock_acquire(): the recursion check, then
    one dependency per lock already held (a trylock adds none: it cannot
    wait, so it cannot deadlock), then the push onto the held stack.
    """
    touch(lock)
    t = SCHED.current
    where = call_site()
    m = getattr(lock, "machine", None) or machine_now()
    for h in t.held_locks:
        if h.lock is lock and not (read and h.read and recursive_ok):
            msg = (f"possible recursive locking detected: {t.label} is trying to "
                   f"acquire {lock.name} at {where} but already holds it, taken at {h.where}")
            if not (read and h.read) or m is None:
                raise LockBug(msg)
            # read after read (down_read twice): it hangs only if a writer queues
            # in between, so the kernel WARNs and goes on - and so do we
            m.report_bug("lockdep", msg)
            break
    if m is not None and not trylock:
        for h in t.held_locks:
            m.lockdep.add(h, lock.name, where, not read, t)
    entry = held_lock(lock, read, where)
    t.held_locks.append(entry)
    return entry


class lockdep_map(Named):
    """Mirrors struct lockdep_map: a lock class with no lock behind it.

    Used for things that behave like a lock towards deadlocks without being
    one - a work item, a workqueue (kernel/workqueue.c acquires them around
    each work function and in flush_work).
    """

    atomic = False

    def __init__(self, name: str, machine: Machine | None = None):
        self.name = name
        self.machine = machine or machine_now()

    def __repr__(self) -> str:
        return f"lockdep_map {self.name}"


def lock_map_acquire(m: lockdep_map, *, read: bool = False) -> None:
    """Mirrors lock_map_acquire() / lock_map_acquire_read()."""
    lock_acquire(m, read=read, recursive_ok=read)


def lock_map_release(m: lockdep_map) -> None:
    """Mirrors lock_map_release()."""
    lock_release(m, "lock_map_release")


def lock_release(lock: object, func: str) -> held_lock:
    """Pop `lock` off the current task's held stack; LockBug if it is not there."""
    touch(lock)
    t = SCHED.current
    for i in range(len(t.held_locks) - 1, -1, -1):
        if t.held_locks[i].lock is lock:
            return t.held_locks.pop(i)
    raise LockBug(f"WARNING: bad unlock balance detected! {t.label} is trying to release "
                  f"{lock.name} at {call_site()} in {func}() but holds no such lock"
                  + (f" (holds: {', '.join(h.lock.name for h in t.held_locks)})"
                     if t.held_locks else ""))


def lock_is_held(lock: object, task: Task | None = None) -> bool:
    """Mirrors lockdep_is_held(): does the task (default: current) hold `lock`?"""
    t = task or SCHED.current
    return any(h.lock is lock for h in t.held_locks)


def lockdep_assert_held(lock: object) -> None:
    """Mirrors lockdep_assert_held(): WARN unless the current task holds `lock`."""
    if lock_is_held(lock):
        return
    m = getattr(lock, "machine", None) or machine_now()
    msg = f"{lock.name} not held by {SCHED.current.label} at {call_site()}"
    if m is None:
        raise LockBug(f"lockdep_assert_held: {msg}")
    m.report_bug("lockdep_assert_held", msg)


def might_sleep(func: str = "might_sleep") -> None:
    """Mirrors might_sleep(): WARN when called in atomic context (a spinlock held)."""
    t = SCHED.current
    if t.preempt_count <= 0:
        return
    atomic = [h for h in t.held_locks if getattr(h.lock, "atomic", False)]
    m = machine_now()
    msg = (f"BUG: sleeping function called from invalid context at {call_site()}: "
           f"{func}() by {t.label}, preempt_count {t.preempt_count}"
           + (f", holding {', '.join(repr(h) for h in atomic)}" if atomic else ""))
    if m is None:
        raise LockBug(msg)
    m.report_bug(func, msg)

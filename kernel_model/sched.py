"""The deterministic scheduler: every concurrent thing runs as a Task on one CPU.

Emulator-level, standing in for kernel/sched/core.c.  A user thread making
system calls, a kernel thread, a workqueue worker, the GPU driver's callback
thread, the HCA: each is a Task, and tasks run one at a time on the single
`SCHED`.  A task gives up the CPU only at a *scheduling point* - lock acquire
and release, wait and wake-up, a refcount dropping to zero, an MMIO or DMA
access, a call into another module, or an explicit cond_resched() - so a run
is a sequence of decisions "who runs next", and nothing else is concurrent.

Design notes.
  * The mechanism is greenlets: a switch costs ~0.2 us, against ~25 us for
    OS threads handing over a baton (measured: tests/benchmarks/
    test_sched_bench.py).  Only one greenlet ever runs, so no Python-level
    locking is needed anywhere in the model.
  * The code that builds the machine (a test, the CLI) runs as Task 0,
    "main".  It is a task like the others: when it blocks (joins a task,
    waits on a completion, takes a held mutex), the others run.
  * Decisions.  At each point with more than one runnable task the
    *strategy* chooses.  The default keeps the current task running until it
    blocks or ends, then takes the task that has been runnable longest
    (FIFO): the same order every run, so demos and traces are stable.
    Every decision is recorded as the chosen task id; `schedule` gives them
    as a short run-length string ("0*12,1,2*3") and ReplayStrategy replays
    one exactly, raising ReplayDivergence if the run goes elsewhere.
  * Task ids count from 1 in creation order and restart whenever a Machine
    is built with no task alive, so a schedule string names the same tasks
    on every run of the same program.
  * Deadlock: when the running task blocks and no task can run (and no
    sleeper has a timeout), the wait-for graph is reported as a
    DeadlockError raised in main.  The stuck tasks are left as they are
    until abandon() unwinds them (Machine.shutdown does).
  * Time is virtual: `jiffies` (HZ = 1000) advances only when every task is
    blocked and one of them sleeps with a timeout - the clock jumps to the
    earliest deadline.  The tracer adds its own fixed cost per event.

Task state (`Task.state`) is protected by nothing: only the running task
touches the scheduler, which is the point of the design.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from greenlet import getcurrent, greenlet

from c_ext import _track, default_backend_name
from kernel_model import current as _cur

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine
    from kernel_model.task import task_struct

HZ = 1000  # jiffies per virtual second

RUNNING, RUNNABLE, BLOCKED, DONE = "running", "runnable", "blocked", "done"


class TaskKilled(BaseException):
    """Thrown into a stuck task by Scheduler.abandon() to unwind its stack."""


class DeadlockError(Exception):
    """Every task is blocked: the message is the wait-for report."""


class ReplayDivergence(Exception):
    """A replayed schedule named a task that could not run at that point."""


class Task:
    """One schedulable context: a greenlet plus what the debug checks track."""

    def __init__(self, sched: Scheduler, tid: int, name: str,
                 fn: Callable[..., Any] | None, args: tuple, ts: task_struct | None):
        self.sched = sched
        self.tid = tid
        self.name = name
        self.fn, self.args = fn, args
        self.ts = ts                    # the task_struct current() names while this runs
        self.saved_ts = ts              # current() as it was when the task left the CPU
        self.machine: Machine | None = ts.machine if ts is not None else None
        self.state = RUNNABLE
        self.greenlet: greenlet | None = None
        self.blocked_on: object = None  # what it waits for (repr and .owner used in reports)
        self.woken = False              # last block ended by wake() rather than a timeout
        self.wake_at: int | None = None
        self.pending: BaseException | None = None   # raised in it when it next resumes
        self.joiners: list[Task] = []
        self.result: Any = None
        self.exc: BaseException | None = None
        self.exc_seen = False           # join() delivered exc to someone
        self.killed = False
        # debug-check state (kernel_model.lockdep)
        self.preempt_count = 0          # spinlocks held / preempt_disable() depth
        self.held_locks: list = []      # lockdep's held-lock stack, oldest first
        self.on_exit: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"Task {self.tid} {self.name} {self.state}"

    @property
    def label(self) -> str:
        """How reports name it: the task_struct's comm-pid when it has one."""
        ts = self.ts
        return f"{ts.comm}-{ts.pid}" if ts is not None else self.name

    @property
    def done(self) -> bool:
        return self.state == DONE

    def join(self) -> Any:
        """Wait for the task to end; return its result or raise its exception."""
        return self.sched.join(self)

    # the body of a spawned task's greenlet
    def _run(self, *_ignored: object) -> None:
        s = self.sched
        self.blocked_on = None          # (a task started asleep: new_sleeping_task)
        s._resumed(self)
        try:
            self.result = self.fn(*self.args)
        except TaskKilled:
            self.killed = True
        except BaseException as e:  # noqa: BLE001 - handed to whoever joins
            self.exc = e
        s._exit(self)


class Strategy:
    """Chooses who runs at a scheduling point.  `candidates` is in run-queue
    order with the current task first when it could go on running."""

    def choose(self, sched: Scheduler, candidates: list[Task], reason: str) -> Task:
        raise NotImplementedError


class DefaultStrategy(Strategy):
    """Run to block, then first come first served: the same order every run."""

    def choose(self, sched: Scheduler, candidates: list[Task], reason: str) -> Task:
        return candidates[0]


class RandomStrategy(Strategy):
    """Uniformly random choices from a seed (a baseline for the explorer)."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def choose(self, sched: Scheduler, candidates: list[Task], reason: str) -> Task:
        return self.rng.choice(candidates)


class ReplayStrategy(Strategy):
    """Make exactly the decisions a recorded schedule string lists."""

    def __init__(self, schedule: str):
        self.steps = parse_schedule(schedule)
        self.i = 0

    def choose(self, sched: Scheduler, candidates: list[Task], reason: str) -> Task:
        if self.i >= len(self.steps):
            raise ReplayDivergence(f"replay: the schedule has {len(self.steps)} decisions but "
                                   f"the run reached another ({reason}); runnable: "
                                   f"{_names(candidates)}")
        tid = self.steps[self.i]
        for t in candidates:
            if t.tid == tid:
                self.i += 1
                return t
        raise ReplayDivergence(f"replay: decision {self.i} wants task {tid}, which cannot run "
                               f"at this point ({reason}); runnable: {_names(candidates)}")


def _names(tasks: list[Task]) -> str:
    return ", ".join(f"{t.tid}:{t.label}" for t in tasks)


def format_schedule(decisions: list[int]) -> str:
    """[0, 0, 0, 1, 2, 2] -> "0*3,1,2*2"."""
    out = []
    for tid, run in itertools.groupby(decisions):
        n = len(list(run))
        out.append(f"{tid}*{n}" if n > 1 else str(tid))
    return ",".join(out)


def parse_schedule(text: str) -> list[int]:
    """The inverse of format_schedule; ValueError on a malformed string."""
    out: list[int] = []
    for part in filter(None, text.replace(" ", "").split(",")):
        tid, star, n = part.partition("*")
        if not tid.isdigit() or (star and not n.isdigit()):
            raise ValueError(f"parse_schedule: bad step {part!r} in {text!r}")
        out += [int(tid)] * (int(n) if n else 1)
    return out


class Scheduler:
    """The CPU.  There is one, SCHED; see the module docstring."""

    def __init__(self) -> None:
        self.main = Task(self, 0, "main", None, (), None)
        self.main.state = RUNNING
        self.main.greenlet = getcurrent()
        self.current = self.main
        self.runq: deque[Task] = deque()
        self.alive: dict[int, Task] = {}          # spawned, not yet done
        self.failed: list[Task] = []              # ended by an exception nobody joined
        self.decisions: list[int] = []
        self.strategy: Strategy = DefaultStrategy()
        self.jiffies = 0
        self._sleepers: list[tuple[int, int, Task]] = []
        self._seq = itertools.count()
        self._tids = itertools.count(1)
        self.switches = 0
        self.dead: DeadlockError | None = None    # set once a deadlock was reported
        self.killing = False
        self.on_switch: list[Callable[[Task, Task, str], None]] = []   # the tracer's hook
        self.on_clock: list[Callable[[int], None]] = []                # jiffies jumped by n
        #: the footprint recorder of partial-order reduction (kernel_model.emu.explore):
        #: called (object, write) for each shared object the running step touches, and
        #: (task, "wake") when it makes a task runnable (a spawn, a wake-up: the task's
        #: next step comes after this one), (task, "exit") at a task's end and (task,
        #: "join") where another joins it - orderings, never races: a join only waits;
        #: None - the common case - when nobody records
        self.fp: Callable[[object, bool | str], None] | None = None
        #: the running step's footprint (kernel_model.emu.explore.Step: .reads and
        #: .writes sets) while recording, for the fields of structs (kernel_model.slab)
        self.fp_step: Any = None
        #: called (container, field) when a recorded step reads a struct field holding a
        #: list, dict, set or deque: the recorder watches it, and the step that changes
        #: it in place writes the field (kernel_model.slab)
        self.fp_watch: Callable[[object, object], None] | None = None
        #: while recording, called (object, made) for every object a footprint names by
        #: its id - a tracked struct when it is made (made True), anything else when
        #: first touched: the recorder holds it until the run ends, so no id is reused
        #: by another object meanwhile (a reused id would make two objects one), and
        #: numbers it in that order, a name that is the same in every run with the same
        #: schedule prefix (sleep sets compare steps of different runs by it)
        self.fp_keep: Callable[[object, bool], None] | None = None

    def __repr__(self) -> str:
        return (f"Scheduler current={self.current.label} runnable={len(self.runq)} "
                f"alive={len(self.alive)} switches={self.switches} jiffies={self.jiffies}")

    # -- epochs and strategies -------------------------------------------------
    def new_epoch(self) -> None:
        """Restart task ids and the decision record (a Machine is being built)."""
        if self.alive:
            return
        self._tids = itertools.count(1)
        self.decisions = []
        self.dead = None

    def use(self, strategy: Strategy | None) -> None:
        """Install a strategy (None: the default) for the decisions from now on."""
        self.strategy = strategy or DefaultStrategy()

    @property
    def schedule(self) -> str:
        """The decisions made since the epoch began, replayable by ReplayStrategy."""
        return format_schedule(self.decisions)

    # -- tasks -------------------------------------------------------------------
    def spawn(self, fn: Callable[..., Any], *args: object, name: str,
              ts: task_struct | None = None) -> Task:
        """Create a runnable task (it first runs at a later scheduling point)."""
        t = self.new_task(fn, *args, name=name, ts=ts)
        self.point("wake_up_new_task")
        return t

    def new_sleeping_task(self, fn: Callable[..., Any], *args: object, name: str,
                          ts: task_struct | None, on: Any) -> Task:
        """A task that starts asleep on the wait queue `on` (its `sleepers`): it first
        runs, from the top, when someone wakes it - as a kernel thread waiting for
        work that was never given any.  No scheduling point: nothing new can run."""
        t = self._make_task(fn, args, name, ts)
        t.state = BLOCKED
        t.blocked_on = on
        on.sleepers.append(t)
        return t

    def new_task(self, fn: Callable[..., Any], *args: object, name: str,
                 ts: task_struct | None = None) -> Task:
        """spawn without its scheduling point: the caller finishes setting the task
        up (stores it, registers it) before anything can run - as kthread_create
        does before wake_up_process - and then calls point("wake_up_new_task").
        A caller that stored the task after spawn's point raced the task itself."""
        t = self._make_task(fn, args, name, ts)
        self.runq.append(t)
        return t

    def _make_task(self, fn: Callable[..., Any], args: tuple, name: str,
                   ts: task_struct | None) -> Task:
        t = Task(self, next(self._tids), name, fn, args, ts)
        t.greenlet = greenlet(t._run, parent=self.main.greenlet)
        self.alive[t.tid] = t
        if self.fp is not None:   # the child's first step comes after this one
            self.fp(t, "wake")
        return t

    def join(self, t: Task) -> Any:
        """Block until `t` ends; its result, or its exception re-raised here."""
        if self.fp is not None:
            self.fp(t, "join")    # after its exit, if it has ended
        while t.state != DONE:
            me = self.current
            t.joiners.append(me)
            try:
                self.block(t)
            except BaseException:  # deadlock, replay divergence: no stale wake-up later
                if me in t.joiners:
                    t.joiners.remove(me)
                raise
        if t.exc is not None:
            t.exc_seen = True
            if t in self.failed:
                self.failed.remove(t)
            raise t.exc
        return t.result

    def run_all(self, machine: Machine | None = None) -> None:
        """Join every live task (of `machine`, or all), in task-id order."""
        while True:
            left = [t for t in self.alive.values() if machine is None or t.machine is machine]
            if not left:
                return
            t = min(left, key=lambda t: t.tid)
            try:
                self.join(t)
            except DeadlockError:
                raise
            except Exception:  # noqa: BLE001 - stays in self.failed for the leak check
                self.failed.append(t)
                t.exc_seen = False

    # -- scheduling points ---------------------------------------------------------
    def point(self, reason: str) -> None:
        """A scheduling point: the strategy may hand the CPU to another task."""
        if not self.runq or self.killing:
            return
        cur = self.current
        cands = [cur, *self.runq]
        nxt = self._choose(cands, reason)
        if nxt is not cur:
            self.runq.remove(nxt)
            cur.state = RUNNABLE
            self.runq.append(cur)
            self._switch(cur, nxt, reason)

    def yield_(self, reason: str) -> bool:
        """sched_yield(): let every other runnable task go first; True if one ran.

        Unlike point(), the current task goes to the back: under the default
        strategy the task that has waited longest runs.  A busy-polling
        caller uses it so the task it polls for (the HCA) gets the CPU; a
        False answer means nothing else could run, so polling again is futile.
        """
        if not self.runq or self.killing:
            return False
        cur = self.current
        nxt = self._choose([*self.runq, cur], reason)
        if nxt is cur:
            return False
        self.runq.remove(nxt)
        cur.state = RUNNABLE
        self.runq.append(cur)
        self._switch(cur, nxt, reason)
        return True

    def block(self, on: object, timeout: int | None = None) -> bool:
        """Sleep until wake() (True) or `timeout` jiffies pass (False).

        `on` is what the task waits for; the deadlock report shows its repr
        and, if it has an `owner` task, follows that edge of the wait-for graph.
        """
        cur = self.current
        if self.killing:
            raise TaskKilled
        if self.dead is not None:
            raise self.dead
        cur.state = BLOCKED
        cur.blocked_on = on
        cur.woken = False
        cur.wake_at = None
        if timeout is not None:
            cur.wake_at = self.jiffies + max(0, timeout)
            heapq.heappush(self._sleepers, (cur.wake_at, next(self._seq), cur))
        try:
            nxt = self._pick_next("block")
        except BaseException:  # ReplayDivergence: the task has not left the CPU
            cur.state, cur.blocked_on, cur.wake_at = RUNNING, None, None
            raise
        if nxt is None:
            return self._deadlock(cur)
        if nxt is not cur:
            self._switch(cur, nxt, "block")
        else:  # its own timeout was the earliest: it never left the CPU
            cur.state = RUNNING
        cur.blocked_on = None
        return cur.woken

    def wake(self, t: Task) -> bool:
        """Make a blocked task runnable (no switch: the caller's next point may)."""
        if t.state != BLOCKED:
            return False
        if self.fp is not None:   # the wakee's next step comes after this one
            self.fp(t, "wake")
        t.state = RUNNABLE
        t.woken = True
        t.wake_at = None
        self.runq.append(t)
        return True

    # -- internals -----------------------------------------------------------------
    def _choose(self, cands: list[Task], reason: str) -> Task:
        nxt = self.strategy.choose(self, cands, reason)
        self.decisions.append(nxt.tid)
        return nxt

    def _pick_next(self, reason: str) -> Task | None:
        """Take the next task to run off the run queue (the current one is not on it)."""
        if not self.runq:
            if not self._wake_sleeper():
                return None
        nxt = self.runq[0] if len(self.runq) == 1 else self._choose(list(self.runq), reason)
        self.runq.remove(nxt)
        return nxt

    def _wake_sleeper(self) -> bool:
        """Nobody can run: jump the clock to the earliest timeout, if any."""
        while self._sleepers:
            at, _, t = heapq.heappop(self._sleepers)
            if t.state == BLOCKED and t.wake_at == at:
                delta = at - self.jiffies
                self.jiffies = at
                for hook in self.on_clock:
                    hook(delta)
                t.state = RUNNABLE
                t.wake_at = None
                self.runq.append(t)
                return True
        return False

    def _switch(self, cur: Task, nxt: Task, reason: str) -> None:
        cur.saved_ts = _cur._current
        self.switches += 1
        for hook in self.on_switch:
            hook(cur, nxt, reason)
        nxt.state = RUNNING
        self.current = nxt
        nxt.greenlet.switch()
        self._resumed(cur)

    def _resumed(self, t: Task) -> None:
        """Back on the CPU: restore this task's `current` and deliver anything pending."""
        self.current = t
        t.state = RUNNING
        _cur._current = t.saved_ts
        if t.pending is not None:
            exc, t.pending = t.pending, None
            raise exc

    def _exit(self, t: Task) -> None:
        """A spawned task's function returned: wake its joiners and run the next task."""
        t.state = DONE
        if self.fp is not None:
            self.fp(t, "exit")
        del self.alive[t.tid]
        for hook in t.on_exit:
            hook()
        if t.exc is not None:
            self.failed.append(t)
        for j in t.joiners:
            self.wake(j)
        t.joiners.clear()
        if self.killing:
            nxt = self.main
        else:
            nxt = self._pick_next("exit")
            if nxt is None:  # only blocked tasks are left: main among them
                self.dead = DeadlockError(self.report("every task is blocked"))
                self.main.pending = self.dead
                nxt = self.main
        t.greenlet.parent = nxt.greenlet  # returning from _run switches to it
        self.switches += 1
        for hook in self.on_switch:
            hook(t, nxt, "exit")
        nxt.state = RUNNING
        self.current = nxt

    def _deadlock(self, cur: Task) -> bool:
        self.dead = DeadlockError(self.report("every task is blocked"))
        if cur is self.main:
            cur.state = RUNNING
            raise self.dead
        self.main.pending = self.dead
        self._switch(cur, self.main, "deadlock")
        raise TaskKilled  # resumed only by abandon()

    # -- reports and teardown ------------------------------------------------------
    def report(self, title: str) -> str:
        """The wait-for graph: who waits for what, who holds it, and the cycle."""
        tasks = [self.main, *sorted(self.alive.values(), key=lambda t: t.tid)]
        lines = [f"{title}:"]
        for t in tasks:
            if t.state != BLOCKED:
                continue
            on = t.blocked_on
            owner = self._waits_for(t)
            if isinstance(on, Task):
                line = f"  task {t.tid} {t.label} waits for task {on.tid} {on.label} to exit"
            else:
                line = f"  task {t.tid} {t.label} waits for {on!r}"
                if owner is not None:
                    line += f" (owner: task {owner.tid} {owner.label})"
            lines.append(line)
            held = t.held_locks
            # the entry lock_acquire() pushed before blocking is the wait, not a hold
            # (a waiter record such as rwsem_waiter names its lock as `.lock`)
            if held and held[-1].lock is getattr(on, "lock", on):
                held = held[:-1]
            for h in held:
                lines.append(f"      holding {h}")
        cycle = self._cycle(tasks)
        if cycle:
            lines.append("  cycle: " + " -> ".join(f"{t.tid}:{t.label}" for t in cycle))
        return "\n".join(lines)

    @staticmethod
    def _waits_for(t: Task) -> Task | None:
        """The task `t` waits on: a lock's owner, or the task it joins."""
        on = t.blocked_on
        owner = on if isinstance(on, Task) else getattr(on, "owner", None)
        return owner if isinstance(owner, Task) else None

    def _cycle(self, tasks: list[Task]) -> list[Task]:
        for start in tasks:
            seen: list[Task] = []
            t: Task | None = start
            while t is not None and t.state == BLOCKED and t not in seen:
                seen.append(t)
                t = self._waits_for(t)
            if t is not None and t in seen:
                return [*seen[seen.index(t):], t]
        return []

    def abandon(self) -> list[Task]:
        """Unwind every live task by throwing TaskKilled into it; returns them."""
        killed = sorted(self.alive.values(), key=lambda t: t.tid)
        if not killed:
            self.dead = None
            return []
        assert self.current is self.main, "abandon() runs from main"
        self.killing = True
        mine = _cur._current  # main's `current`, given back after each unwinding
        try:
            for t in killed:
                if t.state == DONE:
                    continue
                if t in self.runq:
                    self.runq.remove(t)
                if t.greenlet is None or not t.greenlet:   # never started
                    t.state = DONE
                    t.killed = True
                    self.alive.pop(t.tid, None)
                    for hook in t.on_exit:   # as _exit() would (m.kthreads, ...)
                        hook()
                    continue
                self.current = t
                t.state = RUNNING
                self.main.saved_ts, _cur._current = mine, t.saved_ts  # as _switch() does
                t.greenlet.throw(TaskKilled)
                self._resumed(self.main)
        finally:
            self.killing = False
            self._sleepers.clear()
            self.runq.clear()
            self.dead = None
        return killed


#: the one CPU every machine's tasks run on
SCHED = Scheduler()
_track.set_sched(vars(SCHED))     # where c_ext._track.KeyedBase finds the running step


class Named:
    """Emulator-level base of the primitives that report their own touches (locks, wait
    queues, atomics, xarrays): each is named when it is made, while partial-order
    reduction records (Scheduler.fp_keep) - so its name comes from the order things
    were made, the same in every run up to the decision where two runs part, not
    from whichever step first touches it."""

    __slots__ = ()

    def __new__(cls, *args: object, **kwargs: object) -> Any:
        return _named_when_made(object.__new__(cls))


def _named_when_made(obj: Any) -> Any:
    """Hand a new object to the recording reduction to name (Scheduler.fp_keep), if
    one records: Named's and KeyedDict's __new__."""
    keep = SCHED.fp_keep
    if keep is not None:
        keep(obj, True)
    return obj


def touch(obj: object, write: bool | str = True) -> None:
    """Emulator-level: the running step reads (write=False) or writes `obj`, a shared
    object another task may touch too, or adds to it (write="add": a change that
    commutes with other adds, such as an increment whose result nobody looks at).
    Partial-order reduction (kernel_model.emu.explore) orders two steps only when they
    touch a common object, one writing (or one adding and the other reading or
    writing); the primitives call this (locks, wait queues, atomics, kmalloc'd
    objects, memory), so driver code never has to."""
    fp = SCHED.fp
    if fp is not None:
        fp(obj, write)


def touch_key(key: tuple, write: bool | str = True) -> None:
    """Emulator-level: touch's twin for a part of a struct - `key` is (id(struct), ...),
    e.g. one fd of a table or one 2 MiB stretch of an address space - so steps on
    different parts do not conflict; a kfree of the struct conflicts with every part."""
    st = SCHED.fp_step
    if st is not None:
        (st.reads if write is False else st.adds if write == "add" else st.writes).add(key)


class _PyKeyedBase(dict):
    """The Python twin of c_ext._track.KeyedBase, and its reference: KeyedDict's
    lookups and stores (see KeyedDict), each recording its key."""

    __slots__ = ()

    # (touch_key inlined: MLX5_GET and MLX5_SET come through here)
    def __getitem__(self, k: Any) -> Any:
        st = SCHED.fp_step
        if st is not None:
            st.reads.add((id(self), k))
        return dict.__getitem__(self, k)

    def get(self, k: Any, default: Any = None) -> Any:
        st = SCHED.fp_step
        if st is not None:
            st.reads.add((id(self), k))
        return dict.get(self, k, default)

    def __contains__(self, k: object) -> bool:
        st = SCHED.fp_step
        if st is not None:
            st.reads.add((id(self), k))
        return dict.__contains__(self, k)

    def __setitem__(self, k: Any, v: Any) -> None:
        st = SCHED.fp_step
        if st is not None:
            if not dict.__contains__(self, k):
                st.writes.add((id(self), "#keys"))
            st.writes.add((id(self), k))
        dict.__setitem__(self, k, v)

    def __delitem__(self, k: Any) -> None:
        self._forget(k)  # type: ignore[attr-defined]
        dict.__delitem__(self, k)


_KeyedBase: type = _PyKeyedBase if default_backend_name() == "python" else _track.KeyedBase


class KeyedDict(_KeyedBase):  # type: ignore[valid-type,misc]
    """Emulator-level: a dict that reports its accesses to partial-order reduction key
    by key (touch_key), for tables that tasks change entry by entry - the firmware's
    object tables - so that destroying object 5 and looking up object 9 do not
    conflict, as a whole-table watch would make them.  Which keys exist is a part of
    its own (#keys): inserting a key writes it; deleting one adds to it (deletes of
    different keys commute, insertion order would not); iterating and len() read it,
    and iterating reads every entry.  The firmware's tables are KeyedDicts always
    (FwTable); an ifc struct's fields are one only while the reduction records
    (keyed_dict()).  Its lookups and stores are c_ext._track.KeyedBase's (C: the
    firmware's tables are looked up on every command and WQE, and off a recording
    each costs one probe more than a dict's), or _PyKeyedBase's on
    $PEERMEM_BACKEND=python."""

    __slots__ = ()

    def __new__(cls, *args: object, **kwargs: object) -> Any:
        return _named_when_made(dict.__new__(cls))

    def _all(self, write: bool | str = False) -> None:
        st = SCHED.fp_step
        if st is not None:
            i = id(self)
            keys = st.reads if write is False else st.adds if write == "add" else st.writes
            keys.add((i, "#keys"))
            keys.update([(i, k) for k in dict.keys(self)])

    def _forget(self, k: Any) -> None:
        """Key k is about to be deleted (it may be absent): a write of it, and an add to
        the keys if it is there.  A subclass hooks deletions here (FwTable)."""
        st = SCHED.fp_step
        if st is not None:
            st.writes.add((id(self), k))
            if dict.__contains__(self, k):
                st.adds.add((id(self), "#keys"))

    def pop(self, k: Any, *default: Any) -> Any:
        self._forget(k)
        return dict.pop(self, k, *default)

    def setdefault(self, k: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, k):
            self[k] = default
        return self[k]

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Each key as __setitem__ records it (a write; and of #keys when one is new),
        recorded in one go: an ifc struct's copy updates dozens at a time."""
        new = dict(*args, **kwargs)
        st = SCHED.fp_step
        if st is not None:
            i = id(self)
            if not new.keys() <= dict.keys(self):
                st.writes.add((i, "#keys"))
            st.writes.update([(i, k) for k in new])
        dict.update(self, new)

    def popitem(self) -> tuple[Any, Any]:
        self._all(True)
        return dict.popitem(self)

    def clear(self) -> None:
        self._all(True)
        dict.clear(self)

    def __len__(self) -> int:
        st = SCHED.fp_step
        if st is not None:
            st.reads.add((id(self), "#keys"))
        return dict.__len__(self)

    def __iter__(self) -> Any:
        self._all()
        return dict.__iter__(self)

    def keys(self) -> Any:
        st = SCHED.fp_step
        if st is not None:
            st.reads.add((id(self), "#keys"))
        return dict.keys(self)

    def values(self) -> Any:
        self._all()
        return dict.values(self)

    def items(self) -> Any:
        self._all()
        return dict.items(self)

    def copy(self) -> dict:
        self._all()
        return dict(dict.items(self))


def keyed_dict() -> dict:
    """An empty table for KeyedDict's uses: a KeyedDict while partial-order reduction
    records (Scheduler.fp_keep set), else a plain dict."""
    return KeyedDict() if SCHED.fp_keep is not None else {}


def touch_ram(mem: object, addr: int, n: int, write: bool) -> None:
    """Emulator-level: the running step reads or writes RAM [addr, addr + n) of the
    machine whose memory is `mem` - page by page, so a CPU polling a CQ page and a DMA
    into a data page do not conflict (touch's twin for memory)."""
    st = SCHED.fp_step
    if st is not None and n > 0:
        SCHED.fp_keep(mem, False)           # type: ignore[misc]
        keys = st.writes if write else st.reads
        o = id(mem)
        for pfn in range(addr >> 12, ((addr + n - 1) >> 12) + 1):
            keys.add((o, pfn))


def current_task() -> Task:
    """The Task running now (main when no spawned task is on the CPU)."""
    return SCHED.current

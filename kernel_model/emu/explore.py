"""The race explorer: run one program under many schedules and judge every run.

Emulator-level.  A *program* is an ordinary function that builds its own
machine(s), starts the competing tasks, waits for them and asserts; the
explorer runs it again and again, each time with the scheduler's decisions
(`sched.Strategy`) made differently, and judges each run:

  * the program's own assertions and any exception it ends in;
  * the scheduler's deadlock report (DeadlockError, with who holds what);
  * the kernel's debug checks - lockdep, sleeping in atomic context,
    use-after-free and double free of kernel objects (KASAN-style), refcount
    underflow, WARNs (a device DMA into memory revoked or freed WARNs) - and,
    after the run, the machine's leak check.

Strategies (a seed makes each repeatable):

  dfs     bounded exhaustive search by preemption count (CHESS): the runs
          branch at decision points, and a branch that switches away from
          a task that could have gone on costs one preemption; branches over
          the bound (default 2) are not taken.  With partial-order reduction
          (explore_dpor, the default) a run branches only where two steps of
          different tasks race - touch a common object, one writing - so one
          schedule of each class of equivalent ones runs; explore_dfs branches
          everywhere
  pct     PCT: every task gets a random priority, the highest runnable one
          runs, and at d - 1 random steps the running task drops to the
          lowest priority; a depth-d bug is found with probability at least
          1 / (n * k^(d-1)) per run (n tasks, k steps)
  random  every decision uniformly random

pct and random are fair at sched_yield() (YieldFair): a yielding task waits
until the others runnable at its yield have run, so a busy poll cannot starve
the task it polls for.

A failure comes back as a Failure: which check, its details, the schedule
as a string (sched.format_schedule) that ReplayStrategy replays exactly,
and - after shrinking (`shrink`: within a deadline, a long schedule cut
short, then preemptions dropped one at a time while the same check still
fails) - the fewest preemptions found.

The exploration owns the one scheduler while it runs (it must be called
from main, with no task alive).
"""

from __future__ import annotations

import contextlib
import gc
import queue
import random
import time
import warnings
from collections.abc import Callable, Hashable, Iterator
from operator import is_
from typing import Any

import attrs

from c_ext import _track
from kernel_model import slab
from kernel_model.emu.machine import Machine
from kernel_model.emu.tracefilter import filter_trace
from kernel_model.emu.traceout import format_ftrace
from kernel_model.errno import KernelBug
from kernel_model.sched import (
    SCHED,
    DeadlockError,
    DefaultStrategy,
    KeyedDict,
    Named,
    ReplayDivergence,
    Strategy,
    Task,
    format_schedule,
    parse_schedule,
)
from kernel_model.slab import _MUTABLE, _tracked_classes, track_structs
from kernel_model.trace import Tracer

Program = Callable[[], Any]


@attrs.define
class Point:
    """One decision: the runnable task ids, the one that could go on running (None at
    a block; at a yield, the task the yield hands the CPU to), and the one chosen."""

    cands: list[int]
    cur: int | None
    chosen: int

    @property
    def preempts(self) -> bool:
        return self.cur is not None and self.chosen != self.cur


@attrs.define(slots=True)
class Step:
    """What one task did between two scheduling decisions (or a decision and a forced
    switch): the ids of the shared objects it read and wrote (kernel_model.sched.touch).
    `point` is the decision it began at, None when the CPU came to it without a choice
    (the task before it blocked or ended with one task runnable)."""

    tid: int
    point: int | None
    reads: set[Hashable]
    writes: set[Hashable]
    #: what it added to (touch(obj, "add")): adds commute with each other only
    adds: set[Hashable] = attrs.Factory(set)
    #: the tasks it made runnable (spawned or woke): their next steps come after it
    wakes: set[int] = attrs.Factory(set)
    #: the tasks it joined: it comes after their ends, if they have ended
    joins: set[int] = attrs.Factory(set)
    ends: bool = False               # its task ended in it
    #: each object or field it wrote (id or (id, field)) -> how to read it back (a
    #: function and its arguments) and the value it had at the step's first write:
    #: one that holds that value again when the step ends was only read (_silent)
    before: dict[Hashable, tuple[Callable[..., Any], tuple, Any]] = attrs.Factory(dict)


@attrs.frozen
class Footprint:
    """A step's footprint in names that hold across runs (Recording.names: objects
    numbered in the order they were made or first touched, the same in every run up to
    the decision where runs part), for sleep sets: a task put to sleep at a decision
    keeps the footprint of the step it took there in another run."""

    reads: frozenset[Hashable]
    writes: frozenset[Hashable]
    adds: frozenset[Hashable]
    #: the structs named whole or by a field (a kfree's write of the whole struct
    #: conflicts with every field)
    heads: frozenset[Hashable]
    #: the structs written whole
    whole: frozenset[Hashable]
    #: its task could still run when the step ended (it did not block or end): moving
    #: the step earlier then costs a preemption after it (see _DporSearch.pop)
    stays: bool = True

    @classmethod
    def of(cls, st: Step, names: dict[int, tuple[int, int, bool]],
           point: int | None = None) -> Footprint | None:
        """`st`'s footprint by names.  With `point` (the decision st began at): None
        when a name is not stable there - given to an object older than the decision
        when st first touched it; objects nobody named get names of their own that
        match no other (only another run's step at `point` could hold them)."""
        heads: set[Hashable] = set()
        whole: set[Hashable] = set()

        def name(k: int) -> Hashable:
            n = names.get(k)
            if n is None:
                if point is not None:
                    raise _Unstable
                return ("?", k)
            if point is not None and n[1] > point and not n[2]:
                raise _Unstable
            return n[0]

        def rename(keys: set[Hashable], written: bool) -> frozenset[Hashable]:
            out = set()
            for k in keys:
                if type(k) is tuple:
                    h = name(k[0])
                    k = (h, *k[1:])
                else:
                    h = k = name(k)             # type: ignore[arg-type]
                    if written:
                        whole.add(h)
                heads.add(h)
                out.add(k)
            return frozenset(out)

        try:
            fp = (rename(st.reads, False), rename(st.writes, True), rename(st.adds, False))
        except _Unstable:
            return None
        return cls(*fp, frozenset(heads), frozenset(whole))

    def conflicts(self, o: Footprint) -> bool:
        """Do the two steps conflict: a common object, one writing (or one adding and
        the other reading or writing), or a whole struct written and a field of it
        touched?"""
        return bool(self.writes & (o.reads | o.writes | o.adds)
                    or o.writes & (self.reads | self.adds)
                    or self.adds & o.reads or o.adds & self.reads
                    or self.whole & o.heads or o.whole & self.heads)


class _Unstable(Exception):
    """Footprint.of: a name that another run could give to another object."""


class Recording(Strategy):
    """Make the decisions of `prefix` (task ids), then those of `base`; record them all.

    With `footprints`, also record each step's footprint (Step) for partial-order
    reduction: while the run lasts the scheduler's footprint hook and switch hook point
    here, and objects kmalloc'd meanwhile report their attribute reads and writes."""

    def __init__(self, prefix: list[int], base: Strategy | None = None,
                 lenient: bool = False, footprints: bool = False,
                 sleep: dict[int, Sleeper] | None = None, bound: int | None = None):
        self.prefix = prefix
        self.base = base or DefaultStrategy()
        self.lenient = lenient        # a prefix step that cannot be taken: the base's
        self.points: list[Point] = []
        self.footprints = footprints
        self.steps: list[Step] = []
        self._decided: int | None = None   # the task the last decision switches to
        #: each named object's id -> (its name, the decisions made before it was named,
        #: made while recording): see Scheduler.fp_keep and Footprint
        self.names: dict[int, tuple[int, int, bool]] = {}
        #: the sleep set (task -> the footprint of the step it would take, and whether
        #: it prunes: Sleeper), from the last decision of the prefix on: a sleeping task
        #: is not chosen after the prefix while another can run within the preemption
        #: `bound`, and wakes when a step conflicts with its footprint (explore_dpor)
        self.sleep: dict[int, Sleeper] = {}
        self._sleep = dict(sleep or {})     # put to sleep at the prefix's last decision
        #: the sleep set at each decision from the prefix's last on (where not empty)
        self.sleep_at: dict[int, dict[int, Sleeper]] = {}
        self.bound = bound
        self._npre = 0

    def choose(self, sched: Any, candidates: list[Task], reason: str) -> Task:
        i = len(self.points)
        cur = candidates[0].tid if candidates[0] is sched.current else None
        if cur is None and sched.current in candidates:
            # a yield (the yielder last): the default hands the CPU on, and taking it
            # back costs a preemption - CHESS's fairness for spin loops, which would
            # otherwise spin for free and make every bounded search unbounded
            cur = candidates[0].tid
        pick = None
        if i < len(self.prefix):
            pick = next((t for t in candidates if t.tid == self.prefix[i]), None)
            if pick is None and not self.lenient:
                raise ReplayDivergence(f"explore: decision {i} wants task {self.prefix[i]}, "
                                       f"runnable: {[t.tid for t in candidates]}")
        if pick is None:
            pick = self.base.choose(sched, candidates, reason)
            if pick.tid in self.sleep:
                pick = self._awake(sched, candidates, reason, cur, pick)
        self.points.append(Point([t.tid for t in candidates], cur, pick.tid))
        self._npre += self.points[-1].preempts
        if self.footprints:
            self._begin(pick, i)
            self._decided = None if pick is sched.current else pick.tid
            if i == len(self.prefix) - 1:
                self.sleep = self._sleep
            if self.sleep:
                self.sleep_at[i] = dict(self.sleep)
        return pick

    # -- footprints ---------------------------------------------------------------------
    def install(self) -> None:
        """Hook the scheduler (run_once calls this and `remove` around the run)."""
        if self.footprints:
            SCHED.fp = self._touch
            SCHED.fp_watch = self._watch
            SCHED.fp_keep = self._name
            self._keep: dict[int, Any] = {}
            self._watched: dict[int, list[Any]] = {}    # id -> [box, snapshot, fields]
            self._tasks_watch: dict[int, dict[int, list[Any]]] = {}
            SCHED.on_switch.append(self._switched)
            track_structs()
            self._begin(SCHED.current, None)

    def remove(self) -> None:
        """Unhook what install() hooked."""
        if self.footprints:
            self._changes()
            SCHED.fp = SCHED.fp_step = SCHED.fp_watch = SCHED.fp_keep = None
            self._keep.clear()
            _track.clear_keys()             # the run's (id, field) keys, kept for reuse
            SCHED.on_switch.remove(self._switched)
            self._watched.clear()
            self._tasks_watch.clear()

    def _awake(self, sched: Any, candidates: list[Task], reason: str, cur: int | None,
               pick: Task) -> Task:
        """The base strategy picked a sleeping task: the base's choice among the tasks
        awake instead - unless none is, or taking one costs a preemption the bound
        cannot pay (then the sleeper runs, and its step wakes it)."""
        awake = [t for t in candidates if t.tid not in self.sleep]
        if sched.current in candidates and candidates[0] is not sched.current:
            # a yield: the yielder waits for the others - spinning on instead of a
            # sleeper would only spend the bound on polls
            awake = [t for t in awake if t is not sched.current]
        if not awake:
            return pick
        other = self.base.choose(sched, awake, reason)
        cost = cur is not None and other.tid != cur and pick.tid == cur
        if cost and (self.bound is None or self._npre + 1 > self.bound):
            return pick
        return other

    def _name(self, obj: Any, made: bool) -> None:
        """Scheduler.fp_keep: hold `obj` for the run and name it (in order)."""
        i = id(obj)
        if i not in self.names:
            self._keep[i] = obj
            self.names[i] = (len(self.names), len(self.points), made)

    def _begin(self, task: Task, point: int | None) -> None:
        if self.steps:
            self._changes()
            if self.sleep:
                self._wake(self.steps[-1])
        if self.sleep:                      # a sleeper given the CPU is awake
            self.sleep.pop(task.tid, None)
        st = Step(task.tid, point, set(), set())
        self.steps.append(st)
        # fields are recorded from the first decision on: before it main runs alone,
        # and every other task's steps come after its spawn - nothing can race with it
        SCHED.fp_step = st if self.points else None

    def _touch(self, obj: Any, write: bool | str) -> None:
        st = self.steps[-1]
        if write is True or write is False:
            k = id(obj)
            if write:
                state = getattr(obj, "fp_state", None)
                if state is not None and k not in st.writes:
                    st.before[k] = (state, (), state())
                st.writes.add(k)
            else:
                st.reads.add(k)
            self._name(obj, False)
        elif write == "add":
            st.adds.add(id(obj))
            self._name(obj, False)
        elif write == "wake":               # obj is a task this step made runnable
            st.wakes.add(obj.tid)
        elif write == "join":
            st.joins.add(obj.tid)
        else:                               # "exit": obj, the running task, ends
            st.ends = True

    def _watch(self, box: Any, field: Hashable) -> None:
        """A step read `field`, which holds the container `box`: a read, and its task
        watches `box` from now on - the step of that task that changes it (through this
        field or any reference it kept) writes every field `box` was read from.  A
        container it cannot follow (_watchable: a buffer, too big, holding something
        that changes unseen) is not watched: its read is a write.  The snapshot is the
        box's, shared by every task watching it; each compares at its own step ends."""
        st = self.steps[-1]
        w = self._watched.get(id(box))
        if w is None:                       # (ids are not reused while recording)
            if not _watchable(box):
                st.writes.add(field)
                return
            w = self._watched[id(box)] = [box, _snapshot(box), {field}]
        else:
            w[2].add(field)
        st.reads.add(field)
        self._tasks_watch.setdefault(st.tid, {})[id(box)] = w

    def _changes(self) -> None:
        """The step that is ending writes the fields of each container its task
        watches and it changed since the last look (each of the task's steps ends with
        one); a container that can no longer be followed (_watchable) stops being
        watched, by every task, and its next read is a write.  First, its silent
        writes become reads (_silent)."""
        st = self.steps[-1]
        if st.before:
            _silent(st)
        mine = self._tasks_watch.get(st.tid)
        if not mine:
            return
        for key, w in list(mine.items()):
            box, snap, fields = w
            if _changed(box, snap):
                st.writes.update(fields)
                if not _watchable(box):     # its next read decides again: a write
                    for watching in self._tasks_watch.values():
                        watching.pop(key, None)
                    del self._watched[key]
                    continue
                w[1] = _snapshot(box)

    def _wake(self, st: Step) -> None:
        """Step `st` has ended: every sleeper whose step conflicts with it wakes (leaves
        the sleep set; its own task left it when the step began)."""
        fp = Footprint.of(st, self.names)
        for t in [t for t, (f, _) in self.sleep.items() if f.conflicts(fp)]:
            del self.sleep[t]

    def footprints_at(self, points: set[int]) -> dict[int, Footprint | None]:
        """The footprints, in names every run with the same prefix gives alike, of the
        steps that began at the decisions `points` - None for one that touched an
        object first named in that step that was not made in it (an object older than
        the decision, named in another order in another run).  `stays` says whether
        the task could still run after it: the next step began at a decision (not a
        forced switch) with the task among the runnable."""
        out: dict[int, Footprint | None] = {}
        steps = self.steps
        for i, st in enumerate(steps):
            if st.point not in points:
                continue
            fp = Footprint.of(st, self.names, st.point)
            if fp is not None:
                nxt = steps[i + 1] if i + 1 < len(steps) else None
                stays = (nxt is not None and nxt.point is not None
                         and st.tid in self.points[nxt.point].cands)
                fp = attrs.evolve(fp, stays=stays)
            out[st.point] = fp
        return out

    def footprint(self, point: int) -> Footprint | None:
        """footprints_at() of one decision (None if no step began there)."""
        return self.footprints_at({point}).get(point)

    def _switched(self, cur: Task, nxt: Task, reason: str) -> None:
        if self._decided == nxt.tid:        # the decision's step has begun already
            self._decided = None
        else:                               # a switch nobody chose: a new step
            self._begin(nxt, None)


def _silent(st: Step) -> None:
    """_py_silent, in C (c_ext._track.silent) unless the Python recorder was chosen."""
    if slab.TRACK_BACKEND == "c":
        _track.silent(st.before, st.writes, st.reads, _MUTABLE, _STATES)
    else:
        _py_silent(st)


def _py_silent(st: Step) -> None:
    """A step is one atomic move of the machine: nobody sees its values in between.
    So an object or field that ends the step as it began it (a lock taken and given
    back, a mailbox entry filled and emptied) was only read - the step depended on its
    value and left it alone - and the step commutes with other steps that only read
    it.  Compared by value for ints, strings and other immutable values, by identity
    for objects that are not containers (a container is followed by _watch); a field
    whose struct was freed meanwhile stays written."""
    for k, (now, args, was) in st.before.items():
        try:
            v = now(*args)
        except Exception:                  # freed (KASAN's poison), gone: a write
            continue
        if v is was:
            if type(v) in _MUTABLE:
                continue
        elif type(v) is not type(was) or type(v) not in _STATES or v != was:
            continue
        st.writes.discard(k)
        st.reads.add(k)


#: the most items a watched container may hold (Recording._watch): a bigger one's read is
#: a write, so no step end compares a page array item by item
WATCH_MAX = 64


#: what a watched container may hold: values that cannot change in place, or tracked
#: structs (whose fields record themselves); anything else - a list in a dict, an
#: untracked object - could change unseen, so reading its container is a write
_IMMUTABLE = frozenset((int, str, bytes, bool, float, type(None), frozenset, type))
#: what _silent compares by value: immutable values, and the primitives' states
_STATES = _IMMUTABLE | {tuple}


def _watchable(box: Any) -> bool:
    """Can Recording._watch follow `box` by snapshots?  Not a bytearray, not more than
    WATCH_MAX items, nothing inside that can change in place unseen."""
    if type(box) is bytearray or len(box) > WATCH_MAX:
        return False
    items = box.values() if isinstance(box, dict) else box
    for x in items:
        t = type(x)
        if t not in _IMMUTABLE and t not in _tracked_classes and not (
                t is tuple and all(type(y) in _IMMUTABLE for y in x)) and not _reports(t):
            return False
    return True


_REPORTS: dict[type, bool] = {}


def _reports(t: type) -> bool:
    """Does an object of type t report its own touches (a primitive - sched.Named -, a
    KeyedDict, a class that says POR_SELF_REPORTED), so that a container holding it
    changes only when the container does?"""
    r = _REPORTS.get(t)
    if r is None:
        r = _REPORTS[t] = (issubclass(t, (Named, KeyedDict))
                           or bool(getattr(t, "POR_SELF_REPORTED", False)))
    return r


def _snapshot(box: Any) -> Any:
    """What _changed compares a watched container with: its items (a set's, by
    value; a list's, deque's or dict's, by identity and order)."""
    if type(box) is set:
        return frozenset(box)
    if isinstance(box, dict):
        return tuple(box), tuple(box.values())
    return tuple(box)


def _changed(box: Any, snap: Any) -> bool:
    if type(box) is set:
        return box != snap
    if isinstance(box, dict):
        keys, values = snap
        return (len(box) != len(keys) or not all(map(is_, box, keys))
                or not all(map(is_, box.values(), values)))
    return len(box) != len(snap) or not all(map(is_, box, snap))


def _yielder(sched: Any, candidates: list[Task]) -> Task | None:
    """The task deciding by sched_yield(), or None: Scheduler.yield_ offers the run
    queue with the yielder last, point() the current task first, a block not at all."""
    cur = sched.current
    if candidates and candidates[0] is not cur and cur in candidates:
        return cur
    return None


class YieldFair(Strategy):
    """Fairness at sched_yield() for the seeded strategies (CHESS's fair scheduler,
    Musuvathi and Qadeer, PLDI 2008): a task that yields is not chosen again until every
    other task runnable at its yield has been chosen once or stopped being runnable.

    A busy poll (CQ.poll_until: poll, sched_yield, poll again) otherwise starves the
    task it waits for whenever the poller ranks higher - under PCT for the whole run,
    until the poll times out: a false alarm.  The rule only takes choices away at a
    yield, it never reorders: a subclass's `pick` sees the tasks still allowed, and
    PCT keeps its priorities and change points (see PCT)."""

    def __init__(self) -> None:
        self.owed: dict[int, set[int]] = {}     # a yielder -> the tasks it lets go first

    def choose(self, sched: Any, candidates: list[Task], reason: str) -> Task:
        tids = {t.tid for t in candidates}
        for waits in self.owed.values():
            waits &= tids                       # a task that blocked or ended: owed no more
        y = _yielder(sched, candidates)
        if y is not None:
            self.owed[y.tid] = tids - {y.tid}
        allowed = [t for t in candidates if not self.owed.get(t.tid)] or candidates
        pick = self.pick(sched, allowed, reason)
        for waits in self.owed.values():
            waits.discard(pick.tid)
        return pick

    def pick(self, sched: Any, candidates: list[Task], reason: str) -> Task:
        raise NotImplementedError


class FairRandom(YieldFair):
    """Uniformly random choices from a seed among the tasks yield fairness allows
    (sched.RandomStrategy's choices wherever no task has yielded)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.rng = random.Random(seed)

    def pick(self, sched: Any, candidates: list[Task], reason: str) -> Task:
        return self.rng.choice(candidates)


class PCT(YieldFair):
    """PCT (Burckhardt et al.): random priorities, d - 1 priority-change points.

    Yield-fair (YieldFair): a yielder waits until the others runnable at its yield
    have each been chosen, then competes again with its own priority.  That is PCT
    run on the program whose busy polls were blocking waits re-checked after every
    step of another task - the program PCT's analysis is about (a task that cannot
    progress is not enabled) - so the random priorities and the change points keep
    their meaning and the argument for the 1 / (n * k^(d-1)) bound carries over (k
    counting the polls' decisions too).  Demoting the yielder instead would be a
    priority change the analysis does not count: after its wait the poller could
    no longer run before a task it outranked without spending one of the d - 1
    change points."""

    def __init__(self, seed: int, depth: int = 3, steps: int = 200):
        super().__init__()
        self.rng = random.Random(seed)
        self.prio: dict[int, float] = {}
        self.changes = set(self.rng.sample(range(1, max(steps, depth) + 1), depth - 1))
        self.step = 0
        self.low = 0.0

    def pick(self, sched: Any, candidates: list[Task], reason: str) -> Task:
        self.step += 1
        for t in candidates:
            if t.tid not in self.prio:
                self.prio[t.tid] = 1.0 + self.rng.random()
        best = max(candidates, key=lambda t: self.prio[t.tid])
        if self.step in self.changes:            # the running task drops to the bottom
            self.low -= 1.0
            self.prio[best.tid] = self.low
            best = max(candidates, key=lambda t: self.prio[t.tid])
        return best


@attrs.define
class Failure:
    """A run that failed: the check, its details, and how to replay it."""

    check: str
    detail: str
    schedule: str
    preemptions: int

    def __str__(self) -> str:
        return (f"{self.check}: {self.detail}\n  schedule {self.schedule!r} "
                f"({self.preemptions} preemption(s))")


@attrs.define
class Run:
    schedule: str
    points: list[Point]
    failure: Failure | None
    #: a DFS's schedule prefixes still to run after this one (its frontier); None for
    #: strategies whose total is known up front
    frontier: int | None = None


def _preemptions(points: list[Point]) -> int:
    return sum(p.preempts for p in points)


def _where(e: BaseException) -> str:
    """`in fn() at file:line` of the innermost frame of e's traceback."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    co = tb.tb_frame.f_code
    path = "/".join(co.co_filename.replace("\\", "/").split("/")[-2:])
    return f"in {co.co_name}() at {path}:{tb.tb_lineno}"


#: verdicts that may be only the aftermath of a task that oopsed (a worker that died
#: of a use-after-free leaves a waiter stuck, or a result missing): not worth a mention
CONSEQUENCES = ("deadlock", "assertion", "exception", "null-deref")


def _oops(first: int) -> tuple[str, str] | None:
    """The first kernel bug (KASAN report, BUG) a task of this run's machines died of
    while nobody was joining it - a kworker running a free callback, say.  In the
    kernel that oops is the report, so it is the verdict, whatever the program saw."""
    for t in SCHED.failed:
        m = getattr(t, "machine", None)
        if m is not None and m.serial < first:
            continue
        if isinstance(t.exc, KernelBug):
            return (type(t.exc).__name__, f"{t.exc} (task {t.label} died of it)")
        if isinstance(t.exc, AttributeError) and "'NoneType'" in str(t.exc):
            return ("null-deref", f"BUG: kernel NULL pointer dereference: {t.exc} "
                    f"{_where(t.exc)} (task {t.label} died of it)")
    return None


def _judge(program: Program, tracer: Any = None) -> tuple[str, str] | None:
    """Run the program once under the installed strategy; (check, detail) or None.
    A tracer, if given, records the program itself - not the leak check's teardown."""
    first = Machine.next_serial
    hooks = SCHED.on_clock[:], SCHED.on_switch[:]
    verdict: tuple[str, str] | None = None
    if tracer is not None:
        tracer.start()
    try:
        try:
            program()
        finally:
            if tracer is not None:
                tracer.stop()
    except DeadlockError as e:
        verdict = ("deadlock", str(e))              # the wait-for report: who holds what
    except KernelBug as e:
        verdict = (type(e).__name__, str(e))
    except ReplayDivergence:
        raise
    except AssertionError as e:
        verdict = ("assertion", str(e) or "assert")
    except AttributeError as e:
        # EMU: Python's None.attr is the kernel's NULL-pointer dereference (an oops)
        if "'NoneType'" in str(e):
            verdict = ("null-deref", f"BUG: kernel NULL pointer dereference: {e} "
                       f"{_where(e)}")
        else:
            verdict = ("exception", f"AttributeError: {e}")
    except Exception as e:  # noqa: BLE001 - any crash of the program is a verdict
        verdict = ("exception", f"{type(e).__name__}: {e}")
    oops = _oops(first)
    if oops is not None:
        if verdict is not None and verdict[0] not in CONSEQUENCES:
            oops = (oops[0], f"{oops[1]}; the program then failed too: {verdict[0]}")
        verdict = oops
    for m in Machine.made_since(first):
        if not getattr(m, "leak_check_expected", True):
            continue
        m.leak_check_expected = False
        try:
            m.check_leaks(max_lines=None)       # each leaked object, however many
        except Exception as e:  # noqa: BLE001 - the leak check's report (bugs, leaks)
            if verdict is None:
                text = str(e)
                check = "warn" if "WARNING" in text else "leak"
                # the whole report: each leaked object with where it was made, the WARN
                # with its message (a first line alone says only "1 leak(s):")
                verdict = (check, text or type(e).__name__)
    SCHED.abandon()
    SCHED.failed.clear()
    # a run that died (a deadlock, an oops) leaves main's lock stack and wait as they
    # were; they must not hold the run's machine alive into the next run
    SCHED.main.held_locks.clear()
    SCHED.main.blocked_on = None
    SCHED.main.saved_ts = None
    SCHED.on_clock[:], SCHED.on_switch[:] = hooks     # nor the hooks its machines left
    return verdict


def run_once(program: Program, strategy: Strategy, tracer: Any = None) -> Run:
    """One judged run of `program` with `strategy` making the decisions (traced by
    `tracer`, a kernel_model.trace.Tracer not yet started, if given)."""
    rec = strategy if isinstance(strategy, Recording) else Recording([], strategy)
    SCHED.use(rec)
    rec.install()
    try:
        verdict = _judge(program, tracer)
    finally:
        rec.remove()
        SCHED.use(None)
    sched = format_schedule([p.chosen for p in rec.points])
    failure = None if verdict is None else Failure(*verdict, sched, _preemptions(rec.points))
    return Run(sched, rec.points, failure)


def replay(program: Program, schedule: str, tracer: Any = None) -> Run:
    """Run `program` with exactly the decisions of `schedule` (then the default's)."""
    return run_once(program, Recording(parse_schedule(schedule)), tracer)


def schedule_trace(program: Program, schedule: str) -> Any:
    """The kernel_model.tracedata.Trace of one replayed schedule (the program's part):
    every task's calls on its own track, for any of the tracer's output formats."""

    tracer = Tracer()
    replay(program, schedule, tracer)
    return tracer.trace


def interleaving(program: Program, schedule: str, *, depth: int | None = 4,
                 lines: int | None = 60) -> str:
    """The interleaved trace of one schedule, in the tracer's ftrace format: every task's
    calls (to `depth`) with a marker at each context switch, so the report shows which
    task ran what, in which order, up to the failure.  `lines` keeps the last that many
    (the program's trace ends where the failure unwound it)."""

    trace = filter_trace(schedule_trace(program, schedule), depth=depth)
    text = format_ftrace(trace).splitlines()
    head = [ln for ln in text[:5] if ln.startswith("#")]
    body = text[len(head):]
    if lines is not None and len(body) > lines:
        head.append(f"# ... {len(body) - lines} earlier lines left out")
        body = body[-lines:]
    return "\n".join(head + body)


# -- strategies over many runs ------------------------------------------------------------
def explore_dfs(program: Program, bound: int = 2, max_schedules: int | None = None,
                shard: tuple[int, int] = (0, 1)) -> Iterator[Run]:
    """Every schedule with at most `bound` preemptions (CHESS), depth first.

    `shard` (i, n) splits the search into n disjoint parts whose union is the whole:
    the default schedule's alternatives - the roots of the subtrees - are numbered in
    order and shard i takes those numbered i mod n (every shard runs the default
    schedule to find them; shard 0 reports it)."""
    index, count = shard
    stack: list[list[int]] = [[]]
    done = 0
    while stack and (max_schedules is None or done < max_schedules):
        prefix = stack.pop()
        run = run_once(program, Recording(prefix))
        pts = run.points
        npre = _preemptions(pts[:len(prefix)])
        children: list[list[int]] = []
        for i in range(len(prefix), len(pts)):
            p = pts[i]
            for alt in reversed(p.cands):
                if alt == p.chosen:
                    continue
                cost = 1 if p.cur is not None and alt != p.cur else 0
                if npre + cost <= bound:
                    children.append([q.chosen for q in pts[:i]] + [alt])
            npre += p.preempts
        if not prefix:
            children = children[index::count]
        stack.extend(children)             # before the yield: the frontier is known
        if prefix or index == 0:
            done += 1
            run.frontier = len(stack)
            yield run


# -- partial-order reduction ---------------------------------------------------------------
def _races(points: list[Point], steps: list[Step]) -> list[tuple[int, int, set[int], bool]]:
    """DPOR's race analysis of one run (_py_races): in C (c_ext._track.races, the same
    races in the same order) unless the Python recorder was chosen."""
    if slab.TRACK_BACKEND != "c":
        return list(_py_races(points, steps))
    return _track.races([p.cands for p in points], steps, _shared(steps) if steps else set())


def _py_races(points: list[Point],
              steps: list[Step]) -> Iterator[tuple[int, int, set[int], bool]]:
    """DPOR's race analysis of one run (Flanagan-Godefroid, with source-set initials).

    Steps j and k of different tasks race when they touch a common object, one of them
    writing (or one adding and the other reading or writing: adds commute), and
    nothing else orders j before k: j happens-before neither k's task's
    previous step nor k's other dependences (vector clocks over program order and the
    touched objects).  Such a race could go the other way, so for each one this yields
    (d, p, initials, every): the decision d where j's task was given the CPU (at or
    before j), k's task p, and the tasks runnable at d that lead to k - p itself when
    runnable there, else the runnable tasks with a step after j, not after j itself,
    that happens-before k; when there is none, every runnable task (`every` True: all
    of them must be tried, as Flanagan-Godefroid's rule has it).  A step's races come
    in the order of their earlier steps j, so a search is the same whatever the heap
    looked like when it ran."""
    if not steps:
        return
    width = max(s.tid for s in steps) + 1
    shared = _shared(steps)
    _keep = _track.keep if slab.TRACK_BACKEND == "c" else _py_keep
    vcs: list[list[int]] = []
    local: list[int] = []                  # each step's position in its task's sequence
    last_of: dict[int, int] = {}           # task -> its latest step
    woken_by: dict[int, int] = {}          # task -> the step that last made it runnable
    ended: dict[int, int] = {}             # task -> the step it ended in
    count: dict[int, int] = {}
    last_write: dict[Hashable, int] = {}        # object -> the step that wrote it last
    readers: dict[Hashable, dict[int, int]] = {}  # object -> task -> its latest read since
    adders: dict[Hashable, dict[int, int]] = {}   # object -> task -> its latest add since
    fields: dict[int, set[Hashable]] = {}   # a struct's id -> its fields touched so far
    decision: list[int | None] = []        # each step's decision (at or before it)
    first_step: dict[int, int] = {}        # decision -> the step it began
    d_now: int | None = None

    last_write_get, readers_get, adders_get = last_write.get, readers.get, adders.get
    for k, st in enumerate(steps):
        tid = st.tid
        if st.point is not None:
            d_now = st.point
            first_step[d_now] = k
        decision.append(d_now)
        n = count.get(tid, 0) + 1
        count[tid] = n
        local.append(n)
        prev = last_of.get(tid)
        vc = list(vcs[prev]) if prev is not None else [0] * width
        w = woken_by.get(tid)
        if w is not None and (prev is None or w > prev):
            # a spawn or wake-up orders this step after it - and is no race: the task
            # could not have run before it
            _join(vc, vcs[w])
        for t in st.joins:                 # a join of a task that has ended: after it
            e = ended.get(t)
            if e is not None:
                _join(vc, vcs[e])
        deps: set[int] = set()
        deps_add = deps.add
        # only what another task touches too can order two tasks' steps
        reads, adds, writes = _keep(st.reads, shared), _keep(st.adds, shared), \
            _keep(st.writes, shared)
        # each read comes after the object's last write and the adds since; each add
        # after the last write and the reads since (not other adds); each write after
        # all three - a whole struct's (kfree) after each field's too; a field after
        # a write of its whole struct.  (after(), inlined: this loop is the search's
        # own hottest)
        for part, other_get in ((reads, adders_get), (adds, readers_get)):
            for o in part:
                w = last_write_get(o)
                if w is not None:
                    deps_add(w)
                by = other_get(o)
                if by:
                    deps.update(by.values())
                if type(o) is tuple:
                    w = last_write_get(o[0])
                    if w is not None:
                        deps_add(w)
        for o in writes:
            if type(o) is tuple:
                w = last_write_get(o[0])
                if w is not None:
                    deps_add(w)
                keys: Any = (o,)
            else:
                f = fields.get(o)
                keys = (o, *f) if f else (o,)
            for key in keys:
                w = last_write_get(key)
                if w is not None:
                    deps_add(w)
                by = readers_get(key)
                if by:
                    deps.update(by.values())
                by = adders_get(key)
                if by:
                    deps.update(by.values())
        deps = {j for j in deps if steps[j].tid != tid}
        # in step order: which race of a decision the search meets first must not hang
        # on the set's order, which follows the keys' ids (where objects lie in memory)
        for j in sorted(deps):
            tj, lj = steps[j].tid, local[j]
            if vc[tj] >= lj or any(vcs[i][tj] >= lj for i in deps if i != j):
                continue                   # ordered before k by something else
            d = decision[j]
            if d is None:
                continue                   # before any choice: nothing to reverse
            cands = points[d].cands
            if tid in cands:
                yield d, tid, {tid}, False
                continue
            lead = {steps[i].tid for i in range(j + 1, k)
                    if vcs[i][tj] < lj and _hb(vcs, steps, local, i, deps, vc)}
            lead &= set(cands)
            yield d, tid, lead or set(cands), not lead
        for j in deps:
            _join(vc, vcs[j])
        vc[tid] = n
        vcs.append(vc)
        last_of[tid] = k
        for t in st.wakes:
            woken_by[t] = k
        if st.ends:
            ended[tid] = k
        for o in reads:
            readers.setdefault(o, {})[tid] = k
            if type(o) is tuple:
                fields.setdefault(o[0], set()).add(o)
        for o in adds:
            adders.setdefault(o, {})[tid] = k
            if type(o) is tuple:
                fields.setdefault(o[0], set()).add(o)
        for o in writes:
            last_write[o] = k
            readers.pop(o, None)
            adders.pop(o, None)
            if type(o) is tuple:
                fields.setdefault(o[0], set()).add(o)


def _shared(steps: list[Step]) -> set[Hashable]:
    """The objects (a field's: its struct's id) that steps of more than one task touch.
    An object one task alone touches orders only that task's steps, which program
    order orders already: _races leaves it out (most of a process's set-up, its own
    structs, is such)."""
    by_task = (_track.objects_by_task if slab.TRACK_BACKEND == "c" else
               _py_objects_by_task)(steps)
    seen: set[Hashable] = set()
    shared: set[Hashable] = set()
    for mine in by_task.values():
        shared |= seen & mine
        seen |= mine
    return shared


def _py_objects_by_task(steps: list[Step]) -> dict[int, set[Hashable]]:
    """Each task's objects (c_ext._track.objects_by_task's Python twin)."""
    by_task: dict[int, set[Hashable]] = {}
    for st in steps:
        mine = by_task.get(st.tid)
        if mine is None:
            mine = by_task[st.tid] = set()
        for part in (st.reads, st.writes, st.adds):
            mine.update([o[0] if type(o) is tuple else o for o in part])
    return by_task


def _py_keep(keys: set[Hashable], shared: set[Hashable]) -> list[Hashable]:
    """The keys of `keys` whose object is in `shared` (see _shared), in keys' order
    (c_ext._track.keep's Python twin)."""
    return [o for o in keys if (o[0] if type(o) is tuple else o) in shared]


def _join(vc: list[int], other: list[int]) -> None:
    """vc := the pointwise max of vc and other (a vector clock learning another's past)."""
    for t, c in enumerate(other):
        if c > vc[t]:
            vc[t] = c


def _hb(vcs: list[list[int]], steps: list[Step], local: list[int], i: int,
        deps: set[int], vc: list[int]) -> bool:
    """Does step i happen-before the step whose dependences are `deps` (its task's clock
    so far `vc`)?"""
    ti, li = steps[i].tid, local[i]
    return vc[ti] >= li or any(vcs[j][ti] >= li for j in deps) or i in deps


_Races = list[tuple[int, int, set[int], bool]]
#: each decision's step's footprint (Recording.footprint), for the decisions a search
#: may branch at
_Fps = dict[int, "Footprint | None"]
#: a sleeping task's entry: the footprint of the step it would take, and whether a
#: search may skip it where it sleeps (_DporSearch.pop)
Sleeper = tuple["Footprint", bool]
#: the sleep set at each decision a search may branch at
_Slept = dict[int, dict[int, Sleeper]]


def _dpor_step(program: Program, prefix: list[int],
               sleep: dict[int, Sleeper] | None = None,
               bound: int | None = None) -> tuple[Run, _Races, _Fps, _Slept]:
    """One run of the DPOR search: the run, and its races (_races), each decision's
    first one only where several races name the same task there; and the footprints
    of the steps that began at the decisions the search may branch at (the prefix's
    last, the races', and those where the CPU was free), for the sleep sets of the
    runs that branch there, and the sleep sets at those decisions.  `sleep` is this
    run's sleep set (Recording)."""
    rec = Recording(prefix, footprints=True, sleep=sleep, bound=bound)
    run = run_once(program, rec)
    seen: set[tuple[int, int, bool]] = set()
    races = []
    for race in _races(run.points, rec.steps):
        d, p, _lead, every = race
        if (d, p, every) not in seen:
            seen.add((d, p, every))
            races.append(race)
    if run.failure is not None and run.points:
        # a failure cut the run short: the tasks still runnable never took their next
        # steps, so nothing tells what those would race with - as if each raced with
        # every step since it last ran.  The search tries it at the last decision and,
        # as the bound may not pay for what follows there, at the last decision where
        # the CPU was free too (Coons et al.'s conservative branch, taken always):
        # a deadlock found first must not hide a use-after-free behind it
        pts = run.points
        end = len(pts) - 1
        for t in pts[end].cands:
            if t == pts[end].chosen:
                continue
            free = next((e for e in range(end, -1, -1)
                         if pts[e].cur is None and t in pts[e].cands), None)
            for d in {end, free} - {None}:
                if (d, t, False) not in seen and pts[d].chosen != t:
                    seen.add((d, t, False))
                    races.append((d, t, {t}, False))
    want = {d for d, _p, _l, _e in races}
    want.update(i for i, pt in enumerate(run.points) if pt.cur is None and len(pt.cands) > 1)
    if prefix:
        want.add(len(prefix) - 1)
    return run, races, rec.footprints_at(want), {d: rec.sleep_at[d] for d in want
                                              if d in rec.sleep_at}



#: a sharded DPOR search splits once this many prefixes per shard wait to be run
SPLIT_AT = 8

#: the program a --jobs worker process runs (set before the fork; never pickled)
_WORKER_PROGRAM: list[Program] = []


def _dpor_worker(job: tuple[list[int], dict[int, Sleeper], int]
                 ) -> tuple[Run, _Races, _Fps, _Slept]:
    return _dpor_step(_WORKER_PROGRAM[0], *job)


@attrs.define(slots=True)
class _Node:
    """A decision with alternatives, as the search keeps it (keyed by the prefix that
    reaches it): what the one run that reached it by going on (the run that gave it
    its first alternative) saw there, and what has been tried since."""

    #: the tasks tried there or waiting to be (DPOR's backtrack and done sets in one)
    tried: set[int]
    #: the footprint of the step each task tried there took (None: not comparable
    #: across runs) - the sleep sets' source
    fps: dict[int, Footprint | None]
    #: the sleep set there
    slept: dict[int, Sleeper]
    #: the task that could have gone on running there (Point.cur)
    cur: int | None


def _key(chosen: list[int], d: int) -> tuple[int, int]:
    """_DporSearch's key of decision d reached by the decisions `chosen`."""
    return d, hash(tuple(chosen[:d]))


class _DporSearch:
    """The DPOR search's bookkeeping, apart from running: the decisions that have
    alternatives to try (_Node, keyed by the schedule prefix that reaches them) and
    the prefixes still to run."""

    def __init__(self, bound: int, sleep_sets: bool = True):
        self.bound = bound
        self.sleep_sets = sleep_sets
        self.nodes: dict[tuple[int, int], _Node] = {}
        #: the prefixes still to run, each with a guess of its subtree: the decisions
        #: left after it in the run that found it, times the cube of one more than the
        #: preemptions it may still spend (it splits dereg-vs-invalidate 128/237/214/211)
        self.stack: list[tuple[list[int], int]] = [([], 1)]

    def pop(self, last: bool) -> tuple[list[int], dict[int, Sleeper], int]:
        """The next prefix to run (the last pushed, else the first), with its sleep
        set (sleep sets, Godefroid 1996): the tasks already tried at the prefix's last
        decision d, each with the footprint of the step it took there, and the sleep
        set d had.  A sleeping task whose step would come first once it conflicts with
        nothing before it makes a run equivalent to one of its own subtree, so it is
        not chosen (Recording) until a step conflicts with its footprint.

        Under a preemption bound that equivalent run may cost more: moving task t's
        step from later to d costs c(t) at d (a preemption if another could have gone
        on) and one after it if t stays runnable, and saves c(y) of the task y chosen
        at d - never more (dropping a step from between two others never adds a
        preemption).  So a branch to t where t sleeps is skipped (_try) only when
        c(t) + stays <= c(y): its runs' equivalents in t's subtree are within the
        bound whenever they are.  A sleeper that costs more still steers the run, it
        never prunes - pruning it loses schedules a bounded search must run (the
        counters toy in tests/kernel_model/test_explore_dpor.py)."""
        p = (self.stack.pop() if last else self.stack.pop(0))[0]
        node = self.nodes.get(_key(p, len(p) - 1)) if p and self.sleep_sets else None
        if node is None:
            return p, {}, self.bound
        y = p[-1]

        def cost(t: int) -> int:
            return int(node.cur is not None and t != node.cur)
        sleep = dict(node.slept)
        for t, f in node.fps.items():
            if f is not None and t not in sleep:
                sleep[t] = (f, cost(t) + f.stays <= cost(y))
        sleep.pop(y, None)
        return p, sleep, self.bound

    def add(self, run: Run, races: _Races, fps: _Fps | None = None,
            slept: _Slept | None = None) -> None:
        """Turn one run's races into alternatives at its decisions (within the bound);
        keep its steps' footprints (`fps`) and sleep sets (`slept`) at the decisions
        that have alternatives.

        An alternative that costs a preemption is also tried at the last decision
        before it where the CPU was free - when the bound cannot pay for it, and when
        paying spends the last of the bound (Coons, Musuvathi and McKinley's bounded
        partial-order reduction branches there always; these two cases are where the
        plain search's schedule can hold what the reduced one's cannot: the use-after-
        free of tests/scenarios/test_race_corpus.py's dereg-vs-invalidate at bound 1,
        the issue-53 race of the pytest plugin's docstring)."""
        pts = run.points
        chosen = [p.chosen for p in pts]
        fps = fps or {}
        slept = slept or {}
        for d, fp in fps.items():
            known = self.nodes.get(_key(chosen, d))
            if known is not None:
                known.fps.setdefault(chosen[d], fp)

        def node_at(d: int) -> _Node:
            key = _key(chosen, d)
            node = self.nodes.get(key)
            if node is None:
                # first visit with an alternative: every run through it so far chose this
                node = self.nodes[key] = _Node({chosen[d]}, {chosen[d]: fps.get(d)},
                                               slept.get(d, {}), pts[d].cur)
            return node
        npre = [0] * (len(pts) + 1)
        for i, p in enumerate(pts):
            npre[i + 1] = npre[i] + p.preempts
        for d, p, lead, every in races:
            node = node_at(d)
            if every:
                todo = sorted(lead - node.tried)
            elif lead & node.tried:
                continue
            else:
                todo = [p if p in lead else min(lead)]
            for x in todo:
                cost = 1 if pts[d].cur is not None and x != pts[d].cur else 0
                if npre[d] + cost <= self.bound:
                    self._try(chosen, d, node, x,
                              (len(pts) - d) * (self.bound - npre[d] - cost + 1) ** 3)
                    if not cost or npre[d] + cost < self.bound:
                        continue
                    # the preemption spends the last of the bound: what follows must
                    # run without one, where the plain search may have gone over to
                    # x at a free switch earlier and kept a preemption - so try that
                    # too (Coons et al.'s conservative branch, which they add always)
                for e in range(d, -1, -1):     # the last free switch before it
                    if pts[e].cur is None:
                        # x there, else every task runnable there (Coons et al.)
                        free = node_at(e)
                        size = (len(pts) - e) * (self.bound - npre[e] + 1) ** 3
                        for y in [x] if x in pts[e].cands else pts[e].cands:
                            self._try(chosen, e, free, y, size)
                        break

    def _try(self, chosen: list[int], d: int, node: _Node, x: int, size: int) -> None:
        if x not in node.tried:
            node.tried.add(x)
            asleep = node.slept.get(x)
            if asleep is None or not asleep[1]:    # (a pruning sleeper: explored)
                self.stack.append((chosen[:d] + [x], size))

    def split(self, index: int, count: int) -> None:
        """Keep part `index` of `count` of the prefixes waiting: the same greedy
        partition in every shard - biggest guessed subtree first, each to the part
        with the least so far (ties to the lowest part) - so the parts' sizes come
        out alike."""
        load = [0] * count
        mine = []
        order = sorted(range(len(self.stack)), key=lambda i: -self.stack[i][1])
        for i in order:
            part = min(range(count), key=lambda p: (load[p], p))
            load[part] += self.stack[i][1]
            if part == index:
                mine.append(i)
        self.stack = [self.stack[i] for i in sorted(mine)]


def explore_dpor(program: Program, bound: int = 2, max_schedules: int | None = None,
                 shard: tuple[int, int] = (0, 1), jobs: int = 1,
                 sleep_sets: bool = True) -> Iterator[Run]:
    """The schedules of explore_dfs, one per equivalence class: dynamic partial-order
    reduction (Flanagan-Godefroid DPOR) within the same preemption bound.

    Two schedules are equivalent when they differ only in the order of steps that
    touch no common object (or only read it): they end in the same state.  Each run
    records every step's footprint (Recording(footprints=True)); its races - pairs of
    steps of different tasks that conflict and are not ordered by anything else - are
    the only places where trying another task can lead somewhere new, so a decision
    gets an alternative only for a race (the race's later task, or the runnable tasks
    leading to it), never for steps that merely commute.  An alternative that costs a
    preemption the bound cannot pay is moved to the last decision before it where the
    CPU was free (a task blocked or ended) - bounded POR's conservative branch (Coons,
    Musuvathi and McKinley, OOPSLA 2013).  Schedules replay exactly as explore_dfs's.

    `jobs` N > 1 runs the schedules in N forked processes: each run is independent, and
    this process keeps the search's bookkeeping, so the result is the same set of
    equivalence classes, in another order.  `shard` (i, n) splits the search by
    schedule prefix: every shard runs the same first schedules, breadth first, until
    SPLIT_AT * n prefixes wait, then shard i keeps its part of them (_DporSearch.split:
    balanced by a guess of each subtree's size) and whatever its own runs add - a race
    that leads back above the split may be run by two shards, never by none.  Shard 0
    reports the shared first schedules."""
    index, count = shard
    search = _DporSearch(bound, sleep_sets)
    runs = 0
    split = count == 1
    pool = None
    # a first run that nobody records or counts: what the program imports as it runs
    # (a driver at load_module, a device model at its first use) is imported by then,
    # so every recorded run tracks those modules' structs alike - else the first runs
    # of a search saw fewer conflicts than the later ones, and a search depended on
    # what had run before it in the process
    run_once(program, DefaultStrategy())
    if jobs > 1:
        import multiprocessing
        _WORKER_PROGRAM[:] = [program]
        try:
            pool = multiprocessing.get_context("fork").Pool(jobs)
        except OSError as e:    # a process too big to fork (overcommit): same search
            warnings.warn(f"explore: jobs={jobs}: cannot fork workers ({e}); running "
                          "the schedules in this process", RuntimeWarning, stacklevel=2)
    done: queue.SimpleQueue = queue.SimpleQueue()    # the workers' runs, as they end
    inflight = 0
    with _few_collections():
        try:
            while (search.stack or inflight) and (max_schedules is None or runs < max_schedules):
                if not split:                      # breadth first until the split
                    results = [_dpor_step(program, *search.pop(False))]
                elif pool is None:
                    results = [_dpor_step(program, *search.pop(True))]
                else:
                    # every worker kept busy: a prefix goes out as soon as a run comes
                    # back (waiting for a whole batch left one worker idle behind the
                    # other's longer run, and both idle while this process added them)
                    while inflight < jobs and search.stack and \
                            (max_schedules is None or runs + inflight < max_schedules):
                        pool.apply_async(_dpor_worker, (search.pop(True),),
                                         callback=done.put, error_callback=done.put)
                        inflight += 1
                    got = done.get()
                    inflight -= 1
                    if isinstance(got, BaseException):
                        raise got
                    results = [got]
                for run, races, fps, slept in results:
                    search.add(run, races, fps, slept)
                    if not split and len(search.stack) >= SPLIT_AT * count:
                        search.split(index, count)
                        split = True
                    if split or index == 0:
                        runs += 1
                        run.frontier = len(search.stack)
                        yield run
        finally:
            if pool is not None:
                pool.terminate()
                _WORKER_PROGRAM.clear()


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """The cyclic garbage collector, quieter while a search runs: what exists when it
    starts is frozen (never scanned again until it ends) and a collection comes every
    50,000 allocations instead of 700.  A recorded run allocates a great deal (each
    step's footprint sets), and the default thresholds spent a fifth of a run scanning
    the same live objects over and over; the runs' own cycles are still collected."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def explore_random(program: Program, seed: int = 0, max_schedules: int = 100,
                   shard: tuple[int, int] = (0, 1)) -> Iterator[Run]:
    """Runs with uniformly random decisions, seeds seed .. seed + max_schedules - 1
    (shard (i, n): those whose offset is i mod n)."""
    for i in range(shard[0], max_schedules, shard[1]):
        yield run_once(program, FairRandom(seed + i))


def explore_pct(program: Program, seed: int = 0, max_schedules: int = 100, depth: int = 3,
                steps: int | None = None, shard: tuple[int, int] = (0, 1)) -> Iterator[Run]:
    """PCT runs (depth d), seeds seed .. seed + max_schedules - 1 (shard as random's).

    `steps` is PCT's k, the decision points of a run, over which the d - 1 change points
    are drawn; None takes the default schedule's (one run first, not counted).  A k
    much larger than the runs wastes change points past their end, a smaller one
    never changes priorities late.  It is the same for every seed, so a seed's
    schedule does not depend on the shard or on the runs before it."""
    if steps is None:
        steps = max(1, len(run_once(program, Recording([])).points))
    for i in range(shard[0], max_schedules, shard[1]):
        yield run_once(program, PCT(seed + i, depth, steps))


#: a failing schedule with more preemptions than this is first cut short (shrink)
SHRINK_CUT_OVER = 50


def _moves(pts: list[Point], first: int = 0) -> Iterator[tuple[int, list[int]]]:
    """Schedules with one preemption fewer: the decisions as segments (one task chosen
    again and again); where task A is preempted by B's segment, A's next segment moves
    up to go on at once, or else B's segment moves down to after it (each task still
    takes its own steps in its own order - only whose step comes first changes), or
    else that one decision alone goes to A.
    Yields (the preempting segment's index, the decisions), from segment `first` on."""
    segs: list[list[int]] = []
    firsts: list[int] = []
    for i, p in enumerate(pts):
        if segs and segs[-1][0] == p.chosen:
            segs[-1].append(p.chosen)
        else:
            segs.append([p.chosen])
            firsts.append(i)
    for k in range(first, len(segs)):
        i = firsts[k]
        a = pts[i].cur
        if not pts[i].preempts or a is None:
            continue
        m = next((j for j in range(k + 1, len(segs)) if segs[j][0] == a), None)
        if m is not None:
            for order in (segs[:k] + [segs[m]] + segs[k:m] + segs[m + 1:],
                          segs[:k] + segs[k + 1:m + 1] + [segs[k]] + segs[m + 1:]):
                yield k, [t for seg in order for t in seg]
        # or only that one decision is A's
        yield k, [p.chosen for p in pts[:i]] + [a] + [p.chosen for p in pts[i + 1:]]


def shrink(program: Program, failure: Failure, deadline: float | None = 30.0) -> Failure:
    """Drop preemptions from a failing schedule while the same check still fails; the
    best found within `deadline` seconds (None: no limit).

    A schedule of more than SHRINK_CUT_OVER preemptions (PCT's and random's can have
    thousands) is first cut short: the fewest of its first decisions that, the default
    strategy making the rest, still fail - a binary search over the prefix length, a
    few dozen runs whatever the length.  Then preemptions go one at a time (_moves:
    the preempted task goes on, its later steps brought forward, or the preempting
    task's steps put off), the decisions that no longer can be taken left to the
    default strategy."""
    end = None if deadline is None else time.monotonic() + deadline
    best = failure
    pts = replay(program, best.schedule).points

    def late() -> bool:
        return end is not None and time.monotonic() >= end
    if best.preemptions > SHRINK_CUT_OVER:
        lo, hi = 0, len(pts)                    # the first hi decisions are enough
        while hi - lo > 1 and not late():
            mid = (lo + hi) // 2
            run = run_once(program, Recording([q.chosen for q in pts[:mid]], lenient=True))
            if run.failure is not None and run.failure.check == best.check:
                hi = mid
                if run.failure.preemptions < best.preemptions:
                    best, pts = run.failure, run.points
            else:
                lo = mid
    improved, first = True, 0
    while improved and best.preemptions and not late():
        improved = False
        for k, prefix in _moves(pts, first):
            if late():
                break
            run = run_once(program, Recording(prefix, lenient=True))
            f = run.failure
            if f is not None and f.check == best.check and f.preemptions < best.preemptions:
                best, pts, improved = f, run.points, True
                first = max(0, k - 1)           # the segments before k are as they were
                break
    return best


@attrs.define
class Exploration:
    """What an exploration saw: runs, distinct schedules, the first failure (shrunk)."""

    runs: int = 0
    schedules: set[str] = attrs.Factory(set)
    failure: Failure | None = None
    decisions: int = 0             # the most decision points one run went through
    #: DFS: the prefixes still to run (each one schedule at least, so runs + frontier is
    #: a lower bound of the total); pct and random: the runs still to come
    frontier: int = 0


def explore(program: Program, strategy: str = "dfs", *, bound: int = 2,
            max_schedules: int | None = None, seed: int = 0, depth: int = 3,
            stop_at_failure: bool = True, shard: tuple[int, int] = (0, 1),
            progress: Callable[[Exploration], None] | None = None,
            shrink_seconds: float | None = 30.0, por: bool = True,
            jobs: int = 1) -> Exploration:
    """Run an exploration; stop at the first failure (shrunk) unless told otherwise.
    `shard` (i, n) runs part i of n parts (see explore_dpor, explore_dfs); `shrink_seconds`
    bounds the shrinking (shrink's deadline).  DFS uses partial-order reduction
    (explore_dpor) unless `por` is False (plain explore_dfs: every interleaving within
    the bound); `jobs` > 1 runs DPOR's schedules in that many processes."""
    if not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise ValueError(f"explore: shard {shard[0]}/{shard[1]} is not i/n with 0 <= i < n")
    if jobs < 1:
        raise ValueError(f"explore: jobs {jobs} is not a positive number of processes")
    if strategy == "dfs" and por:
        runs = explore_dpor(program, bound, max_schedules, shard, jobs)
    elif strategy == "dfs":
        runs = explore_dfs(program, bound, max_schedules, shard)
    elif strategy == "pct":
        runs = explore_pct(program, seed, max_schedules or 100, depth, shard=shard)
    elif strategy == "random":
        runs = explore_random(program, seed, max_schedules or 100, shard)
    else:
        raise ValueError(f"explore: no strategy {strategy!r} (dfs, pct, random)")
    out = Exploration()
    planned = None if strategy == "dfs" else \
        len(range(shard[0], max_schedules or 100, shard[1]))
    for run in runs:
        out.runs += 1
        out.frontier = run.frontier if planned is None else planned - out.runs
        out.schedules.add(run.schedule)
        out.decisions = max(out.decisions, len(run.points))
        if progress is not None:
            progress(out)
        if run.failure is not None and out.failure is None:
            out.failure = shrink(program, run.failure, shrink_seconds)
            if stop_at_failure:
                break
    return out

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
          branch at every decision point, and a branch that switches away from
          a task that could have gone on costs one preemption; branches over
          the bound (default 2) are not taken
  pct     PCT: every task gets a random priority, the highest runnable one
          runs, and at d - 1 random steps the running task drops to the
          lowest priority; a depth-d bug is found with probability at least
          1 / (n * k^(d-1)) per run (n tasks, k steps)
  random  every decision uniformly random

A failure comes back as a Failure: which check, its details, the schedule
as a string (sched.format_schedule) that ReplayStrategy replays exactly,
and - after shrinking (`shrink`: each preemption in turn is dropped while
the same check still fails) - the fewest preemptions found.

The exploration owns the one scheduler while it runs (it must be called
from main, with no task alive).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from kernel_model.emu.machine import Machine, live_machines
from kernel_model.emu.tracefilter import filter_trace
from kernel_model.emu.traceout import format_ftrace
from kernel_model.errno import KernelBug
from kernel_model.sched import (
    SCHED,
    DeadlockError,
    DefaultStrategy,
    RandomStrategy,
    ReplayDivergence,
    Strategy,
    Task,
    format_schedule,
    parse_schedule,
)
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


class Recording(Strategy):
    """Make the decisions of `prefix` (task ids), then those of `base`; record them all."""

    def __init__(self, prefix: list[int], base: Strategy | None = None,
                 lenient: bool = False):
        self.prefix = prefix
        self.base = base or DefaultStrategy()
        self.lenient = lenient        # a prefix step that cannot be taken: the base's
        self.points: list[Point] = []

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
        self.points.append(Point([t.tid for t in candidates], cur, pick.tid))
        return pick


class PCT(Strategy):
    """PCT (Burckhardt et al.): random priorities, d - 1 priority-change points."""

    def __init__(self, seed: int, depth: int = 3, steps: int = 200):
        self.rng = random.Random(seed)
        self.prio: dict[int, float] = {}
        self.changes = set(self.rng.sample(range(1, max(steps, depth) + 1), depth - 1))
        self.step = 0
        self.low = 0.0

    def choose(self, sched: Any, candidates: list[Task], reason: str) -> Task:
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
        if isinstance(t.exc, KernelBug) and (m is None or m.serial >= first):
            return (type(t.exc).__name__, f"{t.exc} (task {t.label} died of it)")
    return None


def _judge(program: Program, tracer: Any = None) -> tuple[str, str] | None:
    """Run the program once under the installed strategy; (check, detail) or None.
    A tracer, if given, records the program itself - not the leak check's teardown."""
    first = Machine.next_serial
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
    for m in sorted(live_machines, key=lambda m: m.serial):
        if m.serial < first or not getattr(m, "leak_check_expected", True):
            continue
        m.leak_check_expected = False
        try:
            m.check_leaks()
        except Exception as e:  # noqa: BLE001 - the leak check's report (bugs, leaks)
            if verdict is None:
                text = str(e)
                check = "warn" if "WARNING" in text else "leak"
                # the whole report: each leaked object with where it was made, the WARN
                # with its message (a first line alone says only "1 leak(s):")
                verdict = (check, text or type(e).__name__)
    SCHED.abandon()
    SCHED.failed.clear()
    return verdict


def run_once(program: Program, strategy: Strategy, tracer: Any = None) -> Run:
    """One judged run of `program` with `strategy` making the decisions (traced by
    `tracer`, a kernel_model.trace.Tracer not yet started, if given)."""
    rec = strategy if isinstance(strategy, Recording) else Recording([], strategy)
    SCHED.use(rec)
    try:
        verdict = _judge(program, tracer)
    finally:
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


def explore_random(program: Program, seed: int = 0, max_schedules: int = 100,
                   shard: tuple[int, int] = (0, 1)) -> Iterator[Run]:
    """Runs with uniformly random decisions, seeds seed .. seed + max_schedules - 1
    (shard (i, n): those whose offset is i mod n)."""
    for i in range(shard[0], max_schedules, shard[1]):
        yield run_once(program, RandomStrategy(seed + i))


def explore_pct(program: Program, seed: int = 0, max_schedules: int = 100, depth: int = 3,
                steps: int = 200, shard: tuple[int, int] = (0, 1)) -> Iterator[Run]:
    """PCT runs (depth d), seeds seed .. seed + max_schedules - 1 (shard as random's)."""
    for i in range(shard[0], max_schedules, shard[1]):
        yield run_once(program, PCT(seed + i, depth, steps))


def shrink(program: Program, failure: Failure) -> Failure:
    """Drop preemptions from a failing schedule while the same check still fails: each
    preemption in turn is replaced by letting the task go on, the later decisions
    kept where they still can be taken."""
    best = failure
    improved = True
    while improved and best.preemptions:
        improved = False
        pts = replay(program, best.schedule).points
        for i, p in enumerate(pts):
            if not p.preempts:
                continue
            prefix = [q.chosen for q in pts[:i]] + [p.cur] + [q.chosen for q in pts[i + 1:]]
            run = run_once(program, Recording(prefix, lenient=True))
            if run.failure is not None and run.failure.check == best.check and \
                    run.failure.preemptions < best.preemptions:
                best, improved = run.failure, True
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
            progress: Callable[[Exploration], None] | None = None) -> Exploration:
    """Run an exploration; stop at the first failure (shrunk) unless told otherwise.
    `shard` (i, n) runs part i of n disjoint parts (see explore_dfs)."""
    if not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise ValueError(f"explore: shard {shard[0]}/{shard[1]} is not i/n with 0 <= i < n")
    if strategy == "dfs":
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
            out.failure = shrink(program, run.failure)
            if stop_at_failure:
                break
    return out

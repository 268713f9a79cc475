"""Verdicts that keep their words: a lockdep cycle, a WARN and a leak reach the
explorer's Failure, `peermem explore`'s output and a race test's pytest report whole -
every line of the lockdep report, the WARN's message with its call trace, each
leaked object with where it was allocated - not just "warn: host: 1 leak(s):".

Three small programs make one each, in kernel threads on a machine of their own:
an AB-BA lock order (lockdep reports the possible deadlock though none happens),
a refcount_t taken from 0 (refcount_warn_saturate WARNs), and a pinned page never
unpinned.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.explore import Recording, run_once
from kernel_model.emu.machine import Machine
from kernel_model.kthread import kthread_run
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.refcount import refcount_inc, refcount_t
from peermem.cli import main
from scenarios.races import RACES, Race

#: what each program's report must say, every line of it (a line may be indented)
LOCKDEP = [
    "kernel bug: WARNING: lockdep: possible circular locking dependency detected",
    "abba_two-2 is trying to acquire lock_a at tests/kernel_model/test_explore_reports.py:",
    "but already holds lock_b, taken at tests/kernel_model/test_explore_reports.py:",
    "which lock already depends on the new lock; the existing dependency chain:",
    "  lock_a (held, taken at tests/kernel_model/test_explore_reports.py:",
    "-> lock_b (taken at tests/kernel_model/test_explore_reports.py:",
    ") by abba_one-1",
    "possible unsafe locking scenario: CPU0 lock(lock_b); CPU1 lock(lock_a); CPU1 "
    "lock(lock_b); CPU0 lock(lock_a); *** DEADLOCK ***",
    "Call Trace:",
    " lock_acquire() at kernel_model/lockdep.py:",
    " mutex_lock() at kernel_model/locking.py:",
]
WARN = [
    "kernel bug: WARNING: refcount_warn_saturate: refcount_t: addition on 0; "
    "use-after-free.",
    "Call Trace:",
    " refcount_warn_saturate() at kernel_model/refcount.py:",
    " refcount_inc() at kernel_model/refcount.py:",
    " Task._run() at kernel_model/sched.py:",
]
LEAK = [
    "leaky: 2 leak(s):",
    "pfn 0x",
    ": refcount 1 pincount 1 mapcount 0 (anon pid 1 at memory.py:",   # who made it, where
    " do_anonymous_page)",
    "pins: nr_foll_pin_acquired 1 != nr_foll_pin_released 0",
]


def abba() -> None:
    m = Machine(ram_size=16 << 20, name="locky")
    a, b = mutex_init("lock_a"), mutex_init("lock_b")

    def one() -> None:
        mutex_lock(a)
        mutex_lock(b)
        mutex_unlock(b)
        mutex_unlock(a)

    def two() -> None:
        mutex_lock(b)
        mutex_lock(a)
        mutex_unlock(a)
        mutex_unlock(b)

    with m.kernel():
        t = kthread_run(one, name="abba_one")
    t.join()
    with m.kernel():
        t = kthread_run(two, name="abba_two")
    t.join()


def refcount_from_zero() -> None:
    m = Machine(ram_size=16 << 20, name="warny")
    with m.kernel():
        r = refcount_t(0)
        t = kthread_run(lambda: refcount_inc(r), name="incr")
    t.join()


def pin_leak() -> None:
    from c_ext import U64Array
    from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast

    m = Machine(ram_size=16 << 20, name="leaky")
    p = m.spawn("leaker")
    a = p.mmap(0, m.page_size)
    with p.kernel():
        assert pin_user_pages_fast(a, 1, FOLL_WRITE, U64Array(1)) == 1


PROGRAMS = {"lockdep": (abba, LOCKDEP, "warn"), "warn": (refcount_from_zero, WARN, "warn"),
            "leak": (pin_leak, LEAK, "leak")}


def _all_in(lines: list[str], text: str) -> None:
    missing = [ln for ln in lines if ln not in text]
    assert not missing, f"dropped from the report: {missing}\n--- the report:\n{text}"


@pytest.mark.parametrize("kind", PROGRAMS)
def test_the_verdict_keeps_the_whole_report(kind):
    program, lines, check = PROGRAMS[kind]
    f = run_once(program, Recording([])).failure
    assert f is not None and f.check == check
    _all_in(lines, f.detail)
    _all_in(lines, str(f))


def test_a_leak_verdict_lists_every_leaked_object_however_many():
    """The suite's leak check lists 20 and counts the rest; a verdict lists them all."""
    from kernel_model.emu.leakcheck import MAX_LINES
    from kernel_model.page_alloc import GFP_KERNEL

    def program() -> None:
        m = Machine(ram_size=16 << 20, name="many")
        for _ in range(MAX_LINES + 5):
            m.zone.alloc(GFP_KERNEL, 0, "many")
    f = run_once(program, Recording([])).failure
    assert f.check == "leak" and f.detail.startswith(f"many: {MAX_LINES + 5} leak(s):")
    assert f.detail.count("\n  pfn ") == MAX_LINES + 5 and "more" not in f.detail


def test_the_lockdep_report_is_every_line_of_the_splat():
    """The report is lockdep's own text, line for line (indented under its entry)."""
    captured: list[Machine] = []

    def program() -> None:
        from kernel_model.emu.machine import live_machines
        abba()
        captured.append(max(live_machines, key=lambda m: m.serial))
    f = run_once(program, Recording([])).failure
    (splat,) = captured[0].bugs
    assert len(splat.splitlines()) == 6
    for line in splat.splitlines():
        assert line in f.detail


def test_a_warn_from_main_has_no_empty_call_trace():
    """A WARN reported with no emulated-kernel frame on the stack (a test calling
    report_bug itself) is its one line: no "Call Trace:" heading over nothing."""
    m = Machine(ram_size=16 << 20, name="bare")
    m.report_bug("some_function", "something odd")
    from kernel_model.emu.leakcheck import find_leaks
    assert find_leaks(m)[0] == "kernel bug: WARNING: some_function: something odd"
    m.bugs.clear()


@pytest.fixture
def toy_races(monkeypatch):
    """The three programs as race scenarios `peermem explore` can run (legacy: the bug)."""
    for kind, (program, _, check) in PROGRAMS.items():
        def run(legacy: bool, program=program) -> None:
            if legacy:
                program()
        monkeypatch.setitem(RACES, f"toy-{kind}",
                            Race(f"toy-{kind}", "nothing", f"a {kind}", (check,), run))


@pytest.mark.parametrize("kind", PROGRAMS)
def test_the_cli_prints_the_whole_report(toy_races, capsys, kind):
    assert main(["explore", f"toy-{kind}", "--legacy", "--max-schedules", "3"]) == 1
    out = capsys.readouterr().out
    _all_in(PROGRAMS[kind][1], out.split("FAILED: ", 1)[1].split("interleaving of")[0])


RACE_TESTS = '''
import pytest
from tests.kernel_model.test_explore_reports import abba, pin_leak, refcount_from_zero


@pytest.mark.race(bound=0)
def test_lockdep():
    abba()


@pytest.mark.race(strategy="pct", max_schedules=2, depth=2)
def test_warn():
    refcount_from_zero()


@pytest.mark.race(strategy="random", max_schedules=2)
def test_leak():
    pin_leak()
'''


def test_a_race_tests_failure_prints_the_whole_report(pytester):
    """The pytest plugin's report of each failing race test holds the whole text, and
    its summary section says what each explored: schedules, strategy and bound or seed
    and depth, the time."""
    pytester.makepyfile(test_reported=RACE_TESTS)
    res = pytester.runpytest_inprocess("-p", "no:randomly", "-q")
    res.assert_outcomes(failed=3)
    out = res.stdout.str()
    for lines in (LOCKDEP, WARN, LEAK):
        _all_in(lines, out)
    section = out.split("peermem race tests")[1]
    for test, how in (("test_lockdep", r"dfs, bound 0"), ("test_warn", r"pct, seed 0, depth 2"),
                      ("test_leak", r"random, seed 0")):
        assert f"test_reported.py::{test}: 1 schedule(s) explored (1 distinct), {how}, in " \
            in section, section

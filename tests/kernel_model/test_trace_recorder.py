"""The tracer's event recorder: c_ext._tracebuf.Recorder against its twin.

trace.PyRecorder is the reference: each test drives both with the same calls
and compares the events they keep (the layouts kernel_model.trace._build
documents), or checks the same refusal from each.  The C tracepoint
(c_ext._tracebuf.TracePoint) is checked against the generated-function twin
the same way.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from c_ext import _tracebuf
from kernel_model import trace
from kernel_model.trace import PyRecorder, Tracer

RECORDERS = {"c": _tracebuf.Recorder, "python": PyRecorder}


class _Sched:
    current = "the scheduler's task"


def _pair(clock=None):
    """A C recorder and its twin, each finding the running task in the same places."""
    where = {"_current": None}
    return where, {name: make(where, _Sched(), clock) for name, make in RECORDERS.items()}


def _ticks():
    n = iter(range(1000, 2000))
    return lambda: next(n)


def test_both_recorders_keep_the_same_events_in_order():
    where, recs = _pair()
    got = {}
    for name, r in recs.items():
        where["_current"] = None
        assert r.enter(3, None, "a", 7) == "the scheduler's task"      # no current task
        where["_current"] = "task-1"
        r.exit(~3, "task-1", 42)
        r.point("tp", 1, 2, 3)
        r.add("S", "task-1", "task-2", "sleep")
        r.add("T", None, 5, None)
        assert r.enter(4, {"flag": True}) == "task-1"
        assert len(r) == 6
        got[name] = r.events()
    assert got["c"] == got["python"] == [
        (3, "the scheduler's task", None, "a", 7), (~3, "task-1", 42),
        ("P", "task-1", "tp", 1, 2, 3), ("S", "task-1", "task-2", "sleep"),
        ("T", None, 5, None), (4, "task-1", {"flag": True})]


def test_the_wall_clock_goes_after_the_fixed_fields():
    got = {}
    for name, make in RECORDERS.items():
        r = make({"_current": "t"}, _Sched(), _ticks())
        r.enter(1, None, "x")
        r.exit(~1, "t", None)
        r.point("tp", 9)
        r.add("S", "t", "u", "why", 77)          # the hooks put their own timestamp
        got[name] = r.events()
    assert got["c"] == got["python"] == [
        (1, "t", None, 1000, "x"), (~1, "t", None, 1001), ("P", "t", "tp", 1002, 9),
        ("S", "t", "u", "why", 77)]


def test_a_false_current_falls_back_to_the_scheduler():
    """`current._current or SCHED.current`: any false value, not only None."""
    for name, make in RECORDERS.items():
        r = make({"_current": 0}, _Sched())
        assert r.enter(1, None) == "the scheduler's task", name
        r2 = make({}, _Sched())                   # no _current at all
        assert r2.enter(1, None) == "the scheduler's task", name


def test_call_records_entry_and_exit_around_the_call():
    where, recs = _pair()
    where["_current"] = "t"

    def f(a, b=2, *rest, k=0, **more):
        return (a, b, rest, k, more)
    got = {}
    for name, r in recs.items():
        assert r.call(f, 5, ~5, None, 1) == (1, 2, (), 0, {})
        assert r.call(f, 5, ~5, {"k": 3, "z": 4}, 1, 9, 8) == (1, 9, (8,), 3, {"z": 4})
        got[name] = r.events()
    assert got["c"] == got["python"] == [
        (5, "t", None, 1), (~5, "t", (1, 2, (), 0, {})),
        (5, "t", {"k": 3, "z": 4}, 1, 9, 8), (~5, "t", (1, 9, (8,), 3, {"z": 4}))]


def test_call_records_the_exception_and_raises_it_with_its_traceback():
    where, recs = _pair()
    where["_current"] = "t"

    def boom(x):
        raise KeyError(x)
    for name, r in recs.items():
        with pytest.raises(KeyError) as e:
            r.call(boom, 2, ~2, None, "k")
        ev = r.events()
        assert ev[0] == (2, "t", None, "k") and ev[1][:2] == (~2, "t"), name
        assert ev[1][2] is e.value, name           # the exception object itself
        assert e.traceback[-1].name == "boom", name  # raised where it was raised


def test_bad_calls_fail_with_the_same_kind_of_error():
    where, recs = _pair()
    for name, r in recs.items():
        with pytest.raises(TypeError):
            r.enter(1)
        with pytest.raises(TypeError):
            r.exit(1, "t")
        with pytest.raises(TypeError):
            r.point()
        with pytest.raises(TypeError):
            r.call(print, 1, ~1)
        assert len(r) == 0, name                   # a refused call records nothing
    with pytest.raises(TypeError, match="clock must be callable"):
        _tracebuf.Recorder({}, _Sched(), 5)
    with pytest.raises(TypeError):
        _tracebuf.Recorder([], _Sched())
    with pytest.raises(ValueError, match="an event of"):
        _tracebuf.Recorder({}, _Sched()).add(*range(0x10000))
    with pytest.raises(ValueError, match="recorder must be 'c' or 'python'"):
        Tracer(recorder="rust")


def test_a_clock_that_raises_records_nothing():
    def broken():
        raise OSError("no clock")
    for name, make in RECORDERS.items():
        r = make({"_current": "t"}, _Sched(), broken)
        with pytest.raises(OSError):
            r.enter(1, None, "x")
        with pytest.raises(OSError):
            r.point("tp")
        assert r.events() == [], name


def test_a_recorder_in_a_cycle_is_collected():
    """The C recorder takes part in garbage collection: a task that holds the
    recorder which holds the task is freed once nothing else holds them."""
    class Task:
        pass
    t = Task()
    r = _tracebuf.Recorder({"_current": t}, _Sched())
    r.enter(1, None, "arg")
    t.rec = r
    gone = weakref.ref(t)
    del t, r
    gc.collect()
    assert gone() is None


def test_the_c_tracepoint_and_its_twin_record_the_same():
    meta = trace._Tracepoint("twin_check", ("a", "b"), "kernel_model")
    c_tp = _tracebuf.TracePoint(meta, "trace_twin_check", 2)
    ns: dict = {}
    exec("def _mk(_pm_a, _pm_p):\n    def trace_twin_check(a, b):\n"
         "        _pm_a(_pm_p, a, b, )\n    return trace_twin_check\n", ns)
    py_tp = ns["_mk"](trace._discard, meta)
    assert c_tp(1, 2) is None and c_tp.sink is None          # no sink: nothing happens
    got = {}
    for rec_name in ("c", "python"):
        for tp_name, tp in (("c", c_tp), ("python", py_tp)):
            r = RECORDERS[rec_name]({"_current": "t"}, _Sched())
            trace._set_sink(tp, r)
            tp(1, "two")
            trace._set_sink(tp, None)
            tp(3, 4)                                           # unhooked again
            got[rec_name, tp_name] = r.events()
    assert set(map(repr, got.values())) == {repr([("P", "t", meta, 1, "two")])}
    assert repr(c_tp) == "<trace_twin_check>" and c_tp.tp is meta
    with pytest.raises(TypeError, match=r"trace_twin_check\(\) takes 2 positional"):
        c_tp(1)
    with pytest.raises(TypeError, match="by position"):
        c_tp(1, b=2)
    with pytest.raises(AttributeError):
        del c_tp.sink
    with pytest.raises(ValueError):
        _tracebuf.TracePoint(meta, "trace_bad", -1)


def test_a_tracer_on_each_recorder_records_a_real_run_alike():
    """The same pin and unpin under each recorder: the same calls and points
    (the Trace built from each is compared by shape)."""
    from c_ext import U64Array
    from kernel_model.emu.machine import Machine
    from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast, unpin_user_pages

    shapes = {}
    for name in RECORDERS:
        m = Machine()
        p = m.spawn("rec")
        addr = p.mmap(0, 1 << 16)
        pages = U64Array(4)
        with Tracer(recorder=name) as t, p.kernel():
            assert pin_user_pages_fast(addr, 4, FOLL_WRITE, pages) == 4
            unpin_user_pages(pages, 4)
        assert t.recorder == name
        shapes[name] = ([(c.func, c.args, c.ret, c.depth) for c in t.trace.calls()],
                        [(q.name, q.fields) for q in t.trace.points()])
        p.exit(0)
        m.check_leaks()
    assert shapes["c"] == shapes["python"]
    funcs = [c[0] for c in shapes["c"][0]]
    assert funcs[:2] == ["pin_user_pages_fast", "__get_user_pages"]
    assert funcs.count("handle_mm_fault") == 4 and "unpin_user_pages" in funcs
    assert [q[0] for q in shapes["c"][1]] == ["pages_pinned", "pages_unpinned"]

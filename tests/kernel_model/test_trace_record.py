"""What the recorder keeps of a call and of a tracepoint, on both clocks.

The trampoline flattens a call's arguments into its entry event and a
tracepoint's values into its event (kernel_model.trace._build documents the
layouts); the wall clock puts its timestamp among the fixed fields.  These
tests pin every kind of parameter a traced function can have - positional,
defaulted, *args, keyword-only, **kwargs, a closure - and a tracepoint's fields to the
text the Trace shows, in virtual and in wall mode alike.
"""

from __future__ import annotations

import pytest

from kernel_model import trace
from kernel_model.emu.machine import Machine
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import Tracer, traced, tracepoint

trace_rec_point = tracepoint("rec_point", "alpha beta")


@traced(layer="driver")
def rec_inner(x, y=7, *rest, flag=False, **extra):
    """A traced function with every kind of parameter."""
    if trace.enabled:
        trace_rec_point(x, len(rest))
    if flag:
        raise KernelError(EINVAL, "rec_inner: flag set")
    return x + y + sum(rest) + len(extra)


def _make_rec_closure(base):
    @traced(layer="driver")
    def rec_closure(v):
        """A traced closure: its trampoline must keep the closure's cell count."""
        return v + base
    return rec_closure


rec_closure = _make_rec_closure(100)


@traced(layer="driver")
def rec_outer(n):
    """Calls rec_inner three ways (the last one fails) and a traced closure."""
    total = rec_inner(n) + rec_inner(n, 1, 2, 3, colour="red") + rec_closure(n) - 100 - n
    try:
        rec_inner(n, flag=True)
    except KernelError:
        pass
    return total


@pytest.mark.parametrize("recorder", ["c", "python"])
@pytest.mark.parametrize("clock", ["virtual", "wall"])
def test_arguments_fields_and_returns_survive_flattening(clock, recorder):
    m = Machine()
    p = m.spawn("rec")
    with Tracer(clock=clock, recorder=recorder) as t, p.kernel():
        assert rec_outer(5) == 12 + 11 + 1
    tr = t.trace
    outer = [c for c in tr.calls() if c.func == "rec_outer"]
    assert len(outer) == 1 and outer[0].args == "n=5" and outer[0].ret == "24"
    inner = [c for c in outer[0].children if getattr(c, "func", None) == "rec_inner"]
    closure = [c for c in outer[0].children if getattr(c, "func", None) == "rec_closure"]
    assert [(c.args, c.ret) for c in closure] == [("v=5", "105")]
    assert [(c.args, c.ret) for c in inner] == [
        ("x=5, y=7, flag=false", "12"),
        ('x=5, y=1, 2, 3, flag=false, colour="red"', "12"),
        ("x=5, y=7, flag=true", "-EINVAL"),
    ]
    # each tracepoint hit is the child of its call, its fields by name
    points = [c.children for c in inner]
    assert [[(q.name, q.fields) for q in kids] for kids in points] == [
        [("rec_point", {"alpha": 5, "beta": 0})],
        [("rec_point", {"alpha": 5, "beta": 2})],
        [("rec_point", {"alpha": 5, "beta": 0})],
    ]
    # time never runs backwards along a call: entry, its point, its exit
    for c in inner:
        assert c.start <= c.children[0].ts <= c.end
    assert outer[0].start <= inner[0].start and inner[-1].end <= outer[0].end
    p.exit(0)
    m.check_leaks()


def test_both_clocks_and_both_recorders_record_the_same_graph():
    """The same run on the two clocks and the two recorders (c_ext._tracebuf and its
    Python twin): the same calls, arguments, returns and points."""
    def shape(clock, recorder="c"):
        m = Machine()
        p = m.spawn("rec")
        with Tracer(clock=clock, recorder=recorder) as t, p.kernel():
            rec_outer(3)
        p.exit(0)
        m.check_leaks()
        return [(c.func, c.args, c.ret, c.depth) for c in t.trace.calls()], \
            [(q.name, q.fields, q.depth) for q in t.trace.points()]

    assert shape("virtual") == shape("wall") == shape("virtual", "python") == \
        shape("wall", "python")


def test_a_session_after_the_defaults_changed_calls_the_function_as_it_is_now():
    """Each traced function's copy of the original is kept from one tracing session to
    the next; the trampoline fills the defaults from the function as it is now."""
    m = Machine()
    p = m.spawn("rec")
    saved = rec_inner.__defaults__
    try:
        with Tracer() as t, p.kernel():
            assert rec_inner(5) == 12
        with Tracer() as t2, p.kernel():
            assert rec_inner(5) == 12
        rec_inner.__defaults__ = (9,)
        with Tracer() as t3, p.kernel():
            assert rec_inner(5) == 14
        assert rec_inner(5) == 14                      # untraced, as traced
    finally:
        rec_inner.__defaults__ = saved
    assert [c.ret for tr in (t, t2, t3) for c in tr.trace.calls()] == ["12", "12", "14"]
    p.exit(0)
    m.check_leaks()


def _module_instance(base):
    """What a driver's module instance does at load: define traced closures over its
    parameters, two siblings that reach each other through their cells."""
    @traced(layer="driver")
    def inst_probe(v):
        return inst_remove(v) + base

    @traced(layer="driver")
    def inst_remove(v):
        return v if v < 0 else -v
    return inst_probe


def test_a_collected_traced_closure_leaves_the_registry_and_its_trace_still_builds():
    """The registry holds functions weakly (as unloading a module drops its entries):
    a module instance's traced closures go once nothing else holds them, even after a
    Tracer patched them and kept their copies.  A Tracer that patched one holds it
    until its Trace is built, so the arguments still have their parameter names."""
    import gc
    import weakref

    m = Machine()
    p = m.spawn("rec")
    before = set(trace._REGISTRY)
    probe = _module_instance(1000)
    mine = set(trace._REGISTRY) - before
    assert [trace._REGISTRY[f].name for f in sorted(mine)] == ["inst_probe", "inst_remove"]
    with Tracer() as t, p.kernel():
        assert probe(5) == 995
    gone = weakref.ref(probe)
    del probe
    gc.collect()
    assert gone() is not None                          # held by t until its trace is built
    assert [(c.func, c.args, c.ret) for c in t.trace.calls()] == [
        ("inst_probe", "v=5", "995"), ("inst_remove", "v=5", "-5")]
    gc.collect()
    assert gone() is None and not mine & set(trace._REGISTRY)
    with Tracer() as t2, p.kernel():                  # the next session patches what is left
        assert rec_closure(1) == 101
    assert [c.func for c in t2.trace.calls()] == ["rec_closure"]
    p.exit(0)
    m.check_leaks()


def test_a_function_registered_while_tracing_is_recorded_and_restored():
    """A module loaded while a Tracer runs registers its functions then, and they are
    patched at once (as ftrace patches a module's call sites at load): its calls are
    in the trace, and stop() gives it its own code back with its defaults untouched."""
    m = Machine()
    p = m.spawn("rec")
    with Tracer() as t, p.kernel():
        late = _make_rec_closure(7)           # registered now, while tracing
        assert late(1) == 8
        tramp = late.__code__
    assert late.__code__ is not tramp          # the trampoline was installed...
    assert late(1) == 8                        # ...and is gone: the original code runs
    assert late.__kwdefaults__ is None and "_pm" not in late.__code__.co_varnames
    assert [(c.func, c.args, c.ret) for c in t.trace.calls()] == [("rec_closure", "v=1", "8")]
    p.exit(0)
    m.check_leaks()

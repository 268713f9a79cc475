"""The tracer: ftrace's function_graph and tracepoints for the emulated kernel.

Emulator-level (kin to kernel/trace/ftrace.c).  A function that mirrors a
real one is marked `@traced`; a key event is a tracepoint:

    @traced
    def pin_user_pages_fast(start, nr_pages, gup_flags, pages): ...

    trace_pages_pinned = tracepoint("pages_pinned", "start nr_pages pinned")
    ...
    if trace.enabled:
        trace_pages_pinned(start, nr_pages, n)

    with Tracer() as t:          # record
        ...run something...
    print(format_ftrace(t.trace))

Zero cost when off, as ftrace's nop-patched call sites are: `@traced` only
registers the function and returns it untouched.  Starting a Tracer patches
each registered function in place - its `__code__` is swapped for a small
trampoline that calls the recorder, which calls a copy of the original - so
every reference to it (imports, ops tables, bound methods) is traced, and
stopping restores the original code.  Tracepoints cost one module-attribute
test while off.

Recording keeps each event's fields and nothing else: the recorder
(c_ext._tracebuf.Recorder, in C; PyRecorder is its twin) holds them in one
flat array, and a tracepoint on the C backend is a C callable, so a hit
costs no Python frame.  Arguments and return values are summarised to text
only when the Trace (kernel_model.tracedata) is first read after the run.
Times are virtual by default: each recorded event costs TICK_NS, and a sleep
advances the clock by its jiffies, so two runs of the same program give
byte-identical traces.
`Tracer(clock="wall")` records perf_counter_ns() instead.

The layer of a function comes from its module (drivers.mlx5_ib -> mlx5_ib,
kernel_model.syscalls -> syscall, kernel_model.hw -> hw, ...) unless given.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import time
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from c_ext import _tracebuf, default_backend_name
from kernel_model import current as _cur
from kernel_model.errno import KernelError
from kernel_model.sched import SCHED, Task
from kernel_model.tracedata import ENTER, EXIT, LAYERS, POINT, SWITCH, Call, Point, Switch, Trace

TICK_NS = 100          # virtual cost of one recorded event
JIFFY_NS = 1_000_000   # HZ = 1000
MAX_ARGS_TEXT = 120

#: tracepoints test this before building their fields (the static key)
enabled = False

#: every registered function still alive, by fid (see _Traced)
_REGISTRY: dict[int, _Traced] = {}
_next_fid = itertools.count()
_active: Tracer | None = None

_MODULE_LAYERS = (("kernel_model.syscalls", "syscall"), ("kernel_model.hw", "hw"),
                  ("kernel_model", "kernel_model"), ("drivers.ib_core", "ib_core"),
                  ("drivers.mlx5_ib", "mlx5_ib"), ("drivers.mlx5_core", "mlx5_core"),
                  ("drivers.nvidia", "nvidia"), ("drivers", "driver"),
                  ("peermem_clients", "peer_client"), ("userspace", "userspace"))


def layer_of_module(module: str) -> str:
    """The layer a module's functions belong to (see the module docstring)."""
    for prefix, layer in _MODULE_LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return "userspace"


class _Traced:
    """One registered function: its original code and its trampoline.

    The registry holds the function weakly, as the kernel's list of traceable
    functions loses a module's entries when it is unloaded: a driver or peer
    client defines some traced functions per module instance (closures over
    its parameters), one set per machine that loads it, and a search builds
    thousands of machines.  Held strongly, each set stayed registered for the
    rest of the process, with all its closure holds, and every Tracer.start()
    patched them all.  So nothing reachable from here may lead back to the
    function: its trampoline (whose copy of it holds its closure, and a closure
    can hold its sibling functions) lives on the function itself.  (The
    trampoline is made when first needed: every module registers its functions
    at import, and most processes never trace.)
    """

    def __init__(self, fn: types.FunctionType, layer: str, name: str):
        self.fid = next(_next_fid)
        # when fn is collected it leaves the registry (and a Tracer that patched
        # it keeps it alive until that Tracer lets go)
        self.ref = weakref.ref(fn, lambda _, fid=self.fid: _REGISTRY.pop(fid, None))
        self.layer = layer
        self.name = name
        self.code = fn.__code__

    @property
    def fn(self) -> types.FunctionType | None:
        """The function, or None once it has been collected."""
        return self.ref()

    @functools.cached_property
    def params(self) -> list[str]:
        """The positional parameters' names, as the trace prints the arguments."""
        fn = self.fn
        if fn is None:   # not reached: a Tracer holds what it patched until it builds
            return list(self.code.co_varnames[:self.code.co_argcount])
        sig = inspect.signature(fn)  # follows __wrapped__ through functools.wraps
        return [p.name for p in sig.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def tramp(self, fn: types.FunctionType) -> types.CodeType:
        """The trampoline's code, made once and kept on fn with the copy of the
        original it calls: made once, so every tracing session calls the same
        function and the interpreter's specialised call sites for it stay valid
        from one session to the next; on fn, because the copy holds fn's closure
        (see the class docstring).  The copy's defaults never apply: the
        trampoline has fn's signature, fills them from fn's own (as they are at
        the call) and passes every argument."""
        code = fn.__dict__.get("_pm_tramp")
        if code is None:
            copy = types.FunctionType(self.code, fn.__globals__, fn.__name__, fn.__defaults__,
                                      fn.__closure__)
            copy.__kwdefaults__ = fn.__kwdefaults__
            code = fn.__dict__["_pm_tramp"] = _trampoline(fn, self.fid, copy)
        return code


_ORIG = "_pm: the original"   # the constants a trampoline's code holds its copy of fn
_SINK_NAME = "_pm: the sink"  # and _SINK in (placeholders in the generated source)



class _Sink:
    """Where the trampolines find the running Tracer's recorder: one object, a
    constant of every trampoline, so starting a Tracer sets one attribute rather
    than each traced function's defaults."""

    __slots__ = ("call",)

    def __init__(self) -> None:
        self.call: Callable[..., Any] | None = None


_SINK = _Sink()

# (an attribute of the placeholder, not a subscript: the compiler folds "'str'[0]")
_TRAMP = "        return {sink!r}.call({orig!r}, {fid}, {xfid}, {kw}, {args})"


def _trampoline(fn: types.FunctionType, fid: int, copy: types.FunctionType) -> types.CodeType:
    """Code with fn's own signature that hands the call to the recorder:
    `return rec.call(copy, fid, ~fid, kwargs or None, *args)`, which records the entry
    (the running task, the arguments flattened into it: see _build), calls the
    copy of the original, and records the exit (its return value or exception).
    One extra Python call and one call into the recorder (c_ext._tracebuf.Recorder,
    or its twin PyRecorder).

    The function's index `fid` (and ~fid, which its exit records) are literals
    in the code, and the copy and _SINK (where the running Tracer's recorder is)
    constants of it.  The signature is fn's exactly - no extra parameter - so
    fn's own defaults apply (__defaults__ and __kwdefaults__ are untouched) and
    the interpreter specialises calls of it as it does calls of fn.  It has as
    many free variables as fn's closure, because CPython only lets __code__ be
    replaced by code with the same number; they are referenced on a path that
    never runs.
    """
    co = fn.__code__
    names = co.co_varnames
    npos, nkw = co.co_argcount, co.co_kwonlyargcount
    pos, kwonly = list(names[:npos]), list(names[npos:npos + nkw])
    i = npos + nkw
    varargs = names[i] if co.co_flags & inspect.CO_VARARGS else None
    varkw = names[i + bool(varargs)] if co.co_flags & inspect.CO_VARKEYWORDS else None
    params = list(pos)
    if co.co_posonlyargcount:
        params.insert(co.co_posonlyargcount, "/")
    if varargs or kwonly:
        params.append(f"*{varargs}" if varargs else "*")
    params += kwonly + ([f"**{varkw}"] if varkw else [])
    args = "".join(f"{p}, " for p in pos) + (f"*{varargs}, " if varargs else "")
    kws = [f"{k!r}: {k}" for k in kwonly] + ([f"**{varkw}"] if varkw else [])
    kw = "{" + ", ".join(kws) + "}" if kws else "None"
    cells = [f"_pm_cell{j}" for j in range(len(fn.__closure__ or ()))]
    src = ["def _outer():"] + [f"    {c} = None" for c in cells]
    src.append(f"    def _tramp({', '.join(params)}):")
    if cells:
        src.append(f"        if {_SINK_NAME!r}.call is None: ({', '.join(cells)},)")
    src += [_TRAMP.format(sink=_SINK_NAME, orig=_ORIG, fid=fid, xfid=~fid, kw=kw, args=args),
            "    return _tramp"]
    ns: dict[str, Any] = {}
    exec("\n".join(src), ns)  # noqa: S102 - generated from a code object, no user input
    code = ns["_outer"]().__code__
    swap = {_ORIG: copy, _SINK_NAME: _SINK}
    consts = tuple(swap.get(c, c) if type(c) is str else c for c in code.co_consts)
    return code.replace(co_name=co.co_name, co_qualname=co.co_qualname, co_consts=consts,
                        co_filename=co.co_filename, co_firstlineno=co.co_firstlineno)


def traced(fn: Callable | None = None, *, layer: str | None = None,
           name: str | None = None) -> Any:
    """Mark a function that mirrors a real one as traceable (returns it unchanged)."""

    def mark(f: Callable) -> Callable:
        lay = layer or layer_of_module(f.__module__)
        if lay not in LAYERS:
            raise ValueError(f"traced: unknown layer {lay!r} for {f.__qualname__}")
        if not isinstance(f, types.FunctionType) or f.__code__.co_flags & 0x2A0:
            raise TypeError(f"traced: {f!r} is not a plain function")
        r = _Traced(f, lay, name or f.__name__)
        _REGISTRY[r.fid] = r
        if _active is not None:  # a module loaded (imported) while tracing: as ftrace
            _active._patch_function(r)  # patches a module's call sites at load
        return f

    return mark(fn) if fn is not None else mark


def registered() -> list[tuple[str, str]]:
    """(name, layer) of every traceable function (available_filter_functions)."""
    return [(r.name, r.layer) for r in list(_REGISTRY.values())]


class _Tracepoint:
    """What a tracepoint is: name, fields, layer (the event's format file)."""

    def __init__(self, name: str, fields: tuple[str, ...], layer: str):
        self.name, self.fields, self.layer = name, fields, layer

    def __repr__(self) -> str:
        return f"tracepoint {self.name}({', '.join(self.fields)}) [{self.layer}]"


_TRACEPOINTS: list[Any] = []    # c_ext._tracebuf.TracePoint, or its twin (a function)



def _discard(tp: _Tracepoint, *values: object) -> None:
    """Where a tracepoint hit goes while no tracer runs (callers test `enabled` first)."""


def tracepoint(name: str, fields: str, layer: str = "kernel_model") -> Callable[..., None]:
    """Define a tracepoint (TRACE_EVENT, reduced): a function taking its fields.

        trace_pages_pinned = tracepoint("pages_pinned", "start nr_pages pinned")
        ...
        if trace.enabled:
            trace_pages_pinned(start, nr_pages, nr)

    A hit hands its values to the running Tracer's recorder, which keeps them;
    they are named and formatted only when the Trace is built.  On the C backend
    the tracepoint is a c_ext._tracebuf.TracePoint (a hit costs no Python frame)
    whose `sink` a starting Tracer sets and a stopping one clears; on the Python
    backend it is its twin, a generated function whose closure cell `_pm_a`
    holds the recorder's point() (see _set_sink).
    """
    if layer not in LAYERS:
        raise ValueError(f"tracepoint: unknown layer {layer!r}")
    names = tuple(fields.split())
    meta = _Tracepoint(name, names, layer)
    fn: Any
    if default_backend_name() != "python":
        fn = _tracebuf.TracePoint(meta, f"trace_{name}", len(names))
    else:   # the twin: a generated function whose closure cell holds the sink's point()
        src = (f"def _mk(_pm_a, _pm_p):\n"
               f"    def trace_{name}({', '.join(names)}):\n"
               f"        _pm_a(_pm_p, {''.join(f'{f}, ' for f in names)})\n"
               f"    return trace_{name}\n")
        ns: dict[str, Any] = {}
        exec(src, ns)  # noqa: S102 - field names are identifiers, checked by compile
        fn = ns["_mk"](_discard, meta)
        fn.tp = meta
    _TRACEPOINTS.append(fn)
    if _active is not None:
        _active._patch_tracepoint(fn)
    return fn


def _set_sink(tp: Any, rec: Any) -> None:
    """Point a tracepoint at a recorder (None: nowhere).  A C TracePoint takes it
    as is; the Python twin's cell takes its point() (or _discard)."""
    if isinstance(tp, _tracebuf.TracePoint):
        tp.sink = rec
    else:
        tp.__closure__[tp.__code__.co_freevars.index("_pm_a")].cell_contents = \
            _discard if rec is None else rec.point


class PyRecorder:
    """The Python twin of c_ext._tracebuf.Recorder, and its reference: a Tracer's
    events as tuples in a list (the layouts _build documents).  Each method finds
    the running task as the trampolines need it - kernel_model.current's, else the
    scheduler's - and reads the wall clock when it runs."""

    def __init__(self, current_dict: dict, sched: object,
                 clock: Callable[[], int] | None = None):
        self._cur = current_dict
        self._sched = sched
        self._clock = clock
        self._ev: list[tuple] = []

    def _running(self) -> object:
        return self._cur.get("_current") or self._sched.current  # type: ignore[attr-defined]

    def enter(self, fid: int, kw: dict | None, *args: object) -> object:
        """A traced call's entry: (fid, task, kw, [t,] *args); returns the task."""
        k = self._running()
        t = () if self._clock is None else (self._clock(),)
        self._ev.append((fid, k, kw, *t, *args))
        return k

    def call(self, fn: Callable, fid: int, xfid: int, kw: dict | None, *args: object) -> Any:
        """fn(*args, **kw), its entry and exit (xfid = ~fid) recorded around it (a
        trampoline's whole work)."""
        k = self.enter(fid, kw, *args)
        try:
            r = fn(*args, **kw) if kw is not None else fn(*args)
        except BaseException as e:
            self.exit(xfid, k, e)
            raise
        self.exit(xfid, k, r)
        return r

    def exit(self, xfid: int, task: object, value: object) -> None:
        """Its exit: (~fid, task, return value or exception, [t])."""
        t = () if self._clock is None else (self._clock(),)
        self._ev.append((xfid, task, value, *t))

    def point(self, tp: _Tracepoint, *values: object) -> None:
        """A tracepoint hit: ("P", task, tp, [t,] *values)."""
        k = self._running()
        t = () if self._clock is None else (self._clock(),)
        self._ev.append(("P", k, tp, *t, *values))

    def add(self, *fields: object) -> None:
        """An event exactly as given (the scheduler's switch and clock hooks)."""
        self._ev.append(fields)

    def events(self) -> list[tuple]:
        """Every event recorded, in order."""
        return list(self._ev)

    def __len__(self) -> int:
        return len(self._ev)


_RECORDERS: dict[str, Callable[..., Any]] = {"c": _tracebuf.Recorder, "python": PyRecorder}


class Tracer:
    """Records a function graph of the emulated kernel.  See the module docstring."""

    def __init__(self, *, clock: str = "virtual", layers: Iterable[str] | None = None,
                 recorder: str | None = None):
        """`recorder`: "c" (c_ext._tracebuf) or "python" (PyRecorder, its twin);
        None follows $PEERMEM_BACKEND, as the per-page loops do."""
        if clock not in ("virtual", "wall"):
            raise ValueError("Tracer: clock must be 'virtual' or 'wall'")
        recorder = recorder or ("python" if default_backend_name() == "python" else "c")
        if recorder not in _RECORDERS:
            raise ValueError(f"Tracer: recorder must be 'c' or 'python', not {recorder!r}")
        self.clock = clock
        self.recorder = recorder
        self.layers = None if layers is None else set(layers)
        if self.layers is not None and not self.layers <= set(LAYERS):
            raise ValueError(f"Tracer: unknown layer in {sorted(self.layers)}; "
                             f"layers are {', '.join(LAYERS)}")
        self._rec = _RECORDERS[recorder](vars(_cur), SCHED,
                                         time.perf_counter_ns if clock == "wall" else None)
        # what start() patched: (entry, the function), held until stop() restores them
        self._patched: list[tuple[_Traced, types.FunctionType]] = []
        # every function patched in this session, by fid, with its entry: the Trace
        # is built from the entries and reads the functions' signatures, so they
        # are held until it is
        self._fns: dict[int, tuple[_Traced, types.FunctionType]] = {}
        self._trace: Trace | None = None
        self._stopped = False
        self._t0 = 0

    @property
    def trace(self) -> Trace:
        """The recorded Trace, built on first use after stop()."""
        if not self._stopped:
            raise RuntimeError("Tracer: stop() it before reading the trace")
        if self._trace is None:
            self._trace = _build(self._rec.events(), self.clock, self._t0,
                                 {fid: r for fid, (r, _) in self._fns.items()})
            self._fns = {}
        return self._trace

    # -- start / stop --------------------------------------------------------------
    def start(self) -> Tracer:
        """Patch every registered function (of the chosen layers) and record."""
        global _active, enabled
        if _active is not None:
            raise RuntimeError("Tracer: another tracer is running")
        self._t0 = time.perf_counter_ns()
        try:
            self._patch()
        except BaseException:
            self._unpatch()
            raise
        _active, enabled = self, True
        SCHED.on_switch.append(self._on_switch)
        SCHED.on_clock.append(self._on_clock)
        return self

    def _patch(self) -> None:
        _SINK.call = self._rec.call
        for r in list(_REGISTRY.values()):  # a collected function leaves it as we go
            self._patch_function(r)
        for tp in _TRACEPOINTS:
            self._patch_tracepoint(tp)

    def _patch_function(self, r: _Traced) -> None:
        """Swap one registered function's code for its trampoline."""
        fn = r.fn
        if fn is None or (self.layers is not None and r.layer not in self.layers):
            return
        fn.__code__ = r.tramp(fn)
        self._patched.append((r, fn))
        self._fns[r.fid] = (r, fn)

    def _patch_tracepoint(self, tp: Any) -> None:
        if self.layers is None or tp.tp.layer in self.layers:
            _set_sink(tp, self._rec)

    def stop(self) -> None:
        """Restore the original code; `trace` builds the Trace when first read."""
        global _active, enabled
        if _active is not self:
            raise RuntimeError("Tracer: not running")
        self._unpatch()
        SCHED.on_switch.remove(self._on_switch)
        SCHED.on_clock.remove(self._on_clock)
        _active, enabled = None, False
        self._stopped = True

    def _unpatch(self) -> None:
        _SINK.call = None
        for r, fn in self._patched:
            fn.__code__ = r.code
        self._patched.clear()
        for tp in _TRACEPOINTS:
            _set_sink(tp, None)

    def __enter__(self) -> Tracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- recording -------------------------------------------------------------------
    def _on_switch(self, prev: Task, nxt: Task, reason: str) -> None:
        self._add("S", _cur._current or prev, nxt.saved_ts or nxt, reason)

    def _on_clock(self, jiffies: int) -> None:
        self._add("T", None, jiffies, None)

    def _add(self, *ev: object) -> None:
        """A scheduler hook's event, the wall clock's time last when it runs."""
        if self.clock == "wall":
            ev += (time.perf_counter_ns(),)
        self._rec.add(*ev)


# -- building the Trace -------------------------------------------------------------

class _Builder:
    def __init__(self, clock: str, t0: int):
        self.trace = Trace(clock=clock)
        self.t0 = t0
        self.keys: dict[int, int] = {}        # id(key) -> track
        self.keep: list[object] = []          # keeps keys alive while building
        self.stacks: list[list[tuple[Call, int]]] = []   # open calls and their fids
        self.vclock = 0

    def track(self, key: object) -> int:
        tr = self.keys.get(id(key))
        if tr is None:
            tr = self.keys[id(key)] = len(self.trace.tracks)
            self.keep.append(key)
            self.trace.tracks.append(_task_name(key))
            self.trace.roots.append([])
            self.stacks.append([])
        return tr

    def ts(self, raw: int) -> int:
        if self.trace.clock == "wall":
            return raw - self.t0
        self.vclock += TICK_NS
        return self.vclock


def _build(events: list[tuple], clock: str, t0: int, fns: dict[int, _Traced]) -> Trace:
    """The Trace from the recorded tuples.  Their layouts ([t]: the wall clock's
    perf_counter_ns, only in wall mode):
        entry       (fid, task, kwargs or None, [t,] *args)
        exit        (~fid, task, return value or exception, [t])
        tracepoint  ("P", task, _Tracepoint, [t,] *field values)
        switch      ("S", prev task, next task, reason, [t])
        clock tick  ("T", None, jiffies, None, [t])
    Arguments and field values are flattened into the event (one tuple per
    event, not two), so they start after the fixed fields."""
    b = _Builder(clock, t0)
    tl = b.trace.timeline
    machines = set()
    wall = clock == "wall"
    first = 4 if wall else 3          # where an entry's or a tracepoint's values start
    for ev in events:
        code, key, payload = ev[0], ev[1], ev[2]
        raw = 0
        if wall:
            raw = ev[3] if code == "P" or (type(code) is int and code >= 0) else ev[-1]
        if code == "T":
            b.vclock += payload * JIFFY_NS
            continue
        tr = b.track(key)
        km = getattr(key, "machine", None)
        if km is not None:
            machines.add(km.name)
        stack = b.stacks[tr]
        if code == "S":
            tl.append((SWITCH, Switch(b.ts(raw), tr, b.track(payload), ev[3])))
        elif code == "P":
            tp: _Tracepoint = payload
            parent = stack[-1][0] if stack else None
            p = Point(tp.name, tp.layer, tr, b.ts(raw),
                      dict(zip(tp.fields, ev[first:], strict=True)), len(stack), parent)
            (parent.children if parent else b.trace.roots[tr]).append(p)
            tl.append((POINT, p))
        elif code >= 0:
            r = fns[code]
            parent = stack[-1][0] if stack else None
            c = Call(r.name, r.layer, tr, b.ts(raw), args=_args_text(r, ev[first:], payload),
                     depth=len(stack), parent=parent)
            (parent.children if parent else b.trace.roots[tr]).append(c)
            stack.append((c, code))
            tl.append((ENTER, c))
        else:
            fid = ~code
            while stack:
                c, cfid = stack.pop()
                if cfid == fid:
                    c.end = b.ts(raw)
                    c.ret = _ret_text(payload)
                    tl.append((EXIT, c))
                    break
    b.trace.machine = ", ".join(sorted(machines))
    if len(machines) > 1:
        b.trace.tracks = [_task_name(k, True) for k in b.keep]
    return b.trace


def _task_name(key: object, with_machine: bool = False) -> str:
    if isinstance(key, Task):
        if key.ts is not None:
            key = key.ts
        else:  # a device's or the emulator's own task: its machine, if it has one
            m = key.machine
            return f"{m.name}:{key.label}" if with_machine and m is not None else key.label
    name = f"{key.comm}-{key.pid}"
    return f"{key.machine.name}:{name}" if with_machine else name


_HEX_NAMES = ("flags", "prot", "mask", "access", "mode", "key", "qpn", "opcode")


def summarise(v: object, name: str = "") -> str:
    """One argument or return value as trace text (funcgraph-args style).

    Integers print in hex when large (addresses, sizes) or when the
    parameter is a bit field (`*flags`, `prot`, `*mask`, ...); objects print
    their `trace_name` if they have one (a device's name, a file's path),
    else their type - never a repr that would change as the run goes on.
    """
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        if v >= 4096 or v <= -4096 or (v > 0 and name.endswith(_HEX_NAMES)):
            return hex(v)
        return str(v)
    if isinstance(v, str):
        return '"' + (v if len(v) <= 40 else v[:37] + "...") + '"'
    if isinstance(v, bytes | bytearray | memoryview):
        return f"bytes[{len(v)}]"
    freed_name = type(v).__dict__.get("kasan_trace_name")
    if freed_name is not None:  # kfree()d since the call: read nothing of it; slab's poison
        return freed_name(v) or type(v).__mro__[1].__name__  # class says how it is named
    name = getattr(v, "trace_name", None)
    if isinstance(name, str):
        return name
    return type(v).__name__


def _args_text(r: _Traced, args: tuple, kwargs: dict | None) -> str:
    parts = []
    for i, v in enumerate(args):
        if i == 0 and r.params and r.params[0] == "self":
            continue   # a method: the object is the task's device or module, not an argument
        if i < len(r.params):
            parts.append(f"{r.params[i]}={summarise(v, r.params[i])}")
        else:
            parts.append(summarise(v))
    parts += [f"{k}={summarise(v, k)}" for k, v in (kwargs or {}).items()]
    text = ", ".join(parts)
    return text if len(text) <= MAX_ARGS_TEXT else text[:MAX_ARGS_TEXT - 3] + "..."


def _ret_text(v: object) -> str | None:
    if isinstance(v, KernelError):
        return f"-{v.name}"
    if isinstance(v, BaseException):
        return f"!{type(v).__name__}"
    if v is None:
        return None
    return summarise(v)

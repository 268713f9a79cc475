"""Mirrors include/linux/slab.h: kernel-object lifetimes, checked like KASAN/kmemleak.

A driver object (an mr, a umem, a peer context) is "allocated" with
kmalloc_obj(obj) and freed with kfree(obj), the way the kernel's struct is
kzalloc'ed and kfree'd.  The model records every live object with where and
by whom it was allocated, and checks three bugs:
  * use after free: kfree() poisons the object - it becomes an instance of
    a "freed" subclass whose every attribute read, write or delete raises
    UseAfterFree naming the object, who freed it and where, and the access
    (KASAN's slab-use-after-free report);
  * double free: kfree() of a poisoned object raises DoubleFree naming both
    free sites;
  * leaks: an object still allocated at the machine's leak check is listed
    with its allocation site (kmemleak).
# EMU: Python keeps the memory alive, so nothing is really reused; the
# poisoning makes every later access fail at once instead of reading
# whatever the slab put there.  repr() of a freed object still works (it
# is the emulator's, used by reports) and says that it was freed.

The records live in `machine.slab` (made on first use, with its leak check).
"""

from __future__ import annotations

import contextlib
import sys
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from c_ext import _track, default_backend_name
from kernel_model.current import live_machines
from kernel_model.errno import KernelBug
from kernel_model.lockdep import call_site, machine_now
from kernel_model.sched import SCHED, Named, touch, touch_key
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

T = TypeVar("T")

_FREED = "_slab_freed"        # instance __dict__ key: (type name, repr, task, site)
_poisoned: dict[type, type] = {}   # class -> its freed twin
_poison_classes: set[type] = set()


class UseAfterFree(KernelBug):
    """An access to a kfree'd object (KASAN: slab-use-after-free)."""


class DoubleFree(KernelBug):
    """kfree() of an object already freed (KASAN: double-free)."""


class kmem_objects:
    """The live objects of one machine: id -> (object, alloc site, allocating task)."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[object, str, str]] = {}

    def __repr__(self) -> str:
        return f"slab: {len(self.live)} live objects"


def _slab(m: Machine) -> kmem_objects:
    s = getattr(m, "slab", None)
    if s is None:
        s = m.slab = kmem_objects()
        m.leak_checks.append(_leaks)
    return s


def _leaks(m: Machine) -> list[str]:
    return [f"object {type(o).__name__} {_safe_repr(o)} allocated at {where} by {who} "
            "never freed" for o, where, who in m.slab.live.values()]


def _safe_repr(o: object) -> str:
    try:
        return repr(o)
    except Exception as e:  # noqa: BLE001 - a report must not fail on a bad __repr__
        return f"<{type(o).__name__} at {id(o):#x}: repr failed: {e!r}>"


def _info(o: object) -> tuple[str, str, str, str] | None:
    """The poison record of a freed object, or None if it is not freed."""
    if type(o) not in _poison_classes:
        return None
    return object.__getattribute__(o, "__dict__")[_FREED]


def _uaf(o: object, access: str) -> UseAfterFree:
    tname, r, who, where = _info(o)
    return UseAfterFree(f"BUG: KASAN: slab-use-after-free: {access} by {SCHED.current.label} "
                        f"at {call_site()} of {tname} object {r}, freed by {who} at {where}")


def _poison_get(self: object, name: str) -> Any:
    if name == "__class__":  # isinstance() asks; it is not a use of the object
        return type(self)
    _touched(self, name, False)
    raise _uaf(self, f"read of .{name}")


def _poison_set(self: object, name: str, value: object) -> None:
    _touched(self, name, True)
    raise _uaf(self, f"write of .{name}")


def _poison_del(self: object, name: str) -> None:
    _touched(self, name, True)
    raise _uaf(self, f"delete of .{name}")


def _touched(obj: object, name: str, write: bool) -> None:
    """A use of a freed struct is a use all the same: partial-order reduction must see
    it race with the kfree (the schedule where it came first is another outcome)."""
    st = SCHED.fp_step
    if st is not None:
        st.reads.add(id(obj))
        (st.writes if write else st.reads).add((id(obj), name))


def _poison_repr(self: object) -> str:
    tname, r, _who, _where = _info(self)
    return f"<freed {r}>"


def _poison_class(cls: type) -> type:
    """The "freed" twin of `cls` (made once per class): same layout, every access fails."""
    p = _poisoned.get(cls)
    if p is None:
        p = type(f"freed_{cls.__name__}", (cls,), {
            "__slots__": (), "__getattribute__": _poison_get, "__setattr__": _poison_set,
            "__delattr__": _poison_del, "__repr__": _poison_repr, "kasan_freed": True,
            # how a trace (rendered after the run, trace.py) names a freed object:
            "kasan_trace_name": staticmethod(kmem_freed_trace_name),
            "__module__": cls.__module__})
        _poisoned[cls] = p
        _poison_classes.add(p)
    return p


#: what reading an attribute hands out that the reader may then change in place: such a
#: read is a read of the field, and the recorder watches the container (Scheduler.
#: fp_watch) so the step that changes it writes the field; a bytearray (a buffer, maybe
#: large) is not watched - reading it counts as a write
#: (by exact type: isinstance would ask a tracked object for its __class__ again)
_MUTABLE = frozenset((list, dict, set, deque, bytearray, defaultdict, OrderedDict))
_UNSET = object()                  # a field a step set for the first time
_tracked_classes: set[type] = set()
#: which recorder new twins get: "c" (c_ext._track) or "python" (_py_tracked), by
#: $PEERMEM_BACKEND as the per-page loops are; set_track_backend changes it
TRACK_BACKEND = "python" if default_backend_name() == "python" else "c"
_twins: dict[str, dict[type, type]] = {"c": {}, "python": {}}
_tracked = _twins[TRACK_BACKEND]    # class -> its footprint-recording twin
#: each C twin's (adds, own, hasdict) for c_ext._track, which reads it by type
_track_registry: dict[type, tuple[frozenset | None, frozenset | None, bool]] = {}
_track.configure(vars(SCHED), _track_registry, _MUTABLE, _UNSET)


def _tracked_class(cls: type) -> type:
    """The twin of `cls` whose attribute reads and writes go into the footprint of the
    running step (Scheduler.fp_step), field by field, as (id, field) - a field
    conflicts with the same field, and with kfree of the struct (a write of the id,
    which the race analysis extends to every field it saw): made once per class,
    given to objects made while partial-order reduction records, so it costs nothing
    otherwise.

    The recorder is C (c_ext._track: the twin's attribute slots) for a class whose
    attribute access is object's own, on the C backend ($PEERMEM_BACKEND); else the
    Python twin below (_py_tracked), which is also the C one's reference."""
    t = _tracked.get(cls)
    if t is None:
        #: containers whose changes the class reports itself (touch_key, finer than
        #: the field): reading one is a plain read, never watched
        own = frozenset(getattr(cls, "POR_REPORTED", ()))
        #: counters whose reads and writes are adds (POR_ADDS): changes that commute,
        #: whose values no decision depends on (a command token)
        adds = frozenset(getattr(cls, "POR_ADDS", ()))
        hasdict = cls.__dictoffset__ != 0
        ns = {"__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        if TRACK_BACKEND == "c" and _plain_access(cls):
            t = type(cls.__name__, (cls, _track.TrackedBase), ns)
            _track_registry[t] = (adds or None, own or None, hasdict)
        else:
            get, put = _py_tracked(cls, own, adds, hasdict)
            t = type(cls.__name__, (cls,), {**ns, "__getattribute__": get, "__setattr__": put})
        _tracked[cls] = t
        _tracked_classes.add(t)
    return t


def set_track_backend(name: str) -> str:
    """Emulator-level: which recorder the twins made from now on use ("c" or "python");
    returns the one before.  Each backend keeps its own twins, so objects made after
    the change get the other's - for comparing the two (tests/kernel_model)."""
    global TRACK_BACKEND, _tracked
    if name not in _twins:
        raise ValueError(f"set_track_backend: {name!r} is not 'c' or 'python'")
    old, TRACK_BACKEND, _tracked = TRACK_BACKEND, name, _twins[name]
    return old


@contextlib.contextmanager
def track_backend(name: str) -> Iterator[None]:
    """Emulator-level: set_track_backend(name) for the block, the one before after it."""
    old = set_track_backend(name)
    try:
        yield
    finally:
        set_track_backend(old)


def _plain_access(cls: type) -> bool:
    """Is attribute access on `cls` object's own (no class on its MRO but object defines
    __getattribute__, __getattr__, __setattr__ or __delattr__)?  Then the C recorder's
    generic get and set are what the class would do."""
    return not any(n in vars(c) for c in cls.__mro__[:-1]
                   for n in ("__getattribute__", "__getattr__", "__setattr__", "__delattr__"))


def _py_tracked(cls: type, own: frozenset, adds: frozenset, hasdict: bool
                ) -> tuple[Callable[[object, str], Any], Callable[[object, str, object], None]]:
    """The Python recorder: the twin's __getattribute__ and __setattr__ (see
    _tracked_class), around the class's own."""
    get, put = cls.__getattribute__, cls.__setattr__
    dict_of = object.__getattribute__

    def tracked_get(self: object, name: str) -> Any:
        try:
            v = get(self, name)
        except AttributeError:      # a field not set yet: a read all the same
            st = SCHED.fp_step
            if st is not None:
                st.reads.add((id(self), name))
            raise
        st = SCHED.fp_step
        if st is not None:
            if name in adds:
                st.adds.add((id(self), name))
            elif type(v) in _MUTABLE and name not in own:
                SCHED.fp_watch(v, (id(self), name))    # type: ignore[misc]
            else:
                st.reads.add((id(self), name))
        return v

    def tracked_set(self: object, name: str, value: object) -> None:
        st = SCHED.fp_step
        if st is not None:
            key = (id(self), name)
            if name in adds:
                st.adds.add(key)
                put(self, name, value)
                return
            if key not in st.writes:    # the step's first write: keep the value
                if hasdict:             # it had, for Recording's silent writes
                    # (by the instance dict: a property is never silent, and a
                    # field being made raises nothing)
                    d = dict_of(self, "__dict__")
                    st.before[key] = (dict.get, (d, name, _UNSET), d.get(name, _UNSET))
                else:
                    try:
                        was = get(self, name)
                    except AttributeError:
                        was = _UNSET
                    st.before[key] = (get, (self, name), was)
            st.writes.add(key)
        put(self, name, value)

    return tracked_get, tracked_set


#: the packages whose classes are the kernel's structs (and a client's, a device's):
#: while partial-order reduction records, their new objects are tracked twins too
STRUCT_PACKAGES = ("drivers.", "peermem_clients.", "kernel_model.", "examples.")
#: kernel_model's own machinery, whose accesses the primitives report themselves
_NOT_STRUCTS = ("kernel_model.emu.", "kernel_model.sched", "kernel_model.trace",
                "kernel_model.lockdep", "kernel_model.locking", "kernel_model.rwsem",
                "kernel_model.srcu", "kernel_model.refcount", "kernel_model.slab",
                "kernel_model.xarray", "kernel_model.current")
_struct_classes: list[type] = []
_scanned = [0]                # len(sys.modules) when _struct_classes was made
_installed = [-1]             # the _scanned whose classes track_structs has hooked


def _is_struct(cls: type, modname: str) -> bool:
    if type(cls) is not type or cls.__module__ != modname:
        return False
    if issubclass(cls, BaseException) or cls.__new__ not in (object.__new__, _STRUCT_NEW,
                                                             Named.__new__):
        return False
    if any("__init_subclass__" in vars(c) for c in cls.__mro__[:-1]):
        return False
    if vars(cls).get("POR_SELF_REPORTED"):
        return False                        # it reports its own touches (IfcStruct)
    return cls not in _tracked_classes and cls not in _poison_classes


def _structs() -> list[type]:
    """Every struct class of the loaded kernel modules (rescanned when modules load):
    those of STRUCT_PACKAGES, and any module that is a loadable kernel module (a user's
    client has module_init)."""
    if _scanned[0] != len(sys.modules):
        _scanned[0] = len(sys.modules)
        out = []
        for name, mod in list(sys.modules.items()):
            if mod is None or name.startswith(_NOT_STRUCTS):
                continue
            if not (name.startswith(STRUCT_PACKAGES) or hasattr(mod, "module_init")):
                continue
            for v in list(vars(mod).values()):
                if isinstance(v, type) and _is_struct(v, name):
                    out.append(v)
        _struct_classes[:] = out
    return _struct_classes


def _tracked_new(cls: type, *args: object, **kwargs: object) -> object:
    """A struct class's __new__ once partial-order reduction has recorded: off a
    recording a plain object, while one records an object of the class's twin
    (_tracked_class), named to the recorder when made.  The class is given its C
    twin, _track.tracked_new, which calls this only while a recording runs."""
    if SCHED.fp is None:
        return object.__new__(cls)
    obj = object.__new__(_tracked.get(cls) or _tracked_class(cls))
    SCHED.fp_keep(obj, True)                # type: ignore[misc]
    return obj


_track.configure_new(_tracked_new)
#: what track_structs gives every struct class as its __new__
_STRUCT_NEW = _track.tracked_new


def track_structs() -> None:
    """Emulator-level: make every struct class (see _structs) hand out tracked twins
    (_tracked_class) whenever partial-order reduction records, so it sees each field a
    step reads or writes - of a plain struct too, not only of a kmalloc_obj one.
    Called before each recorded run (it picks up modules loaded since).  Once given,
    the __new__ stays: CPython cannot take a Python-level __new__ back off a class
    (the slot keeps calling through it), and off recording it costs one C call per
    object made (_STRUCT_NEW: object.__new__ then, _tracked_new while recording)."""
    classes = _structs()
    if _installed[0] == _scanned[0]:
        return                  # every class of this scan has it (a scan per module load)
    for cls in classes:
        if vars(cls).get("__new__") is not _STRUCT_NEW:
            cls.__new__ = _STRUCT_NEW             # type: ignore[method-assign]
    _installed[0] = _scanned[0]


def counter_add(obj: object, name: str, delta: int) -> None:
    """Emulator-level: obj.name += delta, as a counter nobody reads back in the same
    breath (mm->total_vm, rss): for partial-order reduction an add (touch_key), which
    commutes with other adds and conflicts with a read of the field."""
    object.__setattr__(obj, name, object.__getattribute__(obj, name) + delta)
    touch_key((id(obj), name), "add")


def kmalloc_obj(obj: T) -> T:
    """Record `obj` as allocated on the current machine (kzalloc of its struct)."""
    m = machine_now()
    if m is None:
        raise KernelBug("kmalloc_obj: no current machine (run in m.kernel() or a task)")
    freed = _info(obj)
    if freed is not None:
        raise KernelBug(f"kmalloc_obj: {freed[0]} object {freed[1]} was freed by {freed[2]} "
                        f"at {freed[3]}: allocate a new object")
    live = _slab(m).live
    if id(obj) in live:
        raise KernelBug(f"kmalloc_obj: {type(obj).__name__} object {_safe_repr(obj)} is "
                        f"already allocated, at {live[id(obj)][1]}")
    live[id(obj)] = (obj, call_site(), SCHED.current.label)
    if SCHED.fp is not None:
        if type(obj) not in _tracked_classes:
            object.__setattr__(obj, "__class__", _tracked_class(type(obj)))
        SCHED.fp_keep(obj, True)            # type: ignore[misc]
    return obj


def _owner(obj: object) -> kmem_objects | None:
    """The records holding `obj`: the current machine's, else any live machine's."""
    m = machine_now()
    s = getattr(m, "slab", None)
    if s is not None and s.live.get(id(obj), (None,))[0] is obj:
        return s
    for mach in list(live_machines):        # freed on another machine than it was made
        s = getattr(mach, "slab", None)
        if s is not None and s.live.get(id(obj), (None,))[0] is obj:
            return s
    return None


@traced
def kfree(obj: object) -> None:
    """Mirrors kfree(): forget and poison `obj`; None is ignored as in the kernel."""
    if obj is None:
        return
    where, who = call_site(), SCHED.current.label
    freed = _info(obj)
    if freed is not None:
        tname, r, who1, where1 = freed
        raise DoubleFree(f"BUG: KASAN: double-free: kfree of {tname} object {r} by {who} at "
                         f"{where}; already freed by {who1} at {where1}")
    s = _owner(obj)
    if s is None:
        raise KernelBug(f"BUG: KASAN: invalid-free: kfree of {type(obj).__name__} object "
                        f"{_safe_repr(obj)} by {who} at {where}, which kmalloc_obj never "
                        "allocated")
    del s.live[id(obj)]
    record = (type(obj).__name__, _safe_repr(obj), who, where)
    name = None
    if getattr(type(obj), "TRACE_NAME_OUTLIVES_FREE", False):
        name = getattr(obj, "trace_name", None)
    touch(obj)
    object.__setattr__(obj, _FREED, record)
    if isinstance(name, str):
        object.__setattr__(obj, _FREED + "_trace_name", name)
    cls = type(obj)
    if cls in _tracked_classes:
        cls = cls.__mro__[1]
    object.__setattr__(obj, "__class__", _poison_class(cls))


def kmem_freed_trace_name(obj: object) -> str | None:
    """Emulator helper: the trace name a freed object had when it was freed, for a class
    that asks for it (TRACE_NAME_OUTLIVES_FREE: a stable name, such as a client's,
    that traces - rendered after the run - should keep showing)."""
    if _info(obj) is None:
        return None
    return object.__getattribute__(obj, "__dict__").get(_FREED + "_trace_name")


def kmem_is_freed(obj: object) -> bool:
    """Emulator helper: has `obj` been kfree'd?"""
    return _info(obj) is not None

"""The field recorder of partial-order reduction, in C (c_ext._track) and in Python
(slab._py_tracked): the C one must record exactly what its Python twin records.

A tracked twin's attribute reads and writes go into the running step's footprint
(reads, writes, adds, the value before a step's first write, and a watch of each
mutable container read).  These tests drive both twins through the same accesses and
compare what they recorded, then compare whole searches made with each."""

from __future__ import annotations

import attrs
import pytest

from kernel_model import slab
from kernel_model.emu.explore import Recording, explore_dpor, run_once
from kernel_model.sched import SCHED
from kernel_model.slab import UseAfterFree
from scenarios.races import RACES


class Step:
    """What the recorder writes into (the fields of explore.Step it uses)."""

    def __init__(self) -> None:
        self.reads: set = set()
        self.writes: set = set()
        self.adds: set = set()
        self.before: dict = {}


class WithDict:
    POR_ADDS = ("token",)
    POR_REPORTED = ("table",)

    def __init__(self) -> None:
        self.n = 1
        self.items = [1, 2]
        self.table = {"a": 1}
        self.token = 0


@attrs.define(slots=True)
class WithSlots:
    n: int = 1
    items: list = attrs.Factory(list)


class OwnSetattr:
    """A class with its own __setattr__: the C recorder cannot stand in for it."""

    def __init__(self) -> None:
        self.n = 1

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value * 2 if name == "n" else value)


@pytest.fixture
def recording():
    """SCHED.fp_step and fp_watch as a recording run sets them; each watch call logged."""
    watched: list = []
    st = Step()
    SCHED.fp_step = st
    SCHED.fp_watch = lambda box, key: watched.append((type(box).__name__, key[1]))
    try:
        yield st, watched
    finally:
        SCHED.fp_step = SCHED.fp_watch = None


def _twin(cls: type, backend: str) -> type:
    with slab.track_backend(backend):
        return slab._tracked_class(cls)


def _make(cls: type, backend: str) -> object:
    """An object of cls's twin, its fields set before the step records."""
    st, SCHED.fp_step = SCHED.fp_step, None
    try:
        obj = object.__new__(_twin(cls, backend))
        cls.__init__(obj)
    finally:
        SCHED.fp_step = st
    return obj


def _script(obj: object) -> list:
    """The same accesses on either twin: what each returned or raised."""
    out: list = [obj.n, obj.items]
    obj.n = 5
    obj.n = 6                               # a second write: no second `before`
    out.append(obj.n)
    try:
        obj.missing                         # noqa: B018 - a read that raises
    except AttributeError as e:
        out.append(str(e))
    try:
        obj.fresh = 3                       # a field made in the step (a slots class
    except AttributeError as e:             # has no room for it: the write still counts)
        out.append(str(e))
    if hasattr(type(obj), "POR_ADDS"):
        obj.token = obj.token + 1
        out.append(obj.table)
    return out


def _recorded(st: Step, obj: object) -> tuple:
    """The footprint in names that do not depend on the object's id, and the `before`
    entries as (what reading the field back gives now, the value kept)."""
    def name(k: object) -> object:
        return k[1] if type(k) is tuple and k[0] == id(obj) else k
    def now(read: object, args: tuple) -> object:
        try:
            return read(*args)
        except AttributeError:              # (_silent's "gone": a write)
            return "gone"
    before = {name(k): (now(r, a), was) for k, (r, a, was) in st.before.items()}
    return ({name(k) for k in st.reads}, {name(k) for k in st.writes},
            {name(k) for k in st.adds}, before)


@pytest.mark.parametrize("cls", [WithDict, WithSlots])
def test_the_c_recorder_records_what_the_python_one_does(cls, recording):
    st, watched = recording
    got = {}
    for backend in ("python", "c"):
        st.__init__()
        watched.clear()
        obj = _make(cls, backend)
        result = _script(obj)
        got[backend] = (result, _recorded(st, obj), list(watched))
    assert got["c"] == got["python"]
    result, (reads, writes, adds, before), watched = got["c"]
    assert reads >= {"n", "missing"} and writes >= {"n", "fresh"}
    assert before["n"] == (6, 1)                  # the value before the step's first write
    assert before["fresh"][1] is slab._UNSET      # a field the step made
    assert ("list", "items") in watched           # a container read is watched
    if cls is WithDict:
        assert adds == {"token"} and "token" not in writes
        assert ("dict", "table") not in watched and "table" in reads   # POR_REPORTED


def test_the_c_twin_is_c_and_a_class_with_its_own_setattr_keeps_the_python_one():
    from c_ext import _track
    assert issubclass(_twin(WithDict, "c"), _track.TrackedBase)
    assert not issubclass(_twin(WithDict, "python"), _track.TrackedBase)
    own = _twin(OwnSetattr, "c")
    assert not issubclass(own, _track.TrackedBase)
    obj = object.__new__(own)
    OwnSetattr.__init__(obj)
    assert obj.n == 2                             # its __setattr__ still runs


def test_off_recording_a_c_twin_is_a_plain_object():
    obj = _make(WithDict, "c")
    obj.n = 7
    assert obj.n == 7 and isinstance(obj, WithDict)
    assert type(obj).__mro__[1] is WithDict
    with pytest.raises(AttributeError):
        obj.missing                               # noqa: B018
    with pytest.raises(TypeError):
        setattr(obj, 1, 2)                        # as object's: a name must be a str
    del obj.n
    assert not hasattr(obj, "n")


def test_a_c_twin_takes_object_setattr_and_kfree_poisons_it(recording):
    """The emulator writes past the recorder with object.__setattr__ (counter_add,
    kfree): CPython refuses that on a type whose setattr slot is C code of its own,
    which is why the C recorder's write is a method."""
    from kernel_model.emu.machine import Machine
    st, _ = recording
    obj = _make(WithDict, "c")
    object.__setattr__(obj, "n", 9)
    assert obj.n == 9 and (id(obj), "n") not in st.writes
    SCHED.fp_step = None
    m = Machine(ram_size=16 << 20, name="toy")
    with m.kernel():
        slab.kmalloc_obj(obj)
        slab.kfree(obj)
    with pytest.raises(UseAfterFree):
        obj.n                                     # noqa: B018
    m.check_leaks()


def test_a_subclass_of_a_c_twin_records_as_its_twin(recording):
    st, _ = recording
    sub = type("Sub", (_twin(WithDict, "c"),), {"__slots__": ()})
    obj = object.__new__(sub)
    WithDict.__init__(obj)
    assert obj.token == 0
    assert (id(obj), "token") in st.adds and (id(obj), "n") in st.writes


def test_a_type_made_on_the_c_base_by_hand_is_refused_while_recording(recording):
    from c_ext import _track
    stray = type("Stray", (_track.TrackedBase,), {})
    obj = stray()
    with pytest.raises(TypeError, match="not made from a registered twin"):
        obj.x = 1
    object.__setattr__(obj, "x", 1)
    with pytest.raises(TypeError, match="not made from a registered twin"):
        obj.x                                     # noqa: B018


@pytest.mark.parametrize("name,legacy", [("dereg-vs-invalidate", True),
                                         ("invalidate-vs-teardown", False)])
def test_a_search_is_the_same_with_either_recorder(name, legacy):
    """Same schedules, same verdicts, in the same order: the recorders agree on every
    footprint the search branched on."""
    race = RACES[name]
    got = {}
    for backend in ("python", "c"):
        with slab.track_backend(backend):
            runs = list(explore_dpor(lambda: race.run(legacy), bound=1, max_schedules=25))
        got[backend] = [(r.schedule, r.failure and (r.failure.check, r.failure.detail))
                        for r in runs]
    assert got["c"] == got["python"]
    assert any(f for _, f in got["c"]) is legacy


def test_one_run_records_the_same_footprints_with_either_recorder():
    race = RACES["dma-vs-invalidate"]
    sizes = {}
    for backend in ("python", "c"):
        with slab.track_backend(backend):
            rec = Recording([], footprints=True)
            run = run_once(lambda: race.run(False), rec)
        assert run.failure is None
        sizes[backend] = [(s.tid, s.point, len(s.reads), len(s.writes), len(s.adds))
                          for s in rec.steps]
    assert sizes["c"] == sizes["python"]
    assert sum(r for *_, r, _w, _a in sizes["c"]) > 1000


def test_set_track_backend_refuses_an_unknown_name_and_the_block_gives_it_back():
    before = slab.TRACK_BACKEND
    with pytest.raises(ValueError, match="not 'c' or 'python'"):
        slab.set_track_backend("rust")
    with pytest.raises(RuntimeError), slab.track_backend("python"):
        assert slab.TRACK_BACKEND == "python"
        raise RuntimeError("the block fails")
    assert slab.TRACK_BACKEND == before


def test_a_field_read_again_is_the_same_key_and_a_run_forgets_them(recording):
    """The C recorder makes each (id, field) key once while a run records and hands the
    same tuple out again (a field read a hundred times is not a hundred tuples made,
    hashed and compared): equal to (id(obj), field) always - also when another object
    now lives at a freed one's address - and forgotten at the run's end."""
    from c_ext import _track
    from kernel_model.sched import KeyedDict
    st, _watched = recording
    _track.clear_keys()
    obj = _make(WithSlots, "c")
    obj.n                                       # noqa: B018 - the reads under test
    first = next(k for k in st.reads if k == (id(obj), "n"))
    st.reads.clear()
    obj.n                                       # noqa: B018
    (again,) = [k for k in st.reads if k == (id(obj), "n")]
    assert again is first and _track.cached_keys() >= 1
    table = KeyedDict({7: "a"})
    table[7]                                    # noqa: B018
    table.get(7)
    assert [k for k in st.reads if k == (id(table), 7)] == [(id(table), 7)]
    addr = id(obj)
    del obj, first, again
    st.reads.clear()
    for _ in range(1000):                       # another object at the same address
        other = _make(WithSlots, "c")
        if id(other) == addr:
            break
    other.n                                     # noqa: B018
    assert (id(other), "n") in st.reads
    _track.clear_keys()
    assert _track.cached_keys() == 0


def test_a_recorded_run_leaves_no_keys_kept():
    """Recording.remove forgets the run's keys: what a search keeps does not grow with
    the runs it made."""
    from c_ext import _track
    run = run_once(lambda: RACES["free-callback-vs-put-pages"].run(False),
                   Recording([], footprints=True))
    assert run.points and _track.cached_keys() == 0


class SlotStep:
    """A step keeping its sets in slots, as explore.Step (attrs, slots) does."""

    __slots__ = ("reads", "writes", "adds", "before")

    def __init__(self) -> None:
        self.reads, self.writes, self.adds, self.before = set(), set(), set(), {}


def test_the_c_recorder_finds_the_steps_sets_wherever_it_keeps_them(recording):
    """The C recorder reads a slots step's sets straight from their slots (once it has
    looked up where they are): a set put in their place is the one written, a subclass
    or a changed class whose `reads` is a property is asked through it, as getattr
    would - the same records as the Python twin in every case."""
    from kernel_model.emu.explore import Step as RealStep
    _st, _watched = recording
    obj = _make(WithSlots, "c")
    for st in (RealStep(0, None, set(), set()), SlotStep()):
        SCHED.fp_step = st
        obj.n                                   # noqa: B018 - a read
        assert (id(obj), "n") in st.reads
        st.reads = fresh = set()                # another set in its place
        obj.n                                   # noqa: B018
        obj.items = []
        assert fresh == {(id(obj), "n")} and (id(obj), "items") in st.writes
    elsewhere: set = set()

    class PropStep(SlotStep):
        __slots__ = ()
        reads = property(lambda self: elsewhere)

    st = PropStep.__new__(PropStep)
    SlotStep.reads.__set__(st, set())
    SCHED.fp_step = st
    obj.n                                       # noqa: B018
    assert elsewhere == {(id(obj), "n")} and not SlotStep.reads.__get__(st)
    SCHED.fp_step = st = SlotStep()
    obj.n                                       # noqa: B018 - the offsets of SlotStep
    member = SlotStep.reads
    SlotStep.reads = property(lambda self: elsewhere)   # the class changed since
    try:
        elsewhere.clear()
        obj.n                                   # noqa: B018
        with pytest.raises(AttributeError):
            obj.fresh                           # noqa: B018 - once the class is looked up anew
        assert elsewhere == {(id(obj), "n"), (id(obj), "fresh")}
    finally:
        SlotStep.reads = member
    elsewhere.clear()
    obj.n                                       # noqa: B018 - and back
    obj.n = 4
    assert not elsewhere and member.__get__(st) == {(id(obj), "n")}
    assert (id(obj), "n") in st.writes


def test_an_int_a_str_none_or_a_bool_read_is_never_watched_unless_configured(recording):
    """A field holding an int, a str, None or a bool is a plain read (no watch), as
    the twin's `type(v) in _MUTABLE` says - unless the recorder was configured to
    watch that type, when the short way is off and the read is watched."""
    from c_ext import _track
    st, watched = recording
    obj = _make(WithDict, "c")
    for v in (7, "s", None, True, [1]):
        obj.n = v
        obj.n                                   # noqa: B018
    assert watched == [("list", "n")] and (id(obj), "n") in st.reads
    watched.clear()
    _track.configure(vars(SCHED), slab._track_registry, slab._MUTABLE | {int}, slab._UNSET)
    try:
        obj.n = 7
        obj.n                                   # noqa: B018
    finally:
        _track.configure(vars(SCHED), slab._track_registry, slab._MUTABLE, slab._UNSET)
    assert watched == [("int", "n")]
    watched.clear()
    obj.n                                       # noqa: B018 - configured back
    assert watched == []


def test_a_struct_class_s_new_is_object_new_off_a_recording_and_the_twin_s_on_one():
    """track_structs gives every struct class _track.tracked_new as its __new__: off a
    recording it makes what object.__new__(cls) makes (the arguments go to __init__,
    an abstract class is refused the same way), while one records it is
    slab._tracked_new - an object of the class's twin, named to the recorder."""
    import abc

    from c_ext import _track

    class K:
        def __init__(self, a: int, b: int = 2) -> None:
            self.a, self.b = a, b

    K.__new__ = _track.tracked_new               # type: ignore[method-assign]
    k = K(1, b=3)
    assert type(k) is K and (k.a, k.b) == (1, 3)

    class Abstract(abc.ABC):
        @abc.abstractmethod
        def f(self) -> None: ...

    with pytest.raises(TypeError) as plain:
        object.__new__(Abstract)
    with pytest.raises(TypeError) as ours:
        _track.tracked_new(Abstract)
    assert str(ours.value) == str(plain.value)
    for bad in ((), (5,)):
        with pytest.raises(TypeError, match="tracked_new"):
            _track.tracked_new(*bad)
    kept: list = []
    SCHED.fp, SCHED.fp_keep = (lambda obj, write: None), (lambda obj, made: kept.append(obj))
    try:
        t = K(4)
    finally:
        SCHED.fp = SCHED.fp_keep = None
    assert type(t) is slab._tracked[K] and type(t).__mro__[1] is K and (t.a, t.b) == (4, 2)
    assert kept == [t]
    assert slab._STRUCT_NEW is _track.tracked_new


def test_the_c_new_refuses_what_object_new_refuses():
    """A class that inherits the struct __new__ but whose layout is a C type's (a
    struct mixed with bytes) is refused as object.__new__ refuses it - never made
    with a layout nothing initialised."""
    from c_ext import _track

    class S:
        pass

    S.__new__ = _track.tracked_new                # type: ignore[method-assign]

    class Mixed(S, bytes):
        pass

    with pytest.raises(TypeError) as plain:
        object.__new__(Mixed)
    with pytest.raises(TypeError) as ours:
        Mixed()
    assert str(ours.value) == str(plain.value) and "not safe" in str(ours.value)


def test_the_c_new_is_refused_a_fallback_it_cannot_call_and_says_when_it_has_none():
    """configure_new takes only a callable (TypeError); a class given tracked_new in a
    process where slab never configured the recorder is told so (RuntimeError), not
    made or crashed."""
    import subprocess
    import sys

    from c_ext import _track
    with pytest.raises(TypeError, match="configure_new"):
        _track.configure_new(5)
    code = ("from c_ext import _track\n"
            "class K: pass\n"
            "K.__new__ = _track.tracked_new\n"
            "try:\n    K()\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "_track: tracked_new before configure_new"

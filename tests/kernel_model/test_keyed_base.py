"""KeyedDict's lookups and stores: c_ext._track.KeyedBase against its Python twin.

sched._PyKeyedBase is the reference.  Each test runs the same operations on a
table of each kind, under a stand-in for the running step, and compares what
each recorded (the keys, in the order the sets took them, which is what a
search's order depends on) and what each holds and returns.
"""

from __future__ import annotations

import pytest

from c_ext import _track, default_backend_name
from kernel_model.sched import SCHED, KeyedDict, _PyKeyedBase


class _Step:
    def __init__(self) -> None:
        self.reads: set = set()
        self.writes: set = set()
        self.adds: set = set()


class CKeyed(_track.KeyedBase):
    _forget = KeyedDict._forget


class PyKeyed(_PyKeyedBase):
    _forget = KeyedDict._forget


class Missing(_track.KeyedBase):
    def __missing__(self, k):
        return f"no {k}"


def _run(cls, ops):
    """Apply ops to a fresh table of cls under a recording step; what came of it."""
    d = cls()
    d[0] = "boot"                               # before the step: not recorded
    st = _Step()
    out = []
    SCHED.fp_step = st
    try:
        for op, *a in ops:
            try:
                if op == "get":
                    out.append(d.get(*a))
                elif op == "getitem":
                    out.append(d[a[0]])
                elif op == "in":
                    out.append(a[0] in d)
                elif op == "set":
                    d[a[0]] = a[1]
                elif op == "del":
                    del d[a[0]]
            except KeyError as e:
                out.append(("KeyError", e.args))
    finally:
        SCHED.fp_step = None
    me = id(d)

    def keys(s):   # the keys, in the set's order, with the table's id taken out
        return [(k[0] == me, k[1]) for k in s]
    return out, dict(d), keys(st.reads), keys(st.writes), keys(st.adds)


OPS = [("get", 0), ("get", 5, "dflt"), ("getitem", 0), ("getitem", 7), ("in", 0),
       ("in", 3), ("set", 3, "c"), ("set", 3, "c2"), ("set", "k", 1), ("del", 3),
       ("del", 99), ("get", 3), ("set", (1, 2), "tuple key"), ("getitem", (1, 2))]


def test_both_record_the_same_keys_in_the_same_order_and_hold_the_same():
    c, py = _run(CKeyed, OPS), _run(PyKeyed, OPS)
    assert c == py
    out, held, reads, writes, adds = c
    assert out == ["boot", "dflt", "boot", ("KeyError", (7,)), True, False,
                   ("KeyError", (99,)), None, "tuple key"]
    assert held == {0: "boot", "k": 1, (1, 2): "tuple key"}
    # every key read, each written (a new one writes #keys too; a delete is
    # _forget's: a write of the key, and an add to #keys when it was there)
    assert sorted(map(repr, reads)) == sorted(map(repr, [
        (True, 0), (True, 5), (True, 7), (True, 3), (True, (1, 2))]))
    assert sorted(map(repr, writes)) == sorted(map(repr, [
        (True, "#keys"), (True, 3), (True, "k"), (True, 99), (True, (1, 2))]))
    assert adds == [(True, "#keys")]


def test_nothing_is_recorded_off_a_recording_and_dict_behaviour_is_kept():
    for cls in (CKeyed, PyKeyed):
        d = cls({1: "a"}) if cls is PyKeyed else cls()
        d[1] = "a"
        assert SCHED.fp_step is None
        assert d.get(1) == "a" and d[1] == "a" and 1 in d and d.get(2) is None
        with pytest.raises(KeyError):
            d[2]
        del d[1]
        assert dict(d) == {}
    m = Missing()
    assert m["x"] == "no x" and m.get("x") is None      # get never calls __missing__


def test_bad_calls_fail_as_dicts_do():
    d = CKeyed()
    with pytest.raises(TypeError, match="get expected 1 or 2 arguments"):
        d.get()
    with pytest.raises(TypeError, match="get expected 1 or 2 arguments"):
        d.get(1, 2, 3)
    with pytest.raises(TypeError):
        d[[1]] = 2                                      # unhashable, as in a dict
    with pytest.raises(TypeError):
        d.__contains__([1])
    with pytest.raises(TypeError, match="set_sched"):
        _track.set_sched([])


def test_keyeddict_is_built_on_the_backends_base():
    base = _track.KeyedBase if default_backend_name() == "c" else _PyKeyedBase
    assert KeyedDict.__mro__[1] is base
    t = KeyedDict()
    t["a"] = 1
    assert t.pop("a") == 1 and t.setdefault("b", 2) == 2 and dict(t) == {"b": 2}

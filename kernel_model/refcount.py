"""Mirrors include/linux/refcount.h, kref.h and atomic.h (lib/refcount.c).

atomic_t / atomic64_t are plain signed integers that wrap at 32 / 64 bits.
Operations on them are not scheduling points: they are single instructions
and a task switch cannot split one.
# EMU: one implementation serves both widths (atomic64_* are aliases); the
# counter's type decides where it wraps.  No memory ordering is modelled.

refcount_t is an atomic_t that refuses to wrap.  An increment from 0
(the object is already being freed), a decrement below 0, or an overflow
WARNs and *saturates* the counter at REFCOUNT_SATURATED (INT_MIN / 2): a
saturated object is leaked, never freed twice.  As in the kernel each kind
of WARN is printed once (per Machine here: WARN_ONCE); the counter
saturates every time.

A counter reaching zero is a scheduling point ("refcount_zero") just before
the caller is told so, and so before any release function runs - the
moment other tasks may still race with a lookup.

kref is a refcount_t with a release callback (kref_put).
"""

from __future__ import annotations

from collections.abc import Callable

from kernel_model.errno import KernelBug
from kernel_model.lockdep import machine_now
from kernel_model.sched import SCHED, Named, touch
from kernel_model.trace import traced

INT_MAX = (1 << 31) - 1
INT_MIN = -(1 << 31)
REFCOUNT_MAX = INT_MAX
REFCOUNT_SATURATED = INT_MIN // 2


# -- atomic_t / atomic64_t ----------------------------------------------------------

class atomic_t(Named):
    """Mirrors atomic_t: a 32-bit signed counter."""

    bits = 32
    __slots__ = ("_counter", "__weakref__")

    def __init__(self, i: int = 0):
        self._counter = _wrap(self, i)

    @property
    def counter(self) -> int:
        touch(self, False)
        return self._counter

    @counter.setter
    def counter(self, i: int) -> None:
        touch(self)
        self._counter = i

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.counter})"


class atomic64_t(atomic_t):
    """Mirrors atomic64_t: a 64-bit signed counter."""

    bits = 64
    __slots__ = ()


def _wrap(v: atomic_t, i: int) -> int:
    half = 1 << (v.bits - 1)
    return (i + half) % (half << 1) - half


def ATOMIC_INIT(i: int) -> atomic_t:
    """Mirrors ATOMIC_INIT()."""
    return atomic_t(i)


def atomic_read(v: atomic_t) -> int:
    """Mirrors atomic_read()."""
    return v.counter


def atomic_set(v: atomic_t, i: int) -> None:
    """Mirrors atomic_set(): wraps to the counter's width."""
    v.counter = _wrap(v, i)


def atomic_add_return(i: int, v: atomic_t) -> int:
    """Mirrors atomic_add_return()."""
    v.counter = _wrap(v, v.counter + i)
    return v.counter


def atomic_sub_return(i: int, v: atomic_t) -> int:
    """Mirrors atomic_sub_return()."""
    return atomic_add_return(-i, v)


def _add(i: int, v: atomic_t) -> int:
    """Add i to v without looking at the result: for partial-order reduction an "add",
    which commutes with other adds (two increments end the same in either order) and
    conflicts with reads and writes.  The value before."""
    touch(v, "add")
    old = v._counter
    v._counter = _wrap(v, old + i)
    return old


def atomic_add(i: int, v: atomic_t) -> None:
    """Mirrors atomic_add()."""
    _add(i, v)


def atomic_sub(i: int, v: atomic_t) -> None:
    """Mirrors atomic_sub()."""
    _add(-i, v)


def atomic_inc(v: atomic_t) -> None:
    """Mirrors atomic_inc()."""
    _add(1, v)


def atomic_dec(v: atomic_t) -> None:
    """Mirrors atomic_dec()."""
    _add(-1, v)


def atomic_inc_return(v: atomic_t) -> int:
    """Mirrors atomic_inc_return()."""
    return atomic_add_return(1, v)


def atomic_dec_return(v: atomic_t) -> int:
    """Mirrors atomic_dec_return()."""
    return atomic_add_return(-1, v)


def atomic_fetch_add(i: int, v: atomic_t) -> int:
    """Mirrors atomic_fetch_add(): the value before adding."""
    old = v.counter
    atomic_add_return(i, v)
    return old


def atomic_dec_and_test(v: atomic_t) -> bool:
    """Mirrors atomic_dec_and_test(): True if the result is 0."""
    return atomic_add_return(-1, v) == 0


def atomic_inc_not_zero(v: atomic_t) -> bool:
    """Mirrors atomic_inc_not_zero(): increment unless 0; True if it did."""
    if v.counter == 0:
        return False
    atomic_add_return(1, v)
    return True


def atomic_cmpxchg(v: atomic_t, old: int, new: int) -> int:
    """Mirrors atomic_cmpxchg(): store `new` if the value is `old`; the value before."""
    cur = v.counter
    if cur == _wrap(v, old):
        v.counter = _wrap(v, new)
    return cur


def atomic_xchg(v: atomic_t, new: int) -> int:
    """Mirrors atomic_xchg(): store `new`; the value before."""
    cur, v.counter = v.counter, _wrap(v, new)
    return cur


atomic64_read, atomic64_set = atomic_read, atomic_set
atomic64_add, atomic64_sub, atomic64_inc, atomic64_dec = atomic_add, atomic_sub, \
    atomic_inc, atomic_dec
atomic64_add_return, atomic64_sub_return = atomic_add_return, atomic_sub_return
atomic64_inc_return, atomic64_dec_return = atomic_inc_return, atomic_dec_return
atomic64_fetch_add, atomic64_dec_and_test = atomic_fetch_add, atomic_dec_and_test
atomic64_inc_not_zero, atomic64_cmpxchg, atomic64_xchg = atomic_inc_not_zero, \
    atomic_cmpxchg, atomic_xchg


# -- refcount_t -----------------------------------------------------------------

REFCOUNT_ADD_NOT_ZERO_OVF = REFCOUNT_ADD_OVF = "saturated; leaking memory."
REFCOUNT_ADD_UAF = "addition on 0; use-after-free."
REFCOUNT_SUB_UAF = "underflow; use-after-free."
REFCOUNT_DEC_LEAK = "decrement hit 0; leaking memory."


class refcount_t(Named):
    """Mirrors refcount_t: an atomic_t with saturation instead of wraparound."""

    def __init__(self, n: int = 1):
        self.refs = atomic_t(n)
        self.machine = machine_now()

    def __repr__(self) -> str:
        return f"refcount_t({self.refs.counter})"


def REFCOUNT_INIT(n: int) -> refcount_t:
    """Mirrors REFCOUNT_INIT()."""
    return refcount_t(n)


def refcount_warn_saturate(r: refcount_t, what: str) -> None:
    """Mirrors refcount_warn_saturate(): saturate, then WARN_ONCE with the reason."""
    atomic_set(r.refs, REFCOUNT_SATURATED)
    m = r.machine or machine_now()
    text = f"refcount_t: {what}"
    if m is None:
        raise KernelBug(text)
    warned = getattr(m, "refcount_warned", None)
    if warned is None:
        warned = m.refcount_warned = set()
    if what not in warned:
        warned.add(what)
        m.report_bug("refcount_warn_saturate", text)


def refcount_set(r: refcount_t, n: int) -> None:
    """Mirrors refcount_set()."""
    atomic_set(r.refs, n)


def refcount_read(r: refcount_t) -> int:
    """Mirrors refcount_read()."""
    return atomic_read(r.refs)


def refcount_add_not_zero(i: int, r: refcount_t) -> bool:
    """Mirrors refcount_add_not_zero(): add unless 0; False if it was 0."""
    old = r.refs.counter
    if old == 0:
        return False
    atomic_add(i, r.refs)
    if old < 0 or old + i < 0 or old + i > INT_MAX:
        refcount_warn_saturate(r, REFCOUNT_ADD_NOT_ZERO_OVF)
    return True


def refcount_inc_not_zero(r: refcount_t) -> bool:
    """Mirrors refcount_inc_not_zero(): take a reference unless it is being freed."""
    return refcount_add_not_zero(1, r)


def refcount_add(i: int, r: refcount_t) -> None:
    """Mirrors refcount_add(): WARN on addition to 0 or overflow.

    An "add" for partial-order reduction (_add): increments commute with each other;
    whichever of two runs first onto 0 WARNs, in either order."""
    old = _add(i, r.refs)
    if old == 0:
        refcount_warn_saturate(r, REFCOUNT_ADD_UAF)
    elif old < 0 or old + i < 0 or old + i > INT_MAX:
        refcount_warn_saturate(r, REFCOUNT_ADD_OVF)


def refcount_inc(r: refcount_t) -> None:
    """Mirrors refcount_inc()."""
    refcount_add(1, r)


def refcount_sub_and_test(i: int, r: refcount_t) -> bool:
    """Mirrors refcount_sub_and_test(): True when the count drops to exactly 0."""
    old = atomic_fetch_add(-i, r.refs)
    if old == i:
        SCHED.point("refcount_zero")
        return True
    if old < 0 or old - i < 0:
        refcount_warn_saturate(r, REFCOUNT_SUB_UAF)
    return False


def refcount_dec_and_test(r: refcount_t) -> bool:
    """Mirrors refcount_dec_and_test()."""
    return refcount_sub_and_test(1, r)


def refcount_dec(r: refcount_t) -> None:
    """Mirrors refcount_dec(): a decrement that must not reach 0 (WARN if it does)."""
    if atomic_fetch_add(-1, r.refs) <= 1:
        refcount_warn_saturate(r, REFCOUNT_DEC_LEAK)


# -- kref -------------------------------------------------------------------------

class kref:
    """Mirrors struct kref (starts at 1, as after kref_init)."""

    def __init__(self) -> None:
        self.refcount = refcount_t(1)

    def __repr__(self) -> str:
        return f"kref({self.refcount.refs.counter})"


def kref_init(k: kref) -> None:
    """Mirrors kref_init(): the count is 1."""
    refcount_set(k.refcount, 1)


def kref_read(k: kref) -> int:
    """Mirrors kref_read()."""
    return refcount_read(k.refcount)


def kref_get(k: kref) -> None:
    """Mirrors kref_get(): WARNs (refcount_t) if the count was 0."""
    refcount_inc(k.refcount)


def kref_get_unless_zero(k: kref) -> bool:
    """Mirrors kref_get_unless_zero(): for lookups that race with the last put."""
    return refcount_inc_not_zero(k.refcount)


@traced
def kref_put(k: kref, release: Callable[[kref], object]) -> int:
    """Mirrors kref_put(): drop a reference; on the last, call release(k) and return 1."""
    if refcount_dec_and_test(k.refcount):
        release(k)
        return 1
    return 0

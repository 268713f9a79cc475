"""Tests for kernel_model/refcount.py: atomics, refcount_t saturation, kref."""

from __future__ import annotations

from kernel_model.kthread import kthread_run
from kernel_model.refcount import (
    INT_MAX,
    INT_MIN,
    REFCOUNT_SATURATED,
    atomic64_add_return,
    atomic64_inc,
    atomic64_read,
    atomic64_t,
    atomic_add,
    atomic_add_return,
    atomic_cmpxchg,
    atomic_dec,
    atomic_dec_and_test,
    atomic_dec_return,
    atomic_inc,
    atomic_inc_not_zero,
    atomic_inc_return,
    atomic_read,
    atomic_set,
    atomic_sub,
    atomic_sub_return,
    atomic_t,
    atomic_xchg,
    kref,
    kref_get,
    kref_get_unless_zero,
    kref_init,
    kref_put,
    kref_read,
    refcount_add,
    refcount_dec,
    refcount_dec_and_test,
    refcount_inc,
    refcount_inc_not_zero,
    refcount_read,
    refcount_set,
    refcount_sub_and_test,
    refcount_t,
)
from kernel_model.sched import SCHED, Strategy

# -- atomics ----------------------------------------------------------------------

def test_atomic_t_arithmetic_and_32_bit_wraparound():
    v = atomic_t(5)
    atomic_inc(v)
    atomic_add(4, v)
    atomic_sub(2, v)
    atomic_dec(v)
    assert atomic_read(v) == 7
    assert (atomic_add_return(3, v), atomic_sub_return(1, v)) == (10, 9)
    assert (atomic_inc_return(v), atomic_dec_return(v)) == (10, 9)
    atomic_set(v, INT_MAX)
    assert atomic_inc_return(v) == INT_MIN          # wraps, as the kernel's atomic_t does
    assert atomic_dec_return(v) == INT_MAX
    atomic_set(v, 1 << 32)
    assert atomic_read(v) == 0


def test_atomic_test_and_exchange_ops():
    v = atomic_t(2)
    assert not atomic_dec_and_test(v) and atomic_dec_and_test(v)
    assert not atomic_inc_not_zero(v) and atomic_read(v) == 0
    atomic_set(v, 3)
    assert atomic_inc_not_zero(v) and atomic_read(v) == 4
    assert atomic_cmpxchg(v, 5, 9) == 4 and atomic_read(v) == 4    # no match: unchanged
    assert atomic_cmpxchg(v, 4, 9) == 4 and atomic_read(v) == 9
    assert atomic_xchg(v, -1) == 9 and atomic_read(v) == -1


def test_atomic64_t_wraps_at_64_bits():
    v = atomic64_t((1 << 63) - 1)
    assert atomic64_read(v) == (1 << 63) - 1
    atomic64_inc(v)
    assert atomic64_read(v) == -(1 << 63)
    assert atomic64_add_return(1 << 40, atomic64_t(1 << 40)) == 1 << 41   # no 32-bit wrap


def test_atomics_are_not_scheduling_points(m):
    with m.kernel():
        t = kthread_run(lambda: None, name="other")
        before = len(SCHED.decisions)
        v = atomic_t()
        for _ in range(10):
            atomic_inc(v)
        assert len(SCHED.decisions) == before
        t.join()


# -- refcount_t -------------------------------------------------------------------

def test_refcount_counts_and_reaches_zero(m):
    with m.kernel():
        r = refcount_t(1)
        refcount_inc(r)
        refcount_add(3, r)
        assert refcount_read(r) == 5
        assert not refcount_sub_and_test(4, r)
        assert refcount_inc_not_zero(r) and refcount_read(r) == 2
        refcount_dec(r)
        assert refcount_dec_and_test(r) and refcount_read(r) == 0
        assert not refcount_inc_not_zero(r) and refcount_read(r) == 0
    assert m.bugs == []


def test_increment_from_zero_warns_and_saturates(m):
    with m.kernel():
        r = refcount_t(0)
        refcount_inc(r)
        assert refcount_read(r) == REFCOUNT_SATURATED
        assert not refcount_dec_and_test(r)        # saturated: never freed...
    assert m.bugs == ["WARNING: refcount_warn_saturate: refcount_t: addition on 0; "
                      "use-after-free.",
                      "WARNING: refcount_warn_saturate: refcount_t: underflow; "
                      "use-after-free."]
    m.bugs.clear()


def test_underflow_warns_and_saturates(m):
    with m.kernel():
        r = refcount_t(1)
        assert refcount_dec_and_test(r)
        assert not refcount_dec_and_test(r)        # a second put: underflow
        assert refcount_read(r) == REFCOUNT_SATURATED
    assert m.bugs == ["WARNING: refcount_warn_saturate: refcount_t: underflow; "
                      "use-after-free."]
    m.bugs.clear()


def test_overflow_warns_and_saturates_once_per_kind(m):
    with m.kernel():
        r = refcount_t(INT_MAX)
        refcount_inc(r)
        assert refcount_read(r) == REFCOUNT_SATURATED
        q = refcount_t(INT_MAX)
        assert refcount_inc_not_zero(q) and refcount_read(q) == REFCOUNT_SATURATED
        refcount_add(1, r)                         # still saturated; WARN_ONCE is spent
        assert refcount_read(r) == REFCOUNT_SATURATED
    assert m.bugs == ["WARNING: refcount_warn_saturate: refcount_t: saturated; "
                      "leaking memory."]
    m.bugs.clear()


def test_refcount_dec_to_zero_warns(m):
    with m.kernel():
        r = refcount_t(1)
        refcount_dec(r)
        assert refcount_read(r) == REFCOUNT_SATURATED
        refcount_set(r, 7)
        assert refcount_read(r) == 7
    assert m.bugs == ["WARNING: refcount_warn_saturate: refcount_t: decrement hit 0; "
                      "leaking memory."]
    m.bugs.clear()


class Recorder(Strategy):
    def __init__(self):
        self.reasons = []

    def choose(self, sched, candidates, reason):
        self.reasons.append(reason)
        return candidates[0]


def test_the_drop_to_zero_is_a_scheduling_point(m):
    rec = Recorder()
    with m.kernel():
        t = kthread_run(lambda: None, name="other")
        r = refcount_t(2)
        SCHED.use(rec)
        refcount_dec_and_test(r)
        assert rec.reasons == []
        refcount_dec_and_test(r)
        assert rec.reasons == ["refcount_zero"]
        SCHED.use(None)
        t.join()


# -- kref -----------------------------------------------------------------------

def test_kref_put_releases_on_the_last_reference(m):
    released = []
    with m.kernel():
        k = kref()
        kref_get(k)
        assert kref_read(k) == 2
        assert kref_put(k, released.append) == 0 and released == []
        assert kref_put(k, released.append) == 1 and released == [k]
        assert not kref_get_unless_zero(k) and kref_read(k) == 0
        kref_init(k)
        assert kref_get_unless_zero(k) and kref_read(k) == 2
    assert m.bugs == []


def test_kref_get_after_release_is_reported(m):
    with m.kernel():
        k = kref()
        assert kref_put(k, lambda k: None) == 1
        kref_get(k)
    assert m.bugs == ["WARNING: refcount_warn_saturate: refcount_t: addition on 0; "
                      "use-after-free."]
    m.bugs.clear()


def test_lookup_racing_with_the_last_put(m):
    """The release runs after a scheduling point: a racing lookup must use
    kref_get_unless_zero, which fails once the count hit zero."""
    log = []

    class Interleave(Strategy):
        def choose(self, sched, candidates, reason):
            return candidates[-1] if reason == "refcount_zero" else candidates[0]

    with m.kernel():
        k = kref()

        def lookup():
            log.append(("lookup got", kref_get_unless_zero(k)))

        t = kthread_run(lookup, name="lookup")
        SCHED.use(Interleave())
        kref_put(k, lambda k: log.append("release"))
        SCHED.use(None)
        t.join()
    assert log == [("lookup got", False), "release"]

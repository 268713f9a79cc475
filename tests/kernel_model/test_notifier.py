"""kernel_model/notifier.py: atomic notifier chains - priority order, NOTIFY_STOP_MASK,
double registration (-EEXIST) and unregistering a block not on the chain (-ENOENT)."""

from __future__ import annotations

import errno

from kernel_model.notifier import (
    ATOMIC_INIT_NOTIFIER_HEAD,
    NOTIFY_DONE,
    NOTIFY_OK,
    NOTIFY_STOP,
    atomic_notifier_call_chain,
    atomic_notifier_chain_register,
    atomic_notifier_chain_unregister,
    notifier_block,
)


def _nb(log: list, name: str, ret: int = NOTIFY_OK, priority: int = 0) -> notifier_block:
    return notifier_block(lambda nb, val, v: log.append((name, val, v)) or ret, priority)


def test_blocks_run_by_priority_then_registration_order():
    nh = ATOMIC_INIT_NOTIFIER_HEAD("test")
    log: list = []
    assert atomic_notifier_call_chain(nh, 1, None) == NOTIFY_DONE   # empty chain
    for nb in (_nb(log, "a"), _nb(log, "b", priority=5), _nb(log, "c", NOTIFY_DONE)):
        assert atomic_notifier_chain_register(nh, nb) == 0
    assert atomic_notifier_call_chain(nh, 7, "data") == NOTIFY_DONE  # the last answer
    assert log == [("b", 7, "data"), ("a", 7, "data"), ("c", 7, "data")]


def test_stop_mask_ends_the_walk():
    nh = ATOMIC_INIT_NOTIFIER_HEAD()
    log: list = []
    atomic_notifier_chain_register(nh, _nb(log, "stopper", NOTIFY_STOP))
    atomic_notifier_chain_register(nh, _nb(log, "after"))
    assert atomic_notifier_call_chain(nh, 0, None) == NOTIFY_STOP
    assert [n for n, _, _ in log] == ["stopper"]


def test_double_register_and_stray_unregister_fail():
    nh = ATOMIC_INIT_NOTIFIER_HEAD()
    nb = _nb([], "x")
    assert atomic_notifier_chain_register(nh, nb) == 0
    assert atomic_notifier_chain_register(nh, nb) == -errno.EEXIST and len(nh.head) == 1
    assert atomic_notifier_chain_unregister(nh, nb) == 0
    assert atomic_notifier_chain_unregister(nh, nb) == -errno.ENOENT
    assert "notifier_block" in repr(nb) and "blocks=0" in repr(nh)

"""Mirrors include/linux/notifier.h + kernel/notifier.c: atomic notifier chains.

A subsystem that raises events (mlx5_core's async EQ) keeps a chain head; a
consumer registers a notifier_block whose notifier_call(nb, action, data) is
called for each event, in priority order (higher first, equal ones in the
order they registered).  A callback answering with NOTIFY_STOP_MASK set ends
the walk.  The atomic flavour is called from interrupt context: callbacks
must not sleep.

# EMU: the kernel walks the chain under RCU and registers under a spinlock;
# here registering is a list insert and the walk runs on a snapshot of the
# list, which gives the same "a block unregistered mid-walk may still be
# called once" semantics the RCU walk has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_model.errno import EEXIST, ENOENT
from kernel_model.trace import traced

NOTIFY_DONE = 0x0000
NOTIFY_OK = 0x0001
NOTIFY_STOP_MASK = 0x8000
NOTIFY_BAD = NOTIFY_STOP_MASK | 0x0002
NOTIFY_STOP = NOTIFY_OK | NOTIFY_STOP_MASK


class notifier_block:
    """Mirrors struct notifier_block: the callback and its priority."""

    def __init__(self, notifier_call: Callable[[Any, int, Any], int] | None = None,
                 priority: int = 0):
        self.notifier_call = notifier_call
        self.priority = priority

    def __repr__(self) -> str:
        fn = getattr(self.notifier_call, "__name__", None)
        return f"notifier_block {fn} prio={self.priority}"


class atomic_notifier_head:
    """Mirrors struct atomic_notifier_head: the registered blocks, by priority."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.head: list[notifier_block] = []

    def __repr__(self) -> str:
        return f"atomic_notifier_head {self.name} blocks={len(self.head)}"


def ATOMIC_INIT_NOTIFIER_HEAD(name: str = "") -> atomic_notifier_head:
    """Mirrors ATOMIC_INIT_NOTIFIER_HEAD()."""
    return atomic_notifier_head(name)


@traced
def atomic_notifier_chain_register(nh: atomic_notifier_head, n: notifier_block) -> int:
    """Mirrors atomic_notifier_chain_register() -> notifier_chain_register(): insert
    by priority (after the blocks of equal priority); a block already on the chain
    is a WARN and not added twice (the kernel returns -EEXIST)."""
    if any(b is n for b in nh.head):
        return -EEXIST
    at = next((i for i, b in enumerate(nh.head) if n.priority > b.priority), len(nh.head))
    nh.head.insert(at, n)
    return 0


@traced
def atomic_notifier_chain_unregister(nh: atomic_notifier_head, n: notifier_block) -> int:
    """Mirrors atomic_notifier_chain_unregister(): -ENOENT for a block not on the chain."""
    for i, b in enumerate(nh.head):
        if b is n:
            del nh.head[i]
            return 0
    return -ENOENT


def atomic_notifier_call_chain(nh: atomic_notifier_head, val: int, v: Any) -> int:
    """Mirrors atomic_notifier_call_chain() -> notifier_call_chain(): each block's
    callback in order, until one answers with NOTIFY_STOP_MASK; the last answer
    (NOTIFY_DONE for an empty chain)."""
    ret = NOTIFY_DONE
    for nb in list(nh.head):
        ret = nb.notifier_call(nb, val, v)
        if ret & NOTIFY_STOP_MASK:
            break
    return ret

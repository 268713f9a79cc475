"""Mirrors arch/x86/include/asm/current.h: `current`, the running task.

Kernel functions find their machine, mm and credentials through current(), as
the real ones do, so their signatures stay the kernel's
(`pin_user_pages_fast(start, nr_pages, gup_flags, pages)`).  Whoever runs
kernel code - the system-call layer, the scheduler, a test acting as a kernel
caller - enters a task with `running(task)`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine
    from kernel_model.task import task_struct

_current: task_struct | None = None

# EMU: no kernel has this - the emulator's own registry of every Machine built in this
# interpreter (Machine() adds itself), for the per-test leak check and for slab's lookup
# of an object's owner outside any task; here, at the bottom, so both can reach it
live_machines: weakref.WeakSet[Machine] = weakref.WeakSet()


def current() -> task_struct:
    """The task whose context the kernel code is running in."""
    if _current is None:
        raise RuntimeError("no current task: enter one with kernel_model.current.running(task)")
    return _current


def current_or_none() -> task_struct | None:
    """current(), or None outside any task (emulator-level code only)."""
    return _current


@contextmanager
def running(task: task_struct) -> Iterator[task_struct]:
    """Run the body as `task` (nests; restores the previous task on exit)."""
    global _current
    prev, _current = _current, task
    try:
        yield task
    finally:
        _current = prev

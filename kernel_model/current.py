"""Mirrors arch/x86/include/asm/current.h: `current`, the running task.

Kernel functions find their machine, mm and credentials through current(), as
the real ones do, so their signatures stay the kernel's
(`pin_user_pages_fast(start, nr_pages, gup_flags, pages)`).  Whoever runs
kernel code - the system-call layer, the scheduler, a test acting as a kernel
caller - enters a task with `running(task)`.
"""

from __future__ import annotations

import weakref
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


class running:
    """Run the body as `task` (nests; restores the previous task on exit).

    A class rather than a @contextmanager generator: every load, store and
    system call of a process enters one, and this costs a third as much."""

    __slots__ = ("task", "_prev")

    def __init__(self, task: task_struct):
        self.task = task
        self._prev: list[task_struct | None] = []

    def __enter__(self) -> task_struct:
        global _current
        self._prev.append(_current)
        _current = self.task
        return self.task

    def __exit__(self, *exc: object) -> None:
        global _current
        _current = self._prev.pop()

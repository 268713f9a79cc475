"""Mirrors include/linux/sched.h, include/linux/cred.h and kernel/exit.c.

A task_struct is what `current` points to: its machine, mm, open files,
credentials and resource limits.  do_exit() tears a task down in the
kernel's order: exit_mm() first (the last mmput unmaps everything - pinned
pages survive, held by their pins), then exit_files(), which closes the fd
table in fd order.  So a test chooses which file is released first (say the
GPU's or the uverbs file) by the order it opened them.

EMU: since v5.x the last fput of a file at exit runs from task_work, whose
order the kernel does not promise; we release in fd order so the order is
the test's to choose and the same every run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel_model.current import current, running
from kernel_model.errno import KernelBug
from kernel_model.mm import mmput
from kernel_model.sched import SCHED, touch_key
from kernel_model.uapi.resource import (  # noqa: F401 - task_struct's rlimits, as ever
    MLOCK_LIMIT,
    RLIM_INFINITY,
    RLIMIT_MEMLOCK,
    RLIMIT_NOFILE,
)

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine
    from kernel_model.fs import files_struct
    from kernel_model.mm import mm_struct

INR_OPEN_CUR = 1024

CAP_NET_RAW = 13
CAP_IPC_LOCK = 14
CAP_SYS_RAWIO = 17
CAP_SYS_ADMIN = 21

PF_EXITING = 0x00000004
PF_KTHREAD = 0x00200000


class cred:
    """Mirrors struct cred: ids and the effective capability set."""

    def __init__(self, uid: int = 0, caps: int = 0):
        self.uid = self.euid = uid
        self.cap_effective = caps

    def __repr__(self) -> str:
        return f"cred uid={self.uid} caps={self.cap_effective:#x}"


class task_struct:
    """Mirrors struct task_struct (the parts this model uses)."""

    #: partial-order reduction: the limits (shared by a process's threads) are read
    #: limit by limit (rlimit()), not as a dict of lists that counts as written when read
    POR_REPORTED = ("rlim",)

    def __init__(self, machine: Machine, pid: int, comm: str, mm: mm_struct | None,
                 files: files_struct | None, cred_: cred, rlim: dict[int, list[int]],
                 flags: int = 0):
        self.machine = machine
        self.pid = pid
        self.tgid = pid  # the thread group (process) id; a user thread shares its leader's
        self.comm = comm
        self.mm = mm
        self.files = files
        self.cred = cred_
        self.rlim = rlim  # signal->rlim: resource -> [cur, max]
        self.flags = flags
        self.exit_code: int | None = None
        self.last_error = None  # the KernelError behind the last -errno (diagnostics)

    def __repr__(self) -> str:
        state = "running" if self.exit_code is None else f"exited({self.exit_code})"
        return f"task {self.pid} {self.comm} {state}"

    def do_exit(self, code: int) -> None:
        """Mirrors do_exit(): exit_mm(), then exit_files() in fd order.

        do_exit never returns an error and never stops half-way: each step runs
        even if one before it failed.  A step that raises a kernel error is a
        kernel bug (every teardown callback is void in the kernel) and is
        recorded as a WARN (machine.bugs, which the leak check reports).  A
        debug check's KernelBug (use-after-free, lockdep) is the model's oops:
        the remaining steps still run, then the first one is raised again.
        """
        oops: list[KernelBug] = []
        with running(self):
            self.flags |= PF_EXITING
            mm, self.mm = self.mm, None
            if mm is not None:
                self.ExitStep("exit_mm", mmput, mm, oops)
            files, self.files = self.files, None
            if files is not None:
                self.ExitStep("exit_files", files.close_all, None, oops)
            self.exit_code = code
            self.machine.tasks.pop(self.pid, None)
        if oops:
            raise oops[0]

    def ExitStep(self, step: str, fn: Callable[..., None], arg: Any,
                 oops: list[KernelBug]) -> None:
        """Run one do_exit step; a failure is recorded, never propagated (see do_exit)."""
        try:
            fn() if arg is None else fn(arg)
        except KernelBug as e:
            oops.append(e)
        except Exception as e:  # noqa: BLE001 - do_exit goes on whatever a step did
            self.machine.report_bug(f"do_exit: {step}", f"pid {self.pid}: {e!r}")


def init_task(machine: Machine) -> task_struct:
    """Mirrors init_task (pid 0, "swapper"): the context boot and module init run in."""
    return task_struct(machine, 0, "swapper", None, None, cred(0, ~0 & ((1 << 41) - 1)),
                       {RLIMIT_MEMLOCK: [MLOCK_LIMIT, MLOCK_LIMIT],
                        RLIMIT_NOFILE: [INR_OPEN_CUR, INR_OPEN_CUR]}, PF_KTHREAD)


def capable(cap: int) -> bool:
    """Mirrors capable(): does current hold `cap` in its effective set?"""
    return bool(current().cred.cap_effective >> cap & 1)


def rlimit(resource: int) -> int:
    """Mirrors rlimit(): current's soft limit."""
    rlim = current().rlim
    if SCHED.fp_step is not None:           # the limit read, for partial-order reduction
        SCHED.fp_keep(rlim, False)          # type: ignore[misc]
        touch_key((id(rlim), resource), False)
    return rlim[resource][0]


def can_do_mlock() -> bool:
    """Mirrors can_do_mlock(): a non-zero RLIMIT_MEMLOCK or CAP_IPC_LOCK."""
    return rlimit(RLIMIT_MEMLOCK) != 0 or capable(CAP_IPC_LOCK)

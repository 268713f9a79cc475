"""Process: a user program's view of the machine - system calls and a CPU.

Emulator-level (CapWords).  A Process owns one task_struct with its own mm
and fd table.  Its methods are the only things user code may do to the
kernel: the system calls (returning -errno like the raw syscall) and plain
loads and stores to its own virtual memory, which go through its page tables
like the MMU - faulting pages in, hitting MMIO for a mapped device page, and
raising SegmentationFault (SIGSEGV) where the real CPU would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel_model import syscalls
from kernel_model.current import current_or_none, running
from kernel_model.fs import files_struct
from kernel_model.memory import access_vm, page_at
from kernel_model.mm import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_PRIVATE,
    PROT_READ,
    PROT_WRITE,
    mm_struct,
    mmget,
    mmput,
)
from kernel_model.sched import SCHED, Task
from kernel_model.task import (
    CAP_IPC_LOCK,
    INR_OPEN_CUR,
    MLOCK_LIMIT,
    RLIMIT_MEMLOCK,
    RLIMIT_NOFILE,
    cred,
    task_struct,
)

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine


class SegmentationFault(Exception):
    """SIGSEGV: a user access the MMU and the fault handler could not satisfy.
    `proc` is the Process it is delivered to (what a signal handler's si_pid names)."""

    def __init__(self, message: str, proc: Process | None = None):
        super().__init__(message)
        self.proc = proc


class Process:
    """A user process on a Machine.  See the module docstring."""

    def __init__(self, machine: Machine, comm: str, *, rlimit_memlock: int | None = None,
                 cap_ipc_lock: bool = False, uid: int = 1000,
                 environ: dict[str, str] | None = None):
        self.machine = machine
        self.environ: dict[str, str] = dict(environ or {})  # what getenv() sees
        pid = machine.alloc_pid()
        memlock = MLOCK_LIMIT if rlimit_memlock is None else rlimit_memlock
        caps = 1 << CAP_IPC_LOCK if cap_ipc_lock else 0
        mm = mm_struct(machine, pid)
        self.task = task_struct(machine, pid, comm, mm, files_struct(INR_OPEN_CUR),
                                cred(uid, caps),
                                {RLIMIT_MEMLOCK: [memlock, memlock],
                                 RLIMIT_NOFILE: [INR_OPEN_CUR, INR_OPEN_CUR]})
        machine.tasks[pid] = self.task

    def __repr__(self) -> str:
        return f"Process {self.pid} {self.task.comm} on {self.machine.name}"

    @property
    def pid(self) -> int:
        return self.task.pid

    @property
    def mm(self) -> mm_struct | None:
        return self.task.mm

    @property
    def alive(self) -> bool:
        return self.task.exit_code is None

    def kernel(self):
        """Run kernel code as this process (a context manager entering current)."""
        return running(self.task)

    # -- system calls: return value or -errno, like syscall(2) ---------------
    def _me(self) -> task_struct:
        """The thread of this process making the call: a user thread's own
        task_struct when one of them is running, else the main thread's."""
        ts = current_or_none()
        if ts is not None and ts.tgid == self.task.pid:
            return ts
        return self.task

    def _sys(self, fn, *args):
        if not self.alive:
            raise RuntimeError(f"{self} has exited")
        with running(self._me()):
            return fn(*args)

    def start(self, fn: Callable[..., Any], *args: object) -> Task:
        """Run fn(*args) as this process's main thread: a Task whose current()
        is the process's own task_struct, so a trace shows the user program,
        its system calls and its page faults on one `comm-pid` track."""
        if not self.alive:
            raise RuntimeError(f"{self} has exited")
        return SCHED.spawn(fn, *args, name=self.task.comm, ts=self.task)

    def run(self, fn: Callable[..., Any], *args: object) -> Any:
        """start() and join(): fn's result, or its exception re-raised."""
        return self.start(fn, *args).join()

    def thread(self, fn: Callable[..., Any], *args: object, name: str | None = None) -> Task:
        """pthread_create(): run fn(*args) as a new thread of this process.

        The thread is a Task with its own task_struct sharing the mm and the
        fd table (clone with CLONE_VM | CLONE_FILES | CLONE_THREAD); it
        first runs at the caller's next scheduling point.  Join it with
        `.join()`, which returns fn's result or raises its exception.
        """
        if not self.alive:
            raise RuntimeError(f"{self} has exited")
        leader = self.task
        ts = task_struct(self.machine, self.machine.alloc_pid(), name or leader.comm,
                         leader.mm, leader.files, leader.cred, leader.rlim)
        ts.tgid = leader.pid
        mmget(leader.mm)

        def body() -> Any:
            try:
                return fn(*args)
            finally:  # do_exit of a non-leader thread: drop its mm reference
                mm, ts.mm = ts.mm, None
                ts.files = None
                ts.exit_code = 0
                mmput(mm)

        return SCHED.spawn(body, name=ts.comm, ts=ts)

    def open(self, path: str, flags: int = 2) -> int:
        return self._sys(syscalls.sys_open, path, flags)

    def close(self, fd: int) -> int:
        return self._sys(syscalls.sys_close, fd)

    def read(self, fd: int, buf: int, count: int) -> int:
        return self._sys(syscalls.sys_read, fd, buf, count)

    def dup(self, fd: int) -> int:
        return self._sys(syscalls.sys_dup, fd)

    def fstat(self, fd: int, statbuf: int) -> int:
        return self._sys(syscalls.sys_fstat, fd, statbuf)

    def write(self, fd: int, buf: int, count: int) -> int:
        return self._sys(syscalls.sys_write, fd, buf, count)

    def ioctl(self, fd: int, cmd: int, arg: int = 0) -> int:
        return self._sys(syscalls.sys_ioctl, fd, cmd, arg)

    def mmap(self, addr: int, length: int, prot: int = PROT_READ | PROT_WRITE,
             flags: int = MAP_PRIVATE | MAP_ANONYMOUS, fd: int = -1, offset: int = 0) -> int:
        if flags & MAP_FIXED:          # it replaces what was mapped there: memhooks hear it
            for hook in list(self.__dict__.get("memhooks", ())):
                hook(addr, length)
        return self._sys(syscalls.sys_mmap, addr, length, prot, flags, fd, offset)

    def munmap(self, addr: int, length: int) -> int:
        # EMU: libfabric's memhooks monitor patches the program's relocations so its
        # hook runs before munmap; a library installs such hooks in `memhooks` here
        for hook in list(self.__dict__.get("memhooks", ())):
            hook(addr, length)
        return self._sys(syscalls.sys_munmap, addr, length)

    def madvise(self, addr: int, length: int, behavior: int) -> int:
        return self._sys(syscalls.sys_madvise, addr, length, behavior)

    def userfaultfd(self, flags: int) -> int:
        return self._sys(syscalls.sys_userfaultfd, flags)

    def getdents(self, path: str) -> list[str] | int:
        """The names in a directory of the device tree (/sys/class/...), or -errno."""
        return self._sys(syscalls.sys_getdents, path)

    def sched_yield(self) -> int:
        return self._sys(syscalls.sys_sched_yield)

    def exit(self, code: int = 0) -> None:
        self._sys(syscalls.sys_exit, code)

    # -- the CPU: loads and stores through the page tables ---------------------
    def _access(self, va: int, n: int, write: bool, chunk) -> None:
        if not self.alive:
            raise RuntimeError(f"{self} has exited")
        with running(self.task):
            if va < 0 or va + n > self.task.mm.task_size:
                raise SegmentationFault(f"pid {self.pid}: access at {va:#x} beyond TASK_SIZE",
                                        self)
            done = access_vm(self.task.mm, va, n, write, chunk)
        if done < n:
            kind = "write" if write else "read"
            raise SegmentationFault(f"pid {self.pid}: {kind} at {va + done:#x} "
                                    f"({n} bytes from {va:#x})", self)

    def load(self, va: int, n: int) -> bytes:
        """Read n bytes at va as the program's CPU would."""
        m = self.machine
        t = self.task
        if t.exit_code is None:                          # alive
            phys = page_at(t.mm, va, n, False)           # the TLB hit: no walk
            if phys >= 0:
                if phys + n <= m.ram_size:
                    return m.phys_read(phys, n)
                with running(self.task):    # MMIO: the device's code runs as the process
                    return m.phys_read(phys, n)
        out = bytearray(n)

        def chunk(phys: int, off: int, k: int) -> None:
            out[off:off + k] = m.phys_read(phys, k)

        self._access(va, n, False, chunk)
        return bytes(out)

    def store(self, va: int, data: bytes) -> None:
        """Write data at va as the program's CPU would (MMIO pages reach the device)."""
        m = self.machine
        t = self.task
        if t.exit_code is None:                          # alive
            n = len(data)
            phys = page_at(t.mm, va, n, True)
            if phys >= 0:
                if phys + n <= m.ram_size:
                    m.phys_write(phys, data)
                    return
                with running(self.task):
                    m.phys_write(phys, bytes(data))
                return
        src = memoryview(bytes(data))

        def chunk(phys: int, off: int, k: int) -> None:
            m.phys_write(phys, src[off:off + k])

        self._access(va, len(src), True, chunk)

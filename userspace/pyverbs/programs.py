"""The implicit host's programs: what a pyverbs program gets when it shells out.

A pyverbs test runs as one process on a host with a device; when it runs a program
to learn about that device (`rdma link show -j`, `cat .../ports/1/pkeys/0`, `ip -j
addr show eth0`), the program must describe the emulated host, not the machine the
emulator runs on.  install() wraps subprocess.run (which subprocess.check_output
and check_call's callers reach too) so that a program of the emulated host runs
there, in its process, with its files; every other command runs on the real
machine as before.  uninstall() puts subprocess.run back.

The emulated host's programs:

* `rdma ...`: iproute2's tool (userspace/tools/rdma.py).
* `ls PATH`, `cat PATH...` for a path of the emulated device tree (/sys/class/
  infiniband*, /sys/class/infiniband_verbs, /dev/infiniband): listed and read
  through the host's process (getdents, open/read), exit 2 and coreutils' message
  for a path that is not there.
* `ip ... show [DEV]`: the emulated host has no net devices (see
  docs/pyverbs.md), so a named one "does not exist" (exit 1) and a listing is
  empty.

Like the `pyverbs` alias, this is a deliberate choice: the rdma-core runner and
`pytest --emulated-pyverbs` install it.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from userspace.libc import read_sysfs
from userspace.pyverbs.host import current_process
from userspace.tools import rdma

#: the paths whose `ls` and `cat` are the emulated host's
EMULATED_PATHS = ("/sys/class/infiniband", "/dev/infiniband")


def _emulated_path(path: str) -> bool:
    return any(path == p or path.startswith(p) for p in EMULATED_PATHS)


def _rdma(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = rdma.main(current_process(), argv[1:], out, err)
    return rc, out.getvalue(), err.getvalue()


def _ls(argv: list[str]) -> tuple[int, str, str] | None:
    paths = [a for a in argv[1:] if not a.startswith("-")]
    if len(paths) != 1 or not _emulated_path(paths[0]):
        return None
    names = current_process().getdents(paths[0].rstrip("/") or "/")
    if isinstance(names, int):
        if read_sysfs(current_process(), paths[0]) is not None:
            return 0, paths[0] + "\n", ""
        return 2, "", f"ls: cannot access '{paths[0]}': No such file or directory\n"
    return 0, "".join(n + "\n" for n in sorted(names)), ""


def _cat(argv: list[str]) -> tuple[int, str, str] | None:
    paths = argv[1:]
    if not paths or not all(_emulated_path(p) for p in paths):
        return None
    out, err, rc = [], [], 0
    for p in paths:
        text = read_sysfs(current_process(), p)
        if text is None:
            err.append(f"cat: {p}: No such file or directory\n")
            rc = 1
        else:
            out.append(text)
    return rc, "".join(out), "".join(err)


def _ip(argv: list[str]) -> tuple[int, str, str] | None:
    words = [a for a in argv[1:] if not a.startswith("-")]
    if not words or words[-1] in ("show", "list", "addr", "address", "link", "a", "l"):
        return 0, "[]\n" if ("-j" in argv or "-json" in argv) else "", ""
    if len(words) >= 3 and words[-2] in ("show", "list", "dev"):
        # EMU: the emulated host has no net devices
        return 1, "", f'Device "{words[-1]}" does not exist.\n'
    return None


PROGRAMS: dict[str, Callable[[list[str]], tuple[int, str, str] | None]] = {
    "rdma": _rdma, "ls": _ls, "cat": _cat, "ip": _ip,
}


def run_program(argv: Sequence[str]) -> tuple[int, str, str] | None:
    """Run `argv` on the emulated host: (exit status, stdout, stderr), or None when it
    is not one of the host's programs (the caller runs it on the real machine)."""
    if not argv:
        return None
    prog = PROGRAMS.get(str(argv[0]).rsplit("/", 1)[-1])
    return None if prog is None else prog([str(a) for a in argv])


_real_run: Callable[..., Any] | None = None


def _run(args: Any, *popenargs: Any, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run, with the emulated host's programs run there."""
    assert _real_run is not None
    result = None
    if isinstance(args, (list, tuple)) and not kwargs.get("shell") and not popenargs:
        result = run_program(args)
    if result is None:
        return _real_run(args, *popenargs, **kwargs)
    rc, out, err = result
    text = kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
    stdout: Any = out if text else out.encode()
    stderr: Any = err if text else err.encode()
    if kwargs.get("stderr") == subprocess.STDOUT:
        stdout, stderr = stdout + stderr, stderr[:0]
    if kwargs.get("stdout") is None and kwargs.get("capture_output") is not True:
        stdout = None  # not captured: the real program would have written to our stdout
    if kwargs.get("stderr") in (None, subprocess.DEVNULL) and not kwargs.get("capture_output"):
        stderr = None
    if kwargs.get("check") and rc:
        raise subprocess.CalledProcessError(rc, args, stdout, stderr)
    return subprocess.CompletedProcess(args, rc, stdout, stderr)


def install() -> None:
    """From now on subprocess runs the emulated host's programs on it."""
    global _real_run
    if _real_run is None:
        _real_run = subprocess.run
        subprocess.run = _run


def uninstall() -> None:
    """Undo install()."""
    global _real_run
    if _real_run is not None:
        subprocess.run = _real_run
        _real_run = None

"""Mirrors include/uapi/asm-generic/errno-base.h and errno.h, plus KernelError.

Inside the emulated kernel every failure raises KernelError(errno, message).
The message must start with the name of the function that failed ("ib_umem_get:
...") so a report points straight at the code; the system-call layer turns the
exception into -errno, as the real syscall return path does.
"""

from __future__ import annotations

import re

EPERM = 1
ENOENT = 2
ESRCH = 3
EINTR = 4
EIO = 5
ENXIO = 6
E2BIG = 7
EBADF = 9
EAGAIN = 11
EWOULDBLOCK = EAGAIN
ENOMEM = 12
EACCES = 13
EFAULT = 14
EBUSY = 16
EEXIST = 17
ENODEV = 19
EINVAL = 22
ENFILE = 23
EMFILE = 24
ENOTTY = 25
EFBIG = 27
ENOSPC = 28
ESPIPE = 29
ERANGE = 34
EDEADLK = 35
ENOSYS = 38
ENODATA = 61
EPROTO = 71
EBADMSG = 74
EOVERFLOW = 75
EPROTONOSUPPORT = 93
EOPNOTSUPP = 95
ETIMEDOUT = 110
EREMOTEIO = 121
ECANCELED = 125
ENOKEY = 126
EKEYREJECTED = 129
ENOTSUPP = 524  # kernel-internal (include/linux/errno.h), never seen by userspace

errorcode: dict[int, str] = {
    v: k for k, v in dict(globals()).items()
    if k.startswith("E") and isinstance(v, int) and k != "EWOULDBLOCK"
}

_FUNC_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*: ")


class KernelError(Exception):
    """A failure inside the emulated kernel: an errno and "function: reason"."""

    def __init__(self, errno: int, message: str):
        if errno not in errorcode:
            raise ValueError(f"KernelError: unknown errno {errno}")
        if not _FUNC_PREFIX.match(message):
            raise ValueError(f"KernelError: message must start with 'function: ', got {message!r}")
        super().__init__(errno, message)
        self.errno = errno
        self.message = message

    @property
    def name(self) -> str:
        """The errno's symbolic name, e.g. "EINVAL"."""
        return errorcode[self.errno]

    @property
    def function(self) -> str:
        """The function the message names."""
        return self.message.split(":", 1)[0]

    def __str__(self) -> str:
        return f"{self.message} (-{self.name})"


class KernelBug(Exception):
    """A kernel bug the model caught: a WARN when panic_on_warn is set, or a
    debug check (lockdep, use-after-free, deadlock) that the real kernel would
    hang or crash on.  Not an errno: nothing returns it to userspace."""

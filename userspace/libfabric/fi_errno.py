"""Mirrors rdma/fi_errno.h: fabric errno values.

Calls return 0 or a negative fabric errno (fi_mr(3) "Return Values").  The
values below 256 are the system's errno; libfabric's own start at
FI_ERRNO_OFFSET (256).
"""

from __future__ import annotations

import errno
import os

FI_SUCCESS = 0
FI_EPERM = errno.EPERM
FI_EIO = errno.EIO
FI_EBADF = errno.EBADF
FI_EAGAIN = errno.EAGAIN
FI_ENOMEM = errno.ENOMEM
FI_EACCES = errno.EACCES
FI_EFAULT = errno.EFAULT
FI_EBUSY = errno.EBUSY
FI_ENODEV = errno.ENODEV
FI_EINVAL = errno.EINVAL
FI_ENOSPC = errno.ENOSPC
FI_ENOSYS = errno.ENOSYS
FI_ENODATA = errno.ENODATA
FI_EOPNOTSUPP = errno.EOPNOTSUPP
FI_EKEYREJECTED = errno.EKEYREJECTED

FI_ERRNO_OFFSET = 256
FI_EOTHER = 256          # unspecified error
FI_ETOOSMALL = 257       # provided buffer is too small
FI_EOPBADSTATE = 258     # operation not permitted in the current state
FI_EAVAIL = 259
FI_EBADFLAGS = 260       # flags not supported
FI_ENOEQ = 261
FI_EDOMAIN = 262
FI_ENOCQ = 263
FI_ECRC = 264
FI_ETRUNC = 265
FI_ENOKEY = 266          # required key not available

_FI_STRINGS = {
    FI_EOTHER: "Unspecified error",
    FI_ETOOSMALL: "Provided buffer is too small",
    FI_EOPBADSTATE: "Operation not permitted in current state",
    FI_EAVAIL: "Error available",
    FI_EBADFLAGS: "Flags not supported",
    FI_ENOEQ: "Missing or unavailable event queue",
    FI_EDOMAIN: "Invalid resource domain",
    FI_ENOCQ: "Missing or unavailable completion queue",
    FI_ECRC: "CRC error",
    FI_ETRUNC: "Truncation error",
    FI_ENOKEY: "Required key not available",
}


def fi_strerror(errnum: int) -> str:
    """Mirrors fi_strerror(): the text of a fabric errno (either sign)."""
    n = abs(errnum)
    if n < FI_ERRNO_OFFSET:
        return os.strerror(n)
    return _FI_STRINGS.get(n, "Unknown error")

"""pyverbs' exceptions, as rdma-core's pyverbs/pyverbs_error.py defines them.

A failed verb raises PyverbsRDMAError with the verb's message and the errno; the
message then reads "Failed to allocate PD. Errno: 12, Cannot allocate memory", and
`error_code` holds the errno (tests compare it with errno.EOPNOTSUPP and the like).
A misuse pyverbs itself detects (a bad argument, an object used after close) is a
PyverbsUserError; anything else a PyverbsError.
"""

from __future__ import annotations

import os


class PyverbsError(Exception):
    """The base of pyverbs' exceptions: a message and, optionally, an errno."""

    def __init__(self, msg: str, error_code: int = -1) -> None:
        if error_code != -1:
            msg = f"{msg}. Errno: {error_code}, {os.strerror(error_code)}"
        super().__init__(msg)


class PyverbsRDMAError(PyverbsError):
    """A verb failed: `error_code` is its errno."""

    def __init__(self, msg: str, error_code: int = -1) -> None:
        super().__init__(msg, error_code)
        self._error_code = error_code

    @property
    def error_code(self) -> int:
        return self._error_code


class PyverbsUserError(PyverbsError):
    """pyverbs refused the call before any verb ran (a bad argument, a closed object)."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)

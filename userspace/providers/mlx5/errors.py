"""ProviderError: how the emulated libmlx5 reports a failure.

rdma-core sets errno and returns NULL or a negative value; here the failing
function raises ProviderError(errno, "function: reason"), like the kernel
side's KernelError, so a test can assert both the errno and who failed.  It
is an OSError, so callers that only care about errno can treat it as one.
"""

from __future__ import annotations

import errno as _errno
import re

_FUNC_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*: ")


class ProviderError(OSError):
    """A libmlx5 failure: `errno` is set, the message starts with the function name."""

    def __init__(self, errno: int, message: str):
        if errno not in _errno.errorcode:
            raise ValueError(f"ProviderError: unknown errno {errno}")
        if not _FUNC_PREFIX.match(message):
            raise ValueError(f"ProviderError: message must start with 'function: ', "
                             f"got {message!r}")
        super().__init__(errno, message)
        self.message = message

    @property
    def name(self) -> str:
        """The errno's symbolic name, e.g. "EINVAL"."""
        return _errno.errorcode[self.errno]

    @property
    def function(self) -> str:
        """The function the message names."""
        return self.message.split(":", 1)[0]

    def __str__(self) -> str:
        return f"{self.message} ({self.name})"

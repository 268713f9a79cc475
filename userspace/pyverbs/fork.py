"""pyverbs.fork: ibv_fork_init() and ibv_is_fork_initialized().

The emulated kernel pins user memory with FOLL_PIN, and Linux since 5.13 copies a
pinned anonymous page into the child at fork instead of sharing it, so registered
memory stays the parent's without MADV_DONTFORK: rdma-core then reports fork
support as not needed (IBV_FORK_UNNEEDED) and ibv_fork_init() does nothing.
"""

from __future__ import annotations

import userspace.pyverbs.enums as e


def fork_init() -> None:
    """ibv_fork_init(): nothing to set up (see the module docstring)."""


def is_fork_initialized() -> int:
    """ibv_is_fork_initialized(): IBV_FORK_UNNEEDED."""
    return e.IBV_FORK_UNNEEDED

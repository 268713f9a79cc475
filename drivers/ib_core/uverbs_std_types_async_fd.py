"""Mirrors drivers/infiniband/core/uverbs_std_types_async_fd.c: the async event file.

GET_CONTEXT hands the process a second file besides uverbsN: the anonymous
"[infinibandevent]" file its async events would be read from.  A definition below
uverbs_cmd (which creates it) and uverbs_main (the device files).
"""

from __future__ import annotations

from typing import Any

from kernel_model.current import current
from kernel_model.fs import O_RDWR, cdev, file, file_operations, inode


def _async_release(ino: inode, filp: file) -> None:
    """ib_uverbs_async_event_close(): nothing queued in this model."""


ASYNC_EVENT_FOPS = file_operations(release=_async_release)


def ib_uverbs_alloc_async_event_file(ufile: Any) -> int:
    """Mirrors uverbs_alloc_async_event_file() + the fd GET_CONTEXT returns:
    an anonymous "[infinibandevent]" file installed in the caller's fd table.

    EMU: async events are never delivered; the file exists so fds and their
    close order are as on a real system.
    """
    t = current()
    fd = t.files.alloc_fd()
    f = file(ASYNC_EVENT_FOPS, "anon_inode:[infinibandevent]", inode(cdev(ASYNC_EVENT_FOPS)),
             O_RDWR, 3, ufile)
    t.files.fd_install(fd, f)
    return fd

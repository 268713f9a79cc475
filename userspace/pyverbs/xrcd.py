"""pyverbs.xrcd: XRC domains (ibv_open_xrcd / ibv_close_xrcd).

XRCD(ctx, XRCDInitAttr(comp_mask, oflags, fd)) opens the XRC domain of the file
`fd` (created with O_CREAT when there is none yet), or a private one for fd -1.
XRC SRQs (SrqInitAttrEx with srq_type IBV_SRQT_XRC and xrcd) and XRC receive QPs
(QPInitAttrEx with xrcd) are made in it and closed before it.

# EMU: the fd a program passes is one of the real (host) Python process, as
# rdma-core's tests open a real temporary file; the emulated process has its own
# fd table.  The face opens the same path in the emulated process (O_RDONLY, with
# O_CREAT: a regular file of the emulated VFS, kernel_model/fs.py) and passes
# that fd; it is closed with the XRCD.  Two XRCDs opened on the same path share
# the domain, as two processes opening one file do.
"""

from __future__ import annotations

import errno
import os

from userspace.libibverbs import verbs as v
from userspace.pyverbs import host
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy
from userspace.pyverbs.device import Context
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError

O_CREAT = 0o100


class XRCDInitAttr(PyverbsObject):
    """Mirrors pyverbs' XRCDInitAttr (struct ibv_xrcd_init_attr)."""

    def __init__(self, comp_mask: int, oflags: int, fd: int) -> None:
        super().__init__()
        self.comp_mask, self.oflags, self.fd = comp_mask, oflags, fd


def _emulated_fd(fd: int) -> int:
    """The emulated process's fd for the host file `fd` (see the EMU note)."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:                      # no such fd: what fdget() answers, EBADF
        raise PyverbsRDMAError("Failed to allocate XRCD", errno.EBADF) from None
    efd = host.current_process().open(path, os.O_RDONLY | O_CREAT)
    if efd < 0:
        raise PyverbsRDMAError("Failed to allocate XRCD", -efd)
    return efd


class XRCD(PyverbsCM):
    """Mirrors pyverbs' XRCD: opened on a Context, closed before it (its XRC SRQs
    and QPs first)."""

    def __init__(self, context: Context, init_attr: XRCDInitAttr) -> None:
        super().__init__()
        self._efd = -1
        fd = init_attr.fd
        if init_attr.comp_mask & v.IBV_XRCD_INIT_ATTR_FD and fd != -1:
            self._efd = fd = _emulated_fd(fd)
        attr = v.ibv_xrcd_init_attr(init_attr.comp_mask, fd, init_attr.oflags)
        try:
            self.xrcd = call("Failed to allocate XRCD", v.ibv_open_xrcd, context.ctx, attr)
        except PyverbsRDMAError:
            self._close_efd()
            raise
        self._created()
        self.ctx = context
        context.add_ref(self)
        self.logger.debug("XRCD: Allocated ibv_xrcd")

    @property
    def handle(self) -> int:
        return self.xrcd.handle

    def _close_efd(self) -> None:
        if self._efd >= 0:
            host.current_process().close(self._efd)
            self._efd = -1

    def _free(self) -> None:
        self.logger.debug("Closing XRCD")
        try:
            destroy("Failed to dealloc XRCD", v.ibv_close_xrcd, self.xrcd)
        finally:
            self._close_efd()

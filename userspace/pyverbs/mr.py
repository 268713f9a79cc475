"""pyverbs.mr: memory regions (ibv_reg_mr) over memory of the host's process.

MR(pd, length, access) maps `length` bytes of its own in the process (page aligned,
zeroed) and registers them; with `address` it registers memory the caller owns.
write()/read() store and load through the process's page tables, which is where the
HCA's DMA finds them.
"""

from __future__ import annotations

import resource
from typing import Any

import userspace.pyverbs.enums as e
from userspace import libc
from userspace.libibverbs import verbs as v
from userspace.pyverbs.base import PyverbsCM, call, destroy, unsupported
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsUserError
from userspace.pyverbs.utils import rereg_error_to_str  # noqa: F401 - pyverbs re-exports it

HUGE_PAGE_SIZE = 0x200000


class MR(PyverbsCM):
    """Mirrors pyverbs' MR: a buffer and its registration; close() frees both."""

    def __init__(self, creator: PD, length: int = 0, access: int = 0, address: int | None = None,
                 implicit: bool = False, **kwargs: Any) -> None:
        super().__init__()
        if implicit or kwargs.get("handle") is not None:
            raise unsupported("Failed to register an implicit MR" if implicit
                              else "Failed to import MR")
        if access & e.IBV_ACCESS_ON_DEMAND:
            raise unsupported("Failed to register an ODP MR")
        self.pd = creator
        self.proc = creator.ctx.proc
        self._owned = address is None
        if address is None:
            address = libc.posix_memalign(self.proc, resource.getpagesize(), max(length, 1))
        self._buf, self._length = address, length
        try:
            self.mr = call("Failed to register a MR", v.ibv_reg_mr, creator.pd, address, length,
                           access)
        except BaseException:
            if self._owned:
                libc.free(self.proc, address, max(length, 1))
            raise
        creator.add_ref(self)
        self._created()

    @property
    def buf(self) -> int:
        return self._buf

    @property
    def length(self) -> int:
        return self._length

    @property
    def lkey(self) -> int:
        return self.mr.lkey

    @property
    def rkey(self) -> int:
        return self.mr.rkey

    @property
    def handle(self) -> int:
        return self.mr.handle

    def write(self, data: str | bytes, length: int, offset: int = 0) -> None:
        """Store `length` bytes of `data` (str is encoded) at `offset` of the buffer."""
        self._check_open("MR.write")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self.proc.store(self._buf + offset, raw[:length])

    def read(self, length: int, offset: int) -> bytes:
        """Load `length` bytes at `offset` of the buffer."""
        self._check_open("MR.read")
        if offset < 0:
            raise PyverbsUserError(f"Invalid offset {offset}")
        return self.proc.load(self._buf + offset, length)

    def rereg(self, flags: int, pd: PD | None = None, addr: int = 0, length: int = 0,
              access: int = 0) -> None:
        raise unsupported("Failed to rereg MR")

    def unimport(self) -> None:
        raise unsupported("Failed to unimport MR")

    def _free(self) -> None:
        self.logger.debug("Closing MR")
        destroy("Failed to dereg MR", v.ibv_dereg_mr, self.mr)
        if self._owned:
            libc.free(self.proc, self._buf, max(self._length, 1))

    def __str__(self) -> str:
        return f"MR\nlkey: {self.lkey}\nrkey: {self.rkey}\nlength: {self.length}\n"


class MWBindInfo(PyverbsCM):
    """Mirrors pyverbs' MWBindInfo (struct ibv_mw_bind_info)."""

    def __init__(self, mr: MR, addr: int, length: int, mw_access_flags: int) -> None:
        super().__init__()
        self.mr, self.addr, self.length, self.mw_access_flags = mr, addr, length, mw_access_flags


class MWBind(PyverbsCM):
    """Mirrors pyverbs' MWBind (struct ibv_mw_bind)."""

    def __init__(self, info: MWBindInfo, send_flags: int, wr_id: int = 0) -> None:
        super().__init__()
        self.info, self.send_flags, self.wr_id = info, send_flags, wr_id


class MW(PyverbsCM):
    """Mirrors pyverbs' MW (ibv_alloc_mw): memory windows are not emulated yet."""

    def __init__(self, pd: PD, mw_type: int) -> None:
        super().__init__()
        raise unsupported("Failed to allocate MW")


class DMMR(MR):
    """Mirrors pyverbs' DMMR (ibv_reg_dm_mr): no device memory in the model."""

    def __init__(self, pd: PD, length: int, access: int, dm: Any, offset: int) -> None:
        PyverbsCM.__init__(self)
        raise unsupported("Failed to register a device MR")


class DmaBufMR(MR):
    """Mirrors pyverbs' DmaBufMR (ibv_reg_dmabuf_mr over a GPU's dma-buf): not yet."""

    def __init__(self, pd: PD, length: int, access: int, dmabuf: Any = None, offset: int = 0,
                 gpu: int = 0, gtt: int = 0) -> None:
        PyverbsCM.__init__(self)
        raise unsupported("Failed to register a dma-buf MR")


def mwtype2str(mw_type: int) -> str:
    return {1: "IBV_MW_TYPE_1", 2: "IBV_MW_TYPE_2"}.get(mw_type, "Unknown")

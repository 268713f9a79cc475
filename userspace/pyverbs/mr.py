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
from userspace.pyverbs.base import PyverbsCM, call, destroy, set_errno
from userspace.pyverbs.dmabuf import DmaBuf
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.utils import rereg_error_to_str

HUGE_PAGE_SIZE = 0x200000
SIZE_MAX = (1 << 64) - 1


class MR(PyverbsCM):
    """Mirrors pyverbs' MR: a buffer and its registration; close() frees both."""

    _is_imported = False

    def __init__(self, creator: PD, length: int = 0, access: int = 0, address: int | None = None,
                 implicit: bool = False, **kwargs: Any) -> None:
        super().__init__()
        if kwargs.get("handle") is not None:
            self._import(creator, kwargs["handle"], address)
            return
        self.pd = creator
        self.proc = creator.ctx.proc
        # implicit: ibv_reg_mr(pd, NULL, SIZE_MAX, access) - the whole address space;
        # the buffer (given, or allocated when length > 0) is only what buf names
        self._owned = address is None and (length > 0 or not implicit)
        if self._owned:
            address = libc.posix_memalign(self.proc, resource.getpagesize(), max(length, 1))
        self._buf, self._length = address or 0, length
        try:
            if implicit:
                self.mr = call("Failed to register a MR", v.ibv_reg_mr, creator.pd, 0,
                               SIZE_MAX, access)
            else:
                self.mr = call("Failed to register a MR", v.ibv_reg_mr, creator.pd, address,
                               length, access)
        except BaseException:
            if self._owned:
                libc.free(self.proc, address, max(length, 1))
            raise
        creator.add_ref(self)
        self._created()

    def _import(self, pd: PD, handle: int, address: int | None) -> None:
        """MR(pd, handle=h, address=a): ibv_import_mr() of the MR of handle h of the PD's
        context; its buffer is `a` (the imported MR has no address of its own) and its
        length the kernel's.  Closing it does not deregister the MR."""
        self.pd, self.proc = pd, pd.ctx.proc
        self.mr = call("Failed to import MR", v.ibv_import_mr, pd.pd, handle)
        self._is_imported, self._owned = True, False
        self._buf, self._length = address or 0, self.mr.length
        pd.add_ref(self)
        self._created()

    def unimport(self) -> None:
        """ibv_unimport_mr(), then close() (the MR stays its creator's)."""
        self._check_open("MR.unimport")
        v.ibv_unimport_mr(self.mr)
        self.close()

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
        """Mirrors pyverbs' MR.rereg(): ibv_rereg_mr(); PyverbsRDMAError('Failed to rereg
        MR: <the error code's name>', errno) on failure.  With CHANGE_TRANSLATION the MR
        covers [addr, addr + length) from now on (its own buffer, if it had one, is
        freed); with CHANGE_PD it belongs to `pd`.  lkey/rkey are the kernel's new ones."""
        self._check_open("MR.rereg")
        if flags & e.IBV_REREG_MR_CHANGE_PD and pd is None:
            raise PyverbsUserError("Failed to rereg MR: CHANGE_PD needs a PD")
        ret, err = v.ibv_rereg_mr(self.mr, flags, pd.pd if pd is not None else None, addr,
                                  length, access)
        if ret != 0:
            set_errno(err)
            raise PyverbsRDMAError(f"Failed to rereg MR: {rereg_error_to_str(ret)}", err)
        if flags & e.IBV_REREG_MR_CHANGE_TRANSLATION:
            if self._owned:
                libc.free(self.proc, self._buf, max(self._length, 1))
            self._buf, self._length, self._owned = addr, length, False
        if flags & e.IBV_REREG_MR_CHANGE_PD and pd is not None:
            self.pd.remove_ref(self)
            self.pd = pd
            pd.add_ref(self)

    def _free(self) -> None:
        self.logger.debug("Closing MR")
        if self._is_imported:
            return
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

    def to_c(self) -> v.ibv_mw_bind_info:
        return v.ibv_mw_bind_info(self.mr.mr if self.mr is not None else None, self.addr,
                                  self.length, self.mw_access_flags)


class MWBind(PyverbsCM):
    """Mirrors pyverbs' MWBind (struct ibv_mw_bind)."""

    def __init__(self, info: MWBindInfo, send_flags: int, wr_id: int = 0) -> None:
        super().__init__()
        self.info, self.send_flags, self.wr_id = info, send_flags, wr_id

    def to_c(self) -> v.ibv_mw_bind:
        return v.ibv_mw_bind(self.wr_id, self.send_flags, self.info.to_c())


class MW(PyverbsCM):
    """Mirrors pyverbs' MW (ibv_alloc_mw): a memory window of type 1 (bound with
    QP.bind_mw) or 2 (bound by a BIND_MW work request); close() deallocates it."""

    def __init__(self, pd: PD, mw_type: int) -> None:
        super().__init__()
        self.mw = call("Failed to allocate MW", v.ibv_alloc_mw, pd.pd, mw_type)
        self.pd = pd
        pd.add_ref(self)
        self._created()
        self.logger.debug(f"Allocated memory window of type {mwtype2str(mw_type)}")

    @property
    def rkey(self) -> int:
        return self.mw.rkey

    @property
    def handle(self) -> int:
        return self.mw.handle

    @property
    def type(self) -> int:
        return self.mw.type

    def _free(self) -> None:
        self.logger.debug("Closing MW")
        destroy("Failed to dealloc MW", v.ibv_dealloc_mw, self.mw)

    def __str__(self) -> str:
        return f"MW\nrkey: {self.rkey}\nhandle: {self.handle}\ntype: {mwtype2str(self.type)}\n"


class DMMR(MR):
    """Mirrors pyverbs' DMMR (ibv_reg_dm_mr): a zero-based MR over a DM (buf is 0);
    write/read copy to and from the DM."""

    def __init__(self, pd: PD, length: int, access: int, dm: Any, offset: int) -> None:
        PyverbsCM.__init__(self)
        length, offset = int(length), int(offset)
        self.pd, self.dm, self.proc = pd, dm, pd.ctx.proc
        self._owned, self._buf, self._length = False, 0, length
        self.mr = call(f"Failed to register a device MR. length: {length}, access flags: "
                       f"{access}", v.ibv_reg_dm_mr, pd.pd, dm.dm, offset, length, access)
        pd.add_ref(self)
        dm.add_ref(self)
        self._created()

    def write(self, data: str | bytes, length: int, offset: int = 0) -> None:
        self.dm.copy_to_dm(offset, data, length)

    def read(self, length: int, offset: int) -> bytes:
        return self.dm.copy_from_dm(offset, length)


class DmaBufMR(MR):
    """Mirrors pyverbs' DmaBufMR: ibv_reg_dmabuf_mr(pd, offset, length, iova=offset, fd,
    access) over `dmabuf` (a DmaBuf or a dma-buf fd); without one, a DmaBuf of
    length + offset bytes on `gpu` (GTT with `gtt`) is allocated and closed with the
    MR.  buf is 0 (the MR's addresses are its iova, the offset).  write/read map the
    render node at the buffer's mmap offset (MAP_SHARED), copy, unmap."""

    _IS_DMABUF_MR = True

    def __init__(self, pd: PD, length: int, access: int, dmabuf: Any = None, offset: int = 0,
                 gpu: int = 0, gtt: int = 0) -> None:
        PyverbsCM.__init__(self)
        self.pd, self.proc = pd, pd.ctx.proc
        self._owned, self._buf, self._length = False, 0, length
        self._internal = dmabuf is None
        if dmabuf is None:
            dmabuf = DmaBuf(length + offset, gpu, gtt)
        fd = dmabuf.fd if isinstance(dmabuf, DmaBuf) else dmabuf
        try:
            self.mr = call(f"Failed to register a dma-buf MR. length: {length}, access flags: "
                           f"{access}", v.ibv_reg_dmabuf_mr, pd.pd, offset, length, offset, fd,
                           access)
        except BaseException:
            if self._internal:
                dmabuf.close()      # pyverbs' DmaBuf goes with the failed object
            raise
        self.dmabuf, self.offset = dmabuf, offset
        pd.add_ref(self)
        if isinstance(dmabuf, DmaBuf):
            dmabuf.add_ref(self)
        self._created()
        self.logger.debug(f"Registered dma-buf ibv_mr. Length: {length}, access flags {access}")

    def _map(self, length: int, off: int) -> int:
        addr = self.proc.mmap(0, length + off, libc.PROT_READ | libc.PROT_WRITE,
                              libc.MAP_SHARED, self.dmabuf.drm_fd, self.dmabuf.map_offset)
        if addr < 0:
            set_errno(-addr)
            raise PyverbsError(f"Failed to map dma-buf of size {length}")
        return addr

    def write(self, data: str | bytes, length: int, offset: int = 0) -> None:
        """Write `length` bytes of data at `offset` of the MR (its dma-buf)."""
        self._check_open("DmaBufMR.write")
        raw = data.encode() if isinstance(data, str) else bytes(data)
        off = offset + self.offset
        addr = self._map(length, off)
        try:
            self.proc.store(addr + off, raw[:length])
        finally:
            self.proc.munmap(addr, length + off)

    def read(self, length: int, offset: int) -> bytes:
        """Read `length` bytes at `offset` of the MR (its dma-buf)."""
        self._check_open("DmaBufMR.read")
        off = offset + self.offset
        addr = self._map(length, off)
        try:
            return self.proc.load(addr + off, length)
        finally:
            self.proc.munmap(addr, length + off)

    def _free(self) -> None:
        self.logger.debug("Closing dma-buf MR")
        destroy("Failed to dereg dma-buf MR", v.ibv_dereg_mr, self.mr)
        if self._internal:
            self.dmabuf.close()
        self.dmabuf = None


def mwtype2str(mw_type: int) -> str:
    return {1: "IBV_MW_TYPE_1", 2: "IBV_MW_TYPE_2"}.get(mw_type, "Unknown")

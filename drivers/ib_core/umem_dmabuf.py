"""Mirrors drivers/infiniband/core/umem_dmabuf.c: a umem backed by a dma-buf.

The upstream alternative to peer memory: instead of a
peer client pinning a GPU's memory behind ib_core's back, the GPU driver
exports the memory as a dma-buf and the RDMA driver imports it:

    ib_umem_dmabuf_get(dev, offset, size, fd, access, ops)
                        dma_buf_get(fd); dma_buf_dynamic_attach(..., ops, umem)
    ib_umem_dmabuf_map_pages(umem)     (dma_resv held) dma_buf_map_attachment,
                        the sg table trimmed to [offset, offset + size) at
                        PAGE_SIZE granularity, as fix_peer_sgls does
    ... exporter: dma_buf_move_notify -> ops->move_notify(attach): the MR owner
        stops the device's access and calls ib_umem_dmabuf_unmap_pages ...
    ib_umem_release -> ib_umem_dmabuf_release: unmap, detach, dma_buf_put

Errors: EINVAL when offset + size wraps, the range passes the buffer's end,
or it holds no page; EINVAL for importer ops without move_notify; EBADF /
EINVAL from dma_buf_get for a bad fd or one that is not a dma-buf; what the
exporter's attach returns (EOPNOTSUPP from a GPU exporter that needs
peer-to-peer the importer does not allow).
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_umem import ib_umem
from drivers.ib_core.ib_verbs import ib_access_writable
from kernel_model.dma import DMA_BIDIRECTIONAL
from kernel_model.dma_buf import (
    dma_buf_attach_ops,
    dma_buf_detach,
    dma_buf_dynamic_attach,
    dma_buf_get,
    dma_buf_map_attachment,
    dma_buf_put,
    dma_buf_unmap_attachment,
)
from kernel_model.errno import EINVAL, KernelError
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced


class ib_umem_dmabuf(ib_umem):
    """Mirrors struct ib_umem_dmabuf: the umem, its attachment and current mapping."""

    def __init__(self, ibdev: Any, machine: Any):
        super().__init__(ibdev, machine)
        self.is_dmabuf = True
        self.attach: Any = None
        self.sgt: Any = None                 # the exporter's mapping, while mapped
        self.private: Any = None             # the MR

    @property
    def trace_name(self) -> str:
        return f"dmabuf umem {self.address:#x}+{self.length:#x}"


@traced
def ib_umem_dmabuf_get(device: Any, offset: int, size: int, fd: int, access: int,
                       ops: dma_buf_attach_ops) -> ib_umem_dmabuf:
    """Mirrors ib_umem_dmabuf_get(): attach to the dma-buf behind fd (not mapped yet)."""
    end = offset + size
    if end < offset or size == 0 or end >= 1 << 64:
        raise KernelError(EINVAL, f"ib_umem_dmabuf_get: offset {offset:#x} size {size:#x}")
    if ops is None or ops.move_notify is None:
        raise KernelError(EINVAL, "ib_umem_dmabuf_get: importer ops without move_notify")
    dmabuf = dma_buf_get(fd)
    try:
        if dmabuf.size < end:
            raise KernelError(EINVAL, f"ib_umem_dmabuf_get: [{offset:#x}, {end:#x}) past the "
                              f"buffer's {dmabuf.size:#x} bytes")
        umem = kmalloc_obj(ib_umem_dmabuf(device, device.dma_device.machine))
        umem.length, umem.address = size, offset
        umem.writable = ib_access_writable(access)
        try:
            umem.attach = dma_buf_dynamic_attach(dmabuf, device.dma_device, ops, umem)
        except KernelError:
            kfree(umem)
            raise
    except KernelError:
        dma_buf_put(dmabuf)
        raise
    return umem


@traced
def ib_umem_dmabuf_map_pages(umem: ib_umem_dmabuf) -> int:
    """Mirrors ib_umem_dmabuf_map_pages(): with the dma_resv held, map the attachment
    and take the entries covering [offset, offset + size), the first and last trimmed
    to PAGE_SIZE boundaries; 0 (already mapped: 0 too)."""
    if umem.sgt is not None:
        return 0
    sgt = dma_buf_map_attachment(umem.attach, DMA_BIDIRECTIONAL)
    ps = umem.sgt_append.sgt.machine.page_size
    start = umem.address & ~(ps - 1)
    end = -(-(umem.address + umem.length) // ps) * ps
    out = umem.sgt_append.sgt
    entries: list[tuple[int, int]] = []
    pos = 0
    for i in range(sgt.nents):
        a, n = int(sgt.dma_addr.view[i]), int(sgt.dma_len.view[i])
        lo, hi = max(pos, start), min(pos + n, end)
        if lo < hi:
            entries.append((a + (lo - pos), hi - lo))
        pos += n
    out.ensure_capacity(len(entries))
    for i, (a, n) in enumerate(entries):
        out.dma_addr.view[i], out.dma_len.view[i], out.sg_len.view[i] = a, n, n
        out.sg_pfn.view[i], out.sg_off.view[i] = 0, 0
    out.nents = out.orig_nents = len(entries)
    umem.sgt = sgt
    return 0


@traced
def ib_umem_dmabuf_unmap_pages(umem: ib_umem_dmabuf) -> None:
    """Mirrors ib_umem_dmabuf_unmap_pages(): with the dma_resv held, give the mapping
    back (the umem's table empties)."""
    if umem.sgt is None:
        return
    out = umem.sgt_append.sgt
    out.nents = out.orig_nents = 0
    dma_buf_unmap_attachment(umem.attach, umem.sgt, DMA_BIDIRECTIONAL)
    umem.sgt = None


@traced
def ib_umem_dmabuf_release(umem: ib_umem_dmabuf) -> None:
    """Mirrors ib_umem_dmabuf_release(): unmap under the dma_resv, detach, put."""
    dmabuf = umem.attach.dmabuf
    mutex_lock(dmabuf.resv)
    ib_umem_dmabuf_unmap_pages(umem)
    mutex_unlock(dmabuf.resv)
    dma_buf_detach(dmabuf, umem.attach)
    dma_buf_put(dmabuf)
    kfree(umem)

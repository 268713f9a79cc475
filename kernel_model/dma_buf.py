"""Mirrors drivers/dma-buf/dma-buf.c, reduced: sharing a device's memory between drivers.

An exporter (a GPU driver) wraps a buffer in a dma_buf and hands userspace a
file descriptor; an importer (ib_core's umem_dmabuf) gets the dma_buf from the
fd, attaches its device, and maps the attachment to get DMA addresses:

    dmabuf = dma_buf_export(exp_info)         exporter: ops, size, priv
    fd     = dma_buf_fd(dmabuf, O_CLOEXEC)
    ...
    dmabuf = dma_buf_get(fd)                  importer: a reference
    attach = dma_buf_dynamic_attach(dmabuf, dev, importer_ops, priv)
    dma_resv_lock(dmabuf.resv)
    sgt    = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL)
    dma_resv_unlock(dmabuf.resv)
    ...
    dma_buf_move_notify(dmabuf)               exporter, resv held: the buffer moves;
                                              every importer's move_notify runs and
                                              must stop using the old mapping
    dma_buf_detach(dmabuf, attach); dma_buf_put(dmabuf)

A dynamic importer (importer_ops given) must supply move_notify and map and
unmap only with the reservation lock held; an exporter that cannot move its
buffer (no pin op, a "static" exporter) never calls move_notify.  The buffer
goes when the last reference to its file does (the exporter's release).

# EMU: the reservation object (dma_resv, a ww_mutex plus fences) is a mutex with
# no fences; attachments map on demand only (the core's caching of a static
# exporter's mapping for a dynamic importer is not modelled).
"""

from __future__ import annotations

from typing import Any

import attrs

from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.fs import O_RDWR, cdev, file, file_operations, fput, inode
from kernel_model.lockdep import lockdep_assert_held
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced


@attrs.define(eq=False)
class dma_buf_ops:
    """Mirrors struct dma_buf_ops (the exporter's)."""

    map_dma_buf: Any = None
    unmap_dma_buf: Any = None
    release: Any = None
    attach: Any = None
    detach: Any = None
    pin: Any = None
    unpin: Any = None


@attrs.define(eq=False)
class dma_buf_attach_ops:
    """Mirrors struct dma_buf_attach_ops (the importer's)."""

    move_notify: Any = None
    allow_peer2peer: bool = False


class dma_buf:
    """Mirrors struct dma_buf."""

    def __init__(self, size: int, ops: dma_buf_ops, priv: Any, exp_name: str):
        self.size, self.ops, self.priv, self.exp_name = size, ops, priv, exp_name
        self.resv = mutex_init("dma_resv")
        self.attachments: list[dma_buf_attachment] = []
        self.file: file | None = None

    def __repr__(self) -> str:
        return f"dma_buf {self.exp_name} {self.size:#x} bytes, {len(self.attachments)} attached"


class dma_buf_attachment:
    """Mirrors struct dma_buf_attachment."""

    def __init__(self, dmabuf: dma_buf, dev: Any, importer_ops: dma_buf_attach_ops | None,
                 importer_priv: Any):
        self.dmabuf, self.dev = dmabuf, dev
        self.importer_ops, self.importer_priv = importer_ops, importer_priv
        self.peer2peer = bool(importer_ops and importer_ops.allow_peer2peer)
        self.priv: Any = None

    def __repr__(self) -> str:
        return f"dma_buf_attachment of {self.dmabuf.exp_name}"


def dma_buf_is_dynamic(dmabuf: dma_buf) -> bool:
    """Mirrors dma_buf_is_dynamic(): can the exporter move the buffer (has pin)?"""
    return dmabuf.ops.pin is not None


def _release(inode_: Any, f: file) -> int:
    """dma_buf_file_release -> dma_buf_release: the exporter's release, then free."""
    dmabuf = f.private_data
    if dmabuf.attachments:
        current().machine.report_bug("dma_buf_release", f"{dmabuf} released while attached")
    dmabuf.ops.release(dmabuf)
    kfree(dmabuf)
    return 0


DMA_BUF_FOPS = file_operations(release=_release)


@traced
def dma_buf_export(exp_name: str, ops: dma_buf_ops, size: int, priv: Any,
                   resv: Any = None) -> dma_buf:
    """Mirrors dma_buf_export(): EINVAL without map/unmap/release, with only one of
    pin/unpin, or for size 0.  `resv` (exp_info.resv): the exporter's reservation
    object, shared with the buffer (a GEM object's); without it the buffer has its own."""
    if ops.map_dma_buf is None or ops.unmap_dma_buf is None or ops.release is None or \
            (ops.pin is None) != (ops.unpin is None) or size <= 0:
        raise KernelError(EINVAL, f"dma_buf_export: {exp_name}: bad ops or size {size}")
    dmabuf = kmalloc_obj(dma_buf(size, ops, priv, exp_name))
    if resv is not None:
        dmabuf.resv = resv
    dmabuf.file = file(DMA_BUF_FOPS, "anon_inode:dmabuf", inode(cdev(DMA_BUF_FOPS)), O_RDWR,
                       3, dmabuf)
    return dmabuf


@traced
def dma_buf_fd(dmabuf: dma_buf, flags: int) -> int:
    """Mirrors dma_buf_fd(): install the buffer's file in the caller's fd table."""
    t = current()
    fd = t.files.alloc_fd()
    t.files.fd_install(fd, dmabuf.file)
    return fd


@traced
def dma_buf_get(fd: int) -> dma_buf:
    """Mirrors dma_buf_get(): a reference to the dma_buf behind fd; EBADF for no
    file, EINVAL for a file that is not a dma-buf."""
    f = current().files.fget(fd)               # EBADF for no such fd
    if f.f_op is not DMA_BUF_FOPS:
        fput(f)
        raise KernelError(EINVAL, f"dma_buf_get: fd {fd} is not a dma-buf")
    return f.private_data


def dma_buf_put(dmabuf: dma_buf) -> None:
    """Mirrors dma_buf_put(): drop a reference (the last one releases the buffer)."""
    fput(dmabuf.file)


@traced
def dma_buf_dynamic_attach(dmabuf: dma_buf, dev: Any, importer_ops: dma_buf_attach_ops | None,
                           importer_priv: Any) -> dma_buf_attachment:
    """Mirrors dma_buf_dynamic_attach(): EINVAL for importer ops without move_notify;
    the exporter's attach may refuse (its errno)."""
    if importer_ops is not None and importer_ops.move_notify is None:
        current().machine.report_bug("dma_buf_dynamic_attach", "importer_ops without "
                                     "move_notify")
        raise KernelError(EINVAL, "dma_buf_dynamic_attach: no move_notify")
    attach = kmalloc_obj(dma_buf_attachment(dmabuf, dev, importer_ops, importer_priv))
    if dmabuf.ops.attach is not None:
        try:
            dmabuf.ops.attach(dmabuf, attach)
        except KernelError:
            kfree(attach)
            raise
    mutex_lock(dmabuf.resv)
    dmabuf.attachments.append(attach)
    mutex_unlock(dmabuf.resv)
    return attach


@traced
def dma_buf_detach(dmabuf: dma_buf, attach: dma_buf_attachment) -> None:
    """Mirrors dma_buf_detach()."""
    mutex_lock(dmabuf.resv)
    dmabuf.attachments.remove(attach)
    mutex_unlock(dmabuf.resv)
    if dmabuf.ops.detach is not None:
        dmabuf.ops.detach(dmabuf, attach)
    kfree(attach)


@traced
def dma_buf_pin(attach: dma_buf_attachment) -> None:
    """Mirrors dma_buf_pin(): the exporter keeps the buffer where it is (resv held)."""
    lockdep_assert_held(attach.dmabuf.resv)   # dma_resv_assert_held
    if attach.dmabuf.ops.pin is not None:
        attach.dmabuf.ops.pin(attach)


@traced
def dma_buf_unpin(attach: dma_buf_attachment) -> None:
    """Mirrors dma_buf_unpin()."""
    lockdep_assert_held(attach.dmabuf.resv)   # dma_resv_assert_held
    if attach.dmabuf.ops.unpin is not None:
        attach.dmabuf.ops.unpin(attach)


@traced
def dma_buf_map_attachment(attach: dma_buf_attachment, direction: int) -> Any:
    """Mirrors dma_buf_map_attachment(): the exporter's sg table for this device.  A
    dynamic importer must hold the reservation lock."""
    if attach.importer_ops is not None:
        lockdep_assert_held(attach.dmabuf.resv)   # dma_resv_assert_held
    return attach.dmabuf.ops.map_dma_buf(attach, direction)


@traced
def dma_buf_unmap_attachment(attach: dma_buf_attachment, sgt: Any, direction: int) -> None:
    """Mirrors dma_buf_unmap_attachment()."""
    if attach.importer_ops is not None:
        lockdep_assert_held(attach.dmabuf.resv)   # dma_resv_assert_held
    attach.dmabuf.ops.unmap_dma_buf(attach, sgt, direction)


@traced
def dma_buf_move_notify(dmabuf: dma_buf) -> None:
    """Mirrors dma_buf_move_notify(): the exporter (resv held) is moving the buffer;
    each dynamic importer's move_notify must drop its mapping."""
    lockdep_assert_held(dmabuf.resv)   # dma_resv_assert_held
    for attach in list(dmabuf.attachments):
        if attach.importer_ops is not None:
            attach.importer_ops.move_notify(attach)

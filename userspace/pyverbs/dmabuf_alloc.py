"""pyverbs' dmabuf_alloc.c: a GPU buffer exported as a dma-buf, through the DRM render
node, in the emulated process (its system calls).

    drm_open(unit)      open /dev/dri/renderD(128 + unit) O_RDWR; DRM_IOCTL_VERSION
                        must name "amdgpu" (anything else: EOPNOTSUPP)
    drm_alloc_buf       DRM_IOCTL_AMDGPU_GEM_CREATE (VRAM + CPU_ACCESS_REQUIRED, or
                        GTT + CPU_GTT_USWC), then DRM_IOCTL_PRIME_HANDLE_TO_FD with
                        O_RDWR (the handle is closed again if that fails)
    drm_map_buf         DRM_IOCTL_AMDGPU_GEM_MMAP: the offset to mmap the render
                        node fd at
    dmabuf_free         close the dma-buf fd, DRM_IOCTL_GEM_CLOSE, close the node

As in C, a failure returns None and leaves the errno (base.set_errno) for
PyverbsRDMAErrno; the steps done are undone.

# EMU: the i915 branch (DRM_IOCTL_I915_GEM_CREATE / MMAP_GTT) is not here: the
# emulated hosts have no Intel GPU, so a render node naming i915 cannot occur.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

from kernel_model.uapi import drm as uapi
from userspace import libc
from userspace.pyverbs.base import set_errno

NAME_LEN = 16


class dmabuf:
    """Mirrors struct dmabuf (dmabuf_alloc.c): the render node fd, the dma-buf fd, the
    GEM handle and the mmap offset."""

    def __init__(self, proc: Any, drm_fd: int) -> None:
        self.proc, self.drm_fd = proc, drm_fd
        self.fd, self.handle, self.map_offset = -1, 0, 0


def _ioctl(proc: Any, fd: int, cmd: int, fmt: str, fields: list[int]) -> tuple | None:
    """ioctl() with a struct argument in the process's memory: the struct back, or None
    with errno set."""
    n = struct.calcsize(fmt)
    buf = libc.posix_memalign(proc, 0, n)
    try:
        proc.store(buf, struct.pack(fmt, *fields))
        ret = proc.ioctl(fd, cmd, buf)
        if ret < 0:
            set_errno(-ret)
            return None
        return struct.unpack(fmt, proc.load(buf, n))
    finally:
        libc.free(proc, buf, n)


def drm_open(proc: Any, unit: int) -> int | None:
    """The render node of GPU `unit`, checked to be amdgpu's: its fd, or None."""
    fd = proc.open(uapi.render_node_path(unit), libc.O_RDWR)
    if fd < 0:
        set_errno(-fd)
        return None
    name = libc.posix_memalign(proc, 0, NAME_LEN)
    try:
        out = _ioctl(proc, fd, uapi.DRM_IOCTL_VERSION, uapi.DRM_VERSION_FMT,
                     [0, 0, 0, NAME_LEN, name, 0, 0, 0, 0])
        got = proc.load(name, NAME_LEN).split(b"\0", 1)[0] if out is not None else None
    finally:
        libc.free(proc, name, NAME_LEN)
    if got == b"amdgpu":
        return fd
    if got is not None:
        set_errno(errno.EOPNOTSUPP)
    proc.close(fd)
    return None


def drm_free_buf(proc: Any, drm_fd: int, handle: int) -> None:
    """DRM_IOCTL_GEM_CLOSE (its result is not looked at, as in C)."""
    _ioctl(proc, drm_fd, uapi.DRM_IOCTL_GEM_CLOSE, uapi.DRM_GEM_CLOSE_FMT, [handle, 0])


def amdgpu_alloc(proc: Any, drm_fd: int, size: int, gtt: int) -> int | None:
    """DRM_IOCTL_AMDGPU_GEM_CREATE: the handle, or None."""
    if gtt:
        domains, flags = uapi.AMDGPU_GEM_DOMAIN_GTT, uapi.AMDGPU_GEM_CREATE_CPU_GTT_USWC
    else:
        domains, flags = uapi.AMDGPU_GEM_DOMAIN_VRAM, uapi.AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED
    out = _ioctl(proc, drm_fd, uapi.DRM_IOCTL_AMDGPU_GEM_CREATE, uapi.AMDGPU_GEM_CREATE_FMT,
                 [size, 0, domains, flags])
    return None if out is None else out[0] & 0xFFFFFFFF


def dmabuf_alloc(proc: Any, size: int, unit: int, gtt: int) -> dmabuf | None:
    """Mirrors dmabuf_alloc(): open, allocate, export, find the mmap offset; None (errno
    set) with everything undone on failure."""
    drm_fd = drm_open(proc, unit)
    if drm_fd is None:
        return None
    buf = dmabuf(proc, drm_fd)
    handle = amdgpu_alloc(proc, drm_fd, size, gtt)
    if handle is not None:
        buf.handle = handle
        out = _ioctl(proc, drm_fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, uapi.DRM_PRIME_HANDLE_FMT,
                     [handle, libc.O_RDWR, -1])
        if out is not None:
            buf.fd = out[2]
            mm = _ioctl(proc, drm_fd, uapi.DRM_IOCTL_AMDGPU_GEM_MMAP, uapi.AMDGPU_GEM_MMAP_FMT,
                        [handle])
            if mm is not None:
                buf.map_offset = mm[0]
                return buf
            # as dmabuf_alloc.c's out_free_buf: the handle is closed, the dma-buf fd
            # is left open
        drm_free_buf(proc, drm_fd, handle)
    proc.close(drm_fd)
    return None


def dmabuf_free(buf: dmabuf | None) -> None:
    """Mirrors dmabuf_free(): the dma-buf fd, the GEM handle, the render node."""
    if buf is None:
        return
    proc = buf.proc
    proc.close(buf.fd)
    drm_free_buf(proc, buf.drm_fd, buf.handle)
    proc.close(buf.drm_fd)

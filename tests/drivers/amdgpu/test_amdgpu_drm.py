"""Tests for drivers/amdgpu/amdgpu_drm.py: the render node's ioctls and their errnos,
GEM objects in VRAM (behind BAR0) and GTT, CPU mappings through the node, PRIME
export and the lifetime of an object held by handles, dma-bufs and mappings, and a
move (VRAM -> GTT) with its move_notify and CPU unmap."""

from __future__ import annotations

import errno
import struct

import pytest

from drivers.amdgpu.amdgpu_drm import (
    TTM_PL_TT,
    TTM_PL_VRAM,
    amdgpu_bo_evict,
    amdgpu_dma_buf_pin,
    amdgpu_dma_buf_unpin,
)
from kernel_model.dma_buf import dma_buf_attach_ops, dma_buf_detach, dma_buf_dynamic_attach
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.hw.nvgpu import GPU_PAGE_SIZE
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.uapi import drm as uapi
from userspace import libc

MiB = 1 << 20
NODE = "/dev/dri/renderD128"


@pytest.fixture
def m():
    m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=1, modules=())
    m.load_module("amdgpu")
    return m


def ddev(m):
    return m.modules["amdgpu"].state.devices[0].ddev


def ioctl(p, fd: int, cmd: int, fmt: str, fields: list[int]) -> tuple[int, tuple]:
    """(0 or -errno, the struct back)."""
    n = struct.calcsize(fmt)
    buf = libc.posix_memalign(p, 0, n)
    p.store(buf, struct.pack(fmt, *fields))
    ret = p.ioctl(fd, cmd, buf)
    out = struct.unpack(fmt, p.load(buf, n))
    libc.free(p, buf, n)
    return ret, out


def create(p, fd: int, size: int, domains: int = uapi.AMDGPU_GEM_DOMAIN_VRAM,
           flags: int = 0) -> int:
    ret, out = ioctl(p, fd, uapi.DRM_IOCTL_AMDGPU_GEM_CREATE, uapi.AMDGPU_GEM_CREATE_FMT,
                     [size, 0, domains, flags])
    return ret if ret < 0 else out[0] & 0xFFFFFFFF


def mmap_offset(p, fd: int, handle: int) -> int:
    ret, out = ioctl(p, fd, uapi.DRM_IOCTL_AMDGPU_GEM_MMAP, uapi.AMDGPU_GEM_MMAP_FMT, [handle])
    return ret if ret < 0 else out[0]


def export(p, fd: int, handle: int, flags: int = libc.O_RDWR) -> int:
    ret, out = ioctl(p, fd, uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, uapi.DRM_PRIME_HANDLE_FMT,
                     [handle, flags, -1])
    return ret if ret < 0 else out[2]


def gem_close(p, fd: int, handle: int, pad: int = 0) -> int:
    return ioctl(p, fd, uapi.DRM_IOCTL_GEM_CLOSE, uapi.DRM_GEM_CLOSE_FMT, [handle, pad])[0]


def cpu_map(p, fd: int, off: int, size: int, flags: int = libc.MAP_SHARED) -> int:
    return p.mmap(0, size, libc.PROT_READ | libc.PROT_WRITE, flags, fd, off)


def test_the_node_is_amdgpus_and_version_copies_what_fits(m):
    p = m.spawn("app")
    fd = p.open(NODE, libc.O_RDWR)
    assert fd >= 0
    bufs = libc.posix_memalign(p, 0, 64)
    ret, out = ioctl(p, fd, uapi.DRM_IOCTL_VERSION, uapi.DRM_VERSION_FMT,
                     [0, 0, 0, 16, bufs, 3, bufs + 16, 32, bufs + 32])
    assert ret == 0 and out[:3] == (3, 59, 0)
    assert out[3] == 6 and p.load(bufs, 7) == b"amdgpu\0"
    assert out[5] == 8 and p.load(bufs + 16, 4) == b"201\0"      # cut to 3, length 8
    assert out[7] == 7 and p.load(bufs + 32, 7) == b"AMD GPU"
    ret, _ = ioctl(p, fd, uapi.DRM_IOCTL_VERSION, uapi.DRM_VERSION_FMT,
                   [0, 0, 0, 16, 0x10, 0, 0, 0, 0])             # a bad name pointer
    assert ret == -errno.EFAULT
    assert p.ioctl(fd, uapi.DRM_IOCTL_VERSION, 0x10) == -errno.EFAULT
    assert p.ioctl(fd, uapi._IOWR("d", 0x3F, 8), bufs) == -errno.EINVAL      # no such ioctl
    assert p.ioctl(fd, uapi._IOWR("d", 0x40 + 0x1F, 8), bufs) == -errno.EINVAL
    ret, _ = ioctl(p, fd, uapi.DRM_IOCTL_GEM_FLINK, uapi.DRM_GEM_FLINK_FMT, [1, 0])
    assert ret == -errno.EACCES                                  # not on a render node
    assert p.open("/dev/dri/renderD129", libc.O_RDWR) == -errno.ENOENT
    p.exit(0)
    m.check_leaks()


def test_gem_create_errnos_and_placement(m):
    p = m.spawn("app")
    fd = p.open(NODE, libc.O_RDWR)
    adev = m.modules["amdgpu"].state.devices[0]
    free = len(adev.free_pages)
    assert create(p, fd, 4096, uapi.AMDGPU_GEM_DOMAIN_DOORBELL) == -errno.EINVAL
    assert create(p, fd, 4096, 0x80) == -errno.EINVAL                       # unknown domain
    assert create(p, fd, 4096, flags=1 << 30) == -errno.EINVAL              # unknown flag
    assert create(p, fd, 4096, flags=uapi.AMDGPU_GEM_CREATE_ENCRYPTED) == -errno.EINVAL
    assert create(p, fd, 4096, uapi.AMDGPU_GEM_DOMAIN_GDS) == -errno.EINVAL
    assert create(p, fd, 0) == -errno.EINVAL
    v = create(p, fd, 100 << 10)                  # two 64 KiB VRAM pages, BAR0 mapped
    assert v == 1 and len(adev.free_pages) == free - 2 and m.gpus[0].windows_mapped() == 2
    g = create(p, fd, 5000, uapi.AMDGPU_GEM_DOMAIN_GTT)
    assert g == 2
    bos = {h: bo for h, bo in p.task.files.fdt[fd].private_data.object_idr.items()}
    assert bos[1].mem_type == TTM_PL_VRAM and bos[2].mem_type == TTM_PL_TT
    assert bos[2].size == 8192 and len(bos[2].pages) == 2
    big = create(p, fd, 2 * 256 * MiB)            # neither VRAM nor RAM can hold it
    assert big == -errno.ENOMEM
    assert gem_close(p, fd, 7) == -errno.EINVAL
    assert gem_close(p, fd, 1, pad=1) == -errno.EINVAL
    assert gem_close(p, fd, 1) == 0 and len(adev.free_pages) == free
    assert mmap_offset(p, fd, 1) == -errno.ENOENT
    p.close(fd)                                   # the GTT object's handle goes with it
    assert ddev(m).objects == []
    p.exit(0)
    m.check_leaks()


def test_vram_falls_back_to_gtt_when_full(m):
    p = m.spawn("app")
    fd = p.open(NODE, libc.O_RDWR)
    adev = m.modules["amdgpu"].state.devices[0]
    hog = create(p, fd, (len(adev.free_pages) - 1) * GPU_PAGE_SIZE)
    assert hog > 0
    h = create(p, fd, 2 * GPU_PAGE_SIZE, flags=uapi.AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED)
    bo = p.task.files.fdt[fd].private_data.object_idr[h]
    assert bo.mem_type == TTM_PL_TT
    assert bo.preferred_domains == uapi.AMDGPU_GEM_DOMAIN_VRAM | uapi.AMDGPU_GEM_DOMAIN_GTT
    p.close(fd)
    p.exit(0)
    m.check_leaks()


@pytest.mark.parametrize("domain", [uapi.AMDGPU_GEM_DOMAIN_VRAM, uapi.AMDGPU_GEM_DOMAIN_GTT])
def test_cpu_mapping_reaches_the_objects_memory(m, domain):
    p = m.spawn("app")
    fd = p.open(NODE, libc.O_RDWR)
    h = create(p, fd, 3 * 4096, domain)
    off = mmap_offset(p, fd, h)
    assert off == 1 << 32                         # DRM_FILE_PAGE_OFFSET_START
    bo = p.task.files.fdt[fd].private_data.object_idr[h]
    va = cpu_map(p, fd, off, 3 * 4096)
    assert va > 0 and bo.refcount == 2            # the handle's and the mapping's
    p.store(va + 4096 + 5, b"through the node")
    if domain == uapi.AMDGPU_GEM_DOMAIN_VRAM:
        gpu_addr = (bo.vram_pages[0] << 16) + 4096 + 5
        assert m.gpus[0].vidmem_read(gpu_addr, 16) == b"through the node"
    else:
        assert m.phys_read((bo.pages[1].pfn << 12) + 5, 16) == b"through the node"
    assert p.load(va + 4096 + 5, 16) == b"through the node"
    assert p.munmap(va, 3 * 4096) == 0 and bo.refcount == 1
    # errnos of the mmap
    assert cpu_map(p, fd, off + 4096, 4096) == -errno.EINVAL      # not the object's start
    assert cpu_map(p, fd, off, 4 * 4096) == -errno.EINVAL         # larger than the object
    assert cpu_map(p, fd, off, 4096, libc.MAP_PRIVATE) == -errno.EINVAL   # COW
    other = p.open(NODE, libc.O_RDWR)
    assert cpu_map(p, other, off, 4096) == -errno.EACCES          # no handle in that file
    nocpu = create(p, fd, 4096, flags=uapi.AMDGPU_GEM_CREATE_NO_CPU_ACCESS)
    assert mmap_offset(p, fd, nocpu) == -errno.EPERM
    p.close(other)
    p.close(fd)
    p.exit(0)
    m.check_leaks()


def test_prime_export_and_the_objects_lifetime(m):
    p = m.spawn("app")
    fd = p.open(NODE, libc.O_RDWR)
    adev = m.modules["amdgpu"].state.devices[0]
    free = len(adev.free_pages)
    h = create(p, fd, 4096)
    assert export(p, fd, 9) == -errno.ENOENT
    assert export(p, fd, h, 1 << 5) == -errno.EINVAL
    bo = p.task.files.fdt[fd].private_data.object_idr[h]
    a = export(p, fd, h)
    b = export(p, fd, h, libc.O_RDWR | libc.O_CLOEXEC)           # the same dma-buf again
    assert a >= 0 and b >= 0 and a != b
    assert p.task.files.fdt[a] is p.task.files.fdt[b]
    f = p.task.files.fdt[a]
    assert f.private_data.resv is bo.resv and f.private_data.size == 4096
    assert f.f_count == 4                 # two fds, obj->dma_buf, the PRIME table
    va = cpu_map(p, fd, mmap_offset(p, fd, h), 4096)
    assert gem_close(p, fd, h) == 0      # the handle goes: the dma-buf and mapping hold it
    assert f.f_count == 2 and bo.refcount == 2 and len(adev.free_pages) == free - 1
    p.store(va, b"still here")
    assert p.munmap(va, 4096) == 0 and bo.refcount == 1
    p.close(a)
    assert len(adev.free_pages) == free - 1
    p.close(b)                           # the last reference: the VRAM goes
    assert len(adev.free_pages) == free and ddev(m).objects == []
    p.close(fd)
    p.exit(0)
    m.check_leaks()


def test_a_move_notifies_importers_and_the_cpu_follows(m):
    p = m.spawn("app")
    fd = p.open(NODE, libc.O_RDWR)
    h = create(p, fd, 8192)
    bo = p.task.files.fdt[fd].private_data.object_idr[h]
    dfd = export(p, fd, h)
    va = cpu_map(p, fd, mmap_offset(p, fd, h), 8192)
    p.store(va + 100, b"moving bytes")
    told = []
    ops = dma_buf_attach_ops(move_notify=lambda at: told.append(at), allow_peer2peer=True)
    with m.kernel():
        attach = dma_buf_dynamic_attach(bo.dma_buf, m.hcas[0].pdev, ops, None)
        mutex_lock(bo.resv)
        amdgpu_dma_buf_pin(attach)                # every importer p2p: pinned in VRAM
        mutex_unlock(bo.resv)
        with pytest.raises(KernelError) as ei:
            amdgpu_bo_evict(bo)
        assert ei.value.errno == errno.EBUSY     # a pinned object does not move
        assert told == [] and bo.mem_type == TTM_PL_VRAM
        mutex_lock(bo.resv)
        amdgpu_dma_buf_unpin(attach)
        mutex_unlock(bo.resv)
        amdgpu_bo_evict(bo)                       # VRAM -> GTT
    assert told == [attach] and bo.mem_type == TTM_PL_TT and m.gpus[0].windows_mapped() == 0
    assert p.load(va + 100, 12) == b"moving bytes"   # the CPU faults in the GTT page
    with m.kernel():
        dma_buf_detach(bo.dma_buf, attach)
    p.munmap(va, 8192)
    p.close(dfd)
    p.close(fd)
    p.exit(0)
    m.check_leaks()

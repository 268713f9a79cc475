"""Mirrors kernel-open/nvidia/nv.c (and, in effect, RM's memory calls): /dev/nvidiaN.

What a CUDA process does through its GPU file (kernel_model/uapi/nvidia.py):

    open             an RM client with its own VA space and P2P tokens
    ALLOC_MEMORY     video memory in 64 KiB GPU pages; returns an mmap offset
    mmap(offset)     binds the allocation's unified virtual address: a VMA that
                     is VM_IO | VM_PFNMAP with no PTEs and no fault handler,
                     so a CPU access faults (SIGBUS) and gup cannot pin it -
                     which is why ibv_reg_mr needs a peer-memory client
    MEMCPY           the copy engines: host <-> device through copy_*_user
    POINTER_ATTR     cuPointerGetAttribute / cuPointerSetAttribute
    FREE_MEMORY      cudaFree: third-party free callbacks, then the pages
    close            every allocation the client still holds is freed, with
                     the same callbacks (a process exiting)

# EMU: the VMA and the allocation are bound by mmap, not by UVM's VA-space
# ioctls; a munmap of the VA leaves the allocation (it keeps its pages until
# FREE_MEMORY or close) but unbinds the address.
"""

from __future__ import annotations

from typing import Any

from drivers.nvidia.nv_dmabuf import nv_dma_buf_export
from drivers.nvidia.rm import NvClient, NvDevice, rm_alloc_memory, rm_free_client, rm_free_memory
from kernel_model.current import current
from kernel_model.errno import EFAULT, EINVAL, KernelError
from kernel_model.fs import file_operations
from kernel_model.hw.nvgpu import GPU_PAGE_SIZE
from kernel_model.mm import VM_DONTDUMP, VM_DONTEXPAND, VM_IO, VM_PFNMAP, vm_operations_struct
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user, copy_to_user, ioctl_copy_struct
from kernel_model.uapi import nvidia as uapi


@traced
def nvidia_open(inode: Any, f: Any) -> None:
    """Mirrors nvidia_open(): a new client (what cuInit/cuCtxCreate get from RM)."""
    dev: NvDevice = inode.i_cdev.private
    task = current()
    dev.va_spaces = getattr(dev, "va_spaces", 0) + 1
    client = NvClient(dev, task.mm, dev.va_spaces)
    dev.clients.append(client)
    f.private_data = client


@traced
def nvidia_close(inode: Any, f: Any) -> None:
    """Mirrors nvidia_close(): the client goes; so does all its memory (free callbacks
    first - the third party learns the memory is gone)."""
    rm_free_client(f.private_data)
    f.private_data = None


def _vma_close(vma: Any) -> None:
    mem = vma.vm_private_data
    if mem is not None and mem.va == vma.vm_start:
        mem.va = 0


def _no_split(vma: Any, addr: int) -> None:
    raise KernelError(EINVAL, "nvidia_mmap: a GPU mapping cannot be split")


_GPU_VM_OPS = vm_operations_struct(close=_vma_close, may_split=_no_split)


@traced
def nvidia_mmap(f: Any, vma: Any) -> None:
    """Mirrors nvidia_mmap() for a video memory allocation: bind its unified VA.

    EINVAL for an unknown or already bound handle, a length other than the
    allocation's, or an address not 64 KiB aligned (the GPU maps in 64 KiB
    pages, and nvidia_p2p_get_pages needs that alignment).
    """
    client: NvClient = f.private_data
    handle = vma.vm_pgoff
    mem = client.memory.get(handle)
    if mem is None or mem.freed or mem.va:
        raise KernelError(EINVAL, f"nvidia_mmap: handle {handle} is not an unbound allocation")
    if vma.vm_end - vma.vm_start != mem.size:
        raise KernelError(EINVAL, f"nvidia_mmap: length {vma.vm_end - vma.vm_start:#x}, "
                          f"allocation {mem.size:#x}")
    if vma.vm_start % GPU_PAGE_SIZE:
        raise KernelError(EINVAL, f"nvidia_mmap: {vma.vm_start:#x} not 64 KiB aligned")
    vma.vm_flags |= VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP
    vma.vm_ops = _GPU_VM_OPS
    vma.vm_private_data = mem
    mem.va = vma.vm_start


@traced
def nvidia_ioctl(f: Any, cmd: int, arg: int) -> int:
    """Mirrors nvidia_ioctl(): copy the escape's struct in, do it, copy it back (ENOTTY
    for an unknown escape, EFAULT for a bad argument)."""
    return ioctl_copy_struct(_ESCAPES, f.private_data, cmd, arg, "nvidia_ioctl")


def _alloc(client: NvClient, fields: list[int]) -> list[int]:
    size = fields[0]
    mem = rm_alloc_memory(client, size)
    mem.req_size = size
    fields[1] = mem.handle << current().machine.page_shift
    return fields


def _free(client: NvClient, fields: list[int]) -> None:
    mem = client.lookup(fields[0])
    if mem is None or mem.va != fields[0]:
        raise KernelError(EINVAL, f"nvidia_ioctl: FREE_MEMORY: {fields[0]:#x} is not the "
                          "start of an allocation")
    rm_free_memory(mem)


def _memcpy(client: NvClient, fields: list[int]) -> None:
    dst, src, count, kind, _pad = fields
    if kind not in (uapi.cudaMemcpyHostToDevice, uapi.cudaMemcpyDeviceToHost):
        raise KernelError(EINVAL, f"nvidia_ioctl: MEMCPY kind {kind}")
    gva = dst if kind == uapi.cudaMemcpyHostToDevice else src
    mem = client.lookup(gva, max(count, 1))
    if mem is None:
        raise KernelError(EINVAL, f"nvidia_ioctl: MEMCPY [{gva:#x}, +{count:#x}) is not in "
                          "one allocation")
    gpu = client.dev.gpu
    if kind == uapi.cudaMemcpyHostToDevice:
        data = bytearray(count)
        if copy_from_user(data, src, count):
            raise KernelError(EFAULT, "nvidia_ioctl: MEMCPY: bad host source")
        for off, n in _pieces(gva, count):
            gpu.vidmem_write(mem.gpu_addr(off), bytes(data[off - gva:off - gva + n]))
    else:
        data = b"".join(gpu.vidmem_read(mem.gpu_addr(off), n) for off, n in _pieces(gva, count))
        if copy_to_user(dst, data, count):
            raise KernelError(EFAULT, "nvidia_ioctl: MEMCPY: bad host destination")


def _pieces(va: int, count: int) -> list[tuple[int, int]]:
    """[va, va + count) cut at GPU page boundaries."""
    out = []
    while count:
        n = min(count, GPU_PAGE_SIZE - (va & (GPU_PAGE_SIZE - 1)))
        out.append((va, n))
        va, count = va + n, count - n
    return out


def _get_attr(client: NvClient, fields: list[int]) -> list[int]:
    va, attr = fields[0], fields[1]
    mem = client.lookup(va)
    if mem is None:
        raise KernelError(EINVAL, f"nvidia_ioctl: {va:#x} is not device memory of this "
                          "context")
    values = {
        uapi.CU_POINTER_ATTRIBUTE_MEMORY_TYPE: (uapi.CU_MEMORYTYPE_DEVICE, 0),
        uapi.CU_POINTER_ATTRIBUTE_BUFFER_ID: (mem.buffer_id, 0),
        uapi.CU_POINTER_ATTRIBUTE_P2P_TOKENS: (client.p2p_token, client.va_space),
        uapi.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: (int(mem.sync_memops), 0),
        uapi.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: (mem.va, 0),
        uapi.CU_POINTER_ATTRIBUTE_RANGE_SIZE: (mem.req_size, 0),
    }
    if attr not in values:
        raise KernelError(EINVAL, f"nvidia_ioctl: pointer attribute {attr} not modelled")
    if attr == uapi.CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        mem.sync_memops = True          # retrieving the tokens enables sync memops (11.7)
    fields[3], fields[4] = values[attr]
    return fields


def _set_attr(client: NvClient, fields: list[int]) -> None:
    va, attr, value = fields[0], fields[1], fields[2]
    mem = client.lookup(va)
    if mem is None or attr != uapi.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        raise KernelError(EINVAL, f"nvidia_ioctl: cannot set attribute {attr} at {va:#x}")
    mem.sync_memops = bool(value)


def _export_dmabuf(client: NvClient, fields: list[int]) -> list[int]:
    fields[2] = nv_dma_buf_export(client, fields[0], fields[1])
    return fields


_ESCAPES = {
    uapi.NV_ESC_ALLOC_MEMORY: (uapi.NV_ALLOC_FMT, _alloc),
    uapi.NV_ESC_FREE_MEMORY: (uapi.NV_FREE_FMT, _free),
    uapi.NV_ESC_MEMCPY: (uapi.NV_MEMCPY_FMT, _memcpy),
    uapi.NV_ESC_GET_POINTER_ATTR: (uapi.NV_ATTR_FMT, _get_attr),
    uapi.NV_ESC_SET_POINTER_ATTR: (uapi.NV_ATTR_FMT, _set_attr),
    uapi.NV_ESC_EXPORT_DMABUF: (uapi.NV_EXPORT_DMABUF_FMT, _export_dmabuf),
}


def nvidia_fops(owner: Any) -> file_operations:
    """The GPU file's operations (nv_fops)."""
    return file_operations(owner=owner, open=nvidia_open, release=nvidia_close,
                           unlocked_ioctl=nvidia_ioctl, mmap=nvidia_mmap)

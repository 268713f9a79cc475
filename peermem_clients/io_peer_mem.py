"""Mirrors io_peer_mem (sbates130272/io_peer_mem v0.2): a peer-memory client for PFN mappings.

Device memory a process has mapped through some driver's mmap (a CMB, a
PCIe BAR exposed by UIO) is VM_IO|VM_PFNMAP, so gup refuses it; this client
registers it anyway, by following the PFNs:

    acquire        the range lies in one VMA, that VMA is writable, is not a
                   uverbs mapping (its file would then be held open by the MR
                   for ever), and follow_pfn works on it (a PFN mapping); the
                   client keeps its own reference to the VMA's file (and calls
                   vm_ops->open), as videobuf2 does, so the device memory stays
                   valid even if the process unmaps it before deregistering -
                   which is why it needs no invalidation
    get_pages      an sg table of one entry per page of the range
    dma_map        each page's PFN: its raw bus address, or - under a
                   translating IOMMU - dma_map_resource's
    dma_unmap      nothing (or dma_unmap_resource)
    put_pages      free the sg table
    get_page_size  PAGE_SIZE
    release        drop the VMA reference

It registers with no invalidate callback: it serves every caller.

# EMU: v0.2 allocates ceil(size / PAGE_SIZE) entries and maps raw physical
# addresses whatever the IOMMU; the model covers an unaligned range with one
# more entry when it needs it and maps through the IOMMU when one translates
# (both are defects of io_peer_mem v0.2, sbates130272/io_peer_mem master:
# io_peer_mem.c, get_pages and dma_map).
"""

from __future__ import annotations

import copy
from typing import Any

from drivers.ib_core.peer_mem import (
    ib_register_peer_memory_client,
    ib_unregister_peer_memory_client,
    peer_memory_client,
)
from kernel_model.current import current
from kernel_model.dma import (
    DMA_BIDIRECTIONAL,
    dma_map_resource,
    dma_mapping_error,
    dma_unmap_resource,
)
from kernel_model.errno import EINVAL, EIO, KernelError
from kernel_model.fs import fput, get_file
from kernel_model.memory import follow_pfn
from kernel_model.mm import VM_WRITE
from kernel_model.module import module_put, try_module_get
from kernel_model.scatterlist import sg_alloc_table, sg_free_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced

MODULE_DEPENDS = ("ib_core",)
DRV_NAME = "io_peer_mem"
DRV_VERSION = "0.2"


class io_peer_context:
    """The client context: the range, a reference on its VMA (and file), the sg table."""

    def __init__(self, addr: int, size: int, vma: Any):
        self.addr, self.size, self.vma = addr, size, vma
        self.sg_head: Any = None
        self.npages = 0
        self.mapped_iommu: list[tuple[Any, int]] = []   # (device, dma address) to unmap

    def __repr__(self) -> str:
        return f"io_peer_context {self.addr:#x}+{self.size:#x}"


class IoPeerMem:
    """The module's globals: its registration."""

    def __init__(self, mod: Any):
        self.mod = mod
        self.reg_handle: Any = None

    @traced
    def io_mem_acquire(self, addr: int, size: int, peer_mem_private_data: Any,
                       peer_mem_name: Any, client_context: list) -> int:
        """Mirrors acquire(): 1 for a writable PFN mapping that holds the whole range."""
        mm = current().mm
        vma = mm.find_vma(addr) if mm is not None else None
        if vma is None or vma.vm_start > addr or vma.vm_end < addr + size:
            return 0
        f = vma.vm_file
        if f is not None and f.f_path.startswith("/dev/infiniband/uverbs"):
            return 0
        if not vma.vm_flags & VM_WRITE:
            return 0
        try:
            follow_pfn(vma, addr)
        except KernelError:
            return 0
        # a copy of the VMA, opened, with its own file reference (vm_area_dup + vm_ops->open)
        vma = copy.copy(vma)
        ctx = kmalloc_obj(io_peer_context(addr, size, vma))
        if vma.vm_ops is not None and vma.vm_ops.open is not None:
            vma.vm_ops.open(vma)
        if f is not None:
            get_file(f)
        client_context[0] = ctx
        try_module_get(self.mod)
        return 1

    @traced
    def io_mem_get_pages(self, addr: int, size: int, write: int, force: int, sg_head: Any,
                         context: io_peer_context, core_context: int) -> int:
        """Mirrors get_pages(): count the pages the range touches (the sg table itself is
        built in dma_map: the current core passes no table here, sg_head is NULL)."""
        ps = current().machine.page_size
        context.npages = (context.addr + context.size - 1) // ps - context.addr // ps + 1
        return 0

    @traced
    def io_mem_dma_map(self, sg_head: Any, context: io_peer_context, dma_device: Any,
                       dmasync: int, nmap: list) -> int:
        """Mirrors dma_map(): each page's PFN as its bus address (see the EMU note)."""
        m = current().machine
        ps = m.page_size
        translate = m.iommu.translating
        try:
            sg_alloc_table(sg_head, context.npages)
        except KernelError as e:
            return -e.errno
        context.sg_head = sg_head
        addr, left = context.addr, context.size
        i = 0
        while left > 0:
            try:
                pfn = follow_pfn(context.vma, addr)
            except KernelError as e:
                self._unmap_iommu(context)
                sg_free_table(sg_head)
                return -e.errno
            phys = pfn << m.page_shift
            if translate:
                dma = dma_map_resource(dma_device, phys, ps, DMA_BIDIRECTIONAL)
                if dma_mapping_error(dma_device, dma):
                    self._unmap_iommu(context)
                    sg_free_table(sg_head)
                    return -EIO
                context.mapped_iommu.append((dma_device, dma))
            else:
                dma = phys
            off = addr & (ps - 1)
            sg_head.sg_pfn.view[i] = pfn
            sg_head.sg_off.view[i] = off
            sg_head.sg_len.view[i] = ps
            sg_head.dma_addr.view[i] = dma
            sg_head.dma_len.view[i] = ps
            step = ps - off
            addr, left, i = addr + step, left - step, i + 1
        nmap[0] = i
        return 0

    def _unmap_iommu(self, context: io_peer_context) -> None:
        for dev, dma in context.mapped_iommu:
            dma_unmap_resource(dev, dma, current().machine.page_size, DMA_BIDIRECTIONAL)
        context.mapped_iommu.clear()

    @traced
    def io_mem_dma_unmap(self, sg_head: Any, context: io_peer_context, dma_device: Any) -> int:
        """Mirrors dma_unmap(): nothing to undo for raw addresses (IOMMU mappings go)."""
        self._unmap_iommu(context)
        return 0

    @traced
    def io_mem_put_pages(self, sg_head: Any, context: io_peer_context) -> None:
        """Mirrors put_pages(): free the sg table."""
        sg_free_table(sg_head)

    @traced
    def io_mem_get_page_size(self, context: io_peer_context) -> int:
        """Mirrors get_page_size(): PAGE_SIZE."""
        return current().machine.page_size

    @traced
    def io_mem_release(self, context: io_peer_context) -> None:
        """Mirrors release(): drop the VMA (and file) reference, free the context."""
        vma = context.vma
        if vma.vm_ops is not None and vma.vm_ops.close is not None:
            vma.vm_ops.close(vma)
        if vma.vm_file is not None:
            fput(vma.vm_file)
        kfree(context)
        module_put(self.mod)

    def client(self) -> peer_memory_client:
        return peer_memory_client(
            DRV_NAME, DRV_VERSION, acquire=self.io_mem_acquire, get_pages=self.io_mem_get_pages,
            dma_map=self.io_mem_dma_map, dma_unmap=self.io_mem_dma_unmap,
            put_pages=self.io_mem_put_pages, get_page_size=self.io_mem_get_page_size,
            release=self.io_mem_release)


def module_init(mod: Any) -> IoPeerMem:
    """io_mem_init(): register with no invalidate callback."""
    state = IoPeerMem(mod)
    state.reg_handle = ib_register_peer_memory_client(state.client(), None)
    if state.reg_handle is None:
        raise KernelError(EINVAL, "io_mem_init: registration failed")
    return state


def module_exit(mod: Any) -> None:
    """io_mem_cleanup()."""
    ib_unregister_peer_memory_client(mod.state.reg_handle)

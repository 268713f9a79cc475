"""Mirrors kernel-open/nvidia/nv-dmabuf.c, reduced: exporting GPU memory as a dma-buf.

cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) asks the
driver for a dma-buf of part of an allocation; the fd goes to an importer
(ibv_reg_dmabuf_mr).  The dma-buf holds the memory: a cudaFree while it
exists frees the allocation for the application, but its pages stay until
the last dma-buf reference goes (the exporter's release) - the driver never
moves or revokes them, so it is a static exporter and never calls
move_notify.  That is the design's contrast with peer memory, where cudaFree
revokes the MR through the free callback.

    attach      the importer must accept peer-to-peer MMIO (pages without a
                struct page) - EOPNOTSUPP otherwise
    map         BAR1 windows for the range (as nvidia_p2p_get_pages takes them),
                then the importer device's DMA addresses, one entry per run of
                consecutive windows
    unmap       the DMA mappings and the BAR1 windows go
    release     the hold on the allocation goes; freed memory's pages go back

# EMU: the export is an escape of the model's GPU file (the real driver goes
# through RM's memory handles and NV_ESC_EXPORT_TO_DMABUF_FD); the range must be
# whole 64 KiB GPU pages of one allocation of the caller's context.
"""

from __future__ import annotations

from typing import Any

from drivers.nvidia.nv_p2p import map_window_runs, unmap_window_runs
from drivers.nvidia.rm import (
    NvClient,
    NvMemory,
    rm_p2p_get_pages,
    rm_p2p_put_pages,
    rm_release_pages,
)
from kernel_model.dma_buf import dma_buf_export, dma_buf_fd, dma_buf_ops, dma_buf_put
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.fs import O_CLOEXEC
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.scatterlist import sg_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced


class nv_dma_buf_file_private:
    """Mirrors nv_dma_buf_file_private_t: the allocation range a dma-buf exports."""

    def __init__(self, client: NvClient, mem: NvMemory, first: int, n: int):
        self.client, self.mem, self.first, self.n = client, mem, first, n

    def __repr__(self) -> str:
        return f"nv_dma_buf_file_private {self.n} GPU pages of {self.mem!r}"


def nv_dma_buf_attach(dmabuf: Any, attach: Any) -> None:
    """Mirrors nv_dma_buf_attach(): MMIO pages need an importer that takes p2p."""
    if not attach.peer2peer:
        raise KernelError(EOPNOTSUPP, "nv_dma_buf_attach: importer cannot take peer-to-peer "
                          "MMIO without struct page")


@traced
def nv_dma_buf_map(attach: Any, direction: int) -> sg_table:
    """Mirrors nv_dma_buf_map(): BAR1 windows for the range, mapped for the importer."""
    priv = attach.dmabuf.priv
    mem, dev = priv.mem, priv.client.dev
    va = mem.va + (priv.first << GPU_PAGE_SHIFT)
    mutex_lock(dev.rm_lock)
    try:
        windows = rm_p2p_get_pages(mem, va, priv.n << GPU_PAGE_SHIFT)
    finally:
        mutex_unlock(dev.rm_lock)
    runs = map_window_runs(attach.dev, dev.gpu.bar1.start, windows, priv.n)
    if runs is None:
        _put_windows(priv)
        raise KernelError(EINVAL, "nv_dma_buf_map: dma_map_resource failed")
    sgt = kmalloc_obj(sg_table(attach.dev.machine))
    sgt.ensure_capacity(len(runs))
    for k, (a, size) in enumerate(runs):    # one entry per run of consecutive windows
        sgt.dma_addr.view[k], sgt.dma_len.view[k], sgt.sg_len.view[k] = a, size, size
    sgt.nents = sgt.orig_nents = len(runs)
    sgt.runs = runs
    return sgt


def _put_windows(priv: nv_dma_buf_file_private) -> None:
    dev = priv.client.dev
    mutex_lock(dev.rm_lock)
    rm_p2p_put_pages(dev, priv.mem, priv.first, priv.n)
    mutex_unlock(dev.rm_lock)


@traced
def nv_dma_buf_unmap(attach: Any, sgt: sg_table, direction: int) -> None:
    """Mirrors nv_dma_buf_unmap(): the importer's DMA mappings, then the BAR1 windows."""
    unmap_window_runs(attach.dev, sgt.runs)
    _put_windows(attach.dmabuf.priv)
    kfree(sgt)


@traced
def nv_dma_buf_release(dmabuf: Any) -> None:
    """Mirrors nv_dma_buf_release(): the hold on the allocation goes; if it was
    freed meanwhile and nothing else holds it, its pages go back to the GPU."""
    priv = dmabuf.priv
    mem = priv.mem
    mem.dmabuf_refs -= 1
    if mem.freed and not mem.mem_infos and not mem.dmabuf_refs:
        rm_release_pages(mem)
    kfree(priv)


NV_DMA_BUF_OPS = dma_buf_ops(attach=nv_dma_buf_attach, map_dma_buf=nv_dma_buf_map,
                             unmap_dma_buf=nv_dma_buf_unmap, release=nv_dma_buf_release)


@traced
def nv_dma_buf_export(client: NvClient, va: int, size: int) -> int:
    """Export [va, va + size) of one of the client's allocations: the dma-buf's fd in
    the caller's table.  EINVAL for a range not of whole 64 KiB pages, empty, or not
    inside one live allocation of this context."""
    if va % GPU_PAGE_SIZE or size % GPU_PAGE_SIZE or size == 0:
        raise KernelError(EINVAL, f"nv_dma_buf_export: [{va:#x}, +{size:#x}) is not whole "
                          "64 KiB GPU pages")
    mem = client.lookup(va, size)
    if mem is None or mem.freed:
        raise KernelError(EINVAL, f"nv_dma_buf_export: [{va:#x}, +{size:#x}) is not in one "
                          "allocation of this context")
    priv = kmalloc_obj(nv_dma_buf_file_private(client, mem, (va - mem.va) >> GPU_PAGE_SHIFT,
                                               size >> GPU_PAGE_SHIFT))
    try:
        dmabuf = dma_buf_export("nvidia", NV_DMA_BUF_OPS, size, priv)
    except KernelError:
        kfree(priv)
        raise
    mem.dmabuf_refs += 1
    try:
        return dma_buf_fd(dmabuf, O_CLOEXEC)
    except KernelError:
        dma_buf_put(dmabuf)        # its release drops the hold and frees priv
        raise


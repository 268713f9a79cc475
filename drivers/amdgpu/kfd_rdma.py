"""Mirrors drivers/gpu/drm/amd/amdkfd/kfd_rdma.c and include/drm/amd_rdma.h: the
third-party (RDMA) interface to KFD buffers.

A peer-memory client (amdp2p) gets the table with
amdkfd_query_rdma_interface() and calls:

    is_gpu_address(addr, pid)       1 if a buffer of that process holds addr
    get_page_size(addr, len, pid)   0, and PAGE_SIZE
    get_pages(addr, len, pid, &p2p_info, free_callback, client_priv)
                                    the process by pid, the buffer holding
                                    [addr, addr + len - 1] (EINVAL for either
                                    missing; ENOMEM), under its mutex: the
                                    buffer pinned and an sg table of its bus
                                    (BAR0) addresses, one entry per page, in an
                                    amd_p2p_info; {free_callback, client_priv}
                                    go on the buffer's cb_data_head list
    put_pages(&p2p_info)            EINVAL for NULL; unlink, unpin, free the
                                    entry, *p2p_info = NULL

When the buffer is freed (FREE_MEMORY_OF_GPU, or the process's file closing),
run_rdma_free_callback() - under the process's mutex - first calls every
registered free callback, then drops every entry still linked (a client's
put_pages from inside its callback unlinks its own, which is then skipped).
"After return, all resources are released": a put_pages later is the client's
bug (ROCnRDMA c2f76a7 made amdp2p ignore it).
"""

from __future__ import annotations

from typing import Any

from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.scatterlist import sg_alloc_table, sg_free_table, sg_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced


class amd_p2p_info:
    """Mirrors struct amd_p2p_info: what a client gets from get_pages."""

    def __init__(self, va: int, size: int, pid: Any, pages: sg_table, priv: Any):
        self.va, self.size, self.pid, self.pages, self.priv = va, size, pid, pages, priv

    def __repr__(self) -> str:
        return f"amd_p2p_info {self.va:#x}+{self.size:#x} {self.pages.nents} entries"


class rdma_cb:
    """Mirrors kfd_rdma.c's struct rdma_cb: one pin, its callback, on the buffer's list."""

    def __init__(self, bo: Any, free_callback: Any, client_priv: Any):
        self.bo = bo
        self.free_callback = free_callback
        self.client_priv = client_priv
        self.amd_p2p_data: amd_p2p_info | None = None

    def __repr__(self) -> str:
        return f"rdma_cb on {self.bo!r}"


def _process(pid: Any) -> Any:
    """kfd_lookup_process_by_pid(): the kfd_process of the task's mm, or None.  The
    process list is the loaded module's state (AmdgpuState, drivers/amdgpu/__init__.py,
    which sits above this file and calls into it)."""
    mm = getattr(pid, "mm", None)
    processes = current().machine.modules["amdgpu"].state.processes
    return next((p for p in processes if p.mm is mm), None)


@traced
def is_gpu_address(address: int, pid: Any) -> int:
    """Mirrors is_gpu_address(): 1 if a buffer of pid's process holds address."""
    p = _process(pid)
    if p is None:
        return 0
    mutex_lock(p.mutex)
    try:
        return int(p.find_bo_from_interval(address, address) is not None)
    finally:
        mutex_unlock(p.mutex)


@traced
def get_page_size(address: int, length: int, pid: Any, page_size: list) -> int:
    """Mirrors get_page_size(): PAGE_SIZE, whatever the range."""
    page_size[0] = current().machine.page_size
    return 0


@traced
def get_pages(address: int, length: int, pid: Any, amd_p2p_data: list,
              free_callback: Any, client_priv: Any) -> int:
    """Mirrors get_pages(): 0 and *amd_p2p_data set, or -EINVAL (no process, no buffer
    holding the range, length 0)."""
    p = _process(pid)
    if p is None or not length:
        return -EINVAL
    mutex_lock(p.mutex)
    try:
        bo = p.find_bo_from_interval(address, address + length - 1)
        if bo is None:
            return -EINVAL
        cb = kmalloc_obj(rdma_cb(bo, free_callback, client_priv))
        m = current().machine
        ps = m.page_size
        first = address & ~(ps - 1)
        n = (address + length - first + ps - 1) // ps
        sgt = sg_table(m)
        try:
            sg_alloc_table(sgt, n)                # pin_get_sg_table: one entry per page
        except KernelError as e:
            kfree(cb)
            return -e.errno
        for i in range(n):
            sgt.dma_addr.view[i] = bo.bus_address(first + i * ps)
            sgt.dma_len.view[i] = sgt.sg_len.view[i] = ps
        cb.amd_p2p_data = kmalloc_obj(amd_p2p_info(address, length, pid, sgt, bo))
        bo.cb_data_head.append(cb)
        amd_p2p_data[0] = cb.amd_p2p_data
        return 0
    finally:
        mutex_unlock(p.mutex)


@traced
def put_pages_helper(cb: rdma_cb) -> None:
    """Mirrors kfd_rdma.c put_pages_helper(): unlink, unpin and free one entry."""
    cb.bo.cb_data_head.remove(cb)
    sg_free_table(cb.amd_p2p_data.pages)
    kfree(cb.amd_p2p_data)
    kfree(cb)


@traced
def put_pages(amd_p2p_data: list) -> int:
    """Mirrors put_pages(): -EINVAL for a NULL *amd_p2p_data; otherwise the pin goes and
    *amd_p2p_data = NULL.  A pointer the buffer's free already released is a stale
    one: the model's slab reports the use-after-free a real kernel would commit."""
    info = amd_p2p_data[0]
    if info is None:
        return -EINVAL
    put_pages_helper(next(c for c in info.priv.cb_data_head if c.amd_p2p_data is info))
    amd_p2p_data[0] = None
    return 0


@traced
def run_rdma_free_callback(bo: Any) -> None:
    """Mirrors run_rdma_free_callback(), with the process's mutex held: every client's
    free callback first, then every entry still linked is released."""
    for cb in list(bo.cb_data_head):
        if cb in bo.cb_data_head:
            cb.free_callback(cb.client_priv)
    for cb in list(bo.cb_data_head):        # list_for_each_entry_safe
        put_pages_helper(cb)


class amd_rdma_interface:
    """Mirrors struct amd_rdma_interface: the four calls a client uses."""

    get_pages = staticmethod(get_pages)
    put_pages = staticmethod(put_pages)
    is_gpu_address = staticmethod(is_gpu_address)
    get_page_size = staticmethod(get_page_size)


@traced
def amdkfd_query_rdma_interface(out: list) -> int:
    """Mirrors amdkfd_query_rdma_interface(): 0 and the table, or -EINVAL (no amdgpu)."""
    if "amdgpu" not in current().machine.modules:
        return -EINVAL
    out[0] = amd_rdma_interface
    return 0

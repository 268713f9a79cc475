"""Mirrors amdp2p (RadeonOpenCompute/ROCnRDMA amdp2p.c): the AMD GPU's peer-memory client.

It lets ibv_reg_mr register VRAM a HIP process allocated, through KFD's
amd_rdma_interface (drivers/amdgpu/kfd_rdma.py):

    acquire        is_gpu_address(addr, pid of current) - of the first address
                   only, so a range running past the buffer is claimed too and
                   fails in get_pages (EINVAL) rather than going back to gup -
                   if so a context {va, size, pid}, a module reference
                   (__module_get), and 1
    get_pages      the range must be the acquired one (EINVAL); KFD's
                   get_pages(addr, size, pid, &p2p_info, free_callback, ctx);
                   the core's core_context kept for the callback
    dma_map        KFD built the DMA addresses: the core's table gets a copy of
                   p2p_info->pages (EINVAL without p2p_info); nmap = its entries
    dma_unmap      nothing
    put_pages      KFD's put_pages(&p2p_info) - skipped once the free callback ran
                   (c2f76a7, see ignore_put_after_free)
    get_page_size  KFD's, 4096 if it fails
    release        free the context; module_put
    free callback  (the buffer is being freed) ib_core's invalidate callback with
                   core_context, then free_callback_called = 1

Module parameter (# EMU: ROCnRDMA has no parameters; this picks the release):
  ignore_put_after_free (default 1): ROCnRDMA from c2f76a7 on ("After free
      callback called PeerDirect will also call put_pages. We should ignore such
      call."), where the callback sets free_callback_called after ib_core's
      invalidate returns - on a 4.x core that write lands in a context release()
      already freed.  0: the release before it, whose callback calls ib_core
      and touches nothing after; put_pages then always calls KFD.

Its only module reference is the MR's (acquire to release): nothing holds the
module while its free callback runs.

# EMU: the stored pre-c2f76a7 copies also test is_gpu_address and p2p_info the
# wrong way round and never keep core_context (they could not have registered
# anything); the model keeps HEAD's working logic for both releases.  The
# context's pid reference (never put in the original) is not modelled.
"""

from __future__ import annotations

from typing import Any

from drivers.amdgpu.kfd_rdma import amdkfd_query_rdma_interface
from drivers.ib_core.peer_mem import (
    ib_register_peer_memory_client,
    ib_unregister_peer_memory_client,
    peer_memory_client,
)
from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.module import module_put, try_module_get
from kernel_model.scatterlist import sg_alloc_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced

MODULE_DEPENDS = ("ib_core", "amdgpu")
DRV_NAME = "amdp2p"
DRV_VERSION = "1.0"


class amd_mem_context:
    """Mirrors struct amd_mem_context."""

    def __init__(self, va: int, size: int, pid: Any):
        self.va, self.size, self.pid = va, size, pid
        self.p2p_info: list = [None]            # struct amd_p2p_info *, by reference
        self.free_callback_called = 0
        self.core_context = 0

    def __repr__(self) -> str:
        return f"amd_mem_context {self.va:#x}+{self.size:#x}"


class AmdP2p:
    """The module's globals: KFD's interface, the registration, ib_core's callback."""

    def __init__(self, mod: Any, rdma_interface: Any, ignore_put_after_free: int):
        self.mod = mod
        self.rdma = rdma_interface
        self.ignore_put_after_free = ignore_put_after_free
        self.ib_reg_handle: Any = None
        self.ib_invalidate_callback: list = [None]

    @traced
    def amd_acquire(self, addr: int, size: int, peer_mem_private_data: Any,
                    peer_mem_name: Any, client_context: list) -> int:
        """Mirrors amd_acquire(): 1 (and a module reference) for the caller's GPU memory."""
        pid = current()                          # get_task_pid(current, PIDTYPE_PID)
        if not self.rdma.is_gpu_address(addr, pid):
            return 0
        client_context[0] = kmalloc_obj(amd_mem_context(addr, size, pid))
        try_module_get(self.mod)                 # __module_get(THIS_MODULE)
        return 1

    @traced
    def amd_get_pages(self, addr: int, size: int, write: int, force: int, sg_head: Any,
                      client_context: amd_mem_context, core_context: int) -> int:
        """Mirrors amd_get_pages(): KFD pins the acquired range."""
        ctx = client_context
        if ctx is None or addr != ctx.va or size != ctx.size:
            return -EINVAL
        ret = self.rdma.get_pages(addr, size, ctx.pid, ctx.p2p_info, self.free_callback, ctx)
        if ret or ctx.p2p_info[0] is None:
            return ret
        ctx.core_context = core_context
        return 0

    @traced
    def amd_dma_map(self, sg_head: Any, client_context: amd_mem_context, dma_device: Any,
                    dmasync: int, nmap: list) -> int:
        """Mirrors amd_dma_map(): the core's table is KFD's (# EMU: its entries copied -
        the original copies the struct, sharing KFD's scatterlist)."""
        info = client_context.p2p_info[0]
        if info is None:
            return -EINVAL
        pages = info.pages
        try:
            sg_alloc_table(sg_head, pages.nents)
        except KernelError as e:
            return -e.errno
        n = pages.nents
        for col in ("sg_len", "dma_addr", "dma_len"):
            getattr(sg_head, col).view[:n] = getattr(pages, col).view[:n]
        nmap[0] = n
        return 0

    @traced
    def amd_dma_unmap(self, sg_head: Any, client_context: amd_mem_context,
                      dma_device: Any) -> int:
        """Mirrors amd_dma_unmap(): nothing (KFD owns the mapping)."""
        return 0

    @traced
    def amd_put_pages(self, sg_head: Any, client_context: amd_mem_context) -> None:
        """Mirrors amd_put_pages(): KFD's put_pages, unless the free callback ran (then
        KFD has released the pin itself) - the check c2f76a7 added."""
        ctx = client_context
        if self.ignore_put_after_free and ctx.free_callback_called:
            return
        ret = self.rdma.put_pages(ctx.p2p_info)
        if ret:
            current().machine.dmesg.append(f"amdp2p: put_pages failed: {ret}")
        ctx.p2p_info[0] = None

    @traced
    def amd_get_page_size(self, client_context: amd_mem_context) -> int:
        """Mirrors amd_get_page_size(): KFD's page size, 4096 if it fails."""
        ctx = client_context
        out = [0]
        if self.rdma.get_page_size(ctx.va, ctx.size, ctx.pid, out):
            return 4096
        return out[0]

    @traced
    def amd_release(self, client_context: amd_mem_context) -> None:
        """Mirrors amd_release(): free the context; module_put."""
        kfree(client_context)
        module_put(self.mod)

    @traced
    def free_callback(self, client_priv: amd_mem_context) -> None:
        """Mirrors free_callback(): the buffer is being freed - tell ib_core; from c2f76a7
        on, then mark the context so put_pages leaves KFD alone."""
        ctx = client_priv
        self.ib_invalidate_callback[0](self.ib_reg_handle, ctx.core_context)
        if self.ignore_put_after_free:
            ctx.free_callback_called = 1

    def client(self) -> peer_memory_client:
        return peer_memory_client(
            DRV_NAME, DRV_VERSION, acquire=self.amd_acquire, get_pages=self.amd_get_pages,
            dma_map=self.amd_dma_map, dma_unmap=self.amd_dma_unmap,
            put_pages=self.amd_put_pages, get_page_size=self.amd_get_page_size,
            release=self.amd_release)


def module_init(mod: Any, ignore_put_after_free: int = 1) -> AmdP2p:
    """Mirrors amdp2p_init(): KFD's interface, then the registration (invalidating)."""
    if ignore_put_after_free not in (0, 1):
        raise KernelError(EINVAL, f"amdp2p_init: ignore_put_after_free "
                          f"{ignore_put_after_free}")
    rdma: list = [None]
    ret = amdkfd_query_rdma_interface(rdma)
    if ret < 0:
        raise KernelError(-ret, "amdp2p_init: amdkfd_query_rdma_interface failed")
    state = AmdP2p(mod, rdma[0], ignore_put_after_free)
    state.ib_reg_handle = ib_register_peer_memory_client(state.client(),
                                                         state.ib_invalidate_callback)
    if state.ib_reg_handle is None:
        raise KernelError(EINVAL, "amdp2p_init: ib_register_peer_memory_client failed")
    return state


def module_exit(mod: Any) -> None:
    """Mirrors amdp2p_cleanup(): unregister (ib_core waits for the client's umems)."""
    ib_unregister_peer_memory_client(mod.state.ib_reg_handle)

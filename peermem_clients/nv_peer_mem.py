"""Mirrors nvidia-peermem (580+) and nv_peer_memory 1.3: the GPU's peer-memory client.

(open-gpu-kernel-modules kernel-open/nvidia-peermem/nvidia-peermem.c;
Mellanox/nv_peer_memory nv_peer_mem.c.)

It lets ibv_reg_mr register GPU memory: when gup fails on a cudaMalloc
address, ib_core asks the peer clients, and this one answers for every
range nvidia_p2p_get_pages accepts.

    acquire        round to 64 KiB GPU pages; probe: nvidia_p2p_get_pages with a
                   dummy callback, then nvidia_p2p_put_pages at once; "mine" (1)
                   if that worked, else "not mine" (0) - any error, BAR1
                   exhaustion included, falls through to the next client
    get_pages      nvidia_p2p_get_pages(0, 0, start, mapped_size, free callback)
    dma_map        nvidia_p2p_dma_map_pages for the HCA; one 64 KiB sg entry
                   per GPU page
    dma_unmap      nvidia_p2p_dma_unmap_pages - skipped on the callback's own task
    put_pages      nvidia_p2p_put_pages - skipped on the callback's own task
    get_page_size  64 KiB
    release        free the sg table and the context
    free callback  (cudaFree, or the owner's GPU file closing) callback_task =
                   current; ib_core's invalidate callback; callback_task = NULL;
                   free_dma_mapping + free_page_table (no-ops that RM honours)

Module parameters (nvidia-peermem's):
  persistent_api_support (default 1, from 560): 1 registers only "nv_mem", persistent
      (nvidia_p2p_get_pages_persistent, no invalidate callback: MRs are never
      invalidated); 0 registers "nv_mem" (invalidating) then "nv_mem_nc"
      (persistent), in that order.
  peerdirect_support (default 0): 0 registers "nv_mem" as a
      peer_memory_client_ex with PEER_MEM_INVALIDATE_UNMAPS; 1 is the legacy
      (MLNX_OFED 4.9) layout: the version's ex marker is set but ex_size 0,
      so the core treats it as an old-style client.
  Any other value: EINVAL at load.
  version (default "580.65.06", nvidia-peermem as built with the driver): "1.0" is
      Mellanox nv_peer_memory 1.0, the client MLNX_OFED 4.x shipped with: one
      old-style client "nv_mem" (no _ex, no persistent twin), whose free
      callback sets a sticky `is_callback` - dma_unmap and put_pages then do
      nothing on any task (Mellanox/nv_peer_memory PR 92 made it callback_task,
      the callback's task only) - and touches the context no more once ib_core's
      invalidate returned (so no write to a context a 4.x core's invalidate may
      have freed through release()).  The other parameters are
      ignored.
  issue53_fix (default 0: nvidia-peermem 580.65.06 as released): 1 is the model's
      proposed fix for Mellanox/nv_peer_memory issue 53 ("concurrent invalidation
      and tear-down can trigger a bug", open since 2019; nvidia-peermem.c up to
      580 has the same code), four changes to the invalidating client:
        - the free callback invalidates whatever get_pages/dma_map have stored yet
          (no "invalid page_table"/"invalid dma_mapping" drop: the core's
          mapping_lock, held from get_pages to activation, orders the two);
        - it does not touch the context once ib_core's invalidate returned (a
          concurrent deregistration of the invalidated MR may release() it);
        - nv_dma_unmap leaves the DMA mappings to put_pages, which unmaps them
          (nv_p2p_free_page_table) atomically with the driver's own teardown and
          waits for an in-flight callback - instead of nvidia_p2p_dma_unmap_pages
          on a page table the driver may be freeing;
        - release() puts a pin no put_pages undid (the core calls none for an
          umem invalidated with UNMAPS): it waits for a callback in flight, so
          the context is not freed under it, and the pin does not outlive it.
      With 0, the races of issue 53 are there (scenarios/races.py's
      invalidate-vs-teardown; ibv_dereg_mr vs cudaFree on the ladder,
      tests/peermem_testing/test_race_ladder_baseline.py).

Lock order: none of its own; see peer_mem.py and drivers/nvidia/nv_p2p.py.
"""

from __future__ import annotations

from array import array
from typing import Any

from drivers.ib_core.peer_mem import (
    PEER_MEM_INVALIDATE_UNMAPS,
    ib_register_peer_memory_client,
    ib_unregister_peer_memory_client,
    peer_memory_client,
    peer_memory_client_ex,
)
from drivers.nvidia.nv_p2p import (
    NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API,
    NVIDIA_P2P_DMA_MAPPING_VERSION,
    NVIDIA_P2P_PAGE_SIZE_64KB,
    NVIDIA_P2P_VERSION_COMPATIBLE,
    nvidia_p2p_dma_map_pages,
    nvidia_p2p_dma_unmap_pages,
    nvidia_p2p_free_dma_mapping,
    nvidia_p2p_free_page_table,
    nvidia_p2p_get_pages,
    nvidia_p2p_get_pages_persistent,
    nvidia_p2p_put_pages,
    nvidia_p2p_put_pages_persistent,
)
from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.module import module_put, try_module_get
from kernel_model.pci import to_pci_dev
from kernel_model.scatterlist import sg_alloc_table, sg_free_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced

MODULE_DEPENDS = ("ib_core", "nvidia")
GPU_PAGE_SHIFT = 16
GPU_PAGE_SIZE = 1 << GPU_PAGE_SHIFT
GPU_PAGE_OFFSET = GPU_PAGE_SIZE - 1
GPU_PAGE_MASK = ~GPU_PAGE_OFFSET
DRV_NAME = "nv_mem"
DRV_VERSION = "580.65.06"
NV_MEM_CONTEXT_MAGIC = 0xF1F4F1D0FEF0DAD0


class nv_mem_context:
    """Mirrors struct nv_mem_context (with the 550+ magic pads)."""

    def __init__(self) -> None:
        self.pad1 = NV_MEM_CONTEXT_MAGIC
        self.page_table: Any = None
        self.dma_mapping: Any = None
        self.core_context = 0
        self.page_virt_start = 0
        self.page_virt_end = 0
        self.mapped_size = 0
        self.npages = 0
        self.page_size = 0
        self.callback_task: Any = None
        self.is_callback = 0          # nv_peer_memory 1.0: set for good by the callback
        self.sg_allocated = 0
        self.sg_head: Any = None
        self.pad2 = NV_MEM_CONTEXT_MAGIC

    def __repr__(self) -> str:
        return (f"nv_mem_context [{self.page_virt_start:#x}, {self.page_virt_end:#x}) "
                f"{self.npages} pages")


class NvPeerMem:
    """The module's globals: the registrations and ib_core's invalidate callback."""

    def __init__(self, mod: Any, persistent_api_support: int, peerdirect_support: int,
                 version: str = DRV_VERSION, issue53_fix: int = 0):
        self.mod = mod
        self.issue53_fix = issue53_fix
        self.version = version
        self.persistent = persistent_api_support
        self.peerdirect_support = peerdirect_support
        self.reg_handle: Any = None
        self.reg_handle_nc: Any = None
        self.mem_invalidate_callback: list = [None]
        self.log: list[str] = []

    def peer_err(self, msg: str) -> None:
        current().machine.dmesg.append(f"nvidia-peermem: {msg}")

    # -- acquire ------------------------------------------------------------------------
    def _acquire(self, addr: int, size: int, client_context: list, persistent: bool) -> int:
        ctx = kmalloc_obj(nv_mem_context())
        ctx.page_virt_start = addr & GPU_PAGE_MASK
        ctx.page_virt_end = (addr + size + GPU_PAGE_SIZE - 1) & GPU_PAGE_MASK
        ctx.mapped_size = ctx.page_virt_end - ctx.page_virt_start
        try:
            if persistent and not NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API():
                # before 535.14 a NULL callback is how a persistent pin is asked for
                pt = nvidia_p2p_get_pages(0, 0, ctx.page_virt_start, ctx.mapped_size, None,
                                          None)
                nvidia_p2p_put_pages(0, 0, ctx.page_virt_start, pt)
            elif persistent:
                pt = nvidia_p2p_get_pages_persistent(ctx.page_virt_start, ctx.mapped_size, 0)
                nvidia_p2p_put_pages_persistent(ctx.page_virt_start, pt, 0)
            else:
                pt = nvidia_p2p_get_pages(0, 0, ctx.page_virt_start, ctx.mapped_size,
                                          self.nv_mem_dummy_callback, ctx)
                nvidia_p2p_put_pages(0, 0, ctx.page_virt_start, pt)
        except KernelError:
            kfree(ctx)
            return 0                       # not GPU memory we can pin: not mine
        client_context[0] = ctx
        try_module_get(self.mod)           # __module_get(THIS_MODULE)
        return 1

    @traced
    def nv_mem_acquire(self, addr: int, size: int, peer_mem_private_data: Any,
                       peer_mem_name: Any, client_context: list) -> int:
        """Mirrors nv_mem_acquire(): 1 if the whole range is GPU memory we can pin."""
        return self._acquire(addr, size, client_context, False)

    @traced
    def nv_mem_acquire_nc(self, addr: int, size: int, peer_mem_private_data: Any,
                          peer_mem_name: Any, client_context: list) -> int:
        """Mirrors nv_mem_acquire_nc(): the same, probing with the persistent API."""
        return self._acquire(addr, size, client_context, True)

    def nv_mem_dummy_callback(self, data: Any) -> None:
        """Mirrors nv_mem_dummy_callback(): the probe's pages went; free the table."""
        nvidia_p2p_free_page_table(data.page_table)

    # -- get / put ------------------------------------------------------------------------
    @traced
    def nv_mem_get_pages(self, addr: int, size: int, write: int, force: int, sg_head: Any,
                         context: nv_mem_context, core_context: int) -> int:
        """Mirrors nv_mem_get_pages(): pin the range acquire rounded (addr/size unused)."""
        if context is None:
            return -EINVAL
        context.core_context = core_context
        context.page_size = GPU_PAGE_SIZE
        try:
            context.page_table = nvidia_p2p_get_pages(0, 0, context.page_virt_start,
                                                      context.mapped_size,
                                                      self.nv_get_p2p_free_callback, context)
        except KernelError as e:
            self.peer_err(f"nv_mem_get_pages: error {-e.errno} while calling "
                          "nvidia_p2p_get_pages()")
            return -e.errno
        # the page table must not be used here: an invalidation may already run
        return 0

    @traced
    def nv_mem_get_pages_nc(self, addr: int, size: int, write: int, force: int,
                            sg_head: Any, context: nv_mem_context, core_context: int) -> int:
        """Mirrors nv_mem_get_pages_nc(): the persistent pin."""
        if context is None:
            return -EINVAL
        context.core_context = core_context
        context.page_size = GPU_PAGE_SIZE
        try:
            if NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API():
                context.page_table = nvidia_p2p_get_pages_persistent(context.page_virt_start,
                                                                     context.mapped_size, 0)
            else:                  # the pre-535.14 way: a NULL callback
                context.page_table = nvidia_p2p_get_pages(0, 0, context.page_virt_start,
                                                          context.mapped_size, None, None)
        except KernelError as e:
            return -e.errno
        return 0

    def _sane(self, sg_head: Any, context: nv_mem_context | None) -> bool:
        if context is None:
            return False
        # WARN_ON(memcmp(sg_head, &ctx->sg_head)): a context dma_map never filled holds
        # a zeroed sg_table, equal to the core's own while that is still empty
        never_filled = context.sg_head is None and sg_head is not None and \
            sg_head.orig_nents == 0
        if sg_head is not context.sg_head and not never_filled:
            current().machine.report_bug("nv_peer_mem", "sg_head is not the one dma_map "
                                         "filled")
            return False
        return True

    @traced
    def nv_mem_put_pages(self, sg_head: Any, context: nv_mem_context) -> None:
        """Mirrors nv_mem_put_pages(): unpin, unless this is the free callback's own
        task (the GPU driver unpins after the callback; put_pages would wait on it)."""
        if not self._sane(sg_head, context) or context.callback_task is current() or \
                context.is_callback:
            return
        page_table = context.page_table
        if self.issue53_fix:
            context.page_table = None          # put: release has nothing left to unpin
        nvidia_p2p_put_pages(0, 0, context.page_virt_start, page_table)

    @traced
    def nv_mem_put_pages_nc(self, sg_head: Any, context: nv_mem_context) -> None:
        """Mirrors nv_mem_put_pages_persistent()."""
        if not self._sane(sg_head, context):
            return
        page_table = context.page_table
        if self.issue53_fix:
            context.page_table = None
        if NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API():
            nvidia_p2p_put_pages_persistent(context.page_virt_start, page_table, 0)
        else:
            nvidia_p2p_put_pages(0, 0, context.page_virt_start, page_table)

    # -- DMA -------------------------------------------------------------------------------
    @traced
    def nv_dma_map(self, sg_head: Any, context: nv_mem_context, dma_device: Any, dmasync: int,
                   nmap: list) -> int:
        """Mirrors nv_dma_map(): the HCA's bus addresses, one 64 KiB entry per GPU page."""
        pt = context.page_table
        if pt.page_size != NVIDIA_P2P_PAGE_SIZE_64KB:
            self.peer_err(f"nv_dma_map: assumption of 64KB pages failed size_id={pt.page_size}")
            return -EINVAL
        pdev = to_pci_dev(dma_device)
        if pdev is None:
            self.peer_err("nv_dma_map: invalid pci_dev")
            return -EINVAL
        try:
            mapping = nvidia_p2p_dma_map_pages(pdev, pt)
        except KernelError as e:
            self.peer_err(f"nv_dma_map: error {-e.errno} while calling "
                          "nvidia_p2p_dma_map_pages()")
            return -e.errno
        if not NVIDIA_P2P_VERSION_COMPATIBLE(mapping, NVIDIA_P2P_DMA_MAPPING_VERSION):
            nvidia_p2p_dma_unmap_pages(pdev, pt, mapping)
            return -EINVAL
        context.npages = mapping.entries
        try:
            sg_alloc_table(sg_head, context.npages)
        except KernelError as e:
            nvidia_p2p_dma_unmap_pages(pdev, pt, mapping)
            return -e.errno
        context.dma_mapping = mapping
        context.sg_allocated = 1
        # for each entry: sg_set_page(sg, NULL, 64K, 0), its DMA address and length
        n = context.npages
        sixty_four_k = array("Q", [GPU_PAGE_SIZE]) * n
        sg_head.sg_len.view[:n] = sixty_four_k
        sg_head.dma_addr.view[:n] = mapping.dma_addr_array.view[:n]
        sg_head.dma_len.view[:n] = sixty_four_k
        context.sg_head = sg_head
        nmap[0] = context.npages
        return 0

    @traced
    def nv_dma_unmap(self, sg_head: Any, context: nv_mem_context, dma_device: Any) -> int:
        """Mirrors nv_dma_unmap(): 0; skipped on the free callback's own task."""
        if not self._sane(sg_head, context):
            return -EINVAL
        if context.callback_task is current() or context.is_callback:
            return 0
        if self.issue53_fix:
            return 0               # put_pages unmaps them, ordered with the driver's teardown
        if context.dma_mapping is not None:
            nvidia_p2p_dma_unmap_pages(to_pci_dev(dma_device), context.page_table,
                                       context.dma_mapping)
        return 0

    # -- the rest ----------------------------------------------------------------------------
    @traced
    def nv_mem_get_page_size(self, context: nv_mem_context) -> int:
        """Mirrors nv_mem_get_page_size(): 64 KiB (set by get_pages)."""
        return context.page_size

    @traced
    def nv_mem_release(self, context: nv_mem_context) -> None:
        """Mirrors nv_mem_release(): the sg table, then the context; module_put.

        With issue53_fix, a pin put_pages never undid (the core skips put_pages for an
        umem invalidated with UNMAPS) is put first: that waits for a free callback in
        flight, so the context is not freed under it, and is a no-op once the driver
        tore the mapping down."""
        if self.issue53_fix and context.page_table is not None and \
                context.callback_task is not current():
            page_table, context.page_table = context.page_table, None
            nvidia_p2p_put_pages(0, 0, context.page_virt_start, page_table)
        if context.sg_allocated:
            sg_free_table(context.sg_head)
            context.sg_allocated = 0
        kfree(context)
        module_put(self.mod)

    @traced
    def nv_get_p2p_free_callback(self, data: nv_mem_context) -> None:
        """Mirrors nv_get_p2p_free_callback(): the GPU memory is going - tell ib_core on
        this task (marked in callback_task), then hand the tables back to the driver."""
        try_module_get(self.mod)
        ctx = data
        try:
            if ctx is None or ctx.pad1 != NV_MEM_CONTEXT_MAGIC or \
                    ctx.pad2 != NV_MEM_CONTEXT_MAGIC:
                self.peer_err("nv_get_p2p_free_callback -- detected invalid context, "
                              "skipping further processing")
                return
            page_table, dma_mapping = ctx.page_table, ctx.dma_mapping
            if self.issue53_fix:
                # the proposed fix: no drop, and ctx is not touched after the core returns
                ctx.callback_task = current()
                self.mem_invalidate_callback[0](self.reg_handle, ctx.core_context)
                nvidia_p2p_free_dma_mapping(dma_mapping)
                nvidia_p2p_free_page_table(page_table)
                return
            if page_table is None:
                self.peer_err("nv_get_p2p_free_callback -- invalid page_table")
                return
            if dma_mapping is None:
                self.peer_err("nv_get_p2p_free_callback -- invalid dma_mapping")
                return
            if self.version == "1.0":
                # 1.0: the flag stays set; nothing reads ctx after the core returns
                ctx.is_callback = 1
                self.mem_invalidate_callback[0](self.reg_handle, ctx.core_context)
            else:
                ctx.callback_task = current()
                self.mem_invalidate_callback[0](self.reg_handle, ctx.core_context)
                ctx.callback_task = None
            nvidia_p2p_free_dma_mapping(dma_mapping)
            nvidia_p2p_free_page_table(page_table)
        finally:
            module_put(self.mod)

    # -- the two client tables ------------------------------------------------------------------
    def nv_mem_client(self) -> peer_memory_client:
        return peer_memory_client(
            DRV_NAME, self.version, acquire=self.nv_mem_acquire, get_pages=self.nv_mem_get_pages,
            dma_map=self.nv_dma_map, dma_unmap=self.nv_dma_unmap,
            put_pages=self.nv_mem_put_pages, get_page_size=self.nv_mem_get_page_size,
            release=self.nv_mem_release)

    def nv_mem_client_nc(self, name: str) -> peer_memory_client:
        return peer_memory_client(
            name, DRV_VERSION, acquire=self.nv_mem_acquire_nc,
            get_pages=self.nv_mem_get_pages_nc, dma_map=self.nv_dma_map,
            dma_unmap=self.nv_dma_unmap, put_pages=self.nv_mem_put_pages_nc,
            get_page_size=self.nv_mem_get_page_size, release=self.nv_mem_release)


def module_init(mod: Any, persistent_api_support: int = 1,
                peerdirect_support: int = 0, version: str = DRV_VERSION,
                issue53_fix: int = 0) -> NvPeerMem:
    """Mirrors nv_mem_client_init(): check the parameters, register the client(s)."""
    if version == "1.0":
        # nv_peer_memory 1.0's nv_mem_client_init: one old-style invalidating client
        state = NvPeerMem(mod, 0, 1, version)
        state.reg_handle = ib_register_peer_memory_client(state.nv_mem_client(),
                                                          state.mem_invalidate_callback)
        if state.reg_handle is None:
            raise KernelError(EINVAL, "nv_mem_client_init: registration failed")
        return state
    if version != DRV_VERSION:
        raise KernelError(EINVAL, f"nv_mem_client_init: version {version!r}: the model has "
                          f"nvidia-peermem {DRV_VERSION} and nv_peer_memory 1.0")
    if peerdirect_support not in (0, 1):
        raise KernelError(EINVAL, f"nv_mem_client_init: invalid value for peerdirect_support "
                          f"{peerdirect_support}")
    if persistent_api_support not in (0, 1):
        raise KernelError(EINVAL, "nv_mem_client_init: invalid value for "
                          f"persistent_api_support {persistent_api_support}")
    # EMU: issue53_fix is no nvidia-peermem parameter: the model's proposed fix for
    # Mellanox/nv_peer_memory issue 53 (open), off by default (580.65.06 as released)
    if issue53_fix not in (0, 1):
        raise KernelError(EINVAL, f"nv_mem_client_init: invalid value for issue53_fix "
                          f"{issue53_fix}")
    release = current().machine.modules["nvidia"].state.release
    if tuple(release) < (560, 0):
        # the parameter arrived in 560: earlier builds always register nv_mem, then
        # nv_mem_nc (# EMU: the model takes the parameter and ignores it)
        persistent_api_support = 0
    state = NvPeerMem(mod, persistent_api_support, peerdirect_support,
                      issue53_fix=issue53_fix)
    if persistent_api_support:
        # only the persistent client, under the plain name, without invalidation
        state.reg_handle_nc = ib_register_peer_memory_client(state.nv_mem_client_nc(DRV_NAME),
                                                             None)
        if state.reg_handle_nc is None:
            raise KernelError(EINVAL, "nv_mem_client_init: registration failed")
        return state
    client = state.nv_mem_client()
    if peerdirect_support == 0:
        peer_memory_client_ex(client, flags=PEER_MEM_INVALIDATE_UNMAPS)
    else:
        peer_memory_client_ex(client, ex_size=0, flags=0)   # the marker, nothing more
    state.reg_handle = ib_register_peer_memory_client(client, state.mem_invalidate_callback)
    if state.reg_handle is None:
        raise KernelError(EINVAL, "nv_mem_client_init: registration failed")
    state.reg_handle_nc = ib_register_peer_memory_client(state.nv_mem_client_nc(
        DRV_NAME + "_nc"), None)
    if state.reg_handle_nc is None:
        ib_unregister_peer_memory_client(state.reg_handle)
        raise KernelError(EINVAL, "nv_mem_client_init: registration failed")
    return state


def module_exit(mod: Any) -> None:
    """Mirrors nv_mem_client_cleanup(): unregister both (waits for their MRs)."""
    state: NvPeerMem = mod.state
    if state.reg_handle is not None:
        ib_unregister_peer_memory_client(state.reg_handle)
    if state.reg_handle_nc is not None:
        ib_unregister_peer_memory_client(state.reg_handle_nc)

"""cmb_peer: a peer-memory client written from scratch, for a device's memory BAR.

The worked example of docs/peer-clients.md.  It lets ibv_reg_mr register
memory a process mapped from /dev/uioN (the uio_cmb driver maps a CMB
device's memory BAR with io_remap_pfn_range, so gup refuses it), and it
can take the memory away again: when the device is reset the driver
calls cmb_peer_revoke_all(), which invalidates every registration.

It registers as a peer_memory_client_ex with PEER_MEM_INVALIDATE_UNMAPS:
after it calls the invalidate callback it tears its DMA mappings down
itself, and the core will not call dma_unmap/put_pages for that umem.

Installed as a package (see pyproject.toml here) it is found through the
`peermem.clients` entry-point group: `m.load_module("cmb_peer")`.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.peer_mem import (
    PEER_MEM_INVALIDATE_UNMAPS,
    ib_register_peer_memory_client,
    ib_unregister_peer_memory_client,
    peer_memory_client,
    peer_memory_client_ex,
)
from kernel_model.current import current
from kernel_model.dma import (
    DMA_BIDIRECTIONAL,
    dma_map_resource,
    dma_mapping_error,
    dma_unmap_resource,
)
from kernel_model.errno import EINVAL, EIO, KernelError
from kernel_model.locking import (
    init_waitqueue_head,
    mutex_init,
    mutex_lock,
    mutex_unlock,
    wait_event,
    wake_up,
)
from kernel_model.memory import follow_pfn
from kernel_model.module import module_put, try_module_get
from kernel_model.refcount import kref, kref_get, kref_init, kref_put
from kernel_model.scatterlist import sg_alloc_table, sg_free_table
from kernel_model.slab import kfree, kmalloc_obj

MODULE_DEPENDS = ("ib_core", "uio_cmb")


class cmb_ctx:
    """What the client keeps per registration."""

    def __init__(self, addr: int, size: int):
        self.addr, self.size = addr, size
        self.pfns: list[int] = []           # filled by get_pages
        self.dma: list[int] = []            # filled by dma_map
        self.device: Any = None
        self.core_context = 0
        self.revoked = False                # invalidated: our mappings are gone
        self.revoking: Any = None           # the task revoke_all invalidates it on, now
        self.kref = kref()                  # the core's reference, and revoke_all's
        kref_init(self.kref)


class CmbPeer:
    """The module: one registration, its live contexts, a lock over them."""

    def __init__(self, mod: Any = None) -> None:
        self.mod = mod                      # ours: each MR and each reset holds it
        self.lock = mutex_init("cmb_peer.lock")
        self.live: list[cmb_ctx] = []       # protected by lock
        self.revoke_wq = init_waitqueue_head("cmb_peer.revoke_wq")
        self.invalidate: list = [None]      # filled by ib_register_peer_memory_client
        self.reg: Any = None

    # acquire: is the whole range ours?  Only a /dev/uio mapping is.
    def acquire(self, addr, size, priv, name, client_context) -> int:
        vma = current().mm.find_vma(addr)
        if vma is None or vma.vm_start > addr or vma.vm_end < addr + size:
            return 0
        if vma.vm_file is None or not vma.vm_file.f_path.startswith("/dev/uio"):
            return 0
        ctx = kmalloc_obj(cmb_ctx(addr, size))
        ctx.kref.ctx = ctx                  # container_of(kref, struct cmb_ctx, kref)
        client_context[0] = ctx
        try_module_get(self.mod)            # the MR keeps us loaded, until release
        return 1

    # get_pages: pin.  Device memory needs no pinning; remember the PFNs and
    # the core_context we must name if we ever invalidate.
    def get_pages(self, addr, size, write, force, sg_head, ctx, core_context) -> int:
        mm = current().mm
        ps = current().machine.page_size
        vma = mm.find_vma(ctx.addr)
        try:
            for va in range(ctx.addr & ~(ps - 1), ctx.addr + ctx.size, ps):
                ctx.pfns.append(follow_pfn(vma, va))
        except KernelError as e:
            ctx.pfns.clear()
            return -e.errno
        ctx.core_context = core_context
        mutex_lock(self.lock)
        self.live.append(ctx)
        mutex_unlock(self.lock)
        return 0

    # dma_map: one PAGE_SIZE entry per page, as the HCA must address it
    def dma_map(self, sg_head, ctx, dma_device, dmasync, nmap) -> int:
        m = current().machine
        ps = m.page_size
        sg_alloc_table(sg_head, len(ctx.pfns))
        for i, pfn in enumerate(ctx.pfns):
            a = dma_map_resource(dma_device, pfn << m.page_shift, ps, DMA_BIDIRECTIONAL)
            if dma_mapping_error(dma_device, a):
                self._unmap(ctx, dma_device)
                sg_free_table(sg_head)
                return -EIO
            ctx.dma.append(a)
            sg_head.sg_len.view[i] = ps
            sg_head.dma_addr.view[i] = a
            sg_head.dma_len.view[i] = ps
        ctx.device = dma_device
        nmap[0] = len(ctx.pfns)
        return 0

    def _unmap(self, ctx, dev) -> None:
        for a in ctx.dma:
            dma_unmap_resource(dev, a, current().machine.page_size, DMA_BIDIRECTIONAL)
        ctx.dma.clear()

    # dma_unmap: may come after we already tore down in an invalidation
    def dma_unmap(self, sg_head, ctx, dma_device) -> int:
        mutex_lock(self.lock)
        if not ctx.revoked:
            self._unmap(ctx, dma_device)
        mutex_unlock(self.lock)
        return 0

    # put_pages: the range is no longer used by the device.  If revoke_all is
    # invalidating this very registration, wait until it is done: right after
    # put_pages the core clears the umem's client, and an invalidation still
    # on its way would find it NULL (MLNX_OFED's peer_mem.c: an
    # ib_invalidate_peer_memory() running after ib_peer_umem_release(); nvidia's
    # put_pages waits for its free callback the same way).  No lock of the core
    # is held here, so the invalidation can finish.  The test of `revoking` must
    # be under our lock, with the removal from `live`: revoke_all either takes
    # the context before (and we wait) or never sees it.
    def put_pages(self, sg_head, ctx) -> None:
        mutex_lock(self.lock)
        if ctx in self.live:
            self.live.remove(ctx)
        # an older core (MLNX_OFED 4.x) calls us inside our own invalidate call, on
        # revoke_all's task: that invalidation is ours, and waiting would never end
        revoking = ctx.revoking not in (None, current())
        mutex_unlock(self.lock)
        if revoking:
            wait_event(self.revoke_wq, lambda: not ctx.revoking)
        sg_free_table(sg_head)

    def get_page_size(self, ctx) -> int:
        return current().machine.page_size

    # release: the core is done with the context; revoke_all may still hold it
    def release(self, ctx) -> None:
        kref_put(ctx.kref, _free)
        module_put(self.mod)

    # the device goes away: invalidate every registration, then tear our side down
    def revoke_all(self) -> int:
        # our own module reference while this runs: a deregistration of the MRs we
        # invalidate may drop their references, and an rmmod then would unload us
        try_module_get(self.mod)            # (__module_get, as nvidia's callback does)
        mutex_lock(self.lock)
        victims, self.live = self.live, []
        for ctx in victims:
            kref_get(ctx.kref)              # a deregistration may release it meanwhile
            ctx.revoking = current()        # ... and its put_pages waits for us
        mutex_unlock(self.lock)
        for ctx in victims:
            # no lock held across the callback: it takes the umem's mapping_lock,
            # and the core's stop path takes that before calling our dma_unmap
            self.invalidate[0](self.reg, ctx.core_context)
            mutex_lock(self.lock)
            self._unmap(ctx, ctx.device)
            ctx.revoked = True
            ctx.revoking = None
            mutex_unlock(self.lock)
            wake_up(self.revoke_wq)
            kref_put(ctx.kref, _free)
        module_put(self.mod)
        return len(victims)


def _free(k) -> None:
    kfree(k.ctx)


def cmb_peer_revoke_all() -> int:
    """What the device driver calls on a reset: every registration is invalidated."""
    return current().machine.modules["cmb_peer"].state.revoke_all()


def module_init(mod) -> CmbPeer:
    state = CmbPeer(mod)
    client = peer_memory_client(
        "cmb_peer", "1.0", acquire=state.acquire, get_pages=state.get_pages,
        dma_map=state.dma_map, dma_unmap=state.dma_unmap, put_pages=state.put_pages,
        get_page_size=state.get_page_size, release=state.release)
    peer_memory_client_ex(client, flags=PEER_MEM_INVALIDATE_UNMAPS)
    state.reg = ib_register_peer_memory_client(client, state.invalidate)
    if state.reg is None:
        raise KernelError(EINVAL, "cmb_peer: registration failed")
    return state


def module_exit(mod) -> None:
    ib_unregister_peer_memory_client(mod.state.reg)

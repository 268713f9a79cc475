"""The amdgpu DRM render node, reduced to buffer objects: drm_file.c, drm_ioctl.c,
drm_gem.c, drm_prime.c and drm_vma_manager.c of the DRM core, with amdgpu_gem.c,
amdgpu_dma_buf.c and the TTM pieces (ttm_bo_vm.c, the move) they use.

One render node per AMD GPU, /dev/dri/renderD(128 + n).  What a program does
through it (kernel_model/uapi/drm.py; rdma-core's pyverbs dmabuf_alloc.c does
these five steps):

    open                        a drm_file: its GEM handles and PRIME cache
    DRM_IOCTL_VERSION           name "amdgpu", date, description, version
    DRM_IOCTL_AMDGPU_GEM_CREATE a buffer object (amdgpu_bo): VRAM (64 KiB pages of
                                the GPU, reached through BAR0) or GTT (system
                                pages); a handle for it in the file.  VRAM is
                                always cleared; a VRAM request that does not fit
                                falls back to GTT, as upstream retries
    DRM_IOCTL_AMDGPU_GEM_MMAP   the fake offset the object is mmap()ed at through
                                the render node fd (drm_vma_offset_manager)
    mmap(drm fd, offset)        drm_gem_mmap -> ttm_bo_mmap_obj: VM_PFNMAP|VM_IO, no
                                PTEs yet; each CPU fault inserts the PFN of the
                                object's page where it lives now (a BAR0 page for
                                VRAM, the system page for GTT)
    DRM_IOCTL_PRIME_HANDLE_TO_FD a dma-buf of the object (one per object, cached
                                in obj->dma_buf and the file's PRIME table); its fd
    DRM_IOCTL_GEM_CLOSE         the handle goes (with the file's PRIME entry and,
                                for the last handle, obj->dma_buf's reference)

Lifetime: the object lives while a handle, its dma-buf (the export's reference)
or a CPU mapping holds it; then its memory goes back.

The dma-buf exporter (amdgpu_dmabuf_ops) is dynamic: it has pin/unpin, so an
importer that is itself dynamic (mlx5's dma-buf MRs) attaches without pinning
and the object may move.  amdgpu_bo_validate() moves an object between VRAM and
GTT with its reservation held: amdgpu_bo_move_notify() first tells every
importer (dma_buf_move_notify) and zaps every CPU mapping (ttm_bo_unmap_virtual),
then the bytes are copied to the new place and the old memory is freed.
Importers map again on demand (amdgpu_dma_buf_map: validate into GTT, or VRAM
when the object prefers VRAM and the importer can do peer-to-peer).

Errors as upstream: EINVAL for an unknown DRM ioctl, bad GEM flags or domains,
bad PRIME flags, an mmap at no object's offset, larger than the object or
private-writable; ENOENT for an unknown handle; EACCES for an ioctl a render
node does not allow or an mmap of an object the file holds no handle of; EPERM
to map an object created NO_CPU_ACCESS; ENOMEM when neither VRAM nor system
memory can hold the object; EFAULT for a bad argument pointer.

# EMU: no GART, GPU virtual memory, command submission, fences (the dma_resv is
# the object's mutex), eviction under memory pressure (a move happens only when
# amdgpu_bo_validate() is called) or runtime PM; CPU and GTT domains are both
# plain system pages; a CPU fault inserts one page (no TTM prefault of the next
# 15); every device on the emulated bus can reach BAR0 peer-to-peer
# (pci_p2pdma_distance is not modelled).
"""

from __future__ import annotations

import struct
from typing import Any

from c_ext import U64Array
from kernel_model.current import current
from kernel_model.dma import (
    dma_map_resource,
    dma_map_sgtable,
    dma_mapping_error,
    dma_unmap_resource,
    dma_unmap_sgtable,
)
from kernel_model.dma_buf import (
    dma_buf_export,
    dma_buf_fd,
    dma_buf_move_notify,
    dma_buf_ops,
    dma_buf_put,
)
from kernel_model.errno import (
    EACCES,
    EBUSY,
    EFAULT,
    EINVAL,
    ENOENT,
    ENOMEM,
    EPERM,
    KernelError,
)
from kernel_model.fs import cdev, cdev_add, cdev_del, file_operations, get_file
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.memory import VM_FAULT_SIGBUS, remap_pfn_range, zap_vma_ptes
from kernel_model.mm import (
    VM_DONTDUMP,
    VM_DONTEXPAND,
    VM_IO,
    VM_MAYWRITE,
    VM_PFNMAP,
    VM_SHARED,
    vm_operations_struct,
)
from kernel_model.page_alloc import __GFP_ZERO, GFP_KERNEL, alloc_pages, page_to_phys, put_page
from kernel_model.scatterlist import sg_alloc_table_from_pages, sg_free_table, sg_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user, copy_to_user
from kernel_model.uapi import drm as uapi

# amdgpu_drv.c
DRIVER_NAME, DRIVER_DESC, DRIVER_DATE = "amdgpu", "AMD GPU", "20150101"
KMS_DRIVER_MAJOR, KMS_DRIVER_MINOR, KMS_DRIVER_PATCHLEVEL = 3, 59, 0
# drm_ioctl flags
DRM_AUTH, DRM_MASTER, DRM_ROOT_ONLY, DRM_RENDER_ALLOW = 0x1, 0x2, 0x4, 0x20
# TTM memory types
TTM_PL_SYSTEM, TTM_PL_TT, TTM_PL_VRAM = 0, 1, 2


class drm_vma_offset_manager:
    """Mirrors struct drm_vma_offset_manager: fake mmap offsets (in pages) for objects,
    from DRM_FILE_PAGE_OFFSET_START, first fit."""

    def __init__(self, page_shift: int):
        self.start = (0xFFFFFFFF >> page_shift) + 1      # DRM_FILE_PAGE_OFFSET_START
        self.nodes: dict[int, Any] = {}                   # start page -> object

    def add(self, obj: Any, pages: int) -> int:
        """drm_vma_offset_add(): the object's node start."""
        at = self.start
        for s in sorted(self.nodes):
            if at + pages <= s:
                break
            at = max(at, s + self.nodes[s].vma_pages)
        self.nodes[at] = obj
        return at

    def remove(self, start: int) -> None:
        """drm_vma_offset_remove()."""
        self.nodes.pop(start, None)

    def exact_lookup(self, start: int, pages: int) -> Any:
        """drm_vma_offset_exact_lookup_locked(): the object whose node starts at start
        and holds `pages` pages; None otherwise."""
        obj = self.nodes.get(start)
        return obj if obj is not None and pages <= obj.vma_pages else None


class drm_device:
    """Mirrors struct drm_device for one amdgpu render node (adev: the GPU's kfd_dev,
    whose VRAM page pool amdgpu and amdkfd share)."""

    def __init__(self, adev: Any, index: int, owner: Any):
        self.adev = adev
        self.path = uapi.render_node_path(index)
        self.vma_offset_manager = drm_vma_offset_manager(current().machine.page_shift)
        self.object_name_lock = mutex_init("drm_device.object_name_lock")
        self.objects: list[amdgpu_bo] = []                # live objects, for remove
        self.cdev = cdev(file_operations(owner=owner, open=drm_open, release=drm_release,
                                         unlocked_ioctl=drm_ioctl, mmap=drm_gem_mmap),
                         private=self)

    def __repr__(self) -> str:
        return f"drm_device {self.path} {len(self.objects)} objects"


class drm_file:
    """Mirrors struct drm_file: the file's GEM handles (object_idr) and its PRIME
    table (drm_prime_file_private: handle -> dma_buf)."""

    def __init__(self, dev: drm_device):
        self.dev = dev
        self.object_idr: dict[int, amdgpu_bo] = {}
        self.prime: dict[int, Any] = {}
        self.prime_lock = mutex_init("drm_prime_file_private.lock")
        self.table_lock = mutex_init("drm_file.table_lock")

    def __repr__(self) -> str:
        return f"drm_file of {self.dev.path}: {len(self.object_idr)} handles"


class amdgpu_bo:
    """Mirrors struct amdgpu_bo (a drm_gem_object in a ttm_buffer_object): its size,
    references, handles, exported dma-buf, reservation, mmap node and where it lives
    (mem_type: VRAM pages of the GPU, or system pages for TT)."""

    def __init__(self, dev: drm_device, size: int, preferred_domains: int, flags: int):
        self.dev = dev
        self.size = size
        self.preferred_domains, self.flags = preferred_domains, flags
        self.refcount = 1
        self.handle_count = 0
        self.dma_buf: Any = None
        self.resv = mutex_init("amdgpu_bo.resv")          # obj->resv (dma_resv)
        self.pin_count = 0
        self.mem_type = TTM_PL_SYSTEM
        self.vram_pages: list[int] = []                   # GPU pages, for VRAM
        self.pages: list[Any] = []                        # struct page, for TT
        self.vma_start = 0
        self.vma_pages = 0
        self.vma_allowed: dict[drm_file, int] = {}        # drm_vma_node_allow counts
        self.vmas: list[Any] = []                         # CPU mappings (for unmap_virtual)

    def __repr__(self) -> str:
        where = {TTM_PL_VRAM: "VRAM", TTM_PL_TT: "GTT"}.get(self.mem_type, "system")
        return f"amdgpu_bo {self.size:#x} in {where} ref {self.refcount}"


def _page_size() -> int:
    return current().machine.page_size


# -- placement: VRAM and GTT memory -----------------------------------------------------------
def _vram_alloc(bo: amdgpu_bo) -> list[int]:
    """amdgpu_vram_mgr_new(): GPU pages for the object, cleared, their BAR0 windows
    mapped (see kernel_model/hw/amdgpu.py); ENOMEM when VRAM cannot hold it."""
    adev = bo.dev.adev
    n = -(-bo.size // GPU_PAGE_SIZE)
    if n > len(adev.free_pages):
        raise KernelError(ENOMEM, f"amdgpu_vram_mgr_new: {n} pages wanted, "
                          f"{len(adev.free_pages)} free")
    pages = [adev.free_pages.pop() for _ in range(n)]
    for page in pages:
        adev.gpu.bar1_map(page, page)
        off = page << GPU_PAGE_SHIFT
        adev.gpu.vidmem[off:off + GPU_PAGE_SIZE] = bytes(GPU_PAGE_SIZE)
    return pages


def _vram_free(bo: amdgpu_bo, pages: list[int]) -> None:
    adev = bo.dev.adev
    for page in pages:
        adev.gpu.bar1_unmap(page)
    adev.free_pages.extend(reversed(pages))


def _tt_alloc(bo: amdgpu_bo) -> list[Any]:
    """ttm_pool_alloc(): zeroed system pages for the object; ENOMEM, none kept, when
    memory runs out."""
    n = -(-bo.size // _page_size())
    pages: list[Any] = []
    try:
        for _ in range(n):
            pages.append(alloc_pages(GFP_KERNEL | __GFP_ZERO, 0, "amdgpu gtt"))
    except KernelError:
        for pg in pages:
            put_page(pg)
        raise
    return pages


def amdgpu_bo_bus_address(bo: amdgpu_bo, off: int) -> int:
    """Where byte `off` of a VRAM object is on the bus (BAR0; large BAR: 1:1)."""
    page = bo.vram_pages[off >> GPU_PAGE_SHIFT]
    return bo.dev.adev.gpu.bar1_bus_address(page) + (off & (GPU_PAGE_SIZE - 1))


def _read_all(bo: amdgpu_bo) -> bytes:
    """The object's bytes where it lives (the copy a move's blit makes)."""
    gpu = bo.dev.adev.gpu
    if bo.mem_type == TTM_PL_VRAM:
        return b"".join(gpu.vidmem_read(p << GPU_PAGE_SHIFT, GPU_PAGE_SIZE)
                        for p in bo.vram_pages)[:bo.size]
    m = current().machine
    return b"".join(m.phys_read(page_to_phys(pg), m.page_size) for pg in bo.pages)[:bo.size]


def _write_all(bo: amdgpu_bo, data: bytes) -> None:
    gpu = bo.dev.adev.gpu
    if bo.mem_type == TTM_PL_VRAM:
        for i, p in enumerate(bo.vram_pages):
            chunk = data[i * GPU_PAGE_SIZE:(i + 1) * GPU_PAGE_SIZE]
            gpu.vidmem_write(p << GPU_PAGE_SHIFT, chunk)
        return
    m = current().machine
    ps = m.page_size
    for i, pg in enumerate(bo.pages):
        m.phys_write(page_to_phys(pg), data[i * ps:(i + 1) * ps])


@traced
def amdgpu_bo_create(dev: drm_device, size: int, domain: int, flags: int) -> amdgpu_bo:
    """Mirrors amdgpu_bo_create() + the first validation: the object, placed in VRAM
    when `domain` has VRAM and VRAM has room, else in system pages (GTT) when the
    domain allows them; ENOMEM when it does not fit.  Its mmap node is added
    (drm_vma_offset_add)."""
    ps = _page_size()
    size = -(-size // ps) * ps
    bo = kmalloc_obj(amdgpu_bo(dev, size, domain, flags))
    try:
        if domain & uapi.AMDGPU_GEM_DOMAIN_VRAM:
            try:
                bo.vram_pages = _vram_alloc(bo)
                bo.mem_type = TTM_PL_VRAM
            except KernelError:
                if not domain & uapi.AMDGPU_GEM_DOMAIN_GTT:
                    raise
        if bo.mem_type == TTM_PL_SYSTEM:
            bo.pages = _tt_alloc(bo)
            bo.mem_type = TTM_PL_TT
    except KernelError:
        kfree(bo)
        raise
    bo.vma_pages = size // ps
    bo.vma_start = dev.vma_offset_manager.add(bo, bo.vma_pages)
    dev.objects.append(bo)
    return bo


def _release_memory(bo: amdgpu_bo) -> None:
    if bo.mem_type == TTM_PL_VRAM:
        _vram_free(bo, bo.vram_pages)
        bo.vram_pages = []
    else:
        for pg in bo.pages:
            put_page(pg)
        bo.pages = []
    bo.mem_type = TTM_PL_SYSTEM


def drm_gem_object_get(bo: amdgpu_bo) -> None:
    """Mirrors drm_gem_object_get()."""
    bo.refcount += 1


@traced
def drm_gem_object_put(bo: amdgpu_bo) -> None:
    """Mirrors drm_gem_object_put(): the last reference frees the object
    (amdgpu_gem_object_free -> amdgpu_bo_unref: its memory goes back)."""
    if bo.refcount <= 0:
        current().machine.report_bug("drm_gem_object_put", f"{bo} put below zero")
        return
    bo.refcount -= 1
    if bo.refcount:
        return
    if bo.pin_count:
        current().machine.report_bug("amdgpu_bo_release", f"{bo} freed while pinned")
    bo.dev.vma_offset_manager.remove(bo.vma_start)
    bo.dev.objects.remove(bo)
    _release_memory(bo)
    kfree(bo)


# -- moves --------------------------------------------------------------------------------
@traced
def ttm_bo_unmap_virtual(bo: amdgpu_bo) -> None:
    """Mirrors ttm_bo_unmap_virtual(): every CPU PTE of the object goes (the next CPU
    access faults the page in where the object lives then)."""
    for vma in bo.vmas:
        zap_vma_ptes(vma, vma.vm_start, vma.vm_end - vma.vm_start)


@traced
def amdgpu_bo_move_notify(bo: amdgpu_bo) -> None:
    """Mirrors amdgpu_bo_move_notify() (resv held): importers of the exported dma-buf
    drop their mappings (dma_buf_move_notify), then the CPU mappings go."""
    if bo.dma_buf is not None and bo.mem_type != TTM_PL_SYSTEM:
        dma_buf_move_notify(bo.dma_buf)
    ttm_bo_unmap_virtual(bo)


@traced
def amdgpu_bo_validate(bo: amdgpu_bo, domains: int) -> None:
    """Mirrors ttm_bo_validate() with amdgpu_bo_placement_from_domain(domains), resv
    held: nothing when the object is in an allowed place; else it moves there (VRAM
    first when allowed and free, else GTT): move_notify, the copy, the old memory
    freed.  EBUSY for a pinned object; ENOMEM when no allowed place has room."""
    cur = {TTM_PL_VRAM: uapi.AMDGPU_GEM_DOMAIN_VRAM,
           TTM_PL_TT: uapi.AMDGPU_GEM_DOMAIN_GTT}.get(bo.mem_type, 0)
    if cur & domains:
        return
    if bo.pin_count:
        raise KernelError(EBUSY, f"ttm_bo_validate: {bo} is pinned")
    data = _read_all(bo)
    new_vram: list[int] = []
    new_pages: list[Any] = []
    if domains & uapi.AMDGPU_GEM_DOMAIN_VRAM:
        try:
            new_vram = _vram_alloc(bo)
        except KernelError:
            if not domains & uapi.AMDGPU_GEM_DOMAIN_GTT:
                raise
    if not new_vram:
        new_pages = _tt_alloc(bo)
    amdgpu_bo_move_notify(bo)
    _release_memory(bo)
    if new_vram:
        bo.vram_pages, bo.mem_type = new_vram, TTM_PL_VRAM
    else:
        bo.pages, bo.mem_type = new_pages, TTM_PL_TT
    _write_all(bo, data)


@traced
def amdgpu_bo_evict(bo: amdgpu_bo) -> None:
    """What TTM's eviction of a VRAM object does (amdgpu_evict_flags: to GTT), with the
    reservation taken and dropped here.  EBUSY for a pinned object."""
    mutex_lock(bo.resv)
    try:
        amdgpu_bo_validate(bo, uapi.AMDGPU_GEM_DOMAIN_GTT)
    finally:
        mutex_unlock(bo.resv)


# -- the dma-buf exporter (amdgpu_dma_buf.c) ---------------------------------------------------
def amdgpu_dma_buf_attach(dmabuf: Any, attach: Any) -> None:
    """Mirrors amdgpu_dma_buf_attach(): peer-to-peer stays as the importer asked (see
    the module's EMU note on pci_p2pdma_distance)."""


@traced
def amdgpu_dma_buf_pin(attach: Any) -> None:
    """Mirrors amdgpu_dma_buf_pin() (resv held): pin in VRAM when every attachment can
    do peer-to-peer, else in GTT (moving there first)."""
    bo: amdgpu_bo = attach.dmabuf.priv
    domains = bo.preferred_domains | uapi.AMDGPU_GEM_DOMAIN_GTT
    if any(not a.peer2peer for a in attach.dmabuf.attachments):
        domains &= ~uapi.AMDGPU_GEM_DOMAIN_VRAM
    if not bo.pin_count:
        amdgpu_bo_validate(bo, domains)
    bo.pin_count += 1


@traced
def amdgpu_dma_buf_unpin(attach: Any) -> None:
    """Mirrors amdgpu_dma_buf_unpin()."""
    bo: amdgpu_bo = attach.dmabuf.priv
    bo.pin_count -= 1


@traced
def amdgpu_dma_buf_map(attach: Any, direction: int) -> sg_table:
    """Mirrors amdgpu_dma_buf_map(): an unpinned object is first validated into GTT, or
    VRAM too when it prefers VRAM and the importer does peer-to-peer (a pinned one
    not in GTT: EBUSY); then an sg table for the importer's device - the system
    pages DMA-mapped (drm_prime_pages_to_sg + dma_map_sgtable), or the VRAM runs
    through BAR0 (amdgpu_vram_mgr_alloc_sgt: dma_map_resource each; ENOMEM)."""
    bo: amdgpu_bo = attach.dmabuf.priv
    if not bo.pin_count:
        domains = uapi.AMDGPU_GEM_DOMAIN_GTT
        if bo.preferred_domains & uapi.AMDGPU_GEM_DOMAIN_VRAM and attach.peer2peer:
            bo.flags |= uapi.AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED
            domains |= uapi.AMDGPU_GEM_DOMAIN_VRAM
        amdgpu_bo_validate(bo, domains)
    elif bo.mem_type != TTM_PL_TT and not attach.peer2peer:
        raise KernelError(EBUSY, "amdgpu_dma_buf_map: pinned outside GTT")
    dev = attach.dev
    sgt = kmalloc_obj(sg_table(dev.machine))
    if bo.mem_type == TTM_PL_TT:
        n = len(bo.pages)
        pfns = U64Array(n)
        for i, pg in enumerate(bo.pages):
            pfns.view[i] = pg.pfn
        try:
            sg_alloc_table_from_pages(sgt, pfns, n, 0, bo.size)
            dma_map_sgtable(dev, sgt, direction)
        except KernelError:
            sg_free_table(sgt)
            kfree(sgt)
            raise
        sgt.runs = None
        return sgt
    runs: list[tuple[int, int]] = []      # (first GPU page index, pages) of the object
    for i, p in enumerate(bo.vram_pages):
        if runs and bo.vram_pages[i - 1] + 1 == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    mapped: list[tuple[int, int]] = []
    for first, npages in runs:
        size = min(npages << GPU_PAGE_SHIFT, bo.size - (first << GPU_PAGE_SHIFT))
        a = dma_map_resource(dev, amdgpu_bo_bus_address(bo, first << GPU_PAGE_SHIFT), size,
                             direction)
        if dma_mapping_error(dev, a):
            for addr, sz in mapped:
                dma_unmap_resource(dev, addr, sz, direction)
            kfree(sgt)
            raise KernelError(ENOMEM, "amdgpu_vram_mgr_alloc_sgt: dma_map_resource failed")
        mapped.append((a, size))
    sgt.ensure_capacity(len(mapped))
    for k, (a, size) in enumerate(mapped):
        sgt.dma_addr.view[k], sgt.dma_len.view[k], sgt.sg_len.view[k] = a, size, size
    sgt.nents = sgt.orig_nents = len(mapped)
    sgt.runs = mapped
    return sgt


@traced
def amdgpu_dma_buf_unmap(attach: Any, sgt: sg_table, direction: int) -> None:
    """Mirrors amdgpu_dma_buf_unmap(): system pages DMA-unmapped and the table freed,
    or the BAR0 runs unmapped (amdgpu_vram_mgr_free_sgt)."""
    if sgt.runs is None:
        dma_unmap_sgtable(attach.dev, sgt, direction)
        sg_free_table(sgt)
    else:
        for a, size in sgt.runs:
            dma_unmap_resource(attach.dev, a, size, direction)
    kfree(sgt)


@traced
def drm_gem_dmabuf_release(dmabuf: Any) -> None:
    """Mirrors drm_gem_dmabuf_release(): the export's object reference goes."""
    drm_gem_object_put(dmabuf.priv)


amdgpu_dmabuf_ops = dma_buf_ops(attach=amdgpu_dma_buf_attach, pin=amdgpu_dma_buf_pin,
                                unpin=amdgpu_dma_buf_unpin, map_dma_buf=amdgpu_dma_buf_map,
                                unmap_dma_buf=amdgpu_dma_buf_unmap,
                                release=drm_gem_dmabuf_release)


# -- GEM handles (drm_gem.c) --------------------------------------------------------------------
@traced
def drm_gem_handle_create(file_priv: drm_file, bo: amdgpu_bo) -> int:
    """Mirrors drm_gem_handle_create(): the lowest free handle from 1, holding a
    reference; the file may now mmap the object (drm_vma_node_allow)."""
    handle = 1
    while handle in file_priv.object_idr:
        handle += 1
    drm_gem_object_get(bo)
    bo.handle_count += 1
    bo.vma_allowed[file_priv] = bo.vma_allowed.get(file_priv, 0) + 1
    file_priv.object_idr[handle] = bo
    return handle


def drm_gem_object_lookup(file_priv: drm_file, handle: int) -> amdgpu_bo | None:
    """Mirrors drm_gem_object_lookup(): the object with a reference, or None."""
    bo = file_priv.object_idr.get(handle)
    if bo is not None:
        drm_gem_object_get(bo)
    return bo


@traced
def drm_gem_object_release_handle(handle: int, bo: amdgpu_bo, file_priv: drm_file) -> None:
    """Mirrors drm_gem_object_release_handle(): the file's PRIME entry goes
    (drm_gem_remove_prime_handles), the mmap permission is revoked, then the
    handle's reference (drm_gem_object_handle_put_unlocked: with the last handle,
    obj->dma_buf's reference goes too)."""
    dmabuf = file_priv.prime.pop(handle, None)
    if dmabuf is not None:
        dma_buf_put(dmabuf)
    n = bo.vma_allowed.get(file_priv, 0) - 1
    if n > 0:
        bo.vma_allowed[file_priv] = n
    else:
        bo.vma_allowed.pop(file_priv, None)
    bo.handle_count -= 1
    if bo.handle_count == 0 and bo.dma_buf is not None:
        dmabuf, bo.dma_buf = bo.dma_buf, None       # drm_gem_object_exported_dma_buf_free
        dma_buf_put(dmabuf)
    drm_gem_object_put(bo)


@traced
def drm_gem_handle_delete(file_priv: drm_file, handle: int) -> None:
    """Mirrors drm_gem_handle_delete(): EINVAL for a handle the file does not have."""
    mutex_lock(file_priv.table_lock)
    bo = file_priv.object_idr.pop(handle, None)
    mutex_unlock(file_priv.table_lock)
    if bo is None:
        raise KernelError(EINVAL, f"drm_gem_handle_delete: no handle {handle}")
    drm_gem_object_release_handle(handle, bo, file_priv)


# -- the ioctls ---------------------------------------------------------------------------------
def _copy_field(buf: int, buf_len: int, value: str) -> int:
    """drm_copy_field(): at most buf_len bytes of value (no NUL) to buf; the value's
    full length is what the caller learns."""
    raw = value.encode()
    n = min(len(raw), buf_len)
    if n and buf and copy_to_user(buf, raw[:n], n):
        raise KernelError(EFAULT, "drm_copy_field: copy_to_user")
    return len(raw)


@traced
def drm_version(dev: drm_device, args: list[int], file_priv: drm_file) -> list[int]:
    """Mirrors drm_version(): the driver's version, name, date and description."""
    _maj, _min, _pl, name_len, name, date_len, date, desc_len, desc = args
    name_len = _copy_field(name, name_len, DRIVER_NAME)
    date_len = _copy_field(date, date_len, DRIVER_DATE)
    desc_len = _copy_field(desc, desc_len, DRIVER_DESC)
    return [KMS_DRIVER_MAJOR, KMS_DRIVER_MINOR, KMS_DRIVER_PATCHLEVEL, name_len, name,
            date_len, date, desc_len, desc]


@traced
def drm_gem_close_ioctl(dev: drm_device, args: list[int], file_priv: drm_file) -> None:
    """Mirrors drm_gem_close_ioctl(): EINVAL for a non-zero pad or an unknown handle."""
    handle, pad = args
    if pad:
        raise KernelError(EINVAL, "drm_gem_close_ioctl: pad not zero")
    drm_gem_handle_delete(file_priv, handle)


@traced
def drm_gem_prime_handle_to_fd(dev: drm_device, file_priv: drm_file, handle: int,
                               flags: int) -> int:
    """Mirrors drm_gem_prime_handle_to_fd(): ENOENT for an unknown handle; the file's
    cached dma-buf, or the object's, or a new export (amdgpu_gem_prime_export ->
    drm_gem_dmabuf_export: the dma-buf holds an object reference and shares its
    reservation; obj->dma_buf and the PRIME table each hold a dma-buf reference);
    then a new fd for it (its errors unwind the fd's reference only)."""
    mutex_lock(file_priv.prime_lock)
    try:
        bo = drm_gem_object_lookup(file_priv, handle)
        if bo is None:
            raise KernelError(ENOENT, f"drm_gem_prime_handle_to_fd: no handle {handle}")
        try:
            dmabuf = file_priv.prime.get(handle)
            if dmabuf is not None:
                get_file(dmabuf.file)                       # get_dma_buf
            else:
                mutex_lock(dev.object_name_lock)
                try:
                    if bo.dma_buf is not None:
                        dmabuf = bo.dma_buf
                        get_file(dmabuf.file)
                    else:
                        dmabuf = dma_buf_export("amdgpu", amdgpu_dmabuf_ops, bo.size, bo,
                                                resv=bo.resv)
                        drm_gem_object_get(bo)              # the export's reference
                        bo.dma_buf = dmabuf
                        get_file(dmabuf.file)               # obj->dma_buf's
                    get_file(dmabuf.file)                   # drm_prime_add_buf_handle
                    file_priv.prime[handle] = dmabuf
                finally:
                    mutex_unlock(dev.object_name_lock)
            try:
                return dma_buf_fd(dmabuf, flags)
            except KernelError:
                dma_buf_put(dmabuf)
                raise
        finally:
            drm_gem_object_put(bo)
    finally:
        mutex_unlock(file_priv.prime_lock)


@traced
def drm_prime_handle_to_fd_ioctl(dev: drm_device, args: list[int],
                                 file_priv: drm_file) -> list[int]:
    """Mirrors drm_prime_handle_to_fd_ioctl(): EINVAL for flags other than DRM_CLOEXEC
    and DRM_RDWR."""
    handle, flags, _fd = args
    if flags & ~(uapi.DRM_CLOEXEC | uapi.DRM_RDWR):
        raise KernelError(EINVAL, f"drm_prime_handle_to_fd_ioctl: flags {flags:#x}")
    return [handle, flags, drm_gem_prime_handle_to_fd(dev, file_priv, handle, flags)]


@traced
def drm_gem_flink_ioctl(dev: drm_device, args: list[int], file_priv: drm_file) -> list[int]:
    """drm_gem_flink_ioctl(): global names are for primary nodes (DRM_AUTH) - a render
    node never gets here (drm_ioctl_permit: EACCES)."""
    raise KernelError(EINVAL, "drm_gem_flink_ioctl: not modelled")  # unreachable here


@traced
def amdgpu_gem_create_ioctl(dev: drm_device, args: list[int], file_priv: drm_file) -> list[int]:
    """Mirrors amdgpu_gem_create_ioctl(): EINVAL for the doorbell domain, unknown flags
    or domains, ENCRYPTED (no TMZ) or GDS/GWS/OA (not modelled); the object (VRAM
    always cleared; a failure drops CPU_ACCESS_REQUIRED, then adds GTT to a VRAM
    request, as upstream retries); a handle for it (the allocation's reference
    moves to the handle)."""
    size, _alignment, domains, flags = args
    allowed = (uapi.AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED | uapi.AMDGPU_GEM_CREATE_NO_CPU_ACCESS
               | uapi.AMDGPU_GEM_CREATE_CPU_GTT_USWC | uapi.AMDGPU_GEM_CREATE_VRAM_CLEARED
               | uapi.AMDGPU_GEM_CREATE_VM_ALWAYS_VALID | uapi.AMDGPU_GEM_CREATE_EXPLICIT_SYNC
               | uapi.AMDGPU_GEM_CREATE_ENCRYPTED | uapi.AMDGPU_GEM_CREATE_GFX12_DCC
               | uapi.AMDGPU_GEM_CREATE_DISCARDABLE)
    if domains & uapi.AMDGPU_GEM_DOMAIN_DOORBELL:
        raise KernelError(EINVAL, "amdgpu_gem_create_ioctl: doorbell domain")
    if flags & ~allowed:
        raise KernelError(EINVAL, f"amdgpu_gem_create_ioctl: flags {flags:#x}")
    if domains & ~uapi.AMDGPU_GEM_DOMAIN_MASK:
        raise KernelError(EINVAL, f"amdgpu_gem_create_ioctl: domains {domains:#x}")
    if flags & uapi.AMDGPU_GEM_CREATE_ENCRYPTED:
        raise KernelError(EINVAL, "amdgpu_gem_create_ioctl: TMZ is disabled")
    if domains & (uapi.AMDGPU_GEM_DOMAIN_GDS | uapi.AMDGPU_GEM_DOMAIN_GWS
                  | uapi.AMDGPU_GEM_DOMAIN_OA):
        # EMU: the on-chip GDS/GWS/OA heaps are not modelled
        raise KernelError(EINVAL, "amdgpu_gem_create_ioctl: GDS/GWS/OA not modelled")
    if size == 0:
        # EMU: upstream fails an empty object deeper in TTM; here it is refused first
        raise KernelError(EINVAL, "amdgpu_gem_create_ioctl: size 0")
    flags |= uapi.AMDGPU_GEM_CREATE_VRAM_CLEARED
    while True:
        try:
            bo = amdgpu_bo_create(dev, size, domains, flags)
            break
        except KernelError as e:
            if e.errno != ENOMEM:
                raise
            if flags & uapi.AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED:
                flags &= ~uapi.AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED
                continue
            if domains == uapi.AMDGPU_GEM_DOMAIN_VRAM:
                domains |= uapi.AMDGPU_GEM_DOMAIN_GTT
                continue
            raise
    handle = drm_gem_handle_create(file_priv, bo)
    drm_gem_object_put(bo)                     # the handle holds it now
    return [handle, 0, 0, 0]


@traced
def amdgpu_gem_mmap_ioctl(dev: drm_device, args: list[int], file_priv: drm_file) -> list[int]:
    """Mirrors amdgpu_gem_mmap_ioctl(): ENOENT for an unknown handle, EPERM for an
    object created NO_CPU_ACCESS; the object's fake mmap offset."""
    handle = args[0] & 0xFFFFFFFF
    bo = drm_gem_object_lookup(file_priv, handle)
    if bo is None:
        raise KernelError(ENOENT, f"amdgpu_gem_mmap_ioctl: no handle {handle}")
    try:
        if bo.flags & uapi.AMDGPU_GEM_CREATE_NO_CPU_ACCESS:
            raise KernelError(EPERM, "amdgpu_gem_mmap_ioctl: object has no CPU access")
        return [bo.vma_start << current().machine.page_shift]
    finally:
        drm_gem_object_put(bo)


#: drm_ioctls[] (core) and amdgpu_ioctls_kms[] (driver): nr -> (cmd, fmt, flags, func)
DRM_CORE_IOCTLS = {
    0x00: (uapi.DRM_IOCTL_VERSION, uapi.DRM_VERSION_FMT, DRM_RENDER_ALLOW, drm_version),
    0x09: (uapi.DRM_IOCTL_GEM_CLOSE, uapi.DRM_GEM_CLOSE_FMT, DRM_RENDER_ALLOW,
           drm_gem_close_ioctl),
    0x0A: (uapi.DRM_IOCTL_GEM_FLINK, uapi.DRM_GEM_FLINK_FMT, DRM_AUTH, drm_gem_flink_ioctl),
    0x2D: (uapi.DRM_IOCTL_PRIME_HANDLE_TO_FD, uapi.DRM_PRIME_HANDLE_FMT, DRM_RENDER_ALLOW,
           drm_prime_handle_to_fd_ioctl),
}
AMDGPU_IOCTLS_KMS = {
    uapi.DRM_AMDGPU_GEM_CREATE: (uapi.DRM_IOCTL_AMDGPU_GEM_CREATE, uapi.AMDGPU_GEM_CREATE_FMT,
                                 DRM_AUTH | DRM_RENDER_ALLOW, amdgpu_gem_create_ioctl),
    uapi.DRM_AMDGPU_GEM_MMAP: (uapi.DRM_IOCTL_AMDGPU_GEM_MMAP, uapi.AMDGPU_GEM_MMAP_FMT,
                               DRM_AUTH | DRM_RENDER_ALLOW, amdgpu_gem_mmap_ioctl),
}


@traced
def drm_ioctl(f: Any, cmd: int, arg: int) -> int:
    """Mirrors drm_ioctl(): the core or driver table by number (EINVAL for none);
    drm_ioctl_permit (a render node runs only DRM_RENDER_ALLOW ioctls: EACCES); the
    argument copied in (the caller's size and the table's, the larger zero-filled),
    the handler run, the result copied out; EFAULT for a bad pointer."""
    file_priv: drm_file = f.private_data
    nr = uapi.DRM_IOCTL_NR(cmd)
    if uapi.DRM_COMMAND_BASE <= nr < uapi.DRM_COMMAND_END:
        entry = AMDGPU_IOCTLS_KMS.get(nr - uapi.DRM_COMMAND_BASE)
    else:
        entry = DRM_CORE_IOCTLS.get(nr)
    if entry is None:
        raise KernelError(EINVAL, f"drm_ioctl: invalid ioctl {cmd:#x}")
    drv_cmd, fmt, flags, func = entry
    if not flags & DRM_RENDER_ALLOW:                  # drm_is_render_client
        raise KernelError(EACCES, f"drm_ioctl_permit: {cmd:#x} not allowed on a render node")
    drv_size = struct.calcsize(fmt)
    in_size = out_size = uapi._IOC_SIZE(cmd)
    if not uapi._IOC_DIR(cmd) & uapi._IOC_DIR(drv_cmd) & uapi.IOC_IN:
        in_size = 0
    if not uapi._IOC_DIR(cmd) & uapi._IOC_DIR(drv_cmd) & uapi.IOC_OUT:
        out_size = 0
    kdata = bytearray(max(in_size, out_size, drv_size))
    if in_size and copy_from_user(memoryview(kdata)[:in_size], arg, in_size):
        raise KernelError(EFAULT, "drm_ioctl: copy_from_user")
    out = func(file_priv.dev, list(struct.unpack_from(fmt, kdata)), file_priv)
    if out is not None:
        struct.pack_into(fmt, kdata, 0, *out)
    if out_size and copy_to_user(arg, bytes(kdata[:out_size]), out_size):
        raise KernelError(EFAULT, "drm_ioctl: copy_to_user")
    return 0


# -- open / release -----------------------------------------------------------------------------
@traced
def drm_open(inode: Any, f: Any) -> None:
    """Mirrors drm_open() -> drm_file_alloc(): a drm_file for this open file."""
    f.private_data = kmalloc_obj(drm_file(inode.i_cdev.private))


@traced
def drm_release(inode: Any, f: Any) -> None:
    """Mirrors drm_release() -> drm_file_free(): drm_gem_release (every handle released
    as GEM_CLOSE would), then the PRIME table (empty by then) and the file."""
    file_priv: drm_file = f.private_data
    for handle in sorted(file_priv.object_idr):
        bo = file_priv.object_idr.pop(handle)
        drm_gem_object_release_handle(handle, bo, file_priv)
    f.private_data = None
    kfree(file_priv)


# -- CPU mappings (drm_gem_mmap, ttm_bo_vm.c) ----------------------------------------------------
def ttm_bo_vm_open(vma: Any) -> None:
    """Mirrors ttm_bo_vm_open(): a copy of the mapping (a split) holds the object too."""
    bo: amdgpu_bo = vma.vm_private_data
    drm_gem_object_get(bo)
    bo.vmas.append(vma)


def ttm_bo_vm_close(vma: Any) -> None:
    """Mirrors ttm_bo_vm_close(): the mapping's object reference goes."""
    bo: amdgpu_bo = vma.vm_private_data
    if vma in bo.vmas:
        bo.vmas.remove(vma)
    drm_gem_object_put(bo)


@traced
def amdgpu_gem_fault(vmf: Any) -> int:
    """Mirrors amdgpu_gem_fault() -> ttm_bo_vm_fault_reserved(): with the object
    reserved, insert the PFN of the faulting page where the object lives now (BAR0
    for VRAM, the system page for GTT); VM_FAULT_SIGBUS past the object's end."""
    vma = vmf.vma
    bo: amdgpu_bo = vma.vm_private_data
    m = current().machine
    ps = m.page_size
    mutex_lock(bo.resv)
    try:
        idx = vmf.pgoff - bo.vma_start
        if idx < 0 or idx >= bo.vma_pages or bo.mem_type == TTM_PL_SYSTEM:
            return VM_FAULT_SIGBUS
        if bo.mem_type == TTM_PL_VRAM:
            pfn = amdgpu_bo_bus_address(bo, idx * ps) >> m.page_shift
        else:
            pfn = bo.pages[idx].pfn
        remap_pfn_range(vma, vmf.address & ~(ps - 1), pfn, ps, vma.vm_page_prot)
        return 0                                        # VM_FAULT_NOPAGE
    finally:
        mutex_unlock(bo.resv)


amdgpu_gem_vm_ops = vm_operations_struct(open=ttm_bo_vm_open, close=ttm_bo_vm_close,
                                         fault=amdgpu_gem_fault)


@traced
def drm_gem_mmap(f: Any, vma: Any) -> None:
    """Mirrors drm_gem_mmap() -> drm_gem_mmap_obj() -> amdgpu_gem_object_mmap() ->
    ttm_bo_mmap_obj(): EINVAL when no object starts at the offset or the mapping is
    larger than it, EACCES when the file holds no handle of it, EPERM for a
    NO_CPU_ACCESS object, EINVAL for a private writable (COW) mapping; then a
    VM_PFNMAP|VM_IO mapping holding an object reference, filled by faults."""
    file_priv: drm_file = f.private_data
    dev = file_priv.dev
    m = current().machine
    pages = (vma.vm_end - vma.vm_start) >> m.page_shift
    bo = dev.vma_offset_manager.exact_lookup(vma.vm_pgoff, pages)
    if bo is None:
        raise KernelError(EINVAL, f"drm_gem_mmap: no object at page offset {vma.vm_pgoff:#x} "
                          f"for {pages} pages")
    if file_priv not in bo.vma_allowed:
        raise KernelError(EACCES, "drm_gem_mmap: the file has no handle of the object")
    if bo.flags & uapi.AMDGPU_GEM_CREATE_NO_CPU_ACCESS:
        raise KernelError(EPERM, "amdgpu_gem_object_mmap: object has no CPU access")
    if not vma.vm_flags & VM_SHARED and vma.vm_flags & VM_MAYWRITE:   # is_cow_mapping
        raise KernelError(EINVAL, "ttm_bo_mmap_obj: private writable mapping")
    drm_gem_object_get(bo)
    vma.vm_ops = amdgpu_gem_vm_ops
    vma.vm_private_data = bo
    vma.vm_flags |= VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP
    bo.vmas.append(vma)


# -- the render node's life ------------------------------------------------------------------
@traced
def amdgpu_drm_dev_register(adev: Any, index: int, owner: Any) -> drm_device:
    """drm_dev_register() for amdgpu_pci_probe: the render node appears."""
    dev = drm_device(adev, index, owner)
    cdev_add(dev.cdev, dev.path)
    return dev


@traced
def amdgpu_drm_dev_unregister(dev: drm_device) -> None:
    """drm_dev_unregister(): the node goes; an object still alive is a leak."""
    cdev_del(dev.cdev)
    if dev.objects:
        current().machine.report_bug("amdgpu_pci_remove", f"{dev}: {len(dev.objects)} buffer "
                                     "objects still alive")

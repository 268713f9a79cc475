"""Mirrors the mmap part of drivers/infiniband/hw/mlx5/main.c: mlx5_ib_mmap and UAR objects.

Userspace names what it wants mapped by the mmap offset (vm_pgoff, in pages):

    bits 0..7   index (a static UAR page, the clock-info version)
    bits 8..15  command (enum mlx5_ib_mmap_cmd)
    bits 16..23 high byte of an extended index (ALLOC_WC beyond 255)

REGULAR (0) / WC (2) / NC (3) map one of the context's static UAR pages;
ALLOC_WC (6) allocates and maps one of its dynamic pages; CORE_CLOCK (5)
maps the init segment page holding the free-running timer, read-only;
CLOCK_INFO (7) the kernel's clock-info page.  Any other command is an mmap
entry: `command << 16 | extended index` is a page offset inserted by a UAR
object (MLX5_IB_METHOD_UAR_OBJ_ALLOC), the modern rdma-core's way to get
UARs one at a time.  A UAR page goes to user space at
BAR0 + (uar_index / fw_uars_per_page) * PAGE_SIZE, write-combining (so
BlueFlame copies coalesce) or uncached.

Lock order: bfregi.lock (the dynamic page's busy mark) is dropped before
the UAR command; ufile.umap_lock -> mmap_xa lock in ib_core_uverbs.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_core_uverbs import (
    rdma_user_mmap_entry,
    rdma_user_mmap_entry_get_pgoff,
    rdma_user_mmap_entry_insert_range,
    rdma_user_mmap_entry_put,
    rdma_user_mmap_entry_remove,
    rdma_user_mmap_io,
)
from drivers.ib_core.rdma_core import uverbs_obj_type
from drivers.ib_core.uverbs_ioctl import uverbs_api_ioctl_method, uverbs_copy_to, uverbs_get_const
from drivers.mlx5_core.ifc import MLX5_ISEG_INTERNAL_TIMER_H, MLX5_NON_FP_BFREGS_PER_UAR
from drivers.mlx5_ib.cmd import mlx5_cmd_uar_alloc, mlx5_cmd_uar_dealloc
from drivers.mlx5_ib.dm import mlx5_ib_dm_memic_free
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_IB_MMAP_CMD_MASK,
    MLX5_IB_MMAP_CMD_SHIFT,
    MLX5_IB_MMAP_OFFSET_END,
    MLX5_IB_MMAP_OFFSET_START,
    MLX5_IB_MMAP_TYPE_MEMIC,
    MLX5_IB_MMAP_TYPE_TLP_VAR,
    MLX5_IB_MMAP_TYPE_UAR_NC,
    MLX5_IB_MMAP_TYPE_UAR_WC,
    MLX5_IB_MMAP_TYPE_VAR,
    PAGE_SHIFT,
    PAGE_SIZE,
    fw_uars_per_page,
    get_uars_per_sys_page,
    mlx5_ib_dev,
    mlx5_ib_release_has,
    mlx5_ib_ucontext,
    mlx5_ib_warn,
    mlx5_user_mmap_entry,
    to_mdev,
    to_mmmap,
    to_mucontext,
)
from drivers.mlx5_ib.qp import mlx5_ib_free_bfreg
from kernel_model.errno import EBUSY, EINVAL, ENOSYS, EOPNOTSUPP, EPERM, KernelError
from kernel_model.mm import VM_EXEC, VM_MAYWRITE, VM_MIXEDMAP, VM_SHARED, VM_WRITE, vm_area_struct
from kernel_model.page_alloc import get_page
from kernel_model.pgtable import _PAGE_PRESENT, pgprot_noncached, pgprot_writecombine
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CLOCK_INFO_V1,
    MLX5_IB_MMAP_ALLOC_WC,
    MLX5_IB_MMAP_CLOCK_INFO,
    MLX5_IB_MMAP_CORE_CLOCK,
    MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES,
    MLX5_IB_MMAP_NC_PAGE,
    MLX5_IB_MMAP_REGULAR_PAGE,
    MLX5_IB_MMAP_WC_PAGE,
)
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID,
    MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE,
    MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE,
    MLX5_IB_METHOD_UAR_OBJ_ALLOC,
    MLX5_IB_METHOD_UAR_OBJ_DESTROY,
    MLX5_IB_OBJECT_UAR,
)

# enum mlx5_ib_uapi_uar_alloc_type
MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF = 0
MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC = 1


# -- vm_pgoff decoding ----------------------------------------------------------------------
def get_command(offset: int) -> int:
    """Mirrors get_command()."""
    return (offset >> MLX5_IB_MMAP_CMD_SHIFT) & MLX5_IB_MMAP_CMD_MASK


def get_arg(offset: int) -> int:
    """Mirrors get_arg()."""
    return offset & ((1 << MLX5_IB_MMAP_CMD_SHIFT) - 1)


get_index = get_arg  # Mirrors get_index()


def get_extended_index(offset: int) -> int:
    """Mirrors get_extended_index(): the low byte plus bits 16..23 as the high byte."""
    return get_arg(offset) | ((offset >> 16) & 0xFF) << 8


def mlx5_vma_to_pgoff(vma: vm_area_struct) -> int:
    """Mirrors mlx5_vma_to_pgoff(): the mmap-entry page offset an mmap offset names."""
    return _entry_pgoff(vma.vm_pgoff)


def _entry_pgoff(vm_pgoff: int) -> int:
    """The body of mlx5_vma_to_pgoff() for an mmap offset in pages."""
    return get_command(vm_pgoff) << 16 | get_extended_index(vm_pgoff)


def mlx5_entry_to_mmap_offset(entry: rdma_user_mmap_entry) -> int:
    """Mirrors mlx5_entry_to_mmap_offset(): the byte offset rdma-core passes to mmap."""
    cmd = (entry.start_pgoff >> 16) & 0xFFFF
    index = entry.start_pgoff & 0xFFFF
    return (((index >> 8) << 16) | (cmd << MLX5_IB_MMAP_CMD_SHIFT) | (index & 0xFF)) \
        << PAGE_SHIFT()


def uar_index2pfn(dev: mlx5_ib_dev, uar_idx: int) -> int:
    """Mirrors uar_index2pfn(): the system page of BAR0 holding FW UAR uar_idx."""
    return (dev.mdev.bar_addr >> PAGE_SHIFT()) + uar_idx // fw_uars_per_page(dev)


def uar_index2paddress(dev: mlx5_ib_dev, uar_idx: int) -> int:
    """Mirrors uar_index2paddress()."""
    return dev.mdev.bar_addr + (uar_idx // fw_uars_per_page(dev)) * PAGE_SIZE()


# -- the static and legacy-dynamic UAR pages --------------------------------------------------
@traced
def uar_mmap(dev: mlx5_ib_dev, cmd: int, vma: vm_area_struct,
             context: mlx5_ib_ucontext) -> None:
    """Mirrors uar_mmap(): map a static UAR page, or allocate and map a dynamic one.

    EINVAL: a dyn-UAR context (it has no such pages), a VMA that is not one
    page, an index out of range, a dynamic page already mapped once (its busy
    mark is never cleared).  When the mapping fails after ALLOC_WC allocated a
    UAR, that UAR is freed again (upstream's fix).  A device loaded with an
    older `release` keeps the bug every release before it has: it frees UAR
    number `idx` - the page slot - instead, so the allocated UAR leaks and,
    when both contexts are uid 0 (no DEVX), another process's UAR numbered
    `idx` may be freed under its mapping.
    """
    bfregi = context.bfregi
    dyn_uar = cmd == MLX5_IB_MMAP_ALLOC_WC
    max_valid_idx = bfregi.num_sys_pages if dyn_uar else bfregi.num_static_sys_pages
    if bfregi.lib_uar_dyn:
        raise KernelError(EINVAL, "uar_mmap: dynamic-UAR context (use UAR objects)")
    if vma.vm_end - vma.vm_start != PAGE_SIZE():
        raise KernelError(EINVAL, "uar_mmap: vma is not one page")
    if dyn_uar:
        idx = get_extended_index(vma.vm_pgoff) + bfregi.num_static_sys_pages
    else:
        idx = get_index(vma.vm_pgoff)
    if idx >= max_valid_idx:
        mlx5_ib_warn(dev, f"invalid uar index {idx}, max={max_valid_idx}")
        raise KernelError(EINVAL, f"uar_mmap: invalid uar index {idx}, max={max_valid_idx}")
    if cmd == MLX5_IB_MMAP_NC_PAGE:
        prot = pgprot_noncached(vma.vm_page_prot)
    else:  # WC, ALLOC_WC, and REGULAR as "best effort" write-combining
        prot = pgprot_writecombine(vma.vm_page_prot)
    bfreg_dyn_idx = 0
    if dyn_uar:
        bfreg_dyn_idx = idx * (get_uars_per_sys_page(dev, bfregi.lib_uar_4k)
                               * MLX5_NON_FP_BFREGS_PER_UAR)
        if bfreg_dyn_idx >= bfregi.total_num_bfregs:
            raise KernelError(EINVAL, f"uar_mmap: invalid bfreg_dyn_idx {bfreg_dyn_idx}")
        with bfregi.lock:  # the first bfreg of a dynamic page marks it busy
            if bfregi.count[bfreg_dyn_idx]:
                raise KernelError(EINVAL, f"uar_mmap: wrong offset, idx {idx} is busy, "
                                  f"bfregn={bfreg_dyn_idx}")
            bfregi.count[bfreg_dyn_idx] += 1
        try:
            uar_index = mlx5_cmd_uar_alloc(dev.mdev, context.devx_uid)
        except KernelError:
            mlx5_ib_free_bfreg(dev, bfregi, bfreg_dyn_idx)  # free_bfreg:
            raise
    else:
        uar_index = bfregi.sys_pages[idx]
    try:
        rdma_user_mmap_io(context, vma, uar_index2pfn(dev, uar_index), PAGE_SIZE(), prot, None)
    except KernelError:
        if dyn_uar:  # err:
            victim = uar_index
            if not mlx5_ib_release_has(dev, "uar_mmap_dealloc_uar_index"):
                victim = idx  # EMU: the older release's bug, kept on purpose (see above)
            try:
                mlx5_cmd_uar_dealloc(dev.mdev, victim, context.devx_uid)
            except KernelError as e:
                mlx5_ib_warn(dev, f"uar_mmap: dealloc of uar {victim} failed: {e}")
            mlx5_ib_free_bfreg(dev, bfregi, bfreg_dyn_idx)  # free_bfreg:
        raise
    if dyn_uar:
        bfregi.sys_pages[idx] = uar_index


# -- clock pages ---------------------------------------------------------------------------
def vm_insert_page(vma: vm_area_struct, addr: int, pg: object) -> None:
    """Mirrors vm_insert_page(): map one kernel page (a normal, refcounted PTE).

    # TODO(kernel_model): belongs in kernel_model/memory.py beside remap_pfn_range.
    """
    mm = vma.vm_mm
    vma.vm_flags |= VM_MIXEDMAP
    slot = mm.pgtable.pte_slot(addr, True)
    if mm.pgtable.ram_q[slot >> 3] & _PAGE_PRESENT:
        raise KernelError(EINVAL, f"vm_insert_page: {addr:#x} already mapped")
    get_page(pg)
    pg._mapcount += 1
    mm.pgtable.set(slot, (pg.pfn << mm.machine.page_shift) | vma.vm_page_prot)
    mm.rss += 1


@traced
def mlx5_ib_mmap_clock_info_page(dev: mlx5_ib_dev, vma: vm_area_struct,
                                 context: mlx5_ib_ucontext) -> None:
    """Mirrors mlx5_ib_mmap_clock_info_page(): the read-only clock-info page.

    EINVAL unless one shared page; EOPNOTSUPP for another version or when the
    device has no clock info; EPERM for a writable or executable mapping.
    """
    if vma.vm_end - vma.vm_start != PAGE_SIZE() or not vma.vm_flags & VM_SHARED:
        raise KernelError(EINVAL, "mlx5_ib_mmap_clock_info_page: not one shared page")
    if get_index(vma.vm_pgoff) != MLX5_IB_CLOCK_INFO_V1:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_mmap_clock_info_page: unknown version")
    if vma.vm_flags & (VM_WRITE | VM_EXEC):
        raise KernelError(EPERM, "mlx5_ib_mmap_clock_info_page: writable or executable")
    vma.vm_flags &= ~VM_MAYWRITE
    if dev.clock_info is None:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_mmap_clock_info_page: no clock info")
    vm_insert_page(vma, vma.vm_start, dev.clock_info)


def _mmap_core_clock(dev: mlx5_ib_dev, vma: vm_area_struct,
                     context: mlx5_ib_ucontext) -> None:
    """MLX5_IB_MMAP_CORE_CLOCK: the init segment page with internal_timer_h, uncached."""
    if vma.vm_end - vma.vm_start != PAGE_SIZE():
        raise KernelError(EINVAL, "mlx5_ib_mmap: core clock mapping is not one page")
    if vma.vm_flags & VM_WRITE:
        raise KernelError(EPERM, "mlx5_ib_mmap: core clock mapped writable")
    vma.vm_flags &= ~VM_MAYWRITE
    if PAGE_SIZE() > 4096:  # it would expose more of BAR0 than the timer
        raise KernelError(EOPNOTSUPP, "mlx5_ib_mmap: core clock needs 4 KiB pages")
    pfn = (dev.mdev.iseg_base + MLX5_ISEG_INTERNAL_TIMER_H) >> PAGE_SHIFT()
    rdma_user_mmap_io(context, vma, pfn, PAGE_SIZE(), pgprot_noncached(vma.vm_page_prot),
                      None)


# -- mmap entries ---------------------------------------------------------------------------
@traced
def mlx5_ib_mmap_offset(dev: mlx5_ib_dev, vma: vm_area_struct,
                        ucontext: mlx5_ib_ucontext) -> None:
    """Mirrors mlx5_ib_mmap_offset(): map the object an mmap entry stands for
    (EINVAL when there is none at that offset)."""
    entry = rdma_user_mmap_entry_get_pgoff(ucontext, mlx5_vma_to_pgoff(vma))
    if entry is None:
        raise KernelError(EINVAL, f"mlx5_ib_mmap_offset: no mmap entry at pgoff "
                          f"{mlx5_vma_to_pgoff(vma):#x}")
    mentry = to_mmmap(entry)
    if mentry.mmap_flag in (MLX5_IB_MMAP_TYPE_VAR, MLX5_IB_MMAP_TYPE_UAR_NC,
                            MLX5_IB_MMAP_TYPE_TLP_VAR):
        prot = pgprot_noncached(vma.vm_page_prot)
    else:
        prot = pgprot_writecombine(vma.vm_page_prot)
    try:
        rdma_user_mmap_io(ucontext, vma, mentry.address >> PAGE_SHIFT(),
                          entry.npages * PAGE_SIZE(), prot, entry)
    finally:
        rdma_user_mmap_entry_put(entry)


@traced
def mlx5_ib_mmap(ibcontext: mlx5_ib_ucontext, vma: vm_area_struct) -> None:
    """Mirrors mlx5_ib_mmap(): dispatch on the command in vm_pgoff.

    WC_PAGE/ALLOC_WC need write-combining (EPERM); GET_CONTIGUOUS_PAGES is
    ENOSYS; unknown commands are mmap-entry offsets.
    """
    context = to_mucontext(ibcontext)
    dev = to_mdev(ibcontext.device)
    command = get_command(vma.vm_pgoff)
    if command in (MLX5_IB_MMAP_WC_PAGE, MLX5_IB_MMAP_ALLOC_WC) and not dev.wc_support:
        raise KernelError(EPERM, "mlx5_ib_mmap: no write-combining on this host")
    if command in (MLX5_IB_MMAP_WC_PAGE, MLX5_IB_MMAP_ALLOC_WC, MLX5_IB_MMAP_NC_PAGE,
                   MLX5_IB_MMAP_REGULAR_PAGE):
        uar_mmap(dev, command, vma, context)
    elif command == MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES:
        raise KernelError(ENOSYS, "mlx5_ib_mmap: GET_CONTIGUOUS_PAGES is not supported")
    elif command == MLX5_IB_MMAP_CORE_CLOCK:
        _mmap_core_clock(dev, vma, context)
    elif command == MLX5_IB_MMAP_CLOCK_INFO:
        mlx5_ib_mmap_clock_info_page(dev, vma, context)
    else:
        mlx5_ib_mmap_offset(dev, vma, context)


@traced
def mlx5_ib_mmap_free(entry: rdma_user_mmap_entry) -> None:
    """Mirrors mlx5_ib_mmap_free(): the last reference to a UAR object's entry is
    gone (object destroyed, every VMA closed): DEALLOC_UAR and free it.

    A void callback, like the kernel's: it runs from the object's destroy or
    from a VMA's close (munmap, exit), neither of which can fail, so a failed
    DEALLOC_UAR is only logged (mlx5_cmd_uar_dealloc's result is ignored there)
    and the entry is freed all the same (see the EMU note for a busy UAR).
    """
    mentry = to_mmmap(entry)
    context = to_mucontext(entry.ucontext)
    dev = to_mdev(context.device)
    if mentry.mmap_flag in (MLX5_IB_MMAP_TYPE_UAR_WC, MLX5_IB_MMAP_TYPE_UAR_NC):
        try:
            mlx5_cmd_uar_dealloc(dev.mdev, mentry.page_idx, context.devx_uid)
        except KernelError as e:
            mlx5_ib_warn(dev, f"mlx5_ib_mmap_free: DEALLOC_UAR {mentry.page_idx:#x} "
                         f"failed: {e}")
            if e.errno == EBUSY:
                # EMU: the kernel forgets the UAR here, and the firmware keeps it (and
                # so the DEVX uid) until the function resets.  The user destroyed the
                # UAR object while a CQ or QP of the context still names it (rdma-core
                # does at ibv_close_device with live CQs); the model retries once
                # uverbs has destroyed those, in mlx5_ib_dealloc_ucontext.
                context.busy_uars.append(mentry.page_idx)
        kfree(mentry)
    elif mentry.mmap_flag == MLX5_IB_MMAP_TYPE_MEMIC:
        mlx5_ib_dm_memic_free(mentry.dm)  # kref_put(&mdm->ref, mlx5_ib_dm_memic_free)
    else:
        dev.machine.report_bug("mlx5_ib_mmap_free", f"unexpected entry {mentry!r}")


# -- UAR objects (MLX5_IB_OBJECT_UAR) -----------------------------------------------------
@traced
def alloc_uar_entry(c: mlx5_ib_ucontext, alloc_type: int) -> mlx5_user_mmap_entry:
    """Mirrors alloc_uar_entry(): ALLOC_UAR and an mmap entry in the driver's range
    [9 << 16, (255 << 16) + 0xffff] (the lowest free offset)."""
    dev = to_mdev(c.device)
    entry = kmalloc_obj(mlx5_user_mmap_entry())
    try:
        uar_index = mlx5_cmd_uar_alloc(dev.mdev, c.devx_uid)
    except KernelError:
        kfree(entry)  # end:
        raise
    entry.page_idx = uar_index
    entry.address = uar_index2paddress(dev, uar_index)
    entry.mmap_flag = MLX5_IB_MMAP_TYPE_UAR_WC if alloc_type == MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF \
        else MLX5_IB_MMAP_TYPE_UAR_NC
    try:
        rdma_user_mmap_entry_insert_range(c, entry, PAGE_SIZE(),
                                          MLX5_IB_MMAP_OFFSET_START << 16,
                                          (MLX5_IB_MMAP_OFFSET_END << 16) + (1 << 16) - 1)
    except KernelError:
        mlx5_cmd_uar_dealloc(dev.mdev, uar_index, c.devx_uid)  # err_insert:
        kfree(entry)
        raise
    return entry


def _uar_obj_alloc(uctx: mlx5_ib_ucontext, alloc_type: int) -> mlx5_user_mmap_entry:
    """The checks and allocation of UVERBS_HANDLER(MLX5_IB_METHOD_UAR_OBJ_ALLOC): the entry.

    EOPNOTSUPP for a type other than BF (0) or NC (1), or BF without
    write-combining.  # EMU: also EOPNOTSUPP without the `dyn_uar` module
    parameter - the seed's pre-v5.8 kernel has no UAR objects, so rdma-core's
    singleton NC UAR fails there "harmlessly" and the legacy flow follows.
    """
    dev = to_mdev(uctx.device)
    if not dev.dyn_uar:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_uar_obj_alloc: no UAR objects (dyn_uar off)")
    if alloc_type not in (MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC):
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_uar_obj_alloc: alloc type {alloc_type}")
    if not dev.wc_support and alloc_type == MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_uar_obj_alloc: BF UAR without write-combining")
    return alloc_uar_entry(uctx, alloc_type)


@traced
def mlx5_ib_uar_obj_alloc(uctx: mlx5_ib_ucontext, alloc_type: int) -> tuple[int, int, int]:
    """A UAR object as the ioctl answers it: (mmap_offset, page_id, length)."""
    entry = _uar_obj_alloc(uctx, alloc_type)
    return mlx5_entry_to_mmap_offset(entry), entry.page_idx, entry.npages * PAGE_SIZE()


@traced
def mlx5_ib_uar_obj_destroy(uctx: mlx5_ib_ucontext, mmap_offset: int) -> None:
    """Mirrors mmap_obj_cleanup() for a UAR object, named by its mmap offset.

    rdma_user_mmap_entry_remove(): no new mmaps; the UAR itself is freed by
    mlx5_ib_mmap_free once the last VMA mapping it is gone.  EINVAL when no
    live UAR object has that offset.
    """
    pgoff = _entry_pgoff(mmap_offset >> PAGE_SHIFT())
    entry = uctx.mmap_xa.get(pgoff)
    if entry is None or entry.start_pgoff != pgoff or entry.driver_removed:
        raise KernelError(EINVAL, f"mlx5_ib_uar_obj_destroy: no UAR object at offset "
                          f"{mmap_offset:#x}")
    rdma_user_mmap_entry_remove(entry)


# -- the UAR object's ioctl methods (MLX5_IB_OBJECT_UAR) -------------------------------------
def mmap_obj_cleanup(uobj: Any, why: int, attrs_: Any) -> None:
    """Mirrors mmap_obj_cleanup(): no new mmaps of the entry; the UAR is freed by
    mlx5_ib_mmap_free once no VMA maps it any more."""
    rdma_user_mmap_entry_remove(uobj.object)


UVERBS_OBJECT_MLX5_UAR = uverbs_obj_type("UAR", mmap_obj_cleanup)


@traced
def UVERBS_HANDLER_MLX5_IB_METHOD_UAR_OBJ_ALLOC(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(MLX5_IB_METHOD_UAR_OBJ_ALLOC): the UAR object, and its
    mmap offset, length and page id for the library."""
    uobj = attrs_.uobject
    c = to_mucontext(uobj.context)
    alloc_type = uverbs_get_const(attrs_, MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE)
    entry = _uar_obj_alloc(c, alloc_type)
    uobj.object = entry
    uverbs_copy_to(attrs_, MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
                   mlx5_entry_to_mmap_offset(entry), 8)
    uverbs_copy_to(attrs_, MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, entry.page_idx, 4)
    uverbs_copy_to(attrs_, MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
                   entry.npages * PAGE_SIZE(), 4)


mlx5_ib_uar_methods = {
    (MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC): uverbs_api_ioctl_method(
        UVERBS_HANDLER_MLX5_IB_METHOD_UAR_OBJ_ALLOC,
        mandatory=(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE,
                   MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET,
                   MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH, MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID),
        new_idr=(MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, UVERBS_OBJECT_MLX5_UAR)),
    (MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY): uverbs_api_ioctl_method(
        lambda attrs_: None, mandatory=(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE,),
        destroy_idr=(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, UVERBS_OBJECT_MLX5_UAR)),
}

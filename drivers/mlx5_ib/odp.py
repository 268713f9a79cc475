"""Mirrors drivers/infiniband/hw/mlx5/odp.c: on-demand paging for explicit MRs.

An ODP MR's mkey is created with pg_access and an MTT whose entries start not
present; the pages the process has already touched are loaded at registration
(mlx5_ib_init_odp_mr: a snapshot, no fault).  When the HCA reaches an entry
without its present bit it raises a page fault: an EQE (PAGE_FAULT, RDMA
sub-type: key, address, length, token) on the page-fault EQ, whose interrupt
handler (mlx5_ib_eq_pf_int) queues the EQ's work; the work
(mlx5_ib_eq_pf_process) takes each EQE and queues one work per fault
(mlx5_ib_eqe_pf_action), which looks the key up among the ODP mkeys
(pagefault_single_data_segment), faults the pages in and DMA-maps them
(pagefault_mr -> ib_umem_odp_map_dma_and_lock), loads their MTT entries by UMR
(mlx5r_umr_update_xlt) and resumes the QP (PAGE_FAULT_RESUME; with the error
bit when the fault could not be resolved - the access then completes in error).

The MR's mmu interval notifier (mlx5_ib_invalidate_range) zaps the MTT entries
of an invalidated range by UMR - the UMR completes only once the HCA's DMA
through the mkey drained - then DMA-unmaps the pages; the next access faults.

Prefetch (ibv_advise_mr -> mlx5_ib_advise_mr) faults an SGE list's ranges in
ahead of the HCA, at once (IB_UVERBS_ADVISE_MR_FLAG_FLUSH) or from a workqueue.

dma-buf MRs (mr.py's reg_user_mr_dmabuf) take the same path: their mkey is among
the ODP mkeys with pg_access; the exporter's move_notify zaps the whole MTT
(mlx5r_umr_update_mr_pas) and a fault on it maps the buffer again under its
dma_resv (pagefault_dmabuf_mr) and reloads every entry.

Implicit ODP (ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND): the whole address space,
mlx5_ib_alloc_implicit_mr) is a KSM mkey whose entries each cover 1 GiB
(MLX5_IMR_MTT_SIZE) and start on the null mkey, so the first access to a slice
faults on the parent key; pagefault_implicit_mr then makes the slice's child
(implicit_get_child_mr: an ordinary ODP MTT mkey over a child umem), faults the
pages in through it and points the KSM entry at it by UMR.  A child whose pages
an invalidation all dropped is destroyed from a work (destroy_unused_implicit_
child_mr); the parent's deregistration destroys the children left.

# EMU: the WQE sub-type fault (the driver reading the faulting WQE's data
# segments) is not modelled; the device's ODP capability page (MLX5_CAP_ODP) is
# not in the model's capability layout, so the caps reported are those a
# ConnectX-6 Dx reports for RC, XRC and UD (send), gated by the general pg
# capability; implicit ODP is gated by the general capabilities as upstream.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from c_ext import U64Array
from drivers.ib_core.ib_umem import ib_umem_num_dma_blocks, ib_umem_num_pages
from drivers.ib_core.ib_verbs import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    ib_odp_caps,
)
from drivers.ib_core.umem import ib_umem_find_best_pgsz, ib_umem_release
from drivers.ib_core.umem_dmabuf import (
    ib_umem_dmabuf,
    ib_umem_dmabuf_map_pages,
    ib_umem_dmabuf_unmap_pages,
)
from drivers.ib_core.umem_odp import (
    ODP_READ_ALLOWED_BIT,
    ODP_WRITE_ALLOWED_BIT,
    ib_umem_end,
    ib_umem_odp,
    ib_umem_odp_alloc_child,
    ib_umem_odp_alloc_implicit,
    ib_umem_odp_map_dma_and_lock,
    ib_umem_odp_unmap_dma_pages,
    ib_umem_start,
)
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.eq import (
    eq_update_ci,
    mlx5_eq,
    mlx5_eq_create_generic,
    mlx5_eq_destroy_generic,
    next_eqe_sw,
)
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_EMU_UMR_UPDATE_XLT,
    MLX5_CMD_OP_PAGE_FAULT_RESUME,
    MLX5_MKC_ACCESS_MODE_KSM,
    MLX5_MKC_ACCESS_MODE_MTT,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
    cpu_to_be64,
)
from drivers.mlx5_core.mr import (
    mlx5_core_create_mkey,
    mlx5_core_destroy_mkey,
    mlx5_mkey_to_idx,
)
from drivers.mlx5_ib.cmd import mlx5_cmd_null_mkey
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas
from drivers.mlx5_ib.mlx5_ib import MLX5_MKEY_MR, mlx5_ib_dev, mlx5_ib_mr, mlx5_ib_warn, to_mdev
from kernel_model.errno import EFAULT, EINVAL, ENOENT, EOPNOTSUPP, KernelError
from kernel_model.interrupt import IRQ_HANDLED
from kernel_model.locking import (
    init_waitqueue_head,
    mutex_init,
    mutex_lock,
    mutex_unlock,
    wait_event,
    wake_up,
)
from kernel_model.mm_types import TASK_SIZE
from kernel_model.mmu_notifier import (
    mmu_interval_notifier,
    mmu_interval_notifier_ops,
    mmu_interval_set_seq,
    mmu_notifier_range,
)
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.srcu import (
    cleanup_srcu_struct,
    init_srcu_struct,
    srcu_read_lock,
    srcu_read_unlock,
    synchronize_srcu,
)
from kernel_model.trace import traced
from kernel_model.workqueue import (
    WQ_HIGHPRI,
    WQ_MEM_RECLAIM,
    WQ_UNBOUND,
    alloc_workqueue,
    destroy_workqueue,
    flush_workqueue,
    queue_work,
    system_wq,
    work_struct,
)

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev

# enum ib_odp_general_cap_bits / ib_odp_transport_cap_bits (ib_verbs.h)
IB_ODP_SUPPORT = 1 << 0
IB_ODP_SUPPORT_IMPLICIT = 1 << 1
IB_ODP_SUPPORT_SEND = 1 << 0
IB_ODP_SUPPORT_RECV = 1 << 1
IB_ODP_SUPPORT_WRITE = 1 << 2
IB_ODP_SUPPORT_READ = 1 << 3
IB_ODP_SUPPORT_ATOMIC = 1 << 4
IB_ODP_SUPPORT_SRQ_RECV = 1 << 5

MLX5_EVENT_TYPE_PAGE_FAULT = 0x0C
MLX5_PFAULT_SUBTYPE_WQE, MLX5_PFAULT_SUBTYPE_RDMA = 0, 1
MLX5_PFAULT_REQUESTOR, MLX5_PFAULT_WRITE, MLX5_PFAULT_RDMA = 1 << 0, 1 << 1, 1 << 2
MLX5_IB_NUM_PF_EQE = 0x1000
MLX5_IB_UPD_XLT_ZAP, MLX5_IB_UPD_XLT_ENABLE = 1 << 0, 1 << 1
MLX5_IB_UPD_XLT_ATOMIC, MLX5_IB_UPD_XLT_INDIRECT = 1 << 2, 1 << 6
# implicit ODP: one child MTT mkey per 1 GiB slice (MLX5_IMR_MTT_BITS + PAGE_SHIFT = 30),
# the parent's KSM entries each that size
MLX5_IMR_MTT_SHIFT = 30
MLX5_IMR_MTT_SIZE = 1 << MLX5_IMR_MTT_SHIFT
MLX5_KSM_PAGE_SHIFT = MLX5_IMR_MTT_SHIFT
MLX5_PF_FLAGS_DOWNGRADE, MLX5_PF_FLAGS_SNAPSHOT, MLX5_PF_FLAGS_ENABLE = 1 << 1, 1 << 2, 1 << 3
MLX5_IB_MTT_READ, MLX5_IB_MTT_WRITE = 1 << 0, 1 << 1
# EMU: the page-fault EQ's interrupt vector (see mlx5_eq_create_generic's note)
MLX5_IB_PF_EQ_VECTOR = 1


class mlx5_ib_pf_eq:
    """Mirrors struct mlx5_ib_pf_eq: the page-fault EQ, its work and workqueue."""

    def __init__(self, dev: mlx5_ib_dev):
        self.dev = dev
        self.core: mlx5_eq | None = None
        self.wq = None


class mlx5_pagefault(work_struct):
    """Mirrors struct mlx5_pagefault (RDMA sub-type): one fault from one EQE."""

    def __init__(self, eq: mlx5_ib_pf_eq, eqe: bytes):
        super().__init__(mlx5_ib_eqe_pf_action)
        self.eq = eq
        self.event_subtype = eqe[3]
        (self.bytes_committed, self.r_key, _r, self.packet_size, self.rdma_op_len,
         self.rdma_va, pftype_token) = struct.unpack_from(">IIHHIQI", eqe, 0x20)
        self.token = pftype_token & 0xFFFFFF
        self.type = pftype_token >> 24


# -- capabilities and device setup ---------------------------------------------------------
def mlx5_ib_internal_fill_odp_caps(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_internal_fill_odp_caps(): nothing without the pg capability;
    else ODP for RC, XRC and UD sends (see the module's EMU note), and implicit ODP
    when the device has fixed_buffer_size, null_mkey and
    umr_extended_translation_offset (# EMU: umr_indirect_mkey_disabled is not in the
    model's capability layout: never set)."""
    caps = ib_odp_caps()
    if MLX5_CAP_GEN(dev.mdev, "pg"):
        caps.general_caps = IB_ODP_SUPPORT
        caps.ud_odp_caps = IB_ODP_SUPPORT_SEND
        if MLX5_CAP_GEN(dev.mdev, "fixed_buffer_size") and \
                MLX5_CAP_GEN(dev.mdev, "null_mkey") and \
                MLX5_CAP_GEN(dev.mdev, "umr_extended_translation_offset"):
            caps.general_caps |= IB_ODP_SUPPORT_IMPLICIT
        caps.rc_odp_caps = (IB_ODP_SUPPORT_SEND | IB_ODP_SUPPORT_RECV | IB_ODP_SUPPORT_WRITE
                            | IB_ODP_SUPPORT_READ | IB_ODP_SUPPORT_ATOMIC
                            | IB_ODP_SUPPORT_SRQ_RECV)
        caps.xrc_odp_caps = (IB_ODP_SUPPORT_SEND | IB_ODP_SUPPORT_WRITE | IB_ODP_SUPPORT_READ
                             | IB_ODP_SUPPORT_ATOMIC | IB_ODP_SUPPORT_SRQ_RECV)
    dev.odp_caps = caps


@traced
def mlx5_ib_odp_init_one(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_odp_init_one(): the caps, the null mkey (implicit ODP), the ODP
    mkey table and its srcu, the (not yet created) page-fault EQ and the mutex that
    creates it once."""
    mlx5_ib_internal_fill_odp_caps(dev)
    if dev.odp_caps.general_caps & IB_ODP_SUPPORT_IMPLICIT:
        dev.null_mkey = mlx5_cmd_null_mkey(dev.mdev)
    dev.odp_mkeys = {}                           # xarray odp_mkeys: index -> mlx5_ib_mr
    dev.odp_srcu = init_srcu_struct("dev->odp_srcu")
    dev.odp_pf_eq = mlx5_ib_pf_eq(dev)
    dev.odp_eq_mutex = mutex_init("dev->odp_eq_mutex")


@traced
def mlx5_ib_odp_cleanup_one(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_odp_cleanup_one(): destroy the page-fault EQ if it was made."""
    eq = dev.odp_pf_eq
    if eq.core is not None:
        mlx5_eq_destroy_generic(dev.mdev, eq.core)
        eq.core = None
        destroy_workqueue(eq.wq)              # flushes the faults still queued
        eq.wq = None
    cleanup_srcu_struct(dev.odp_srcu)


@traced
def mlx5r_odp_create_eq(dev: mlx5_ib_dev, eq: mlx5_ib_pf_eq) -> None:
    """Mirrors mlx5r_odp_create_eq(): the first ODP MR creates the page-fault EQ
    (PAGE_FAULT events) and its workqueue; later calls find it made.  EOPNOTSUPP on
    a device without ODP (upstream since the dma-buf MRs create it too)."""
    if not dev.odp_caps.general_caps & IB_ODP_SUPPORT:
        raise KernelError(EOPNOTSUPP, "mlx5r_odp_create_eq: no ODP support")
    mutex_lock(dev.odp_eq_mutex)
    try:
        if eq.core is not None:
            return
        eq.wq = alloc_workqueue("mlx5_ib_page_fault", WQ_HIGHPRI | WQ_UNBOUND | WQ_MEM_RECLAIM,
                                MLX5_IB_NUM_PF_EQE)
        try:
            eq.core = mlx5_eq_create_generic(dev.mdev, MLX5_IB_NUM_PF_EQE, MLX5_IB_PF_EQ_VECTOR,
                                             1 << MLX5_EVENT_TYPE_PAGE_FAULT,
                                             mlx5_ib_eq_pf_int, "mlx5_ib_page_fault_eq")
        except BaseException:
            destroy_workqueue(eq.wq)
            eq.wq = None
            raise
        eq.core.pf_eq = eq
    finally:
        mutex_unlock(dev.odp_eq_mutex)


def mlx5r_store_odp_mkey(dev: mlx5_ib_dev, mr: mlx5_ib_mr) -> None:
    """Mirrors mlx5r_store_odp_mkey(): the page-fault path finds the MR by its mkey."""
    dev.odp_mkeys[mlx5_mkey_to_idx(mr.mmkey.key)] = mr


def mlx5r_erase_odp_mkey(dev: mlx5_ib_dev, mr: mlx5_ib_mr) -> None:
    """The xa_erase + synchronize_srcu of __mlx5_ib_dereg_mr for an ODP MR: no page
    fault finds the MR any more, and none still uses it."""
    dev.odp_mkeys.pop(mlx5_mkey_to_idx(mr.mmkey.key), None)
    synchronize_srcu(dev.odp_srcu)


# -- the MTT by UMR ------------------------------------------------------------------------
@traced
def mlx5r_umr_update_xlt(mr: mlx5_ib_mr, idx: int, npages: int, flags: int) -> None:
    """Mirrors mlx5r_umr_update_xlt() for an ODP MR (umem_mutex held): MTT entries
    [idx, idx + npages) from the umem's dma_list (present bits from its access bits),
    or zapped (MLX5_IB_UPD_XLT_ZAP); MLX5_IB_UPD_XLT_ENABLE turns the mkey on;
    MLX5_IB_UPD_XLT_INDIRECT: KSM entries of an implicit MR (mlx5r_umr_update_xlt_ksm).
    # EMU: the UMR is the firmware command EMU_UMR_UPDATE_XLT (see its opcode)."""
    if flags & MLX5_IB_UPD_XLT_INDIRECT:
        mlx5r_umr_update_xlt_ksm(mr, idx, npages, flags)
        return
    dev = to_mdev(mr.device)
    odp: ib_umem_odp = mr.umem
    zap = bool(flags & MLX5_IB_UPD_XLT_ZAP)
    in_ = IfcStruct("emu_umr_update_xlt_in", klm_pas_mtt=0 if zap else max(npages, 1))
    MLX5_SET("emu_umr_update_xlt_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_UPDATE_XLT)
    MLX5_SET("emu_umr_update_xlt_in", in_, "mkey_index", mlx5_mkey_to_idx(mr.mmkey.key))
    MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_offset", idx)
    MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_nentries", npages)
    MLX5_SET("emu_umr_update_xlt_in", in_, "zap", int(zap))
    MLX5_SET("emu_umr_update_xlt_in", in_, "enable", int(bool(flags & MLX5_IB_UPD_XLT_ENABLE)))
    if not zap:
        mlx5_odp_populate_xlt(odp, idx, npages, MLX5_ADDR_OF("emu_umr_update_xlt_in", in_,
                                                             "klm_pas_mtt"))
    # EMU: the command's completion stands for the UMR's CQE; no one-jiffy sleep as in
    # umr.py - the page-fault worker must not wait on a timer the busy-polling
    # process it serves keeps from advancing
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("emu_umr_update_xlt_out"))


def mlx5_odp_populate_xlt(odp: ib_umem_odp, idx: int, nentries: int, out: U64Array) -> None:
    """Mirrors populate_mtt(): each entry the page's DMA address with MTT read, and
    write when the page was mapped writable; 0 (not present) for a page not mapped."""
    view = odp.dma_list.view
    for i in range(nentries):
        pa = view[idx + i]
        if not pa:
            out.view[i] = 0
            continue
        bits = MLX5_IB_MTT_READ | (MLX5_IB_MTT_WRITE if pa & ODP_WRITE_ALLOWED_BIT else 0)
        out.view[i] = cpu_to_be64((pa & ~3) | bits)


# -- invalidation --------------------------------------------------------------------------
@traced
def mlx5_ib_invalidate_range(mni: mmu_interval_notifier, rng: mmu_notifier_range,
                             cur_seq: int) -> bool:
    """Mirrors mlx5_ib_invalidate_range(): under umem_mutex, set the sequence (a fault
    collecting pages meanwhile retries), zap the MTT entries of every mapped run in
    the range (the HCA's DMA drained), then DMA-unmap the pages; an implicit MR's
    child left with no page mapped goes (destroy_unused_implicit_child_mr)."""
    umem_odp: ib_umem_odp = mni.container          # container_of
    mr = umem_odp.private
    mutex_lock(umem_odp.umem_mutex)
    try:
        mmu_interval_set_seq(mni, cur_seq)
        start = max(ib_umem_start(umem_odp), rng.start)
        end = min(ib_umem_end(umem_odp), rng.end)
        shift = umem_odp.page_shift
        view = umem_odp.dma_list.view
        run = None
        first = (start - ib_umem_start(umem_odp)) >> shift
        last = (end - 1 - ib_umem_start(umem_odp)) >> shift
        for idx in range(first, last + 2):
            mapped = idx <= last and view[idx] & (ODP_READ_ALLOWED_BIT | ODP_WRITE_ALLOWED_BIT)
            if mapped and run is None:
                run = idx
            elif not mapped and run is not None:
                if mr is not None:
                    try:
                        mlx5r_umr_update_xlt(mr, run, idx - run, MLX5_IB_UPD_XLT_ZAP)
                    except KernelError as e:   # void in the kernel: only warned about
                        mlx5_ib_warn(to_mdev(mr.device),
                                     f"mlx5_ib_invalidate_range: zap failed: {e}")
                run = None
        ib_umem_odp_unmap_dma_pages(umem_odp, start, end)
        if not umem_odp.npages_mapped and mr is not None and mr.parent is not None:
            destroy_unused_implicit_child_mr(mr)
    finally:
        mutex_unlock(umem_odp.umem_mutex)
    return True


mlx5_mn_ops = mmu_interval_notifier_ops(invalidate=mlx5_ib_invalidate_range)


# -- page faults ---------------------------------------------------------------------------
@traced
def pagefault_real_mr(mr: mlx5_ib_mr, odp: ib_umem_odp, user_va: int, bcnt: int,
                      flags: int) -> int:
    """Mirrors pagefault_real_mr(): fault in (or, SNAPSHOT, only find) the pages,
    DMA-map them, load their MTT entries (ENABLE: and turn the mkey on); the pages
    of the range, in the kernel's PAGE_SIZE units."""
    access_mask = ODP_READ_ALLOWED_BIT
    if odp.writable and not flags & MLX5_PF_FLAGS_DOWNGRADE:
        access_mask |= ODP_WRITE_ALLOWED_BIT
    np = ib_umem_odp_map_dma_and_lock(odp, user_va, bcnt, access_mask,
                                      not flags & MLX5_PF_FLAGS_SNAPSHOT)
    try:
        start_idx = (user_va - ib_umem_start(odp)) >> odp.page_shift
        mlx5r_umr_update_xlt(mr, start_idx, np,
                             MLX5_IB_UPD_XLT_ENABLE if flags & MLX5_PF_FLAGS_ENABLE else 0)
    finally:
        mutex_unlock(odp.umem_mutex)
    return np


@traced
def pagefault_mr(mr: mlx5_ib_mr, io_virt: int, bcnt: int, flags: int) -> int:
    """Mirrors pagefault_mr(): for an explicit ODP MR the device address to the
    process's (iova -> umem address), EFAULT for a range outside the umem; an
    implicit MR's goes to pagefault_implicit_mr.  A
    dma-buf MR maps its whole buffer again (pagefault_dmabuf_mr); EFAULT below its
    iova."""
    if mr.umem.is_dmabuf:
        if io_virt < mr.iova:
            raise KernelError(EFAULT, "pagefault_mr: address below the MR's iova")
        return pagefault_dmabuf_mr(mr, bcnt, flags)
    odp: ib_umem_odp = mr.umem
    if odp.is_implicit_odp:
        return pagefault_implicit_mr(mr, odp, io_virt, bcnt, flags)
    user_va = io_virt - mr.iova + odp.address
    if user_va < ib_umem_start(odp) or user_va >= ib_umem_end(odp) or \
            ib_umem_end(odp) - user_va < bcnt:
        raise KernelError(EFAULT, "pagefault_mr: range outside the MR")
    return pagefault_real_mr(mr, odp, user_va, bcnt, flags)


# -- implicit ODP --------------------------------------------------------------------------
def mlx5_imr_mtt_entries(dev: mlx5_ib_dev) -> int:
    """mlx5_imr_mtt_entries: the PAGE_SIZE MTT entries of one child (1 GiB)."""
    return MLX5_IMR_MTT_SIZE >> dev.mdev.pdev.machine.page_shift


def mlx5_imr_ksm_entries() -> int:
    """mlx5_imr_ksm_entries: the parent's KSM entries - TASK_SIZE rounded up to a power
    of two, in 1 GiB slices (2^17 on x86-64)."""
    return (1 << (TASK_SIZE - 1).bit_length()) >> MLX5_IMR_MTT_SHIFT


@traced
def mlx5_mr_cache_alloc(pd: object, access_flags: int, access_mode: int, ndescs: int,
                        start: int, log_page_size: int) -> mlx5_ib_mr:
    """Mirrors mlx5_mr_cache_alloc() (mr.c) for the implicit ODP mkeys: an mkey created
    free (a UMR turns it on), with pg_access, `ndescs` translation entries (MTT: 8
    bytes each; KSM: 16) none present, from `start` (a KSM parent: length64, the
    whole address space; an MTT child: ndescs pages).  The MR's keys set; nothing else.

    # EMU: no mkey cache: CREATE_MKEY each time, with the PD and access bits set at
    # creation (the cache's mkeys get them by the enabling UMR); it lives here, not in
    # mr.py, because mr.py imports this module."""
    dev = to_mdev(pd.device)
    mr = kmalloc_obj(mlx5_ib_mr(pd.device))
    ksm = access_mode == MLX5_MKC_ACCESS_MODE_KSM
    n64 = 2 * ndescs if ksm else ndescs + (ndescs & 1)
    in_ = IfcStruct("create_mkey_in", klm_pas_mtt=n64)
    MLX5_SET("create_mkey_in", in_, "pg_access", 1)
    MLX5_SET("create_mkey_in", in_, "uid", pd.uid)
    mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
    MLX5_SET("mkc", mkc, "a", bool(access_flags & IB_ACCESS_REMOTE_ATOMIC))
    MLX5_SET("mkc", mkc, "rw", bool(access_flags & IB_ACCESS_REMOTE_WRITE))
    MLX5_SET("mkc", mkc, "rr", bool(access_flags & IB_ACCESS_REMOTE_READ))
    MLX5_SET("mkc", mkc, "lw", bool(access_flags & IB_ACCESS_LOCAL_WRITE))
    MLX5_SET("mkc", mkc, "lr", 1)
    MLX5_SET("mkc", mkc, "pd", pd.pdn)
    MLX5_SET64("mkc", mkc, "start_addr", start)
    MLX5_SET("mkc", mkc, "free", 1)
    MLX5_SET("mkc", mkc, "umr_en", 1)
    MLX5_SET("mkc", mkc, "access_mode_1_0", access_mode & 3)
    MLX5_SET("mkc", mkc, "access_mode_4_2", access_mode >> 2)
    if ksm:
        MLX5_SET("mkc", mkc, "length64", 1)
    else:
        MLX5_SET64("mkc", mkc, "len", ndescs << log_page_size)
    MLX5_SET("mkc", mkc, "log_page_size", log_page_size)
    octo = ndescs if ksm else (ndescs + 1) // 2
    MLX5_SET("mkc", mkc, "translations_octword_size", octo)
    MLX5_SET("create_mkey_in", in_, "translations_octword_actual_size", octo)
    dev.mkey_var = (dev.mkey_var + 1) & 0xFF          # assign_mkey_variant()
    MLX5_SET("mkc", mkc, "mkey_7_0", dev.mkey_var)
    try:
        mr.mmkey.key = mlx5_core_create_mkey(dev.mdev, in_)
    except BaseException:
        kfree(mr)
        raise
    mr.mmkey.type = MLX5_MKEY_MR
    mr.mmkey.ndescs = ndescs
    mr.lkey = mr.rkey = mr.mmkey.key
    mr.access_flags = access_flags
    return mr


def mlx5_odp_populate_klm(imr: mlx5_ib_mr, idx: int, nentries: int, flags: int,
                          out: U64Array) -> None:
    """Mirrors populate_klm(): KSM entries [idx, idx + nentries) of the parent - the
    child's key where a child exists (and not ZAP), else the null mkey (an access
    through it faults); each entry's address is its slice's start."""
    dev = to_mdev(imr.device)
    zap = bool(flags & MLX5_IB_UPD_XLT_ZAP)
    # every slice on the null mkey (the machine's loop: an implicit MR has one entry
    # per GiB of the address space), then each child's over its own
    size = MLX5_IMR_MTT_SIZE & 0xFFFFFFFF
    dev.mdev.pdev.machine.ops.ksm_fill(out, idx, nentries, size, dev.null_mkey,
                                       MLX5_IMR_MTT_SHIFT)
    if zap:
        return
    raw = memoryview(out.buf)
    for i, child in imr.implicit_children.items():
        if idx <= i < idx + nentries:
            struct.pack_into(">IIQ", raw, 16 * (i - idx), size, child.lkey,
                             i << MLX5_IMR_MTT_SHIFT)


@traced
def mlx5r_umr_update_xlt_ksm(imr: mlx5_ib_mr, idx: int, nentries: int, flags: int) -> None:
    """mlx5r_umr_update_xlt() with MLX5_IB_UPD_XLT_INDIRECT: KSM entries [idx, idx +
    nentries) of an implicit MR from its children (populate_klm; ZAP: all on the null
    mkey); MLX5_IB_UPD_XLT_ENABLE turns the mkey on.  # EMU: the UMR is the firmware
    command EMU_UMR_UPDATE_XLT, its entries 16-byte KSMs for a KSM mkey."""
    dev = to_mdev(imr.device)
    in_ = IfcStruct("emu_umr_update_xlt_in", klm_pas_mtt=2 * max(nentries, 1))
    MLX5_SET("emu_umr_update_xlt_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_UPDATE_XLT)
    MLX5_SET("emu_umr_update_xlt_in", in_, "mkey_index", mlx5_mkey_to_idx(imr.mmkey.key))
    MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_offset", idx)
    MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_nentries", nentries)
    MLX5_SET("emu_umr_update_xlt_in", in_, "enable", int(bool(flags & MLX5_IB_UPD_XLT_ENABLE)))
    mlx5_odp_populate_klm(imr, idx, nentries, flags,
                          MLX5_ADDR_OF("emu_umr_update_xlt_in", in_, "klm_pas_mtt"))
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("emu_umr_update_xlt_out"))


@traced
def mlx5_ib_alloc_implicit_mr(pd: object, access_flags: int) -> mlx5_ib_mr:
    """Mirrors mlx5_ib_alloc_implicit_mr(): the root umem (ib_umem_odp_alloc_implicit),
    a KSM mkey over the whole address space with every entry on the null mkey (UMR,
    ZAP | ENABLE), iova 0, length 0, no children yet; stored among the ODP mkeys so
    its faults find it.  ib_umem_odp_alloc_implicit's errors (EINVAL for HUGETLB);
    firmware errors.  Every step unwound on failure."""
    dev = to_mdev(pd.device)
    umem_odp = ib_umem_odp_alloc_implicit(pd.device, access_flags)
    try:
        imr = mlx5_mr_cache_alloc(pd, access_flags, MLX5_MKC_ACCESS_MODE_KSM,
                                  mlx5_imr_ksm_entries(), 0, MLX5_KSM_PAGE_SHIFT)
    except BaseException:
        ib_umem_release(umem_odp)
        raise
    imr.iova, imr.length, imr.pd = 0, 0, pd
    imr.umem = umem_odp
    umem_odp.private = imr
    imr.is_odp_implicit = True
    imr.implicit_children = {}
    imr.implicit_children_lock = mutex_init("imr->implicit_children")
    imr.implicit_dying = False
    try:
        mlx5r_umr_update_xlt(imr, 0, mlx5_imr_ksm_entries(),
                             MLX5_IB_UPD_XLT_INDIRECT | MLX5_IB_UPD_XLT_ZAP
                             | MLX5_IB_UPD_XLT_ENABLE)
    except BaseException:
        mlx5_core_destroy_mkey(dev.mdev, imr.mmkey.key)
        ib_umem_release(umem_odp)
        kfree(imr)
        raise
    mlx5r_store_odp_mkey(dev, imr)
    return imr


def _free_implicit_child(mr: mlx5_ib_mr) -> None:
    """The mlx5_ib_dereg_mr() of a child: no fault finds it, its mkey goes, then its umem
    (the notifier removed, what is mapped unmapped)."""
    dev = to_mdev(mr.device)
    mlx5r_erase_odp_mkey(dev, mr)
    mlx5_core_destroy_mkey(dev.mdev, mr.mmkey.key)
    ib_umem_release(mr.umem)
    mr.umem = None
    kfree(mr)


@traced
def implicit_get_child_mr(imr: mlx5_ib_mr, idx: int) -> mlx5_ib_mr:
    """Mirrors implicit_get_child_mr(): the child of slice idx - a child umem over the
    slice (ib_umem_odp_alloc_child: its own notifier) and an MTT mkey with every entry
    zapped, turned on by UMR; then published in the parent's children and among the
    ODP mkeys.  If a racing fault published one first, ours goes and theirs is
    returned - with a reference the caller drops (mlx5r_deref_odp_mkey).  (The
    parent's KSM entry is the caller's to update.)"""
    dev = to_mdev(imr.device)
    odp = ib_umem_odp_alloc_child(imr.umem, idx << MLX5_IMR_MTT_SHIFT, MLX5_IMR_MTT_SIZE,
                                  mlx5_mn_ops)
    try:
        mr = mlx5_mr_cache_alloc(imr.pd, imr.access_flags, MLX5_MKC_ACCESS_MODE_MTT,
                                 mlx5_imr_mtt_entries(dev), idx << MLX5_IMR_MTT_SHIFT,
                                 odp.page_shift)
    except BaseException:
        ib_umem_release(odp)
        raise
    mr.pd, mr.umem, mr.parent = imr.pd, odp, imr
    mr.odp_users = 0                                # mmkey.usecount beyond the xarray's
    mr.odp_users_wq = init_waitqueue_head("mr->mmkey.wait")
    mr.page_shift = odp.page_shift
    mr.iova, mr.length = idx << MLX5_IMR_MTT_SHIFT, MLX5_IMR_MTT_SIZE
    odp.private = mr
    try:
        mlx5r_umr_update_xlt(mr, 0, mlx5_imr_mtt_entries(dev),
                             MLX5_IB_UPD_XLT_ZAP | MLX5_IB_UPD_XLT_ENABLE)
    except BaseException:
        mlx5_core_destroy_mkey(dev.mdev, mr.mmkey.key)
        ib_umem_release(odp)
        kfree(mr)
        raise
    mutex_lock(imr.implicit_children_lock)
    theirs = imr.implicit_children.get(idx)
    if theirs is None:                              # __xa_cmpxchg(NULL -> mr) won
        imr.implicit_children[idx] = mr
        mlx5r_store_odp_mkey(dev, mr)
    got = theirs if theirs is not None else mr
    got.odp_users += 1                              # the caller's reference
    mutex_unlock(imr.implicit_children_lock)
    if theirs is not None:          # ours was never published: no srcu wait (we hold it)
        mlx5_core_destroy_mkey(dev.mdev, mr.mmkey.key)
        ib_umem_release(odp)
        kfree(mr)
    return got


@traced
def pagefault_implicit_mr(imr: mlx5_ib_mr, odp_imr: ib_umem_odp, user_va: int, bcnt: int,
                          flags: int) -> int:
    """Mirrors pagefault_implicit_mr(): fault [user_va, user_va + bcnt) in slice by
    slice through each slice's child (made if missing); if any child was made, the
    parent's KSM entries from the first new one on are loaded by UMR (under the root
    umem's umem_mutex) - also when a later slice failed.  The pages mapped; EFAULT for
    a range beyond the KSM's reach; the children's errors."""
    reach = mlx5_imr_ksm_entries() << MLX5_IMR_MTT_SHIFT
    if user_va >= reach or reach - user_va < bcnt:
        raise KernelError(EFAULT, "pagefault_implicit_mr: range beyond the address space")
    end_idx = (user_va + bcnt - 1) >> MLX5_IMR_MTT_SHIFT
    upd_start, upd_len, npages = end_idx + 1, 0, 0
    try:
        while bcnt > 0:
            idx = user_va >> MLX5_IMR_MTT_SHIFT
            mutex_lock(imr.implicit_children_lock)
            mtt = imr.implicit_children.get(idx)
            if mtt is not None:
                mtt.odp_users += 1                  # refcount_inc(&mtt->mmkey.usecount)
            mutex_unlock(imr.implicit_children_lock)
            if mtt is None:
                mtt = implicit_get_child_mr(imr, idx)
                upd_start = min(upd_start, idx)
                upd_len = idx - upd_start + 1
            odp: ib_umem_odp = mtt.umem
            length = min(user_va + bcnt, ib_umem_end(odp)) - user_va
            try:
                npages += pagefault_real_mr(mtt, odp, user_va, length, flags)
            finally:
                mlx5r_deref_odp_mkey(mtt)
            user_va += length
            bcnt -= length
    finally:
        # implicit_children changed: the KSM follows before the fault is resumed
        if upd_len:
            mutex_lock(odp_imr.umem_mutex)
            try:
                mlx5r_umr_update_xlt(imr, upd_start, upd_len,
                                     MLX5_IB_UPD_XLT_INDIRECT | MLX5_IB_UPD_XLT_ATOMIC)
            finally:
                mutex_unlock(odp_imr.umem_mutex)
    return npages


def mlx5r_deref_odp_mkey(mr: mlx5_ib_mr) -> None:
    """Mirrors mlx5r_deref_odp_mkey(): drop a fault's reference on a child; the last
    one wakes its destruction (mlx5r_deref_wait_odp_mkey)."""
    mr.odp_users -= 1
    if not mr.odp_users:
        wake_up(mr.odp_users_wq)


class _child_free_work(work_struct):
    """The odp_destroy work of a child (struct mlx5_ib_mr's odp_destroy.work)."""

    def __init__(self, mr: mlx5_ib_mr):
        super().__init__(free_implicit_child_mr_work)
        self.mr = mr


@traced
def destroy_unused_implicit_child_mr(mr: mlx5_ib_mr) -> None:
    """Mirrors destroy_unused_implicit_child_mr() (the child's umem_mutex held by the
    invalidation): take the child out of the parent's children - unless the parent is
    being deregistered (its dereg destroys the children) or another took it first -
    and bounce its destruction to a work (freeing sleeps; the notifier cannot remove
    itself from its own callback)."""
    imr = mr.parent
    idx = ib_umem_start(mr.umem) >> MLX5_IMR_MTT_SHIFT
    mutex_lock(imr.implicit_children_lock)
    try:
        if imr.implicit_dying or imr.implicit_children.get(idx) is not mr:
            return
        del imr.implicit_children[idx]
    finally:
        mutex_unlock(imr.implicit_children_lock)
    queue_work(system_wq(), _child_free_work(mr))


@traced
def free_implicit_child_mr_work(work: work_struct) -> None:
    """Mirrors free_implicit_child_mr_work(): once no fault uses the child, the parent's
    KSM entry of the slice back on the null mkey (or on a newer child) by UMR under the
    root's umem_mutex, then the child deregistered."""
    mr: mlx5_ib_mr = work.mr
    imr = mr.parent
    odp_imr: ib_umem_odp = imr.umem
    wait_event(mr.odp_users_wq, lambda: not mr.odp_users)  # mlx5r_deref_wait_odp_mkey
    mutex_lock(odp_imr.umem_mutex)
    try:
        mlx5r_umr_update_xlt(imr, ib_umem_start(mr.umem) >> MLX5_IMR_MTT_SHIFT, 1,
                             MLX5_IB_UPD_XLT_INDIRECT | MLX5_IB_UPD_XLT_ATOMIC)
    except KernelError as e:
        mlx5_ib_warn(to_mdev(imr.device), f"free_implicit_child_mr_work: {e}")
    finally:
        mutex_unlock(odp_imr.umem_mutex)
    _free_implicit_child(mr)


@traced
def mlx5_ib_free_implicit_mr(imr: mlx5_ib_mr) -> None:
    """Mirrors __mlx5_ib_dereg_mr() + mlx5_ib_free_odp_mr() for an implicit MR (already
    out of the ODP mkeys, no fault uses it): no child is bounced to a work any more and
    those bounced are done (they update the parent's KSM), then the parent's mkey goes
    (no DMA through it), then every child left, then the root umem and the MR."""
    dev = to_mdev(imr.device)
    mutex_lock(imr.implicit_children_lock)
    imr.implicit_dying = True
    mutex_unlock(imr.implicit_children_lock)
    flush_workqueue(system_wq())
    mlx5_core_destroy_mkey(dev.mdev, imr.mmkey.key)
    mutex_lock(imr.implicit_children_lock)
    children = list(imr.implicit_children.values())
    imr.implicit_children.clear()
    mutex_unlock(imr.implicit_children_lock)
    for mtt in children:
        _free_implicit_child(mtt)
    ib_umem_release(imr.umem)
    imr.umem = None
    kfree(imr)


# -- dma-buf MRs ---------------------------------------------------------------------------
@traced
def mlx5r_umr_update_mr_pas(mr: mlx5_ib_mr, flags: int) -> None:
    """Mirrors mlx5r_umr_update_mr_pas() (umr.c) for a dma-buf MR (dma_resv held): every
    MTT entry by UMR - the umem's PAGE_SIZE DMA blocks with the present bits, or, with
    MLX5_IB_UPD_XLT_ZAP, zero (the HCA's DMA through the mkey drained first);
    MLX5_IB_UPD_XLT_ENABLE turns the mkey on.  # EMU: the UMR is the firmware command
    EMU_UMR_UPDATE_XLT, as mlx5r_umr_update_xlt's."""
    dev = to_mdev(mr.device)
    umem = mr.umem
    npages = ib_umem_num_dma_blocks(umem, 1 << mr.page_shift)
    zap = bool(flags & MLX5_IB_UPD_XLT_ZAP)
    in_ = IfcStruct("emu_umr_update_xlt_in", klm_pas_mtt=0 if zap else max(npages, 1))
    MLX5_SET("emu_umr_update_xlt_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_UPDATE_XLT)
    MLX5_SET("emu_umr_update_xlt_in", in_, "mkey_index", mlx5_mkey_to_idx(mr.mmkey.key))
    MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_offset", 0)
    MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_nentries", npages)
    MLX5_SET("emu_umr_update_xlt_in", in_, "zap", int(zap))
    MLX5_SET("emu_umr_update_xlt_in", in_, "enable", int(bool(flags & MLX5_IB_UPD_XLT_ENABLE)))
    if not zap:
        mlx5_ib_populate_pas(umem, 1 << mr.page_shift,
                             MLX5_ADDR_OF("emu_umr_update_xlt_in", in_, "klm_pas_mtt"),
                             MLX5_IB_MTT_READ | MLX5_IB_MTT_WRITE)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("emu_umr_update_xlt_out"))


def mlx5_umem_dmabuf_find_best_pgsz(umem: ib_umem_dmabuf) -> int:
    """Mirrors mlx5_umem_dmabuf_find_best_pgsz(): a dma-buf mkey's page size is fixed at
    PAGE_SIZE (any layout after a move must fit): PAGE_SIZE if the mapping allows
    it, else 0."""
    ps = 1 << umem.ibdev.dma_device.machine.page_shift
    return ib_umem_find_best_pgsz(umem, ps, umem.iova)


@traced
def pagefault_dmabuf_mr(mr: mlx5_ib_mr, bcnt: int, flags: int) -> int:
    """Mirrors pagefault_dmabuf_mr(): under the dma_resv, map the dma-buf again
    (ib_umem_dmabuf_map_pages: a mapping still there is kept) and load every MTT
    entry by UMR (ENABLE: and turn the mkey on); the umem's pages.  EINVAL (the
    mapping given back) when the exporter's layout does not fit PAGE_SIZE entries;
    the exporter's map errors."""
    umem: ib_umem_dmabuf = mr.umem
    resv = umem.attach.dmabuf.resv
    mutex_lock(resv)
    try:
        ib_umem_dmabuf_map_pages(umem)
        if not mlx5_umem_dmabuf_find_best_pgsz(umem):
            ib_umem_dmabuf_unmap_pages(umem)
            raise KernelError(EINVAL, "pagefault_dmabuf_mr: mapping not in PAGE_SIZE blocks")
        mlx5r_umr_update_mr_pas(mr, MLX5_IB_UPD_XLT_ENABLE if flags & MLX5_PF_FLAGS_ENABLE
                                else 0)
    finally:
        mutex_unlock(resv)
    return ib_umem_num_pages(umem)


def mlx5_ib_init_dmabuf_mr(mr: mlx5_ib_mr) -> None:
    """Mirrors mlx5_ib_init_dmabuf_mr(): map the whole buffer and turn the mkey on."""
    pagefault_dmabuf_mr(mr, mr.umem.length, MLX5_PF_FLAGS_ENABLE)


@traced
def pagefault_single_data_segment(dev: mlx5_ib_dev, key: int, io_virt: int,
                                  bcnt: int) -> int:
    """Mirrors pagefault_single_data_segment(): find the ODP MR of key (under the
    odp srcu, so its deregistration waits) and fault its range in; pages mapped.
    0 for a key no ODP MR has (deleted, or never ODP); EFAULT for a stale key."""
    idx = srcu_read_lock(dev.odp_srcu)
    try:
        mr = dev.odp_mkeys.get(mlx5_mkey_to_idx(key))
        if mr is None:
            return 0                        # "skipping page fault for a deleted key"
        if mr.mmkey.key != key:
            raise KernelError(EFAULT, f"pagefault_single_data_segment: stale key {key:#x}")
        return pagefault_mr(mr, io_virt, bcnt, 0)
    finally:
        srcu_read_unlock(dev.odp_srcu, idx)


@traced
def mlx5_ib_page_fault_resume(dev: mlx5_ib_dev, pfault: mlx5_pagefault, error: int) -> None:
    """Mirrors mlx5_ib_page_fault_resume(): PAGE_FAULT_RESUME with the fault's token
    (and error); a failure is only warned about."""
    in_ = IfcStruct("page_fault_resume_in")
    MLX5_SET("page_fault_resume_in", in_, "opcode", MLX5_CMD_OP_PAGE_FAULT_RESUME)
    MLX5_SET("page_fault_resume_in", in_, "page_fault_type", pfault.type)
    MLX5_SET("page_fault_resume_in", in_, "token", pfault.token)
    MLX5_SET("page_fault_resume_in", in_, "error", error)
    try:
        mlx5_cmd_exec(dev.mdev, in_, IfcStruct("page_fault_resume_out"))
    except KernelError as e:
        mlx5_ib_warn(dev, f"mlx5_ib_page_fault_resume: token {pfault.token:#x}: {e}")


@traced
def mlx5_ib_mr_rdma_pfault_handler(dev: mlx5_ib_dev, pfault: mlx5_pagefault) -> None:
    """Mirrors mlx5_ib_mr_rdma_pfault_handler(): fault the key's range in; resume with
    an error if that failed or mapped fewer pages than the range has."""
    ps = 1 << dev.mdev.pdev.machine.page_shift
    address, length = pfault.rdma_va, pfault.rdma_op_len
    pages = (-(-(address + length) // ps) - address // ps) if length else 0
    try:
        ret = pagefault_single_data_segment(dev, pfault.r_key, address, length)
    except KernelError as e:
        mlx5_ib_warn(dev, f"mlx5_ib_mr_rdma_pfault_handler: {e}")
        ret = -e.errno
    mlx5_ib_page_fault_resume(dev, pfault, int(ret < 0 or pages > ret))


@traced
def mlx5_ib_eqe_pf_action(work: work_struct) -> None:
    """Mirrors mlx5_ib_eqe_pf_action() / mlx5_ib_pfault(): one fault, by sub-type."""
    pfault: mlx5_pagefault = work
    dev = pfault.eq.dev
    if pfault.event_subtype == MLX5_PFAULT_SUBTYPE_RDMA:
        mlx5_ib_mr_rdma_pfault_handler(dev, pfault)
    else:
        mlx5_ib_warn(dev, f"invalid page fault event subtype {pfault.event_subtype:#x}")
        mlx5_ib_page_fault_resume(dev, pfault, 1)


def mlx5_ib_eq_pf_process(eq: mlx5_ib_pf_eq) -> None:
    """Mirrors mlx5_ib_eq_pf_process(): each EQE software owns becomes a fault work on
    the EQ's workqueue; the consumer index goes back, the EQ re-armed."""
    core = eq.core
    mdev: mlx5_core_dev = eq.dev.mdev
    while (eqe := next_eqe_sw(mdev, core)) is not None:
        if eqe[1] == MLX5_EVENT_TYPE_PAGE_FAULT:
            queue_work(eq.wq, mlx5_pagefault(eq, eqe))
        else:
            mlx5_ib_warn(eq.dev, f"Unsupported page fault event sub-type: {eqe[1]:#x}")
        core.cons_index += 1
    eq_update_ci(core, True)


@traced
def mlx5_ib_eq_pf_int(vector: int, core: mlx5_eq) -> int:
    """Mirrors mlx5_ib_eq_pf_int(): the page-fault EQ's interrupt - its EQEs are taken
    here (the kernel does so under the EQ's lock, or defers to the EQ's work)."""
    mlx5_ib_eq_pf_process(core.pf_eq)
    return IRQ_HANDLED


def mlx5_ib_init_odp_mr(mr: mlx5_ib_mr) -> None:
    """Mirrors mlx5_ib_init_odp_mr(): load the pages already present (a snapshot, no
    fault) and turn the mkey on."""
    pagefault_real_mr(mr, mr.umem, mr.umem.address, mr.umem.length,
                      MLX5_PF_FLAGS_SNAPSHOT | MLX5_PF_FLAGS_ENABLE)


# -- prefetch (ibv_advise_mr) --------------------------------------------------------------
IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH = 0
IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE = 1
IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT = 2
IB_UVERBS_ADVISE_MR_FLAG_FLUSH = 1 << 0


def get_prefetchable_mr(pd: object, advice: int, lkey: int) -> mlx5_ib_mr | None:
    """Mirrors get_prefetchable_mr() (odp srcu held): the ODP MR of lkey if it is in
    pd and - for PREFETCH_WRITE - writable; None otherwise."""
    dev = to_mdev(pd.device)
    mr = dev.odp_mkeys.get(mlx5_mkey_to_idx(lkey))
    if mr is None or mr.mmkey.key != lkey or mr.pd is not pd:
        return None
    if advice == IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE and not mr.umem.writable:
        return None
    return mr


@traced
def mlx5_ib_prefetch_sg_list(pd: object, advice: int, pf_flags: int,
                             sg_list: list[tuple[int, int, int]]) -> None:
    """Mirrors mlx5_ib_prefetch_sg_list(): fault each SGE's range in now.  ENOENT for
    an lkey that is not a prefetchable ODP MR of the PD; pagefault_mr's errors."""
    dev = to_mdev(pd.device)
    for addr, length, lkey in sg_list:
        idx = srcu_read_lock(dev.odp_srcu)
        try:
            mr = get_prefetchable_mr(pd, advice, lkey)
            if mr is None:
                raise KernelError(ENOENT, f"mlx5_ib_prefetch_sg_list: lkey {lkey:#x}")
            pagefault_mr(mr, addr, length, pf_flags)
        finally:
            srcu_read_unlock(dev.odp_srcu, idx)


class prefetch_mr_work(work_struct):
    """Mirrors struct prefetch_mr_work: an asynchronous prefetch of an SGE list."""

    def __init__(self, pd: object, advice: int, pf_flags: int,
                 sg_list: list[tuple[int, int, int]]):
        super().__init__(mlx5_ib_prefetch_mr_work)
        self.pd, self.advice, self.pf_flags, self.frags = pd, advice, pf_flags, sg_list


@traced
def mlx5_ib_prefetch_mr_work(work: work_struct) -> None:
    """Mirrors mlx5_ib_prefetch_mr_work(): the queued prefetch; a failure is only warned
    about (the caller returned long ago).  # EMU: the MRs are looked up again here
    under the odp srcu instead of being referenced (num_deferred_work) at queue time;
    one deregistered meanwhile is skipped."""
    w: prefetch_mr_work = work
    dev = to_mdev(w.pd.device)
    try:
        mlx5_ib_prefetch_sg_list(w.pd, w.advice, w.pf_flags, w.frags)
    except KernelError as e:
        mlx5_ib_warn(dev, f"mlx5_ib_prefetch_mr_work: {e}")


@traced
def mlx5_ib_advise_mr(pd: object, advice: int, flags: int, sg_list: list[tuple[int, int, int]],
                      num_sge: int, attrs: object) -> None:
    """Mirrors mlx5_ib_advise_mr() -> mlx5_ib_advise_mr_prefetch(): PREFETCH (read
    only: DOWNGRADE), PREFETCH_WRITE, PREFETCH_NO_FAULT (only pages already present:
    SNAPSHOT); with IB_UVERBS_ADVISE_MR_FLAG_FLUSH at once, else on a workqueue.

    EOPNOTSUPP for another advice; EINVAL (asynchronous) when an lkey is not a
    prefetchable ODP MR of the PD; ENOENT and pagefault_mr's errors (synchronous)."""
    if advice not in (IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
                      IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                      IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT):
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_advise_mr: advice {advice}")
    pf_flags = {IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH: MLX5_PF_FLAGS_DOWNGRADE,
                IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: MLX5_PF_FLAGS_SNAPSHOT}.get(
                    advice, 0)
    if flags & IB_UVERBS_ADVISE_MR_FLAG_FLUSH:
        mlx5_ib_prefetch_sg_list(pd, advice, pf_flags, sg_list)
        return
    dev = to_mdev(pd.device)
    idx = srcu_read_lock(dev.odp_srcu)
    try:                                    # init_prefetch_work(): every lkey checked first
        if any(get_prefetchable_mr(pd, advice, lkey) is None for _a, _n, lkey in sg_list):
            raise KernelError(EINVAL, "mlx5_ib_advise_mr_prefetch: an lkey is not a "
                              "prefetchable ODP MR")
    finally:
        srcu_read_unlock(dev.odp_srcu, idx)
    queue_work(system_wq(), prefetch_mr_work(pd, advice, pf_flags, list(sg_list)))

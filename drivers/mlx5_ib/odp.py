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

# EMU: implicit ODP (the whole address space), the WQE sub-type fault (the driver
# reading the faulting WQE's data segments) and ODP for UD are not modelled; the
# device's ODP capability page (MLX5_CAP_ODP) is not in the model's capability
# layout, so the caps reported are those a ConnectX-6 Dx reports for RC and XRC,
# gated by the general pg capability.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from c_ext import U64Array
from drivers.ib_core.ib_verbs import ib_odp_caps
from drivers.ib_core.umem_odp import (
    ODP_READ_ALLOWED_BIT,
    ODP_WRITE_ALLOWED_BIT,
    ib_umem_end,
    ib_umem_odp,
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
    MLX5_SET,
    IfcStruct,
    cpu_to_be64,
)
from drivers.mlx5_core.mr import mlx5_mkey_to_idx
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, mlx5_ib_mr, mlx5_ib_warn, to_mdev
from kernel_model.errno import EFAULT, EINVAL, ENOENT, EOPNOTSUPP, KernelError
from kernel_model.interrupt import IRQ_HANDLED
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.mmu_notifier import (
    mmu_interval_notifier,
    mmu_interval_notifier_ops,
    mmu_interval_set_seq,
    mmu_notifier_range,
)
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
    else ODP for RC and XRC (see the module's EMU note) - no implicit ODP, no UD."""
    caps = ib_odp_caps()
    if MLX5_CAP_GEN(dev.mdev, "pg"):
        caps.general_caps = IB_ODP_SUPPORT
        caps.rc_odp_caps = (IB_ODP_SUPPORT_SEND | IB_ODP_SUPPORT_RECV | IB_ODP_SUPPORT_WRITE
                            | IB_ODP_SUPPORT_READ | IB_ODP_SUPPORT_ATOMIC
                            | IB_ODP_SUPPORT_SRQ_RECV)
        caps.xrc_odp_caps = (IB_ODP_SUPPORT_SEND | IB_ODP_SUPPORT_WRITE | IB_ODP_SUPPORT_READ
                             | IB_ODP_SUPPORT_ATOMIC | IB_ODP_SUPPORT_SRQ_RECV)
    dev.odp_caps = caps


@traced
def mlx5_ib_odp_init_one(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_odp_init_one(): the caps, the ODP mkey table and its srcu, the
    (not yet created) page-fault EQ and the mutex that creates it once."""
    mlx5_ib_internal_fill_odp_caps(dev)
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
    (PAGE_FAULT events) and its workqueue; later calls find it made."""
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
    or zapped (MLX5_IB_UPD_XLT_ZAP); MLX5_IB_UPD_XLT_ENABLE turns the mkey on.
    # EMU: the UMR is the firmware command EMU_UMR_UPDATE_XLT (see its opcode)."""
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
    the range (the HCA's DMA drained), then DMA-unmap the pages."""
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
    """Mirrors pagefault_mr() for an explicit ODP MR: the device address to the
    process's (iova -> umem address), EFAULT for a range outside the umem."""
    odp: ib_umem_odp = mr.umem
    user_va = io_virt - mr.iova + odp.address
    if user_va < ib_umem_start(odp) or user_va >= ib_umem_end(odp) or \
            ib_umem_end(odp) - user_va < bcnt:
        raise KernelError(EFAULT, "pagefault_mr: range outside the MR")
    return pagefault_real_mr(mr, odp, user_va, bcnt, flags)


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

"""Mirrors drivers/infiniband/core/umem.c, include/rdma/ib_umem.h and the block iterator of
drivers/infiniband/core/iter.c: pinning user memory for a device.

An ib_umem is user memory a driver hands to its HCA: a QP or CQ buffer, a
doorbell page, an MR.  ib_umem_get() pins the pages (FOLL_LONGTERM, charged
to mm->pinned_vm against RLIMIT_MEMLOCK), gathers them into a scatterlist
and DMA-maps it; ib_umem_release() undoes all of that.  Between the two a
driver asks which device page size fits (ib_umem_find_best_pgsz /
_pgoff) and walks the mapping in blocks of that size to fill its page
tables (rdma_umem_for_each_dma_block; ib_umem_fill_dma_blocks is the same
walk as one C loop, for an MTT/PAS of a quarter-million entries).

Facts the callers rely on (ib_umem_get(), ib_umem_find_best_pgsz()):
  * writable is decided by the access flags only; a read-only umem pins
    without FOLL_WRITE (since 5.x; 5.3 always pinned for write).
  * find_best_pgsz writes umem->iova, and num_dma_blocks, num_pages and the
    pinned_vm refund in ib_umem_release all read iova, not address.  A
    driver that moves iova to a different page offset changes what release
    gives back - the kernel does the same.

Lock order: none; ib_umem holds no lock.  The caller owns the umem.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING

from c_ext import U64Array
from drivers.ib_core.ib_umem import (  # noqa: F401 - ib_umem.h, re-exported
    IB_PEER_MEM_ALLOW,
    IB_PEER_MEM_INVAL_SUPP,
    _align,
    _page_shift,
    ib_umem,
    ib_umem_dma_offset,
    ib_umem_num_dma_blocks,
    ib_umem_num_pages,
    ib_umem_offset,
    ib_umem_start_dma_addr,
)
from drivers.ib_core.peer_mem import ib_peer_umem_get, ib_peer_umem_release
from drivers.ib_core.umem_dmabuf import ib_umem_dmabuf_release
from drivers.ib_core.umem_odp import ib_umem_odp_release, to_ib_umem_odp
from kernel_model import trace
from kernel_model.current import current
from kernel_model.dma import (
    DMA_ATTR_WEAK_ORDERING,
    DMA_BIDIRECTIONAL,
    dma_get_max_seg_size,
    dma_map_sgtable,
    dma_unmap_sgtable,
)
from kernel_model.errno import EACCES, EFAULT, EINVAL, ENOMEM, EOPNOTSUPP, EPERM, KernelError
from kernel_model.gup import (
    FOLL_LONGTERM,
    FOLL_WRITE,
    gup_fast_need,
    pin_user_pages_fast,
    unpin_user_page_range_dirty_lock,
    unpin_user_pages_dirty_lock,
)
from kernel_model.locking import cond_resched
from kernel_model.mm import mmdrop, mmgrab
from kernel_model.pgtable import _PAGE_SPECIAL
from kernel_model.scatterlist import (
    UINT_MAX,
    sg_alloc_append_table_from_pages,
    sg_appended,
    sg_free_append_table,
    sg_table,
)
from kernel_model.sched import SCHED
from kernel_model.task import CAP_IPC_LOCK, RLIMIT_MEMLOCK, can_do_mlock, capable, rlimit
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.ib_core.device import ib_device
    from kernel_model.mm import mm_struct

from drivers.ib_core.ib_verbs import (  # noqa: E402,F401 - re-exported for callers
    IB_ACCESS_FLUSH_GLOBAL,
    IB_ACCESS_FLUSH_PERSISTENT,
    IB_ACCESS_HUGETLB,
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_MW_BIND,
    IB_ACCESS_ON_DEMAND,
    IB_ACCESS_RELAXED_ORDERING,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    IB_MR_REREG_ACCESS,
    IB_MR_REREG_TRANS,
    IB_ZERO_BASED,
    ib_access_writable,
)

U64_MAX = (1 << 64) - 1


def ib_dma_max_seg_size(dev: ib_device) -> int:
    """Mirrors ib_dma_max_seg_size(), an inline in include/rdma/ib_verbs.h.

    The longest scatterlist entry the device takes; mlx5_core sets 2 GiB on
    its PCI function, so a contiguous 1 GiB umem is one entry.
    # EMU: no software-DMA devices (ib_uses_virt_dma, which gives UINT_MAX).
    """
    return dma_get_max_seg_size(dev.dma_device)


def ib_umem_find_best_pgoff(umem: ib_umem, pgsz_bitmap: int, pgoff_bitmask: int) -> int:
    """Mirrors ib_umem_find_best_pgoff(): find_best_pgsz for hardware that takes an offset.

    Instead of a user IOVA the device sees the DMA address bits it can encode
    as an offset into its first page (pgoff_bitmask), so iova becomes
    `start_dma & pgoff_bitmask`.  0 when no supported size fits.
    """
    return ib_umem_find_best_pgsz(umem, pgsz_bitmap, ib_umem_start_dma_addr(umem) & pgoff_bitmask)


def ib_umem_is_contiguous(umem: ib_umem) -> bool:
    """Mirrors ib_umem_is_contiguous(): could one aligned device page hold the whole umem?

    Tries the smallest power of two that would cover it from its start DMA
    address.  (Side effect, as in the kernel: iova = the start DMA address.)
    """
    dma = ib_umem_start_dma_addr(umem)
    span = (dma ^ ((umem.length - 1 + dma) & U64_MAX)) + 1
    pgsz = 1 << (span - 1).bit_length()  # roundup_pow_of_two()
    return ib_umem_find_best_pgoff(umem, pgsz, U64_MAX) != 0


# -- umem.c ----------------------------------------------------------------------------
@traced
def ib_umem_find_best_pgsz(umem: ib_umem, pgsz_bitmap: int, virt: int) -> int:
    """Mirrors ib_umem_find_best_pgsz(): the best device page size for a single-size MR.

    The smallest size giving the fewest pages such that, in every page, the
    device address (virt...) and the DMA address agree in the low bits.  0
    if no size in pgsz_bitmap fits.  Sets umem.iova = virt.
    """
    umem.iova = va = virt
    if umem.is_odp:  # ODP is always self-consistent: its own page size or nothing
        page_size = 1 << to_ib_umem_odp(umem).page_shift
        return page_size if pgsz_bitmap & page_size else 0
    # sizes that would already cover the whole range: nothing larger than the first
    span_bits = max(1, (((umem.length - 1 + virt) & U64_MAX) ^ virt).bit_length())  # bits_per()
    mask = pgsz_bitmap & U64_MAX & ~((1 << span_bits) - 1)
    sgt = umem.sgt_append.sgt
    # the per-entry walk is a C loop (c_ext pm_pgsz_mask, with its Python twin)
    mask |= sgt.machine.ops.pgsz_mask(sgt.dma_addr, sgt.dma_len, sgt.nents, va,
                                      ib_umem_offset(umem))
    if mask:
        pgsz_bitmap &= (1 << (_ctz(mask) + 1)) - 1  # GENMASK(count_trailing_zeros(mask), 0)
    return 1 << (pgsz_bitmap.bit_length() - 1) if pgsz_bitmap else 0


def _ctz(x: int) -> int:
    return (x & -x).bit_length() - 1


@traced
def ib_umem_get(device: ib_device, addr: int, size: int, access: int) -> ib_umem:
    """Mirrors ib_umem_get(): pin [addr, addr + size) of current's mm and DMA-map it.

    Errors: EINVAL (range wraps, or no page), EPERM (no RLIMIT_MEMLOCK and no
    CAP_IPC_LOCK), EOPNOTSUPP (IB_ACCESS_ON_DEMAND), ENOMEM (pinned_vm would
    pass RLIMIT_MEMLOCK), and whatever gup or the DMA mapping return (EFAULT
    for an unmapped or VM_IO|VM_PFNMAP range).  Every error unwinds fully.
    No peer-memory client is asked (peer_mem_flags 0).
    """
    return __ib_umem_get(device, addr, size, access, 0)


@traced
def ib_umem_get_peer(device: ib_device, addr: int, size: int, access: int,
                     peer_mem_flags: int) -> ib_umem:
    """Mirrors ib_umem_get_peer() (MLNX_OFED): ib_umem_get, and when pinning or mapping
    fails, the peer-memory clients (peer_mem.py); IB_PEER_MEM_INVAL_SUPP in
    peer_mem_flags says the caller can take an invalidation.  If no client takes
    the range, gup's error stands."""
    return __ib_umem_get(device, addr, size, access, IB_PEER_MEM_ALLOW | peer_mem_flags)


def __ib_umem_get(device: ib_device, addr: int, size: int, access: int,
                  peer_mem_flags: int) -> ib_umem:
    """Mirrors __ib_umem_get() (MLNX_OFED umem.c): the checks, the pinned_vm charge, the
    pin and map - and, on their failure path only, the peer attempt."""
    task = current()
    m = task.machine
    ps, shift = m.page_size, m.page_shift
    end = addr + size
    # EMU: addr and size are unsigned long / size_t in C; a negative int is refused too
    if addr < 0 or size < 0 or end > U64_MAX or _align(end, ps) > U64_MAX:
        raise KernelError(EINVAL, f"ib_umem_get: {addr:#x}+{size:#x} overflows")
    if not can_do_mlock():
        raise KernelError(EPERM, "ib_umem_get: RLIMIT_MEMLOCK is 0 and no CAP_IPC_LOCK")
    if access & IB_ACCESS_ON_DEMAND:
        raise KernelError(EOPNOTSUPP, "ib_umem_get: ODP memory goes through ib_umem_odp_get")
    mm = task.mm
    if mm is None:  # EMU: the kernel would oops in mmgrab(NULL) from a kernel thread
        raise KernelError(EFAULT, "ib_umem_get: no user mm (kernel thread)")
    umem = ib_umem(device, m)
    umem.length, umem.address = size, addr
    umem.iova = addr  # drivers set the real one with ib_umem_find_best_pgsz()
    umem.writable = ib_access_writable(access)
    umem.owning_mm = mm
    mmgrab(mm)
    with ExitStack() as unwind:
        unwind.callback(mmdrop, mm)  # umem_kfree:
        # EMU: the scratch page of struct page pointers is a U64Array of PFNs
        page_list = U64Array(ps // 8, zero=False)
        npages = ib_umem_num_pages(umem)
        if npages == 0 or npages > UINT_MAX:
            raise KernelError(EINVAL, f"ib_umem_get: {npages} pages")
        lock_limit = rlimit(RLIMIT_MEMLOCK) >> shift
        mm.pinned_vm += npages  # atomic64_add_return()
        if mm.pinned_vm > lock_limit and not capable(CAP_IPC_LOCK):
            mm.pinned_vm -= npages
            raise KernelError(ENOMEM, f"ib_umem_get: pinned_vm {mm.pinned_vm} + {npages} "
                              f"pages over RLIMIT_MEMLOCK ({lock_limit} pages)")
        unwind.callback(_refund_pinned_vm, umem, mm)  # the pinned_vm charge
        try:
            _pin_pages(device, umem, addr & ~(ps - 1), npages, page_list)
            attrs = DMA_ATTR_WEAK_ORDERING if access & IB_ACCESS_RELAXED_ORDERING else 0
            dma_map_sgtable(device.dma_device, umem.sgt_append.sgt, DMA_BIDIRECTIONAL, attrs)
        except KernelError as err:
            __ib_umem_release(device, umem, False)  # umem_release:
            if not peer_mem_flags & IB_PEER_MEM_ALLOW:
                raise
            # the peer umem keeps the pinned_vm charge and the mm reference
            umem = ib_peer_umem_get(umem, err, peer_mem_flags)
        unwind.pop_all()
    return umem


def _pin_pages(device: ib_device, umem: ib_umem, cur_base: int, npages: int,
               page_list: U64Array) -> None:
    """ib_umem_get()'s loop: pin a page of pointers' worth at a time, append each batch."""
    shift = _page_shift(umem)
    gup_flags = FOLL_LONGTERM | (FOLL_WRITE if umem.writable else 0)
    max_seg = ib_dma_max_seg_size(device)
    while npages:
        done = _pin_batches_at_once(umem, cur_base, npages, page_list, max_seg)
        cur_base += done << shift
        npages -= done
        if not npages:
            break
        cond_resched()
        pinned = pin_user_pages_fast(cur_base, min(npages, page_list.n), gup_flags, page_list)
        if pinned <= 0:  # gup raises rather than return < 0; 0 would loop for ever
            raise KernelError(EFAULT, f"ib_umem_get: nothing pinned at {cur_base:#x}")
        cur_base += pinned << shift
        npages -= pinned  # a short pin just goes round again from where it stopped
        try:
            sg_alloc_append_table_from_pages(umem.sgt_append, page_list, pinned, 0,
                                             pinned << shift, max_seg, npages)
        except KernelError:
            unpin_user_pages_dirty_lock(page_list, pinned, False)
            raise


#: _pin_batches_at_once may run the batches in one C call (tests that watch each
#: batch's pin_user_pages_fast call turn it off)
PIN_AT_ONCE = True


def _pin_batches_at_once(umem: ib_umem, cur_base: int, npages: int, page_list: U64Array,
                         max_seg: int) -> int:
    """_pin_pages' batches in C (ops.pin_append, called again as the table grows), as
    long as each batch's pin_user_pages_fast is its fast path alone; the pages pinned
    and appended (0: the loop takes the batch one call at a time).

    # EMU: a shortcut that changes nothing anyone can see.  It is taken only with
    # tracing off (the per-batch calls would trace nothing), no other task runnable
    # and not in atomic context (each batch's cond_resched() could switch to nobody
    # and warn of nothing), and the range inside the task's address space (the
    # per-batch checks would pass).  It stops at the first page the fast path
    # cannot pin: that batch goes the kernel's way, the slow path included.  The
    # table is the same either way: an append extends the last entry up to
    # max_segment wherever the batches were cut (test_umem.py compares the two)."""
    task = current()
    m, mm = task.machine, task.mm
    shift = m.page_shift
    max_seg &= ~((1 << shift) - 1)
    if not PIN_AT_ONCE or trace.enabled or SCHED.runq or SCHED.current.preempt_count > 0 \
            or max_seg < 1 << shift or cur_base + (npages << shift) > mm.task_size:
        return 0
    sgt = umem.sgt_append.sgt
    need = gup_fast_need(FOLL_WRITE if umem.writable else 0)
    batch = page_list.n
    total, sparse = 0, False
    while total < npages:
        # room for one more batch's worst case - or, once a batch came back barely
        # coalesced, for every page left - so that a range that coalesces (or that
        # the fast path cannot pin at all: peer memory) is never sized for an entry
        # per page, and one that does not is grown once, not doubled again and again
        left = npages - total
        sgt.ensure_capacity(sgt.orig_nents + (left if sparse else min(batch, left)))
        before = sgt.orig_nents
        done, nents = m.ops.pin_append(m.mem, mm.pgd, cur_base + (total << shift), left,
                                       need, _PAGE_SPECIAL, page_list, max_seg, sgt.sg_pfn,
                                       sgt.sg_off, sgt.sg_len, before)
        if done:
            m.vmstat["nr_foll_pin_acquired"] += done
            sg_appended(umem.sgt_append, nents, left - done)
            sparse = 2 * (nents - before) > done
        total += done
        if not done or sgt.capacity - sgt.orig_nents >= min(batch, npages - total):
            break                       # a batch the fast path could not pin in full
    return total


def _refund_pinned_vm(umem: ib_umem, mm: mm_struct) -> None:
    """atomic64_sub(ib_umem_num_pages(umem), &mm->pinned_vm)."""
    mm.pinned_vm -= ib_umem_num_pages(umem)


def __ib_umem_release(device: ib_device, umem: ib_umem, dirty: bool) -> None:
    """Mirrors __ib_umem_release(): unmap (if it was mapped), unpin every run, free the table.

    `dirty` is false on ib_umem_get's error path: nothing was mapped and the
    device never wrote, so no page is dirtied.
    """
    sgt = umem.sgt_append.sgt
    if dirty:
        dma_unmap_sgtable(device.dma_device, sgt, DMA_BIDIRECTIONAL, 0)
    n = sgt.orig_nents
    if n:
        # EMU: one C call over every entry, so no cond_resched() per 4096 entries
        unpin_user_page_range_dirty_lock(sgt.sg_pfn, sgt.sg_len, n, umem.writable and dirty,
                                         len_shift=sgt.page_shift)
    sg_free_append_table(umem.sgt_append)


@traced
def ib_umem_release(umem: ib_umem | None) -> None:
    """Mirrors ib_umem_release(): unmap, unpin (dirty if writable), refund pinned_vm, mmdrop.

    None does nothing (IS_ERR_OR_NULL).  The refund is ib_umem_num_pages(),
    computed from iova as the kernel does.
    """
    if umem is None:
        return
    if umem.is_peer:
        ib_peer_umem_release(umem)
        return
    if umem.is_dmabuf:
        ib_umem_dmabuf_release(umem)
        return
    if umem.is_odp:
        ib_umem_odp_release(to_ib_umem_odp(umem))
        return
    __ib_umem_release(umem.ibdev, umem, True)
    mm = umem.owning_mm
    _refund_pinned_vm(umem, mm)
    mmdrop(mm)


def ib_umem_check_rereg(umem: ib_umem | None, flags: int, new_access_flags: int) -> None:
    """Mirrors ib_umem_check_rereg() (upstream badad6fad60d): a rereg that keeps the
    umem (ACCESS without TRANS) may not make a read-only pinning writable - the
    pages were pinned without FOLL_WRITE: EACCES.  No umem (nothing to keep): fine."""
    if umem is None:
        return
    if flags & IB_MR_REREG_ACCESS and not flags & IB_MR_REREG_TRANS and \
            ib_access_writable(new_access_flags) and not umem.writable:
        raise KernelError(EACCES, "ib_umem_check_rereg: writable access over a read-only "
                          "pinning")


# -- iter.c / ib_umem.h: the DMA block iterator ----------------------------------------
class ib_block_iter:
    """Mirrors struct ib_block_iter: a cursor over a DMA-mapped table in pgsz blocks."""

    def __init__(self, sgt: sg_table, nents: int, pgsz: int):
        # __rdma_block_iter_start()
        self.sgt = sgt
        self.sg = 0  # index of __sg
        self.sg_nents = nents
        self.pg_bit = pgsz.bit_length() - 1  # __fls(pgsz)
        self.sg_advance = 0
        self.dma_addr = 0
        self.sg_numblocks = 0


def __rdma_block_iter_next(biter: ib_block_iter) -> bool:
    """Mirrors __rdma_block_iter_next(): step to the next block; False past the end."""
    if not biter.sg_nents:
        return False
    addrs, lens = biter.sgt.dma_addr.view, biter.sgt.dma_len.view
    pgsz = 1 << biter.pg_bit
    biter.dma_addr = (addrs[biter.sg] + biter.sg_advance) & U64_MAX
    delta = pgsz - (biter.dma_addr & (pgsz - 1))
    while biter.sg_nents and (lens[biter.sg] - biter.sg_advance) & U64_MAX <= delta:
        delta -= (lens[biter.sg] - biter.sg_advance) & U64_MAX
        biter.sg_advance = 0
        biter.sg += 1
        biter.sg_nents -= 1
    biter.sg_advance += delta
    return True


def rdma_block_iter_dma_address(biter: ib_block_iter) -> int:
    """Mirrors rdma_block_iter_dma_address(): the current block's aligned DMA address."""
    return biter.dma_addr & ~((1 << biter.pg_bit) - 1)


def rdma_for_each_block(sgt: sg_table, nents: int, pgsz: int) -> Iterator[int]:
    """Mirrors rdma_for_each_block(): every pgsz block of the first nents DMA segments."""
    biter = ib_block_iter(sgt, nents, pgsz)
    while __rdma_block_iter_next(biter):
        yield rdma_block_iter_dma_address(biter)


def rdma_umem_for_each_dma_block(umem: ib_umem, pgsz: int) -> Iterator[int]:
    """Mirrors rdma_umem_for_each_dma_block(): the umem's blocks, exactly
    ib_umem_num_dma_blocks() of them, yielded as aligned DMA addresses.

    pgsz must be <= PAGE_SIZE or come from ib_umem_find_best_pgsz().
    """
    sgt = umem.sgt_append.sgt
    biter = ib_block_iter(sgt, sgt.nents, pgsz)  # __rdma_umem_block_iter_start()
    biter.sg_advance = ib_umem_offset(umem) & ~(pgsz - 1)
    biter.sg_numblocks = ib_umem_num_dma_blocks(umem, pgsz)
    while __rdma_block_iter_next(biter) and biter.sg_numblocks:  # __rdma_umem_block_iter_next
        biter.sg_numblocks -= 1
        yield rdma_block_iter_dma_address(biter)


def ib_umem_fill_dma_blocks(umem: ib_umem, pgsz: int, out: U64Array, or_flags: int = 0,
                            big_endian: bool = False) -> int:
    """The loop every driver writes around rdma_umem_for_each_dma_block(), in C.

    Writes `block | or_flags` for each block (big-endian for device tables:
    mlx5_ib_populate_pas is `ib_umem_fill_dma_blocks(umem, page_size, pas,
    access_flags, big_endian=True)`) and returns how many it wrote.
    # EMU: kernel-side this is open-coded in each driver; one fused loop here.
    """
    sgt = umem.sgt_append.sgt
    nblocks = ib_umem_num_dma_blocks(umem, pgsz)
    if nblocks > len(out):  # EMU: the kernel trusts the caller to size the table
        raise KernelError(EINVAL, f"ib_umem_fill_dma_blocks: {nblocks} blocks, room for "
                          f"{len(out)}")
    return sgt.machine.ops.dma_blocks(sgt.dma_addr, sgt.dma_len, sgt.nents,
                                      ib_umem_offset(umem) & ~(pgsz - 1), pgsz, nblocks, out,
                                      or_flags, big_endian)

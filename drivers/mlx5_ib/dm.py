"""Mirrors drivers/infiniband/hw/mlx5/dm.c: device memory (ibv_alloc_dm) as on-chip
memory (MEMIC), its mmap entry, and MRs over it (ibv_reg_dm_mr).

    mlx5_cmd_alloc_memic    the lowest free run of PAGE_SIZE pages of the MEMIC BAR
                            window (the driver's bitmap), then ALLOC_MEMIC in it; a
                            run the firmware finds full (EAGAIN) moves one page on
    handle_alloc_dm_memic   the size rounded up to 64 bytes, an mmap entry in the
                            DEVICE_MEM range (8 << 16 ...) for the pages, the page
                            index and the start's offset in its page to user space
    mlx5_ib_dealloc_dm      removes the mmap entry; DEALLOC_MEMIC happens in
                            mlx5_ib_mmap_free once no VMA maps the pages any more
    mlx5_ib_reg_dm_mr       CREATE_MKEY with access mode MEMIC over the device
                            address (BAR-relative), zero-based

Errors: EINVAL for a zero length, an alignment beyond log_max_memic_addr_alignment
(the firmware's unit is 64 << n bytes), access bits a MEMIC MR cannot have;
ENOMEM when no run of pages is free; EOPNOTSUPP for a DM type other than MEMIC
(the steering ICM types are not modelled) or a device without MEMIC.

Lock: dm.lock (spinlock) around the bitmap only; the command runs outside it.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_core_uverbs import (
    rdma_user_mmap_entry_insert_range,
    rdma_user_mmap_entry_remove,
)
from drivers.ib_core.ib_verbs import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    IB_ZERO_BASED,
    ib_dm,
)
from drivers.ib_core.rdma_core import (
    UVERBS_LOOKUP_READ,
    rdma_lookup_get_uobject,
    rdma_lookup_put_uobject,
)
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_attr_is_valid,
    uverbs_copy_to,
    uverbs_get_const,
)
from drivers.ib_core.uverbs_std_types_dm import UVERBS_OBJECT_DM
from drivers.mlx5_core.cmd import mlx5_cmd_exec_inout
from drivers.mlx5_core.driver import MLX5_CAP64_DEV_MEM, MLX5_CAP_DEV_MEM, mlx5_core_dev
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_ALLOC_MEMIC,
    MLX5_CMD_OP_DEALLOC_MEMIC,
    MLX5_GET,
    MLX5_MKC_ACCESS_MODE_MEMIC,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_IB_MMAP_TYPE_MEMIC,
    PAGE_SHIFT,
    PAGE_SIZE,
    mlx5_ib_mr,
    mlx5_user_mmap_entry,
    to_mdev,
)
from drivers.mlx5_ib.mr import mlx5_ib_create_mkey, set_mkc_access_pd_addr_fields, set_mr_fields
from kernel_model.errno import EAGAIN, EINVAL, ENOMEM, EOPNOTSUPP, KernelError
from kernel_model.locking import spin_lock, spin_lock_init, spin_unlock
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced
from kernel_model.uapi.ib_user_ioctl_cmds import UVERBS_OBJECT_DM as UVERBS_OBJECT_DM_ID
from kernel_model.uapi.mlx5_abi import MLX5_IB_MMAP_DEVICE_MEM
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE,
    MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX,
    MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET,
    MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE,
    MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH,
    MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX,
    MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET,
    MLX5_IB_METHOD_DM_QUERY,
    MLX5_IB_UAPI_DM_TYPE_MEMIC,
)

# drivers/infiniband/hw/mlx5/dm.h
MLX5_MEMIC_BASE_ALIGN = 6
MLX5_MEMIC_BASE_SIZE = 1 << MLX5_MEMIC_BASE_ALIGN
MLX5_MEMIC_ALLOC_SIZE_MASK = 0x3F
MLX5_IB_DM_MEMIC_ALLOWED_ACCESS = (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE
                                   | IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC
                                   | IB_ZERO_BASED)


class mlx5_dm:
    """Mirrors struct mlx5_dm: which PAGE_SIZE pages of the MEMIC window are taken."""

    def __init__(self, mdev: mlx5_core_dev):
        self.dev = mdev
        self.lock = spin_lock_init("&dm->lock")
        # protected by lock:
        self.memic_alloc_pages: set[int] = set()   # the bitmap's set bits

    def __repr__(self) -> str:
        return f"mlx5_dm {len(self.memic_alloc_pages)} MEMIC page(s) taken"


class mlx5_ib_dm_memic(ib_dm):
    """Mirrors struct mlx5_ib_dm_memic (with its mlx5_ib_dm base): a MEMIC allocation
    and the mmap entry that maps it."""

    def __init__(self, device: Any):
        super().__init__(device)
        self.type = MLX5_IB_UAPI_DM_TYPE_MEMIC
        self.size = 0            # the allocation: the length rounded up to 64 bytes
        self.dev_addr = 0        # bar_addr + the firmware's memic_start_addr
        self.req_length = 0
        self.mentry = mlx5_user_mmap_entry()
        self.mentry.dm = self    # container_of(mentry, struct mlx5_ib_dm_memic, mentry)


def _bitmap_find_next_zero_area(taken: set[int], size: int, start: int, nr: int) -> int:
    """Mirrors bitmap_find_next_zero_area(): the first run of nr clear bits from start
    (size or beyond when none fits)."""
    idx = start
    while idx + nr <= size:
        busy = [i for i in range(idx, idx + nr) if i in taken]
        if not busy:
            return idx
        idx = busy[-1] + 1
    return size


@traced
def mlx5_cmd_alloc_memic(dm: mlx5_dm, length: int, alignment: int) -> int:
    """Mirrors mlx5_cmd_alloc_memic(): the device address (bar_addr + start) of `length`
    bytes of MEMIC aligned to 1 << alignment (the firmware's 64 << n)."""
    dev = dm.dev
    num_memic_hw_pages = MLX5_CAP_DEV_MEM(dev, "memic_bar_size") >> PAGE_SHIFT()
    hw_start_addr = MLX5_CAP64_DEV_MEM(dev, "memic_bar_start_addr")
    max_alignment = MLX5_CAP_DEV_MEM(dev, "log_max_memic_addr_alignment")
    num_pages = -(-length // PAGE_SIZE())
    if not length or length & MLX5_MEMIC_ALLOC_SIZE_MASK:
        raise KernelError(EINVAL, f"mlx5_cmd_alloc_memic: length {length:#x}")
    mlx5_alignment = 0 if alignment < MLX5_MEMIC_BASE_ALIGN else alignment - MLX5_MEMIC_BASE_ALIGN
    if mlx5_alignment > max_alignment:
        raise KernelError(EINVAL, f"mlx5_cmd_alloc_memic: alignment 2^{alignment} beyond "
                          f"64 << {max_alignment}")
    in_ = IfcStruct("alloc_memic_in")
    MLX5_SET("alloc_memic_in", in_, "opcode", MLX5_CMD_OP_ALLOC_MEMIC)
    MLX5_SET("alloc_memic_in", in_, "range_size", num_pages * PAGE_SIZE())
    MLX5_SET("alloc_memic_in", in_, "memic_size", length)
    MLX5_SET("alloc_memic_in", in_, "log_memic_addr_alignment", mlx5_alignment)
    page_idx = 0
    while page_idx < num_memic_hw_pages:
        spin_lock(dm.lock)
        page_idx = _bitmap_find_next_zero_area(dm.memic_alloc_pages, num_memic_hw_pages,
                                               page_idx, num_pages)
        if page_idx < num_memic_hw_pages:
            dm.memic_alloc_pages.update(range(page_idx, page_idx + num_pages))
        spin_unlock(dm.lock)
        if page_idx >= num_memic_hw_pages:
            break
        MLX5_SET64("alloc_memic_in", in_, "range_start_addr",
                   hw_start_addr + page_idx * PAGE_SIZE())
        try:
            out = mlx5_cmd_exec_inout(dev, in_)
        except KernelError as e:
            spin_lock(dm.lock)
            dm.memic_alloc_pages.difference_update(range(page_idx, page_idx + num_pages))
            spin_unlock(dm.lock)
            if e.errno == EAGAIN:
                page_idx += 1
                continue
            raise
        return dev.bar_addr + MLX5_GET("alloc_memic_out", out, "memic_start_addr")
    raise KernelError(ENOMEM, f"mlx5_cmd_alloc_memic: no {num_pages} free MEMIC page(s)")


@traced
def mlx5_cmd_dealloc_memic(dm: mlx5_dm, addr: int, length: int) -> None:
    """Mirrors mlx5_cmd_dealloc_memic(): DEALLOC_MEMIC, then the pages are free again
    (a failed command keeps them taken, as upstream)."""
    dev = dm.dev
    hw_start_addr = MLX5_CAP64_DEV_MEM(dev, "memic_bar_start_addr")
    num_pages = -(-length // PAGE_SIZE())
    addr -= dev.bar_addr
    start_page_idx = (addr - hw_start_addr) >> PAGE_SHIFT()
    in_ = IfcStruct("dealloc_memic_in")
    MLX5_SET("dealloc_memic_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_MEMIC)
    MLX5_SET64("dealloc_memic_in", in_, "memic_start_addr", addr)
    MLX5_SET("dealloc_memic_in", in_, "memic_size", length)
    mlx5_cmd_exec_inout(dev, in_)
    spin_lock(dm.lock)
    dm.memic_alloc_pages.difference_update(range(start_page_idx, start_page_idx + num_pages))
    spin_unlock(dm.lock)


@traced
def mlx5_ib_dm_memic_free(dm: mlx5_ib_dm_memic) -> None:
    """Mirrors mlx5_ib_dm_memic_free(): the last reference went (kref_put from
    mlx5_ib_mmap_free): DEALLOC_MEMIC and free.  Void, as a kref release is: a failed
    command is logged."""
    dev = to_mdev(dm.device)
    try:
        mlx5_cmd_dealloc_memic(dev.dm, dm.dev_addr, dm.size)
    except KernelError as e:
        dev.mdev.log.append(f"mlx5_ib {dev.name}: DEALLOC_MEMIC {dm.dev_addr:#x} failed: {e}")
    kfree(dm)


def add_dm_mmap_entry(context: Any, mentry: mlx5_user_mmap_entry, mmap_flag: int, size: int,
                      address: int) -> None:
    """Mirrors add_dm_mmap_entry(): an entry in [DEVICE_MEM << 16, + 0xffff]."""
    mentry.mmap_flag = mmap_flag
    mentry.address = address
    rdma_user_mmap_entry_insert_range(context, mentry, size, MLX5_IB_MMAP_DEVICE_MEM << 16,
                                      (MLX5_IB_MMAP_DEVICE_MEM << 16) + (1 << 16) - 1)


@traced
def handle_alloc_dm_memic(ctx: Any, length: int, alignment: int,
                          attrs_: Any) -> mlx5_ib_dm_memic:
    """Mirrors handle_alloc_dm_memic(): see the module docstring."""
    dev = to_mdev(ctx.device)
    if not MLX5_CAP_DEV_MEM(dev.mdev, "memic"):
        raise KernelError(EOPNOTSUPP, "handle_alloc_dm_memic: no MEMIC")
    dm = kmalloc_obj(mlx5_ib_dm_memic(ctx.device))
    dm.size = -(-length // MLX5_MEMIC_BASE_SIZE) * MLX5_MEMIC_BASE_SIZE
    dm.req_length = length
    try:
        dm.dev_addr = mlx5_cmd_alloc_memic(dev.dm, dm.size, alignment)
    except KernelError:
        kfree(dm)
        raise
    address = dm.dev_addr & ~(PAGE_SIZE() - 1)
    try:
        add_dm_mmap_entry(ctx, dm.mentry, MLX5_IB_MMAP_TYPE_MEMIC, dm.size, address)
    except KernelError:
        mlx5_cmd_dealloc_memic(dev.dm, dm.dev_addr, dm.size)
        kfree(dm)
        raise
    try:
        page_idx = dm.mentry.start_pgoff & 0xFFFF
        uverbs_copy_to(attrs_, MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX, page_idx, 2)
        uverbs_copy_to(attrs_, MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET,
                       dm.dev_addr & (PAGE_SIZE() - 1), 8)
    except KernelError:
        rdma_user_mmap_entry_remove(dm.mentry)  # err_copy: the free runs from mmap_free
        raise
    return dm


@traced
def mlx5_ib_alloc_dm(ibdev: Any, context: Any, length: int, alignment: int,
                     attrs_: Any) -> ib_dm:
    """Mirrors mlx5_ib_alloc_dm(): the type (MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE, default
    MEMIC) decides; only MEMIC is modelled (EOPNOTSUPP otherwise)."""
    dm_type = MLX5_IB_UAPI_DM_TYPE_MEMIC
    if uverbs_attr_is_valid(attrs_, MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE):
        dm_type = uverbs_get_const(attrs_, MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE)
    if dm_type != MLX5_IB_UAPI_DM_TYPE_MEMIC:
        # EMU: the steering SW ICM types (DevX steering) are not modelled
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_alloc_dm: DM type {dm_type}")
    return handle_alloc_dm_memic(context, length, alignment, attrs_)


@traced
def mlx5_ib_dealloc_dm(ibdm: ib_dm, attrs_: Any) -> None:
    """Mirrors mlx5_ib_dealloc_dm() -> mlx5_dm_memic_dealloc(): no new mmaps; the
    MEMIC goes back to the firmware when the last VMA is gone (mlx5_ib_mmap_free)."""
    rdma_user_mmap_entry_remove(ibdm.mentry)


@traced
def mlx5_ib_reg_dm_mr(pd: Any, dm: Any, offset: int, length: int, access: int,
                      attrs_: Any) -> mlx5_ib_mr:
    """Mirrors mlx5_ib_reg_dm_mr() -> mlx5_ib_get_dm_mr(): an mkey of access mode MEMIC
    from the DM's device address (BAR-relative) + offset, `length` bytes.  EINVAL for
    access bits outside MLX5_IB_DM_MEMIC_ALLOWED_ACCESS."""
    if dm.type != MLX5_IB_UAPI_DM_TYPE_MEMIC:
        raise KernelError(EINVAL, f"mlx5_ib_reg_dm_mr: DM type {dm.type}")
    if access & ~MLX5_IB_DM_MEMIC_ALLOWED_ACCESS:
        raise KernelError(EINVAL, f"mlx5_ib_reg_dm_mr: access {access:#x} on MEMIC")
    dev = to_mdev(pd.device)
    start_addr = dm.dev_addr + offset - dev.mdev.bar_addr   # pci_resource_start(pdev, 0)
    mr = kmalloc_obj(mlx5_ib_mr(pd.device))
    in_ = IfcStruct("create_mkey_in")
    MLX5_SET("create_mkey_in", in_, "uid", pd.uid)
    mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
    MLX5_SET("mkc", mkc, "access_mode_1_0", MLX5_MKC_ACCESS_MODE_MEMIC & 0x3)
    MLX5_SET("mkc", mkc, "access_mode_4_2", (MLX5_MKC_ACCESS_MODE_MEMIC >> 2) & 0x7)
    MLX5_SET64("mkc", mkc, "len", length)
    set_mkc_access_pd_addr_fields(mkc, access, start_addr, pd)
    try:
        mlx5_ib_create_mkey(dev, mr.mmkey, in_)
    except KernelError:
        kfree(mr)
        raise
    set_mr_fields(mr, length, access, start_addr)
    return mr


@traced
def UVERBS_HANDLER_MLX5_IB_METHOD_DM_QUERY(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(MLX5_IB_METHOD_DM_QUERY): where a DM's pages are (the mmap
    page index, the start's offset in its page) and its requested length - what
    ibv_import_dm maps the DM of another context by.  The handle is an IDR attribute
    of access READ (ENOENT for a handle this file does not hold, EINVAL for one of
    another type); EOPNOTSUPP for a DM other than MEMIC.

    # EMU: the method is in the table whether or not the device has MEMIC (the kernel
    # leaves it out when alloc_dm is NULL); without MEMIC no DM handle can exist."""
    uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_DM, attrs_.ufile,
                                   uverbs_get_const(attrs_, MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE),
                                   UVERBS_LOOKUP_READ, attrs_)
    try:
        dm = uobj.object
        if dm.type != MLX5_IB_UAPI_DM_TYPE_MEMIC:
            raise KernelError(EOPNOTSUPP, f"mlx5_ib_dm_query: DM type {dm.type}")
        uverbs_copy_to(attrs_, MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX,
                       dm.mentry.start_pgoff & 0xFFFF, 2)
        uverbs_copy_to(attrs_, MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET,
                       dm.dev_addr & (PAGE_SIZE() - 1), 8)
        uverbs_copy_to(attrs_, MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH, dm.req_length, 8)
    finally:
        rdma_lookup_put_uobject(uobj, UVERBS_LOOKUP_READ)


#: ADD_UVERBS_METHODS(mlx5_ib_dm, UVERBS_OBJECT_DM, ..., MLX5_IB_METHOD_DM_QUERY)
mlx5_ib_dm_methods = {
    (UVERBS_OBJECT_DM_ID, MLX5_IB_METHOD_DM_QUERY): uverbs_api_ioctl_method(
        UVERBS_HANDLER_MLX5_IB_METHOD_DM_QUERY,
        mandatory=(MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE, MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET,
                   MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX, MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH)),
}

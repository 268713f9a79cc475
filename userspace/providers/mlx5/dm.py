"""Mirrors rdma-core providers/mlx5/verbs.c: device memory (mlx5_alloc_dm, mlx5_free_dm,
mlx5_memcpy_to_dm, mlx5_memcpy_from_dm, mlx5_reg_dm_mr, mlx5_import_dm,
mlx5_unimport_dm) - MEMIC only.

mlx5_alloc_dm: EINVAL for a comp_mask bit or a length above the context's
max_dm_size (ibv_query_device_ex's, kept at open), and for any failure of the
DM_ALLOC ioctl (libmlx5 reports EINVAL whatever the kernel said); the pages are
then mapped from the uverbs file at the DEVICE_MEM offset of the page index the
kernel returned (ENOMEM, and the DM freed again, if that fails).

The copies go through the mapping - loads and stores to the BAR's on-chip
memory - and return 0 or an errno, as the C functions do: EFAULT for a range
beyond the DM, EINVAL for an offset or a length that is not a multiple of 4.
# EMU: libmlx5 copies one relaxed 4-byte atomic at a time; here one store or load per
# call covers the range (the device decodes any width), which is what those copies
# amount to in the on-chip memory.
"""

from __future__ import annotations

import errno

import attrs

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_ioctl_cmds as c
from kernel_model.uapi.mlx5_abi import MLX5_IB_MMAP_DEVICE_MEM
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX,
    MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET,
    MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE,
    MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH,
    MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX,
    MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET,
    MLX5_IB_METHOD_DM_QUERY,
)
from userspace.libc import MAP_SHARED, PROT_READ, PROT_WRITE
from userspace.libibverbs.cmd import VerbsError, execute_ioctl
from userspace.libibverbs.verbs_types import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_MR_TYPE_MR,
    ibv_mr,
)
from userspace.providers.mlx5.errors import ProviderError

IBV_ACCESS_OPTIONAL_RANGE = 0x3FF00000
MLX5_DM_ALLOWED_ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                          | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
                          | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_OPTIONAL_RANGE)
MLX5_IB_MMAP_CMD_SHIFT = 8


@attrs.define(eq=False)
class mlx5_dm:
    """Mirrors struct mlx5_dm (with struct verbs_dm / ibv_dm): handle, mapping, length."""

    context: object
    handle: int
    length: int
    mmap_va: int = 0
    start_va: int = 0
    mmap_len: int = 0


@traced
def mlx5_alloc_dm(ctx, length: int, log_align_req: int, comp_mask: int = 0) -> mlx5_dm:
    """Mirrors mlx5_alloc_dm() -> _mlx5dv_alloc_dm() -> alloc_dm_memic()."""
    if comp_mask:
        raise ProviderError(errno.EINVAL, f"mlx5_alloc_dm: comp_mask {comp_mask:#x}")
    if length > ctx.max_dm_size:
        raise ProviderError(errno.EINVAL, f"mlx5_alloc_dm: length {length:#x} above "
                            f"max_dm_size {ctx.max_dm_size:#x}")
    page_size = ctx.page_size
    act_size = -(-length // page_size) * page_size
    try:
        out = execute_ioctl(ctx, c.UVERBS_OBJECT_DM, c.UVERBS_METHOD_DM_ALLOC, [
            (c.UVERBS_ATTR_ALLOC_DM_HANDLE, 0, "idr"),
            (c.UVERBS_ATTR_ALLOC_DM_LENGTH, length, "in8"),
            (c.UVERBS_ATTR_ALLOC_DM_ALIGNMENT, log_align_req, "in"),
            (MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET, 0, "out8"),
            (MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX, 0, "out4")], "ibv_cmd_alloc_dm")
    except VerbsError as e:
        raise ProviderError(errno.EINVAL, f"mlx5_alloc_dm: {e.strerror}") from None
    dm = mlx5_dm(ctx, out[c.UVERBS_ATTR_ALLOC_DM_HANDLE], length)
    va = dm_mmap(ctx, out[MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX] & 0xFFFF, act_size)
    if va < 0:
        _cmd_free_dm(dm)
        raise ProviderError(errno.ENOMEM, f"mlx5_alloc_dm: mmap failed ({-va})")
    dm.mmap_va, dm.mmap_len = va, act_size
    dm.start_va = va + (out[MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET] & (page_size - 1))
    return dm


def dm_mmap(ctx, page_idx: int, act_size: int) -> int:
    """Mirrors dm_mmap(): map the DM's pages from the command fd at the DEVICE_MEM
    offset of page_idx (set_command + set_extended_index); the address or -errno."""
    offset = ((page_idx >> 8) << 16) | (MLX5_IB_MMAP_DEVICE_MEM << MLX5_IB_MMAP_CMD_SHIFT) \
        | (page_idx & 0xFF)
    return ctx.proc.mmap(0, act_size, PROT_READ | PROT_WRITE, MAP_SHARED, ctx.cmd_fd,
                         ctx.page_size * offset)


@traced
def mlx5_import_dm(ctx, dm_handle: int) -> mlx5_dm:
    """Mirrors mlx5_import_dm(): MLX5_IB_METHOD_DM_QUERY for where the DM behind the
    handle is (the kernel's errors: ENOENT for a handle the fd's context does not hold,
    EINVAL for one of another type), then its pages mapped as mlx5_alloc_dm maps them
    (ENOMEM if that fails).  The copies then reach the same on-chip memory."""
    out = execute_ioctl(ctx, c.UVERBS_OBJECT_DM, MLX5_IB_METHOD_DM_QUERY, [
        (MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE, dm_handle, "in8"),
        (MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET, 0, "out8"),
        (MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX, 0, "out4"),
        (MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH, 0, "out8")], "mlx5_import_dm")
    length = out[MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH]
    act_size = -(-length // ctx.page_size) * ctx.page_size
    va = dm_mmap(ctx, out[MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX] & 0xFFFF, act_size)
    if va < 0:
        raise ProviderError(errno.ENOMEM, f"mlx5_import_dm: mmap failed ({-va})")
    dm = mlx5_dm(ctx, dm_handle, length, mmap_va=va, mmap_len=act_size)
    dm.start_va = va + (out[MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET] & (ctx.page_size - 1))
    return dm


@traced
def mlx5_unimport_dm(dm: mlx5_dm) -> None:
    """Mirrors mlx5_unimport_dm(): unmap the pages; the kernel's DM stays."""
    dm.context.proc.munmap(dm.mmap_va, dm.mmap_len)
    dm.mmap_va = dm.start_va = 0


def _cmd_free_dm(dm: mlx5_dm) -> None:
    """Mirrors ibv_cmd_free_dm(): UVERBS_METHOD_DM_FREE (a destroy: the object is gone
    on the kernel's side whatever it answers, but an error is returned)."""
    execute_ioctl(dm.context, c.UVERBS_OBJECT_DM, c.UVERBS_METHOD_DM_FREE,
                  [(c.UVERBS_ATTR_FREE_DM_HANDLE, dm.handle, "in8")], "ibv_cmd_free_dm")


@traced
def mlx5_free_dm(dm: mlx5_dm) -> None:
    """Mirrors mlx5_free_dm(): DM_FREE, then unmap (a failed free keeps the mapping)."""
    _cmd_free_dm(dm)
    dm.context.proc.munmap(dm.mmap_va, dm.mmap_len)
    dm.mmap_va = dm.start_va = 0


def _check(dm: mlx5_dm, offset: int, length: int) -> int:
    if offset < 0 or length < 0 or offset + length > dm.length:
        return errno.EFAULT
    if length & 3 or offset & 3:
        return errno.EINVAL
    return 0


@traced
def mlx5_memcpy_to_dm(dm: mlx5_dm, dm_offset: int, data: bytes, length: int) -> int:
    """Mirrors mlx5_memcpy_to_dm(): 0, EFAULT (beyond the DM) or EINVAL (not 4-aligned)."""
    rc = _check(dm, dm_offset, length)
    if rc == 0 and length:
        dm.context.proc.store(dm.start_va + dm_offset, bytes(data[:length]))
    return rc


@traced
def mlx5_memcpy_from_dm(dm: mlx5_dm, dm_offset: int, length: int) -> tuple[int, bytes]:
    """Mirrors mlx5_memcpy_from_dm(): (0, the bytes), or (EFAULT/EINVAL, b"")."""
    rc = _check(dm, dm_offset, length)
    if rc or not length:
        return rc, b""
    return 0, bytes(dm.context.proc.load(dm.start_va + dm_offset, length))


@traced
def mlx5_reg_dm_mr(pd, dm: mlx5_dm, dm_offset: int, length: int, access: int) -> ibv_mr:
    """Mirrors mlx5_reg_dm_mr() -> ibv_cmd_reg_dm_mr(): EINVAL for access bits a DM MR
    cannot have or without IBV_ACCESS_ZERO_BASED (before any ioctl), then
    UVERBS_METHOD_DM_MR_REG; the MR's addr is 0 (zero-based)."""
    if access & ~MLX5_DM_ALLOWED_ACCESS:
        raise ProviderError(errno.EINVAL, f"mlx5_reg_dm_mr: access {access:#x}")
    if not access & IBV_ACCESS_ZERO_BASED:
        raise ProviderError(errno.EINVAL, "ibv_cmd_reg_dm_mr: IBV_ACCESS_ZERO_BASED missing")
    out = execute_ioctl(pd.context, c.UVERBS_OBJECT_MR, c.UVERBS_METHOD_DM_MR_REG, [
        (c.UVERBS_ATTR_REG_DM_MR_HANDLE, 0, "idr"),
        (c.UVERBS_ATTR_REG_DM_MR_RESP_LKEY, 0, "out4"),
        (c.UVERBS_ATTR_REG_DM_MR_RESP_RKEY, 0, "out4"),
        (c.UVERBS_ATTR_REG_DM_MR_PD_HANDLE, pd.handle, "in"),
        (c.UVERBS_ATTR_REG_DM_MR_DM_HANDLE, dm.handle, "in"),
        (c.UVERBS_ATTR_REG_DM_MR_OFFSET, dm_offset, "in8"),
        (c.UVERBS_ATTR_REG_DM_MR_LENGTH, length, "in8"),
        (c.UVERBS_ATTR_REG_DM_MR_ACCESS_FLAGS, access, "in")], "ibv_cmd_reg_dm_mr")
    return ibv_mr(pd.context, pd, 0, length, out[c.UVERBS_ATTR_REG_DM_MR_HANDLE],
                  out[c.UVERBS_ATTR_REG_DM_MR_RESP_LKEY], out[c.UVERBS_ATTR_REG_DM_MR_RESP_RKEY],
                  IBV_MR_TYPE_MR)

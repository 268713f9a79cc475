"""Mirrors rdma-core providers/mlx5/buf.c (the parts a parent domain reaches) and the
custom-allocator half of dbrec.c: where libmlx5 gets the memory of a queue.

A QP, CQ or SRQ made on a parent domain whose init attr carried allocators
(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) asks the application for its buffer and for
its doorbell record: alloc(parent_domain, pd_context, size, alignment, resource_type)
returns an address in the process, 0 (NULL: the creation fails) or
IBV_ALLOCATOR_USE_DEFAULT (libmlx5 allocates as it would without the allocators).  A
buffer the application gave is never zeroed by the library, and goes back through
free(parent_domain, pd_context, ptr, resource_type) when the object is destroyed.

# EMU: of the other allocation types (MLX5_<prefix>_ALLOC_TYPE: huge pages,
# contiguous pages, mlx5dv's extern allocator, dma-buf heaps) only the anonymous one
# is modelled here; the default allocation is posix_memalign of the process.
"""

from __future__ import annotations

import errno
from typing import Any

from userspace.libc import free, posix_memalign
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_types import IBV_ALLOCATOR_USE_DEFAULT
from userspace.providers.mlx5.dbrec import mlx5_alloc_dbrec, mlx5_free_db

# enum mlx5_alloc_type (mlx5.h)
MLX5_ALLOC_TYPE_ANON, MLX5_ALLOC_TYPE_HUGE, MLX5_ALLOC_TYPE_CONTIG = 0, 1, 2
MLX5_ALLOC_TYPE_PREFER_HUGE, MLX5_ALLOC_TYPE_PREFER_CONTIG = 3, 4
MLX5_ALLOC_TYPE_EXTERNAL, MLX5_ALLOC_TYPE_CUSTOM, MLX5_ALLOC_TYPE_DMABUF = 5, 6, 7

# mlx5dv.h: the resource types a parent domain's allocator is asked for
RDMA_DRIVER_MLX5 = 1
MLX5DV_RES_TYPE_QP = RDMA_DRIVER_MLX5 << 32 | 1
MLX5DV_RES_TYPE_RWQ = RDMA_DRIVER_MLX5 << 32 | 2
MLX5DV_RES_TYPE_DBR = RDMA_DRIVER_MLX5 << 32 | 3
MLX5DV_RES_TYPE_SRQ = RDMA_DRIVER_MLX5 << 32 | 4
MLX5DV_RES_TYPE_CQ = RDMA_DRIVER_MLX5 << 32 | 5

_UINTPTR_MAX = (1 << 64) - 1


def to_mparent_domain(pd: Any) -> Any:
    """Mirrors to_mparent_domain(): the parent domain `pd` is, or None for a plain PD
    (a parent domain is the mlx5_pd whose mprotection_domain is set)."""
    if pd is not None and getattr(pd, "mprotection_domain", None) is not None:
        return pd
    return None


def mlx5_is_custom_alloc(pd: Any) -> bool:
    """Mirrors mlx5_is_custom_alloc(): a parent domain with both allocator callbacks."""
    mparent_domain = to_mparent_domain(pd)
    return bool(mparent_domain is not None and mparent_domain.alloc is not None
                and mparent_domain.free is not None)


def _call_alloc(mparent_domain: Any, size: int, alignment: int, resource_type: int) -> int:
    """The application's alloc callback; what it returns as a void * (0 if it is no
    address a pointer can hold)."""
    addr = mparent_domain.alloc(mparent_domain, mparent_domain.pd_context, size, alignment,
                                resource_type)
    if not isinstance(addr, int) or not 0 <= addr <= _UINTPTR_MAX:
        return 0
    return addr


def mlx5_alloc_buf_custom(pd: Any, size: int, alignment: int, resource_type: int) -> int | None:
    """Mirrors mlx5_alloc_buf_custom(): the parent domain's allocator for `size` bytes;
    None when it answers IBV_ALLOCATOR_USE_DEFAULT (the caller falls back), the address
    otherwise; NULL for a non-empty buffer fails (ENOMEM).

    # EMU: rdma-core leaves errno as the allocator left it; here it is ENOMEM."""
    addr = _call_alloc(to_mparent_domain(pd), size, alignment, resource_type)
    if addr == IBV_ALLOCATOR_USE_DEFAULT:
        return None
    if addr or size == 0:
        return addr
    raise VerbsError(errno.ENOMEM, f"mlx5_alloc_buf_custom: the allocator returned NULL "
                     f"for {size} bytes of resource type {resource_type:#x}")


def mlx5_alloc_prefered_buf(ctx: Any, pd: Any, size: int, resource_type: int,
                            req_alignment: int | None = None) -> tuple[int, int]:
    """Mirrors mlx5_get_alloc_type() + mlx5_alloc_prefered_buf(): a parent domain's
    allocator first (aligned to req_alignment, a page by default), the anonymous
    allocation when there is none or it asks for the default.  Returns (address,
    MLX5_ALLOC_TYPE_CUSTOM or MLX5_ALLOC_TYPE_ANON)."""
    if mlx5_is_custom_alloc(pd):
        alignment = ctx.page_size if req_alignment is None else req_alignment
        addr = mlx5_alloc_buf_custom(pd, size, alignment, resource_type)
        if addr is not None:
            return addr, MLX5_ALLOC_TYPE_CUSTOM
    return posix_memalign(ctx.proc, ctx.page_size, size), MLX5_ALLOC_TYPE_ANON


def mlx5_free_actual_buf(ctx: Any, pd: Any, addr: int, size: int, buf_type: int,
                         resource_type: int) -> None:
    """Mirrors mlx5_free_actual_buf(): a custom buffer goes back to the parent domain's
    free callback (mlx5_free_buf_custom), an anonymous one to the process."""
    if buf_type == MLX5_ALLOC_TYPE_CUSTOM:
        mparent_domain = to_mparent_domain(pd)
        mparent_domain.free(mparent_domain, mparent_domain.pd_context, addr, resource_type)
        return
    free(ctx.proc, addr, size)


def mlx5_alloc_dbrec_pd(ctx: Any, pd: Any) -> tuple[int, bool]:
    """Mirrors mlx5_alloc_dbrec(context, pd, &custom_alloc): on a parent domain with
    allocators, 8 bytes aligned to 8 of type MLX5DV_RES_TYPE_DBR from the application
    (ENOMEM for NULL; IBV_ALLOCATOR_USE_DEFAULT falls back); else a record of the
    library's doorbell pages (dbrec.py).  Returns (address, custom_alloc)."""
    if mlx5_is_custom_alloc(pd):
        db = _call_alloc(to_mparent_domain(pd), 8, 8, MLX5DV_RES_TYPE_DBR)
        if db != IBV_ALLOCATOR_USE_DEFAULT:
            if not db:
                raise VerbsError(errno.ENOMEM, "mlx5_alloc_dbrec: the allocator returned NULL")
            return db, True
    return mlx5_alloc_dbrec(ctx), False


def mlx5_free_db_pd(ctx: Any, db: int, pd: Any, custom_alloc: bool) -> None:
    """Mirrors mlx5_free_db(context, db, pd, custom_alloc): a record the application
    gave goes back to its free callback, any other to the doorbell pages."""
    if custom_alloc:
        mparent_domain = to_mparent_domain(pd)
        mparent_domain.free(mparent_domain, mparent_domain.pd_context, db,
                            MLX5DV_RES_TYPE_DBR)
        return
    mlx5_free_db(ctx, db)

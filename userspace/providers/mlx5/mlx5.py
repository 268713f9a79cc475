"""Mirrors rdma-core providers/mlx5/mlx5.c: the mlx5 context (open and close).

mlx5_alloc_context() is what ibv_open_device() runs for an mlx5 device:

  1. read MLX5_TOTAL_UUARS / MLX5_NUM_LOW_LAT_UUARS (env.get_uar_info);
  2. GET_CONTEXT with mlx5_ib_alloc_ucontext_req_v2 (the bfreg counts,
     max_cqe_version 1, lib_caps 4K_UAR | DYN_UAR, the DEVX flag - retried
     without DEVX if the kernel refuses it);
  3. mlx5_set_context(): copy the response's limits; a kernel that answered
     tot_bfregs != 0 has static UARs ("legacy"): map every static UAR page
     (mmap of the uverbs fd, vm_pgoff = command << 8 | index) and build bfs[];
     a kernel that answered 0 hands out UARs per QP later (dynamic mode);
  4. try the singleton non-cached UAR object for CQ doorbells (a legacy
     kernel has none: CQs then ring through uar[0]).

mlx5_free_context() unmaps what was mapped and frees the dynamic UARs.
"""

from __future__ import annotations

import errno
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_ALLOC_UCTX_DEVX,
    MLX5_LIB_CAP_4K_UAR,
    MLX5_LIB_CAP_DYN_UAR,
    mlx5_ib_alloc_ucontext_req_v2,
    mlx5_ib_alloc_ucontext_resp,
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
from userspace.libc import MAP_SHARED, PROT_WRITE, SysError, free, posix_memalign
from userspace.libibverbs.cmd import (
    VerbsError,
    execute_ioctl,
    ibv_cmd_get_context,
    ibv_cmd_query_device_any,
)
from userspace.libibverbs.verbs_types import ibv_context
from userspace.providers.mlx5 import env as mlx5_env
from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5dv import MLX5_CTX_FLAGS_NO_KERN_DYN_UAR
from userspace.providers.mlx5.uar import (
    adjust_uar_info,
    build_legacy_bfs,
    clean_dyn_uars,
    mlx5_bf,
    mlx5_map_legacy_uars,
    mlx5_set_singleton_nc_uar,
    mlx5_uar_info,
)

MLX5_VENDOR_ID = 0x15B3  # Mellanox: the hca_table of the mlx5 provider


@attrs.define(eq=False)
class mlx5_context(ibv_context):
    """Mirrors struct mlx5_context: the verbs context plus what libmlx5 keeps."""

    page_size: int = 4096
    tot_uuars: int = 0
    low_lat_uuars: int = 0
    single_threaded: bool = False
    shut_up_bf: bool = False
    prefer_bf: bool = True      # MLX5_POST_SEND_PREFER_BF
    flags: int = 0
    # from the alloc_ucontext response
    bf_reg_size: int = 0
    cache_line_size: int = 64
    max_sq_desc_sz: int = 0
    max_rq_desc_sz: int = 0
    max_send_wqebb: int = 0
    max_recv_wr: int = 0
    max_srq_recv_wr: int = 0
    num_ports: int = 0
    cqe_version: int = 0
    num_uars_per_page: int = 1
    uar_size: int = 4096
    num_dyn_bfregs: int = 0
    resp: Any = None
    atomic_cap: int = 0         # ibv_device_attr.atomic_cap (mlx5_query_device_ctx)
    max_dm_size: int = 0        # ibv_device_attr_ex.max_dm_size (mlx5_query_device_ctx)
    # UARs
    uar: list[mlx5_uar_info] = attrs.Factory(list)
    bfs: list[mlx5_bf] = attrs.Factory(list)
    nc_uar: mlx5_bf | None = None
    cq_uar_reg: int = 0
    dyn_uar_bf_list: list[mlx5_bf] = attrs.Factory(list)
    dyn_uar_qp_shared_list: list[mlx5_bf] = attrs.Factory(list)
    dyn_uar_qp_dedicated_list: list[mlx5_bf] = attrs.Factory(list)
    qp_max_dedicated_uuars: int = 0
    qp_alloc_dedicated_uuars: int = 0
    qp_max_shared_uuars: int = 0
    qp_alloc_shared_uuars: int = 0
    # doorbell records (dbrec.py)
    dbr_available_pages: list = attrs.Factory(list)
    dbr_map: dict = attrs.Factory(dict)
    # user indexes of QPs (cqe_version 1)
    uidx_table: dict[int, Any] = attrs.Factory(dict)  # user index -> mlx5_qp (cqe v1)
    # UAR objects: mapped address -> uverbs handle
    uar_obj_handles: dict[int, int] = attrs.Factory(dict)

    # -- the I/O the pure modules call back into ---------------------------------
    def mmap_page(self, offset: int) -> int:
        """mmap one UAR page of the uverbs file at `offset` (MAP_SHARED, PROT_WRITE)."""
        addr = self.proc.mmap(0, self.page_size, PROT_WRITE, MAP_SHARED, self.cmd_fd, offset)
        if addr < 0:
            raise SysError(-addr, f"mmap of UAR offset {offset:#x}")
        return addr

    def munmap_page(self, addr: int) -> None:
        self.proc.munmap(addr, self.page_size)

    def dbr_alloc_page(self) -> int:
        return posix_memalign(self.proc, self.page_size, self.page_size)

    def dbr_free_page(self, addr: int) -> None:
        free(self.proc, addr, self.page_size)

    def alloc_uar_obj(self, kind: int) -> tuple[int, int, int]:
        """mlx5dv_devx_alloc_uar(): MLX5_IB_METHOD_UAR_OBJ_ALLOC, then mmap the page.

        A mmap failure destroys the object again.
        """
        out = execute_ioctl(self, MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_ALLOC, [
            (MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, 0, "idr"),
            (MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, kind, "in"),
            (MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, 0, "out8"),
            (MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH, 0, "out4"),
            (MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, 0, "out4")], "mlx5dv_devx_alloc_uar")
        handle = out[MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE]
        offset = out[MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET]
        try:
            addr = self.mmap_page(offset)
        except OSError:
            self._destroy_uar_obj(handle)
            raise
        self.uar_obj_handles[addr] = handle
        return addr, out[MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID], offset

    def _destroy_uar_obj(self, handle: int) -> None:
        execute_ioctl(self, MLX5_IB_OBJECT_UAR, MLX5_IB_METHOD_UAR_OBJ_DESTROY,
                      [(MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, handle, "idr")],
                      "mlx5dv_devx_free_uar")

    def free_uar_obj(self, bf: mlx5_bf) -> None:
        """mlx5dv_devx_free_uar(): munmap, then MLX5_IB_METHOD_UAR_OBJ_DESTROY.  Void, as
        in rdma-core: a destroy that fails (the program closed the command fd under the
        library) is ignored, and the object is forgotten either way."""
        self.munmap_page(bf.uar)
        handle = self.uar_obj_handles.pop(bf.uar, None)
        if handle is None:
            return
        try:
            self._destroy_uar_obj(handle)
        except OSError:
            pass


@traced
def mlx5_cmd_get_context(ctx: mlx5_context, req: mlx5_ib_alloc_ucontext_req_v2):
    """Mirrors mlx5_cmd_get_context(): GET_CONTEXT (ibv_cmd_get_context), with
    DEVX first, then once without it for a kernel that refuses DEVX."""
    try:
        return ibv_cmd_get_context(ctx, req, mlx5_ib_alloc_ucontext_resp)
    except VerbsError:
        if not req.flags & MLX5_IB_ALLOC_UCTX_DEVX:
            raise
        req.flags &= ~MLX5_IB_ALLOC_UCTX_DEVX
        return ibv_cmd_get_context(ctx, req, mlx5_ib_alloc_ucontext_resp)


@traced
def mlx5_alloc_context(base: ibv_context) -> mlx5_context:
    """Mirrors mlx5_alloc_context() (see the module docstring)."""
    proc = base.proc
    ctx = mlx5_context(base.device, proc, base.cmd_fd, base.ops, base.cmd_buf,
                       page_size=proc.machine.page_size)  # sysconf(_SC_PAGESIZE)
    environ = proc.environ
    ctx.tot_uuars, ctx.low_lat_uuars = mlx5_env.get_uar_info(environ, ctx.page_size)
    ctx.single_threaded = mlx5_env.single_threaded_app(environ)
    ctx.shut_up_bf = mlx5_env.get_shut_up_bf(environ)
    ctx.prefer_bf = mlx5_env.get_always_bf(environ)
    req = mlx5_ib_alloc_ucontext_req_v2(
        total_num_bfregs=ctx.tot_uuars, num_low_latency_bfregs=ctx.low_lat_uuars,
        max_cqe_version=1, lib_caps=MLX5_LIB_CAP_4K_UAR | MLX5_LIB_CAP_DYN_UAR,
        flags=MLX5_IB_ALLOC_UCTX_DEVX)
    core, resp = mlx5_cmd_get_context(ctx, req)
    ctx.async_fd, ctx.num_comp_vectors = core.async_fd, core.num_comp_vectors
    try:
        mlx5_set_context(ctx, resp)
    except BaseException:
        proc.close(ctx.async_fd)
        raise
    mlx5_query_device_ctx(ctx)
    return ctx


@traced
def mlx5_query_device_ctx(ctx: mlx5_context) -> None:
    """Mirrors mlx5_query_device_ctx(): QUERY_DEVICE once at open, keeping what the
    data path needs - atomic_cap (a QP may post atomics only on a device that has
    them).  Void: a failure leaves the defaults."""
    try:
        attr = ibv_cmd_query_device_any(ctx)
    except OSError:
        return
    ctx.atomic_cap = attr.orig_attr.atomic_cap
    ctx.max_dm_size = attr.max_dm_size


@traced
def mlx5_set_context(ctx: mlx5_context, resp: mlx5_ib_alloc_ucontext_resp) -> None:
    """Mirrors mlx5_set_context(): limits, UAR mapping (legacy), singleton NC UAR."""
    ctx.resp = resp
    for name in ("bf_reg_size", "cache_line_size", "max_sq_desc_sz", "max_rq_desc_sz",
                 "max_send_wqebb", "max_recv_wr", "max_srq_recv_wr", "num_ports",
                 "cqe_version", "num_dyn_bfregs"):
        setattr(ctx, name, getattr(resp, name))
    ctx.uar_size, ctx.num_uars_per_page = adjust_uar_info(ctx.page_size, resp)
    if resp.tot_bfregs:  # a kernel without dynamic UARs: map the static ones now
        ctx.tot_uuars = resp.tot_bfregs
        ctx.flags |= MLX5_CTX_FLAGS_NO_KERN_DYN_UAR
        ctx.uar = mlx5_map_legacy_uars(resp, ctx.page_size, ctx.shut_up_bf, ctx.mmap_page,
                                       ctx.munmap_page)
        ctx.bfs = build_legacy_bfs(resp, ctx.uar, low_lat_uuars=ctx.low_lat_uuars,
                                   page_size=ctx.page_size,
                                   single_threaded=ctx.single_threaded)
    else:
        ctx.qp_max_dedicated_uuars = ctx.low_lat_uuars
        ctx.qp_max_shared_uuars = ctx.tot_uuars - ctx.low_lat_uuars
    mlx5_set_singleton_nc_uar(ctx)  # a failure leaves nc_uar None
    if ctx.nc_uar is None and not ctx.uar:  # dynamic mode has nothing else for CQs
        raise ProviderError(errno.EOPNOTSUPP, "mlx5_set_context: no NC UAR in dynamic mode")
    ctx.cq_uar_reg = ctx.nc_uar.uar if ctx.nc_uar is not None else ctx.uar[0].reg


@traced
def mlx5_free_context(ctx: mlx5_context) -> None:
    """Mirrors mlx5_free_context(): unmap the static UARs, free the dynamic ones."""
    for u in ctx.uar:
        ctx.munmap_page(u.reg)
    ctx.uar.clear()
    clean_dyn_uars(ctx)

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

mlx5_import_context() is what ibv_import_device() runs on a command fd that already
has a context: no GET_CONTEXT - UVERBS_METHOD_QUERY_CONTEXT returns that context's
alloc_ucontext response, and step 3 follows (EINVAL for a context with static UARs).
"""

from __future__ import annotations

import errno
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET,
    MLX5_IB_ALLOC_UCTX_DEVX,
    MLX5_IB_CLOCK_INFO_V1,
    MLX5_LIB_CAP_4K_UAR,
    MLX5_LIB_CAP_DYN_UAR,
    mlx5_ib_alloc_ucontext_req_v2,
    mlx5_ib_alloc_ucontext_resp,
)
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX,
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
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
)
from userspace.libibverbs.verbs_types import ibv_context
from userspace.providers.mlx5 import env as mlx5_env
from userspace.providers.mlx5.clock import (
    mlx5_map_clock_info,
    mlx5_map_internal_clock,
    mlx5_unmap_clocks,
)
from userspace.providers.mlx5.devx import get_hca_general_caps
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
    # what get_hca_general_caps learns through a DevX general command (devx.py)
    max_dc_rd_atom: int = 0
    max_dc_init_rd_atom: int = 0
    num_lag_ports: int = 0
    lag_tx_port_affinity: int = 0
    general_obj_types_caps: int = 0
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
    # the clocks (clock.py): core_clock.offset, the mapped timer and clock-info page
    core_clock_offset: int = 0
    hca_core_clock: int = 0
    clock_info_page: int = 0

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
def mlx5_cmd_get_context(ctx: mlx5_context, req: mlx5_ib_alloc_ucontext_req_v2,
                         always_devx: bool = True):
    """Mirrors mlx5_cmd_get_context(): GET_CONTEXT (ibv_cmd_get_context), with
    DEVX first, then once without it for a kernel that refuses DEVX - unless the
    caller insists on DEVX (mlx5_alloc_context's retry_open with always_devx false)."""
    try:
        return ibv_cmd_get_context(ctx, req, mlx5_ib_alloc_ucontext_resp)
    except VerbsError:
        if not req.flags & MLX5_IB_ALLOC_UCTX_DEVX or not always_devx:
            raise
        req.flags &= ~MLX5_IB_ALLOC_UCTX_DEVX
        return ibv_cmd_get_context(ctx, req, mlx5_ib_alloc_ucontext_resp)


def mlx5_init_context(base: ibv_context) -> mlx5_context:
    """Mirrors mlx5_init_context(): the provider's context on the command fd, with what
    the environment says (MLX5_TOTAL_UUARS, MLX5_SINGLE_THREADED, MLX5_SHUT_UP_BF...)."""
    proc = base.proc
    ctx = mlx5_context(base.device, proc, base.cmd_fd, base.ops, base.cmd_buf,
                       page_size=proc.machine.page_size)  # sysconf(_SC_PAGESIZE)
    environ = proc.environ
    ctx.tot_uuars, ctx.low_lat_uuars = mlx5_env.get_uar_info(environ, ctx.page_size)
    ctx.single_threaded = mlx5_env.single_threaded_app(environ)
    ctx.shut_up_bf = mlx5_env.get_shut_up_bf(environ)
    ctx.prefer_bf = mlx5_env.get_always_bf(environ)
    return ctx


@traced
def mlx5_alloc_context(base: ibv_context, ctx_attr: Any = None) -> mlx5_context:
    """Mirrors mlx5_alloc_context() (see the module docstring).  ctx_attr is the
    mlx5dv_context_attr of mlx5dv_open_device (the private data of verbs_open_device):
    with MLX5DV_CONTEXT_FLAGS_DEVX the open insists on DEVX (no retry without it)."""
    proc = base.proc
    ctx = mlx5_init_context(base)
    req = mlx5_ib_alloc_ucontext_req_v2(
        total_num_bfregs=ctx.tot_uuars, num_low_latency_bfregs=ctx.low_lat_uuars,
        max_cqe_version=1, lib_caps=MLX5_LIB_CAP_4K_UAR | MLX5_LIB_CAP_DYN_UAR,
        flags=MLX5_IB_ALLOC_UCTX_DEVX)
    core, resp = mlx5_cmd_get_context(ctx, req, always_devx=not (ctx_attr and ctx_attr.flags))
    ctx.async_fd, ctx.num_comp_vectors = core.async_fd, core.num_comp_vectors
    try:
        mlx5_set_context(ctx, resp)
    except BaseException:
        proc.close(ctx.async_fd)
        raise
    mlx5_query_device_ctx(ctx)
    return ctx


@traced
def mlx5_import_context(base: ibv_context) -> mlx5_context:
    """Mirrors mlx5_import_context(): mlx5_init_context, then UVERBS_METHOD_QUERY_CONTEXT
    with MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX - the alloc_ucontext response of the
    context the command fd already has - and mlx5_set_context in import mode: EINVAL
    when that context has static UARs (tot_bfregs != 0; a kernel without dynamic UARs),
    which a second library instance cannot take over.  No GET_CONTEXT: the kernel's
    ucontext is the one the fd has."""
    ctx = mlx5_init_context(base)
    proc, size = ctx.proc, mlx5_ib_alloc_ucontext_resp.SIZE
    buf = posix_memalign(proc, 8, size)
    try:
        ibv_cmd_query_context(ctx, [(MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX, (buf, size),
                                     "ptr_out")])
        resp = mlx5_ib_alloc_ucontext_resp.unpack(proc.load(buf, size))
    finally:
        free(proc, buf, size)
    if resp.tot_bfregs:
        raise ProviderError(errno.EINVAL, "mlx5_set_context: an imported context with "
                            f"{resp.tot_bfregs} static bfregs")
    mlx5_set_context(ctx, resp)
    mlx5_query_device_ctx(ctx)
    return ctx


@traced
def mlx5_query_device_ctx(ctx: mlx5_context) -> None:
    """Mirrors mlx5_query_device_ctx(): QUERY_DEVICE once at open, keeping what the
    data path needs - atomic_cap (a QP may post atomics only on a device that has
    them) - after get_hca_general_caps (a DevX QUERY_HCA_CAP).  Void: a failure leaves
    the defaults."""
    get_hca_general_caps(ctx)
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
    if resp.comp_mask & MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET:
        ctx.core_clock_offset = resp.hca_core_clock_offset
        mlx5_map_internal_clock(ctx)
    ctx.clock_info_page = 0
    if resp.clock_info_versions & (1 << MLX5_IB_CLOCK_INFO_V1):
        mlx5_map_clock_info(ctx)
    mlx5_set_singleton_nc_uar(ctx)  # a failure leaves nc_uar None
    if ctx.nc_uar is None and not ctx.uar:  # dynamic mode has nothing else for CQs
        raise ProviderError(errno.EOPNOTSUPP, "mlx5_set_context: no NC UAR in dynamic mode")
    ctx.cq_uar_reg = ctx.nc_uar.uar if ctx.nc_uar is not None else ctx.uar[0].reg


@traced
def mlx5_free_context(ctx: mlx5_context) -> None:
    """Mirrors mlx5_free_context(): unmap the static UARs, free the dynamic ones, unmap
    the clock pages."""
    mlx5_unmap_clocks(ctx)
    for u in ctx.uar:
        ctx.munmap_page(u.reg)
    ctx.uar.clear()
    clean_dyn_uars(ctx)

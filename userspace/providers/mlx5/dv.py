"""Mirrors the mlx5 direct-verbs entry points of rdma-core providers/mlx5 (mlx5.c, verbs.c):
mlx5dv_open_device, mlx5dv_query_device, mlx5dv_devx_alloc_uar / mlx5dv_devx_free_uar and
the mlx5dv_* calls that need what the emulated HCA lacks.

* mlx5dv_open_device(): verbs_open_device() with a struct mlx5dv_context_attr as the
  provider's private data.  mlx5_alloc_context() refuses flags other than
  MLX5DV_CONTEXT_FLAGS_DEVX with EINVAL; without flags it asks for DEVX and retries
  without it (what ibv_open_device does), with the flag it insists on DEVX.
* mlx5dv_query_device(): the mlx5dv_context answered from what the context keeps
  (the alloc_ucontext response); each comp_mask bit the caller asked for is answered
  as _mlx5dv_query_device does, including the ones whose caps are zero here because
  they come from ibv_query_device_ex's mlx5 driver response or from DevX queries.
* mlx5dv_devx_alloc_uar(): flags MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC hands out the
  context's singleton NC UAR (freeing it does nothing); flags 0 (BF) pops a register
  of the dedicated-UAR list, allocating one more UAR object (MLX5_IB_METHOD_UAR_OBJ_ALLOC
  and the mmap) when the list is empty; freeing gives the register back to the list,
  and the UAR itself goes at context close (clean_dyn_uars).  Any other flag is
  EOPNOTSUPP.
"""

from __future__ import annotations

import errno
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.ib_user_ioctl_cmds import UVERBS_OBJECT_DEVICE
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS,
    mlx5_ib_clock_info,
)
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_QUERY_PORT,
    MLX5_IB_ATTR_QUERY_PORT_PORT_NUM,
    MLX5_IB_METHOD_QUERY_PORT,
    mlx5_ib_uapi_query_port,
)
from userspace.libc import free, posix_memalign
from userspace.libibverbs.cmd import VerbsError, execute_ioctl
from userspace.libibverbs.verbs import ibv_open_device
from userspace.providers.mlx5.clock import (  # noqa: F401 - mlx5dv.h
    _mlx5dv_get_clock_info,
    mlx5dv_clock_info,
    mlx5dv_ts_to_ns,
)
from userspace.providers.mlx5.devx import _mlx5dv_devx_general_cmd
from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5 import mlx5_context
from userspace.providers.mlx5.uar import (
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
    mlx5_alloc_dyn_uar,
    mlx5_bf,
    mlx5_insert_dyn_uuars,
)
from userspace.providers.mlx5.verbs import mlx5_create_qp_ex, mlx5_ctx_ops

# mlx5dv.h: enum mlx5dv_context_attr_flags
MLX5DV_CONTEXT_FLAGS_DEVX = 1 << 0
# mlx5dv.h: enum mlx5dv_context_flags
MLX5DV_CONTEXT_FLAGS_CQE_V1 = 1 << 0
MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS = 1 << 7
# mlx5dv.h: enum mlx5dv_context_comp_mask
MLX5DV_CONTEXT_MASK_CQE_COMPRESION = 1 << 0
MLX5DV_CONTEXT_MASK_SWP = 1 << 1
MLX5DV_CONTEXT_MASK_STRIDING_RQ = 1 << 2
MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS = 1 << 3
MLX5DV_CONTEXT_MASK_DYN_BFREGS = 1 << 4
MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE = 1 << 5
MLX5DV_CONTEXT_MASK_FLOW_ACTION_FLAGS = 1 << 6
MLX5DV_CONTEXT_MASK_DC_ODP_CAPS = 1 << 7
MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK = 1 << 8
MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS = 1 << 9
MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD = 1 << 10
MLX5DV_CONTEXT_MASK_DCI_STREAMS = 1 << 11
MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH = 1 << 12
MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD = 1 << 13
MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM = 1 << 14
# the masks answered unconditionally (the value may be zero)
_ALWAYS_ANSWERED = (MLX5DV_CONTEXT_MASK_CQE_COMPRESION | MLX5DV_CONTEXT_MASK_SWP
                    | MLX5DV_CONTEXT_MASK_STRIDING_RQ | MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS
                    | MLX5DV_CONTEXT_MASK_DCI_STREAMS | MLX5DV_CONTEXT_MASK_DYN_BFREGS
                    | MLX5DV_CONTEXT_MASK_FLOW_ACTION_FLAGS | MLX5DV_CONTEXT_MASK_DC_ODP_CAPS
                    | MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD
                    | MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH
                    | MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD
                    | MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM)


@attrs.define
class mlx5dv_context_attr:
    """Mirrors struct mlx5dv_context_attr."""

    flags: int = 0
    comp_mask: int = 0


@attrs.define
class mlx5dv_cqe_comp_caps:
    max_num: int = 0
    supported_format: int = 0


@attrs.define
class mlx5dv_sw_parsing_caps:
    sw_parsing_offloads: int = 0
    supported_qpts: int = 0


@attrs.define
class mlx5dv_striding_rq_caps:
    min_single_stride_log_num_of_bytes: int = 0
    max_single_stride_log_num_of_bytes: int = 0
    min_single_wqe_log_num_of_strides: int = 0
    max_single_wqe_log_num_of_strides: int = 0
    supported_qpts: int = 0


@attrs.define
class mlx5dv_dci_streams_caps:
    max_log_num_concurent: int = 0
    max_log_num_errored: int = 0


@attrs.define
class mlx5dv_context:
    """Mirrors struct mlx5dv_context (what mlx5dv_query_device fills)."""

    version: int = 0
    flags: int = 0
    comp_mask: int = 0
    cqe_comp_caps: mlx5dv_cqe_comp_caps = attrs.Factory(mlx5dv_cqe_comp_caps)
    sw_parsing_caps: mlx5dv_sw_parsing_caps = attrs.Factory(mlx5dv_sw_parsing_caps)
    striding_rq_caps: mlx5dv_striding_rq_caps = attrs.Factory(mlx5dv_striding_rq_caps)
    tunnel_offloads_caps: int = 0
    max_dynamic_bfregs: int = 0
    max_clock_info_update_nsec: int = 0
    flow_action_flags: int = 0
    dc_odp_caps: int = 0
    hca_core_clock: int = 0
    num_lag_ports: int = 0
    sig_caps: int = 0
    dci_streams_caps: mlx5dv_dci_streams_caps = attrs.Factory(mlx5dv_dci_streams_caps)
    max_wr_memcpy_length: int = 0
    crypto_caps: int = 0
    # what get_hca_general_caps learnt (QUERY_HCA_CAP through a DevX general command);
    # 0 for a context without DevX
    max_dc_rd_atom: int = 0
    max_dc_init_rd_atom: int = 0


@attrs.define(eq=False)
class mlx5dv_devx_uar:
    """Mirrors struct mlx5dv_devx_uar (inside struct mlx5_devx_uar, inside mlx5_bf)."""

    reg_addr: int
    base_addr: int
    page_id: int
    mmap_off: int
    comp_mask: int
    context: mlx5_context
    bf: mlx5_bf
    singleton: bool = False


def mlx5dv_is_supported(device: Any) -> bool:
    """Mirrors mlx5dv_is_supported(): is the device driven by the mlx5 provider."""
    return device.ops is mlx5_ctx_ops  # is_mlx5_dev(): the device's ops are mlx5's


def _check_mlx5(ctx: Any, fn: str) -> mlx5_context:
    if not isinstance(ctx, mlx5_context):  # mlx5_get_dv_ops() is NULL: not an mlx5 context
        raise ProviderError(errno.EOPNOTSUPP, f"{fn}: not an mlx5 context")
    return ctx


@traced
def mlx5dv_open_device(proc: Any, device: Any, attr: mlx5dv_context_attr) -> mlx5_context:
    """Mirrors mlx5dv_open_device(): EOPNOTSUPP for a non-mlx5 device, then
    verbs_open_device() with attr for mlx5_alloc_context() (the checks here are
    the ones it makes on its private data before GET_CONTEXT).

    EINVAL for a flag other than MLX5DV_CONTEXT_FLAGS_DEVX.
    """
    if not mlx5dv_is_supported(device):
        raise ProviderError(errno.EOPNOTSUPP, "mlx5dv_open_device: not an mlx5 device")
    if attr.flags & ~MLX5DV_CONTEXT_FLAGS_DEVX:
        raise ProviderError(errno.EINVAL, f"mlx5_alloc_context: flags {attr.flags:#x}")
    return ibv_open_device(proc, device, attr)


@traced
def mlx5dv_query_device(ctx: Any, attrs_out: mlx5dv_context) -> int:
    """Mirrors mlx5dv_query_device() / _mlx5dv_query_device(): 0, or EOPNOTSUPP for a
    context that is not mlx5's.  attrs_out.comp_mask names what to answer and is
    replaced by what was answered."""
    if not isinstance(ctx, mlx5_context):
        return errno.EOPNOTSUPP
    asked = attrs_out.comp_mask
    attrs_out.version = 0
    attrs_out.flags = 0
    if ctx.cqe_version == 1:
        attrs_out.flags |= MLX5DV_CONTEXT_FLAGS_CQE_V1
    # MPW / 128B CQE / packet-based credit flags (and the CQE compression, SW parsing,
    # striding RQ, tunnel offload caps) come from the mlx5 driver part of the
    # ibv_query_device_ex response (struct mlx5_ib_query_device_resp), which the
    # emulated stack does not exchange (see mlx5_query_device_ex): they stay 0
    resp = ctx.resp
    if resp is not None and resp.comp_mask & MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS:
        attrs_out.flags |= MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS
    out = asked & _ALWAYS_ANSWERED
    if asked & MLX5DV_CONTEXT_MASK_DYN_BFREGS:
        attrs_out.max_dynamic_bfregs = ctx.num_dyn_bfregs
    if asked & MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM:
        attrs_out.max_dc_rd_atom = ctx.max_dc_rd_atom
        attrs_out.max_dc_init_rd_atom = ctx.max_dc_init_rd_atom
    if asked & MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS and ctx.num_lag_ports:
        attrs_out.num_lag_ports = ctx.num_lag_ports
        out |= MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS
    # CLOCK_INFO_UPDATE, HCA_CORE_CLOCK: answered only when the context mapped the
    # clock-info page / the core clock (hca_core_clock: the mapped timer's address)
    if asked & MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE and ctx.clock_info_page:
        attrs_out.max_clock_info_update_nsec = mlx5_ib_clock_info.unpack(
            ctx.proc.load(ctx.clock_info_page, mlx5_ib_clock_info.SIZE)).overflow_period
        out |= MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE
    if asked & MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK and ctx.hca_core_clock:
        attrs_out.hca_core_clock = ctx.hca_core_clock
        out |= MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK
    attrs_out.comp_mask = out
    return 0


@traced
def mlx5dv_get_clock_info(ctx: Any, clock_info: mlx5dv_clock_info) -> int:
    """Mirrors mlx5dv_get_clock_info(): EOPNOTSUPP for a context that is not mlx5's,
    else _mlx5dv_get_clock_info (EINVAL without the clock-info page, EBUSY)."""
    if not isinstance(ctx, mlx5_context):
        return errno.EOPNOTSUPP
    return _mlx5dv_get_clock_info(ctx, clock_info)


def mlx5dv_devx_general_cmd(ctx: Any, in_: int, inlen: int, out: int, outlen: int) -> int:
    """Mirrors mlx5dv_devx_general_cmd(): EOPNOTSUPP without the mlx5 dv ops (not an
    mlx5 context), else the provider's general command (devx.py); 0 or the errno."""
    if not isinstance(ctx, mlx5_context):
        return errno.EOPNOTSUPP
    return _mlx5dv_devx_general_cmd(ctx, in_, inlen, out, outlen)


@traced
def mlx5dv_devx_alloc_uar(ctx: Any, flags: int) -> mlx5dv_devx_uar:
    """Mirrors mlx5dv_devx_alloc_uar() / _mlx5dv_devx_alloc_uar() (see the module
    docstring).  EOPNOTSUPP for an unknown flag, for NC without the singleton NC UAR,
    and whatever the UAR object allocation fails with."""
    mctx = _check_mlx5(ctx, "mlx5dv_devx_alloc_uar")
    if flags & ~MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC:
        raise ProviderError(errno.EOPNOTSUPP, f"mlx5dv_devx_alloc_uar: flags {flags:#x}")
    if flags & MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC:
        bf = mlx5_get_singleton_nc_uar(mctx)
        return mlx5dv_devx_uar(bf.reg, bf.uar, bf.page_id, bf.uar_mmap_offset, 0, mctx, bf,
                               singleton=True)
    bf = mlx5_attach_dedicated_uar(mctx, flags)
    # a dynamic UAR knows its page id; a legacy one would ask the kernel
    # (MLX5_IB_METHOD_DEVX_QUERY_UAR), but legacy contexts cannot allocate one here
    return mlx5dv_devx_uar(bf.reg, bf.uar, bf.page_id, bf.uar_mmap_offset, 0, mctx, bf)


@traced
def mlx5dv_devx_free_uar(uar: mlx5dv_devx_uar) -> None:
    """Mirrors mlx5dv_devx_free_uar(): nothing for the singleton; a dedicated register
    goes back to the context's list (mlx5_detach_dedicated_uar)."""
    if uar.singleton:
        return
    mlx5_detach_dedicated_uar(uar.context, uar.bf)


def mlx5_get_singleton_nc_uar(ctx: mlx5_context) -> mlx5_bf:
    """Mirrors mlx5_get_singleton_nc_uar(): EOPNOTSUPP when the context has none."""
    if ctx.nc_uar is None:
        raise ProviderError(errno.EOPNOTSUPP, "mlx5_get_singleton_nc_uar: no NC UAR")
    return ctx.nc_uar


def mlx5_attach_dedicated_uar(ctx: mlx5_context, flags: int) -> mlx5_bf:
    """Mirrors mlx5_attach_dedicated_uar(): a register of dyn_uar_bf_list, allocating
    one more UAR object (split into its registers) when the list is empty."""
    head = ctx.dyn_uar_bf_list
    if not head:
        bf = mlx5_alloc_dyn_uar(ctx, flags)
        mlx5_insert_dyn_uuars(ctx, bf)
    return head.pop(0)


def mlx5_detach_dedicated_uar(ctx: mlx5_context, bf: mlx5_bf) -> None:
    """Mirrors mlx5_detach_dedicated_uar(): back to the tail of dyn_uar_bf_list."""
    ctx.dyn_uar_bf_list.append(bf)


@traced
def mlx5dv_query_port(ctx: Any, port_num: int) -> tuple[int, mlx5_ib_uapi_query_port | None]:
    """Mirrors mlx5dv_query_port() -> _mlx5dv_query_port(): MLX5_IB_METHOD_QUERY_PORT
    on the device, its answer in the caller's struct mlx5dv_port.  (0, the port) or
    (errno, None) as the C function returns: EOPNOTSUPP for a context that is not
    mlx5's, EINVAL (from the kernel) for a port the device lacks."""
    if not isinstance(ctx, mlx5_context):
        return errno.EOPNOTSUPP, None
    size = mlx5_ib_uapi_query_port.SIZE  # sizeof(struct mlx5dv_port): the same layout
    buf = posix_memalign(ctx.proc, 8, size)
    try:
        execute_ioctl(ctx, UVERBS_OBJECT_DEVICE, MLX5_IB_METHOD_QUERY_PORT,
                      [(MLX5_IB_ATTR_QUERY_PORT_PORT_NUM, port_num, "in"),
                       (MLX5_IB_ATTR_QUERY_PORT, (buf, size), "ptr_out")],
                      "mlx5dv_query_port")
        return 0, mlx5_ib_uapi_query_port.unpack(ctx.proc.load(buf, size))
    except VerbsError as e:
        return e.errno, None
    finally:
        free(ctx.proc, buf, size)


@traced
def mlx5dv_create_qp(context: Any, qp_attr: Any, mlx5_qp_attr: Any) -> Any:
    """Mirrors mlx5dv_create_qp() -> _mlx5dv_create_qp(): EOPNOTSUPP for a context that
    is not mlx5's; else create_qp with the mlx5dv_qp_init_attr (dc.py), after the
    checks mlx5_create_qp_ex makes on the verbs attributes."""
    mctx = _check_mlx5(context, "mlx5dv_create_qp")
    return mlx5_create_qp_ex(mctx, qp_attr, mlx5_qp_attr)


def mlx5dv_wr_set_dc_addr(qpx: Any, ah: Any, remote_dctn: int, remote_dc_key: int) -> None:
    """Mirrors mlx5dv_wr_set_dc_addr(): the DCI's setter (EOPNOTSUPP on another QP:
    the C op pointer is NULL there)."""
    _dv_op(qpx, "wr_set_dc_addr")(qpx, ah, remote_dctn, remote_dc_key)


def mlx5dv_wr_set_dc_addr_stream(qpx: Any, ah: Any, remote_dctn: int, remote_dc_key: int,
                                 stream_id: int) -> None:
    """Mirrors mlx5dv_wr_set_dc_addr_stream()."""
    _dv_op(qpx, "wr_set_dc_addr_stream")(qpx, ah, remote_dctn, remote_dc_key, stream_id)


def mlx5dv_wr_raw_wqe(qpx: Any, wqe: bytes) -> None:
    """Mirrors mlx5dv_wr_raw_wqe() (a QP created with dv send ops)."""
    _dv_op(qpx, "wr_raw_wqe")(qpx, wqe)


def _dv_op(qpx: Any, name: str) -> Any:
    op = qpx.ops.get(name) if qpx is not None else None
    if op is None:
        raise ProviderError(errno.EOPNOTSUPP, f"mlx5dv_{name}: the QP has no {name} op")
    return op


def mlx5dv_unsupported(ctx: Any, fn: str) -> int:
    """The errno of an mlx5dv_* call that needs what the emulated HCA or kernel lacks
    (DevX commands, the clock-info page, crypto, reserved QPNs, LAG port affinity,
    UDP source port): EOPNOTSUPP, as libmlx5 returns when the
    kernel or device does not offer it."""
    _check_mlx5(ctx, fn)
    return errno.EOPNOTSUPP

"""Mirrors rdma-core providers/mlx5's direct-verbs QP creation (verbs.c: mlx5dv_create_qp,
the mlx5dv_qp_init_attr part of create_qp, create_dct, modify_dct) and the DC send
setters (qp.c: mlx5_send_wr_set_dc_addr, mlx5_send_wr_set_dc_addr_stream).

mlx5dv_create_qp() (dv.py) is create_qp() with a struct mlx5dv_qp_init_attr:

    comp_mask           QP_CREATE_FLAGS | DC | SEND_OPS_FLAGS | DCI_STREAMS, others EINVAL
    DC                  only on an IBV_QPT_DRIVER QP (EINVAL otherwise); an
                        IBV_QPT_DRIVER QP needs it (EINVAL), with dc_type DCI or
                        DCT (EINVAL otherwise)
    create_flags        the mlx5dv_qp_create_flags (EINVAL for others): tunnel
                        offloads, TIR self loopback, (dis)allow scatter to CQE (both:
                        EINVAL), packet based credit mode become vendor flags of the
                        CREATE_QP request; signature pipelining and OOO data path need
                        device support the emulated HCA does not report: EOPNOTSUPP
    DCI                 a send-only QP (MLX5_QP_FLAG_TYPE_DCI) whose WQEs carry a
                        datagram segment naming the DCT (wr_set_dc_addr); DCI
                        streams beyond dci_streams_caps are EINVAL
    DCT                 create_dct(): no buffers, no doorbell record - CREATE_QP
                        with MLX5_QP_FLAG_TYPE_DCT and the access key; the number
                        comes with the move to RTR (modify_dct, the extended
                        MODIFY_QP's response)
    send ops            mlx5_qp_fill_wr_pfns (qp_ex.py) with the dv send ops

# EMU: create_qp does not start from MLX5_QP_FLAG_SCATTER_CQE (use_scatter_to_cqe):
# the provider's QPs never ask for scatter to CQE unless ALLOW_SCATTER_TO_CQE says so.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import (
    MLX5_QP_FLAG_ALLOW_SCATTER_CQE,
    MLX5_QP_FLAG_DCI_STREAM,
    MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE,
    MLX5_QP_FLAG_SCATTER_CQE,
    MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC,
    MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC,
    MLX5_QP_FLAG_TUNNEL_OFFLOADS,
    MLX5_QP_FLAG_TYPE_DCI,
    MLX5_QP_FLAG_TYPE_DCT,
    mlx5_ib_create_qp,
    mlx5_ib_create_qp_resp,
    mlx5_ib_modify_qp,
    mlx5_ib_modify_qp_resp,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_async import verbs_obj_handle
from userspace.libibverbs.verbs_types import (
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QP_STATE,
    IBV_QPS_RTR,
)

# mlx5dv.h: enum mlx5dv_qp_init_attr_mask
MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS = 1 << 0
MLX5DV_QP_INIT_ATTR_MASK_DC = 1 << 1
MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS = 1 << 2
MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS = 1 << 3
MLX5_DV_CREATE_QP_SUP_COMP_MASK = (MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS
                                   | MLX5DV_QP_INIT_ATTR_MASK_DC
                                   | MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS
                                   | MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS)
# mlx5dv.h: enum mlx5dv_dc_type
MLX5DV_DCTYPE_DCT, MLX5DV_DCTYPE_DCI = 1, 2
# mlx5dv.h: enum mlx5dv_qp_create_flags
MLX5DV_QP_CREATE_TUNNEL_OFFLOADS = 1 << 0
MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_UC = 1 << 1
MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_MC = 1 << 2
MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE = 1 << 3
MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE = 1 << 4
MLX5DV_QP_CREATE_PACKET_BASED_CREDIT_MODE = 1 << 5
MLX5DV_QP_CREATE_SIG_PIPELINING = 1 << 6
MLX5DV_QP_CREATE_OOO_DP = 1 << 7
MLX5DV_QP_CREATE_SUP_FLAGS = (1 << 8) - 1
IBV_QPT_DRIVER = 0xFF
MLX5_EXTENDED_UD_AV = 0x80000000


@attrs.define
class mlx5dv_dci_streams:
    """Mirrors struct mlx5dv_dci_streams."""

    log_num_concurent: int = 0
    log_num_errored: int = 0


@attrs.define
class mlx5dv_dc_init_attr:
    """Mirrors struct mlx5dv_dc_init_attr (dct_access_key and dci_streams are a union
    in C; each reader takes the member its dc_type means)."""

    dc_type: int = 0
    dct_access_key: int = 0
    dci_streams: mlx5dv_dci_streams = attrs.Factory(mlx5dv_dci_streams)


@attrs.define
class mlx5dv_qp_init_attr:
    """Mirrors struct mlx5dv_qp_init_attr."""

    comp_mask: int = 0
    create_flags: int = 0
    dc_init_attr: mlx5dv_dc_init_attr = attrs.Factory(mlx5dv_dc_init_attr)
    send_ops_flags: int = 0


def _einval(what: str) -> VerbsError:
    return VerbsError(errno.EINVAL, what)


def create_qp_dv_attr(mctx: Any, attr: Any, qp: Any, mlx5_qp_attr: Any) -> int:
    """The mlx5_qp_attr part of create_qp(): check it, set qp.dc_type, and return the
    vendor flags (mlx5_create_flags) it asks for; see the module docstring.  First of
    all, the new post-send API on a DCT (it sends nothing) is EINVAL."""
    mlx5_create_flags = 0
    if attr.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS and attr.qp_type == IBV_QPT_DRIVER \
            and mlx5_qp_attr is not None and mlx5_qp_attr.comp_mask & MLX5DV_QP_INIT_ATTR_MASK_DC \
            and mlx5_qp_attr.dc_init_attr.dc_type == MLX5DV_DCTYPE_DCT:
        raise _einval("create_qp: send_ops_flags on a DCT")
    if mlx5_qp_attr is None:
        if attr.qp_type == IBV_QPT_DRIVER:
            raise _einval("create_qp: IBV_QPT_DRIVER without mlx5dv attributes")
        return 0
    mask = mlx5_qp_attr.comp_mask
    if mask & ~MLX5_DV_CREATE_QP_SUP_COMP_MASK:
        raise _einval(f"create_qp: Unsupported vendor comp_mask {mask:#x} for create_qp")
    if mask & MLX5DV_QP_INIT_ATTR_MASK_DC and attr.qp_type != IBV_QPT_DRIVER:
        raise _einval("create_qp: DC QP must be of type IBV_QPT_DRIVER")
    if mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS:
        flags = mlx5_qp_attr.create_flags
        if flags & ~MLX5DV_QP_CREATE_SUP_FLAGS:
            raise _einval(f"create_qp: Unsupported creation flags {flags:#x}")
        for dv_flag, vendor in ((MLX5DV_QP_CREATE_TUNNEL_OFFLOADS, MLX5_QP_FLAG_TUNNEL_OFFLOADS),
                                (MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_UC,
                                 MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC),
                                (MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_MC,
                                 MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC)):
            if flags & dv_flag:
                mlx5_create_flags |= vendor
        if flags & MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE:
            if flags & MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE:
                raise _einval("create_qp: Wrong usage of creation flags (disable and allow "
                              "scatter to CQE)")
            mlx5_create_flags &= ~MLX5_QP_FLAG_SCATTER_CQE
        if flags & MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE:
            mlx5_create_flags |= MLX5_QP_FLAG_ALLOW_SCATTER_CQE | MLX5_QP_FLAG_SCATTER_CQE
        if flags & MLX5DV_QP_CREATE_PACKET_BASED_CREDIT_MODE:
            mlx5_create_flags |= MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE
        # EMU: the context learns neither SQD2RTS support nor the OOO caps (DevX)
        if flags & MLX5DV_QP_CREATE_SIG_PIPELINING:
            raise VerbsError(errno.EOPNOTSUPP, "create_qp: signature pipelining needs "
                             "SQD2RTS support")
        if flags & MLX5DV_QP_CREATE_OOO_DP:
            raise VerbsError(errno.EOPNOTSUPP, "create_qp: no out-of-order data path")
    if attr.qp_type != IBV_QPT_DRIVER:
        return mlx5_create_flags
    if not mask & MLX5DV_QP_INIT_ATTR_MASK_DC:
        raise _einval("create_qp: IBV_QPT_DRIVER QP without MLX5DV_QP_INIT_ATTR_MASK_DC")
    dc = mlx5_qp_attr.dc_init_attr
    if dc.dc_type == MLX5DV_DCTYPE_DCT:
        qp.dc_type = MLX5DV_DCTYPE_DCT
        return mlx5_create_flags
    if dc.dc_type != MLX5DV_DCTYPE_DCI:
        raise _einval(f"create_qp: dc_type {dc.dc_type}")
    mlx5_create_flags |= MLX5_QP_FLAG_TYPE_DCI
    qp.dc_type = MLX5DV_DCTYPE_DCI
    if mask & MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS:
        # EMU: the context never learns dci_streams_caps (the mlx5 part of the
        # query_device response is not exchanged): they are 0, as on a device without
        streams = dc.dci_streams
        if streams.log_num_concurent > 0 or streams.log_num_errored > 0:
            raise _einval("create_qp: DCI streams beyond dci_streams_caps")
        mlx5_create_flags |= MLX5_QP_FLAG_DCI_STREAM
    return mlx5_create_flags


@traced
def create_dct(context: Any, attr: Any, mlx5_qp_attr: mlx5dv_qp_init_attr, qp: Any,
               mlx5_create_flags: int, mlx5_store_uidx: Callable[[Any, Any], int]) -> Any:
    """Mirrors create_dct(): EINVAL for verbs attributes beyond the PD, dv attributes
    beyond DC and create flags, vendor flags beyond scatter to CQE; scatter to CQE
    is dropped (the context has no MLX5_VENDOR_CAP_FLAGS_SCAT2CQE_DCT); a user index;
    CREATE_QP with MLX5_QP_FLAG_TYPE_DCT and the access key (the request's buf_addr
    union member).  The DCT has no number until it reaches RTR.  (mlx5_store_uidx is
    the provider's, passed in by create_qp.)"""
    if attr.comp_mask & ~IBV_QP_INIT_ATTR_PD:
        raise _einval("create_dct: Unsupported comp_mask for create_dct")
    if mlx5_qp_attr.comp_mask & ~(MLX5DV_QP_INIT_ATTR_MASK_DC
                                  | MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS):
        raise _einval("create_dct: Unsupported vendor comp_mask for create_dct")
    if mlx5_create_flags & ~MLX5_QP_FLAG_SCATTER_CQE:
        raise _einval("create_dct: Unsupported creation flags requested for DCT QP")
    mlx5_create_flags &= ~MLX5_QP_FLAG_SCATTER_CQE
    mctx = context
    qp.uidx = mlx5_store_uidx(mctx, qp)
    cap, pd = attr.cap, attr.pd
    drv = mlx5_ib_create_qp(buf_addr=mlx5_qp_attr.dc_init_attr.dct_access_key,
                            flags=MLX5_QP_FLAG_TYPE_DCT | mlx5_create_flags, uidx=qp.uidx)
    req = uv.ib_uverbs_create_qp(
        user_handle=verbs_obj_handle(qp),   # so an async event on the DCT finds it
        pd_handle=pd.handle, send_cq_handle=attr.send_cq.handle if attr.send_cq else 0,
        recv_cq_handle=attr.recv_cq.handle if attr.recv_cq else 0,
        max_send_wr=cap.max_send_wr, max_recv_wr=cap.max_recv_wr,
        max_send_sge=cap.max_send_sge, max_recv_sge=cap.max_recv_sge,
        max_inline_data=cap.max_inline_data, sq_sig_all=attr.sq_sig_all,
        qp_type=attr.qp_type, is_srq=int(attr.srq is not None),
        srq_handle=attr.srq.handle if attr.srq is not None else 0)
    try:
        resp, _drv = c.ibv_cmd_create_qp_ex(context, req, drv, mlx5_ib_create_qp_resp)
    except BaseException:
        mctx.uidx_table.pop(qp.uidx, None)
        raise
    qp.handle, qp.qp_num = resp.qp_handle, 0
    qp.dc_type = MLX5DV_DCTYPE_DCT
    return qp


@traced
def modify_dct(qp: Any, attr: Any, attr_mask: int) -> None:
    """Mirrors modify_dct(): the extended MODIFY_QP with the driver's request and
    response; at the move to RTR the response must carry the DCT's number (EINVAL
    otherwise), which becomes the QP's number."""
    resp_len, resp = c.ibv_cmd_modify_qp_ex(qp, attr, attr_mask, mlx5_ib_modify_qp(),
                                            mlx5_ib_modify_qp_resp)
    if not (attr_mask & IBV_QP_STATE and attr.qp_state == IBV_QPS_RTR):
        return
    if resp.response_length < mlx5_ib_modify_qp_resp.offsetof("dctn") + 4:
        raise _einval(f"modify_dct: response of {resp.response_length} bytes has no dctn")
    qp.qp_num = resp.dctn

"""Mirrors rdma-core libibverbs/cmd*.c: each verb as one write() to the uverbs file.

This is the one place userspace crosses into the kernel for verbs:
`execute_write` lays out ib_uverbs_cmd_hdr + the core request + the
provider's request (driver udata) in the process's memory, points the
request's `response` at a buffer for the core response + the provider's
response, and calls write(cmd_fd).  A short write is the errno the kernel
returned.

EMU: the command is built in a scratch page of the context (rdma-core builds
it on its stack).  The core verbs use the legacy write() commands (the kernel
accepts them as well as rdma-core's ioctl() encoding of the same verbs);
driver methods that exist only as ioctls (mlx5's UAR objects) go through
`execute_ioctl`.
"""

from __future__ import annotations

import errno
import os
from typing import Any, TypeVar

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.rdma_user_ioctl import (
    RDMA_VERBS_IOCTL,
    UVERBS_ATTR_F_MANDATORY,
    ib_uverbs_attr,
    ib_uverbs_ioctl_hdr,
)
from kernel_model.uapi.ustruct import UStruct
from userspace.libibverbs import verbs_types as v
from userspace.libibverbs.cint import c_assign

T = TypeVar("T", bound=UStruct)

CMD_BUF_SIZE = 4096
RESP_OFFSET = 2048


class VerbsError(OSError):
    """A failed verb: its errno and the verb (like pyverbs' PyverbsRDMAError)."""

    def __init__(self, errno_: int, what: str):
        super().__init__(errno_, f"{what} failed: {os.strerror(errno_)} (errno {errno_})")


@traced
def execute_write(ctx: Any, command: int, req: UStruct, resp_cls: type[T] | None,
                  drv_req: UStruct | None = None, drv_resp_cls: type[UStruct] | None = None,
                  what: str = "") -> tuple[T | None, Any]:
    """write() one legacy command; returns (core response, provider response)."""
    proc, buf = ctx.proc, ctx.cmd_buf
    resp_size = resp_cls.SIZE if resp_cls else 0
    drv_resp_size = drv_resp_cls.SIZE if drv_resp_cls else 0
    if resp_cls is not None:
        req.response = buf + RESP_OFFSET
    # the handlers' cmd->field = value copies are C assignments: out-of-range values wrap
    body = c_assign(req).pack() + (c_assign(drv_req).pack() if drv_req is not None else b"")
    count = uv.ib_uverbs_cmd_hdr.SIZE + len(body)
    hdr = uv.ib_uverbs_cmd_hdr(command=command, in_words=count // 4,
                               out_words=(resp_size + drv_resp_size) // 4)
    proc.store(buf, hdr.pack() + body)
    ret = proc.write(ctx.cmd_fd, buf, count)
    if ret != count:
        raise VerbsError(-ret if ret < 0 else 5, what or f"uverbs command {command}")
    if resp_cls is None:
        return None, None
    raw = proc.load(buf + RESP_OFFSET, resp_size + drv_resp_size)
    resp = resp_cls.unpack(raw[:resp_size])
    drv = drv_resp_cls.unpack(raw[resp_size:]) if drv_resp_cls else None
    return resp, drv


@traced
def ibv_cmd_get_context(ctx: Any, drv_req: UStruct, drv_resp_cls: type[UStruct]):
    """GET_CONTEXT with the provider's alloc_ucontext request."""
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_GET_CONTEXT, uv.ib_uverbs_get_context(),
                         uv.ib_uverbs_get_context_resp, drv_req, drv_resp_cls,
                         "ibv_cmd_get_context")


@traced
def ibv_cmd_query_device(ctx: Any) -> uv.ib_uverbs_query_device_resp:
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_QUERY_DEVICE, uv.ib_uverbs_query_device(),
                         uv.ib_uverbs_query_device_resp, what="ibv_cmd_query_device")[0]


@traced
def ibv_cmd_query_port(ctx: Any, port_num: int) -> uv.ib_uverbs_query_port_resp:
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_QUERY_PORT,
                         uv.ib_uverbs_query_port(port_num=port_num),
                         uv.ib_uverbs_query_port_resp, what="ibv_cmd_query_port")[0]


@traced
def ibv_cmd_alloc_pd(ctx: Any, drv_resp_cls: type[UStruct] | None = None):
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_ALLOC_PD, uv.ib_uverbs_alloc_pd(),
                         uv.ib_uverbs_alloc_pd_resp, None, drv_resp_cls, "ibv_cmd_alloc_pd")


@traced
def ibv_cmd_dealloc_pd(ctx: Any, pd_handle: int) -> None:
    execute_write(ctx, uv.IB_USER_VERBS_CMD_DEALLOC_PD,
                  uv.ib_uverbs_dealloc_pd(pd_handle=pd_handle), None,
                  what="ibv_cmd_dealloc_pd")


@traced
def ibv_cmd_reg_mr(ctx: Any, pd_handle: int, addr: int, length: int, hca_va: int,
                   access: int) -> uv.ib_uverbs_reg_mr_resp:
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_REG_MR,
                         uv.ib_uverbs_reg_mr(start=addr, length=length, hca_va=hca_va,
                                             pd_handle=pd_handle, access_flags=access),
                         uv.ib_uverbs_reg_mr_resp, what="ibv_cmd_reg_mr")[0]


@traced
def ibv_cmd_dereg_mr(ctx: Any, mr_handle: int) -> None:
    execute_write(ctx, uv.IB_USER_VERBS_CMD_DEREG_MR,
                  uv.ib_uverbs_dereg_mr(mr_handle=mr_handle), None, what="ibv_cmd_dereg_mr")


@traced
def ibv_cmd_create_cq(ctx: Any, cqe: int, comp_vector: int, drv_req: UStruct,
                      drv_resp_cls: type[UStruct], user_handle: int = 0):
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_CQ,
                         uv.ib_uverbs_create_cq(user_handle=user_handle, cqe=cqe,
                                                comp_vector=comp_vector, comp_channel=-1),
                         uv.ib_uverbs_create_cq_resp, drv_req, drv_resp_cls,
                         "ibv_cmd_create_cq")


@traced
def ibv_cmd_destroy_cq(ctx: Any, cq_handle: int) -> None:
    execute_write(ctx, uv.IB_USER_VERBS_CMD_DESTROY_CQ,
                  uv.ib_uverbs_destroy_cq(cq_handle=cq_handle), uv.ib_uverbs_destroy_cq_resp,
                  what="ibv_cmd_destroy_cq")


@traced
def ibv_cmd_create_qp(ctx: Any, req: uv.ib_uverbs_create_qp, drv_req: UStruct,
                      drv_resp_cls: type[UStruct]):
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_QP, req, uv.ib_uverbs_create_qp_resp,
                         drv_req, drv_resp_cls, "ibv_cmd_create_qp")


@traced
def ibv_cmd_create_qp_ex(ctx: Any, req: uv.ib_uverbs_create_qp, drv_req: UStruct,
                         drv_resp_cls: type[UStruct]):
    """Mirrors ibv_cmd_create_qp_ex() (libibverbs/cmd_qp.c), what libmlx5's
    create_qp() calls: for a QP that asks for nothing beyond ibv_qp_init_attr
    it is the legacy CREATE_QP write, the same bytes as ibv_cmd_create_qp.

    # EMU: rdma-core tries the ioctl method first and falls back to write();
    # the emulated uverbs takes create_qp through write() only.
    """
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_QP, req, uv.ib_uverbs_create_qp_resp,
                         drv_req, drv_resp_cls, "ibv_cmd_create_qp_ex")


@traced
def ibv_cmd_destroy_qp(ctx: Any, qp_handle: int) -> None:
    execute_write(ctx, uv.IB_USER_VERBS_CMD_DESTROY_QP,
                  uv.ib_uverbs_destroy_qp(qp_handle=qp_handle), uv.ib_uverbs_destroy_qp_resp,
                  what="ibv_cmd_destroy_qp")


def _dest(ah: Any) -> uv.ib_uverbs_qp_dest:
    """copy_modify_qp_fields()'s address vector."""
    grh = ah.grh
    return uv.ib_uverbs_qp_dest(dgid=grh.dgid, flow_label=grh.flow_label, dlid=ah.dlid,
                                sgid_index=grh.sgid_index, hop_limit=grh.hop_limit,
                                traffic_class=grh.traffic_class, sl=ah.sl,
                                src_path_bits=ah.src_path_bits, static_rate=ah.static_rate,
                                is_global=ah.is_global, port_num=ah.port_num)


#: copy_modify_qp_fields(): the scalar attributes under their IBV_QP_* bit (same names)
_MODIFY_FIELDS = (("STATE", "qp_state"), ("CUR_STATE", "cur_qp_state"),
                  ("EN_SQD_ASYNC_NOTIFY", "en_sqd_async_notify"),
                  ("ACCESS_FLAGS", "qp_access_flags"), ("PKEY_INDEX", "pkey_index"),
                  ("PORT", "port_num"), ("QKEY", "qkey"), ("PATH_MTU", "path_mtu"),
                  ("TIMEOUT", "timeout"), ("RETRY_CNT", "retry_cnt"), ("RNR_RETRY", "rnr_retry"),
                  ("RQ_PSN", "rq_psn"), ("MAX_QP_RD_ATOMIC", "max_rd_atomic"),
                  ("ALT_PATH", "alt_pkey_index"), ("ALT_PATH", "alt_port_num"),
                  ("ALT_PATH", "alt_timeout"), ("MIN_RNR_TIMER", "min_rnr_timer"),
                  ("SQ_PSN", "sq_psn"), ("MAX_DEST_RD_ATOMIC", "max_dest_rd_atomic"),
                  ("PATH_MIG_STATE", "path_mig_state"), ("DEST_QPN", "dest_qp_num"))


@traced
def ibv_cmd_modify_qp(qp: Any, attr: Any, attr_mask: int) -> None:
    """Mirrors ibv_cmd_modify_qp(): the attributes attr_mask names (copy_modify_qp_fields)
    in one MODIFY_QP write, no response.  EOPNOTSUPP for mask bits past
    IBV_QP_DEST_QPN (those need the extended command)."""
    if attr_mask & ~((v.IBV_QP_DEST_QPN << 1) - 1):
        raise VerbsError(errno.EOPNOTSUPP, "ibv_cmd_modify_qp")
    cmd = uv.ib_uverbs_modify_qp(qp_handle=qp.handle, attr_mask=attr_mask)
    for bit, name in _MODIFY_FIELDS:
        if attr_mask & getattr(v, "IBV_QP_" + bit):
            setattr(cmd, name, getattr(attr, name))
    if attr_mask & v.IBV_QP_AV:
        cmd.dest = _dest(attr.ah_attr)
    if attr_mask & v.IBV_QP_ALT_PATH:
        cmd.alt_dest = _dest(attr.alt_ah_attr)
    execute_write(qp.context, uv.IB_USER_VERBS_CMD_MODIFY_QP, cmd, None, what="ibv_cmd_modify_qp")


def _ah_from(dest: uv.ib_uverbs_qp_dest, ah: Any) -> None:
    grh = ah.grh
    grh.dgid, grh.flow_label, grh.sgid_index = dest.dgid, dest.flow_label, dest.sgid_index
    grh.hop_limit, grh.traffic_class = dest.hop_limit, dest.traffic_class
    ah.dlid, ah.sl, ah.src_path_bits = dest.dlid, dest.sl, dest.src_path_bits
    ah.static_rate, ah.is_global, ah.port_num = dest.static_rate, dest.is_global, dest.port_num


_QUERY_FIELDS = ("qkey", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags", "pkey_index",
                 "alt_pkey_index", "qp_state", "cur_qp_state", "path_mtu", "path_mig_state",
                 "sq_draining", "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer",
                 "port_num", "timeout", "retry_cnt", "rnr_retry", "alt_port_num", "alt_timeout")
_CAP_FIELDS = ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data")


@traced
def ibv_cmd_query_qp(qp: Any, attr: Any, attr_mask: int, init_attr: Any) -> None:
    """Mirrors ibv_cmd_query_qp(): QUERY_QP, then the response into the caller's
    ibv_qp_attr and ibv_qp_init_attr.  EOPNOTSUPP from IBV_QP_RATE_LIMIT on."""
    if attr_mask & ~(v.IBV_QP_RATE_LIMIT - 1):
        raise VerbsError(errno.EOPNOTSUPP, "ibv_cmd_query_qp")
    resp = execute_write(qp.context, uv.IB_USER_VERBS_CMD_QUERY_QP,
                         uv.ib_uverbs_query_qp(qp_handle=qp.handle, attr_mask=attr_mask),
                         uv.ib_uverbs_query_qp_resp, what="ibv_cmd_query_qp")[0]
    for name in _QUERY_FIELDS:
        setattr(attr, name, getattr(resp, name))
    for name in _CAP_FIELDS:
        setattr(attr.cap, name, getattr(resp, name))
        setattr(init_attr.cap, name, getattr(resp, name))
    _ah_from(resp.dest, attr.ah_attr)
    _ah_from(resp.alt_dest, attr.alt_ah_attr)
    init_attr.send_cq, init_attr.recv_cq = qp.send_cq, qp.recv_cq
    init_attr.srq = getattr(qp, "srq", None)
    init_attr.qp_type, init_attr.sq_sig_all = qp.qp_type, resp.sq_sig_all


# -- the ioctl() path (rdma-core cmd_ioctl.c), for driver methods ---------------------------
IOCTL_OUT_OFFSET = 3072  # where output attributes' buffers go in the scratch page


@traced
def execute_ioctl(ctx: Any, object_id: int, method_id: int,
                  attrs: list[tuple[int, int, str]], what: str = "") -> dict[int, int]:
    """ioctl(RDMA_VERBS_IOCTL) one method call; returns {attr_id: value} of the outputs.

    `attrs` are (attr_id, value, kind): "in" an inline input, "out4"/"out8" an
    output of 4/8 bytes (a pointer to a buffer), "idr" a handle (new objects
    get theirs written back; destroy names one).
    """
    proc, buf = ctx.proc, ctx.cmd_buf
    out_at: dict[int, tuple[int, int]] = {}
    packed, next_out = [], buf + IOCTL_OUT_OFFSET
    for attr_id, value, kind in attrs:
        size = {"in": 4, "in8": 8, "idr": 8, "out4": 4, "out8": 8}[kind]
        if kind.startswith("out"):
            out_at[attr_id] = (next_out, size)
            value, next_out = next_out, next_out + 8
        if kind.startswith("in"):            # an inline value: its bytes, as C passes it
            value &= (1 << (8 * size)) - 1
        packed.append(ib_uverbs_attr(attr_id=attr_id, len=size, flags=UVERBS_ATTR_F_MANDATORY,
                                     data=value).pack())
    hdr = ib_uverbs_ioctl_hdr(length=ib_uverbs_ioctl_hdr.SIZE + len(packed) * ib_uverbs_attr.SIZE,
                              object_id=object_id, method_id=method_id, num_attrs=len(packed),
                              driver_id=1)
    proc.store(buf, hdr.pack() + b"".join(packed))
    ret = proc.ioctl(ctx.cmd_fd, RDMA_VERBS_IOCTL, buf)
    if ret:
        raise VerbsError(-ret if ret < 0 else 5, what or f"uverbs method {method_id:#x}")
    out = {a: int.from_bytes(proc.load(addr, n), "little") for a, (addr, n) in out_at.items()}
    for i, (attr_id, _v, kind) in enumerate(attrs):
        if kind == "idr":
            at = buf + ib_uverbs_ioctl_hdr.SIZE + i * ib_uverbs_attr.SIZE + 8
            out[attr_id] = int.from_bytes(proc.load(at, 8), "little")
    return out

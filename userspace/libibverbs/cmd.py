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
from kernel_model.uapi import ib_user_ioctl_cmds as ioc
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.ib_user_ioctl_cmds import (
    UVERBS_ATTR_QUERY_PORT_PORT_NUM,
    UVERBS_ATTR_QUERY_PORT_RESP,
    UVERBS_METHOD_QUERY_PORT,
    UVERBS_OBJECT_DEVICE,
)
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
def ibv_cmd_query_port(ctx: Any, port_num: int) -> uv.ib_uverbs_query_port_resp_ex:
    """Mirrors ibv_cmd_query_port() (cmd_device.c): the ioctl UVERBS_METHOD_QUERY_PORT
    into a response_ex; against a kernel without the method (ENOTTY, EPROTONOSUPPORT:
    execute_ioctl_fallback's TRY_WRITE) the write command, whose answer leaves
    port_cap_flags2 and active_speed_ex 0."""
    size = uv.ib_uverbs_query_port_resp_ex.SIZE
    buf = ctx.cmd_buf + RESP_OFFSET    # C's resp_ex on the stack: the scratch page's
    try:                               # response area, as the write commands use
        execute_ioctl(ctx, UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT,
                      [(UVERBS_ATTR_QUERY_PORT_PORT_NUM, port_num, "in"),
                       (UVERBS_ATTR_QUERY_PORT_RESP, (buf, size), "ptr_out")],
                      "ibv_cmd_query_port")
        return uv.ib_uverbs_query_port_resp_ex.unpack(ctx.proc.load(buf, size))
    except VerbsError as e:
        if e.errno not in (errno.ENOTTY, errno.EPROTONOSUPPORT):
            raise
    legacy = execute_write(ctx, uv.IB_USER_VERBS_CMD_QUERY_PORT,
                           uv.ib_uverbs_query_port(port_num=port_num),
                           uv.ib_uverbs_query_port_resp, what="ibv_cmd_query_port")[0]
    return uv.ib_uverbs_query_port_resp_ex.unpack(legacy.pack().ljust(size, b"\0"))


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
def ibv_cmd_rereg_mr(vmr: Any, flags: int, addr: int, length: int, hca_va: int, access: int,
                     pd: Any) -> uv.ib_uverbs_rereg_mr_resp:
    """Mirrors ibv_cmd_rereg_mr(): REREG_MR (the PD handle only with CHANGE_PD); the
    MR takes the keys the kernel answers (and the PD's context with CHANGE_PD)."""
    pd_handle = pd.handle if flags & v.IBV_REREG_MR_CHANGE_PD else 0
    resp = execute_write(vmr.context, uv.IB_USER_VERBS_CMD_REREG_MR,
                         uv.ib_uverbs_rereg_mr(mr_handle=vmr.handle, flags=flags, start=addr,
                                               length=length, hca_va=hca_va,
                                               pd_handle=pd_handle, access_flags=access),
                         uv.ib_uverbs_rereg_mr_resp, what="ibv_cmd_rereg_mr")[0]
    vmr.lkey, vmr.rkey = resp.lkey, resp.rkey
    if flags & v.IBV_REREG_MR_CHANGE_PD:
        vmr.context = pd.context
    return resp


@traced
def ibv_cmd_alloc_mw(pd: Any, mw_type: int) -> uv.ib_uverbs_alloc_mw_resp:
    """Mirrors ibv_cmd_alloc_mw(): ALLOC_MW in the PD."""
    return execute_write(pd.context, uv.IB_USER_VERBS_CMD_ALLOC_MW,
                         uv.ib_uverbs_alloc_mw(pd_handle=pd.handle, mw_type=mw_type),
                         uv.ib_uverbs_alloc_mw_resp, what="ibv_cmd_alloc_mw")[0]


@traced
def ibv_cmd_dealloc_mw(mw: Any) -> None:
    """Mirrors ibv_cmd_dealloc_mw()."""
    execute_write(mw.context, uv.IB_USER_VERBS_CMD_DEALLOC_MW,
                  uv.ib_uverbs_dealloc_mw(mw_handle=mw.handle), None, what="ibv_cmd_dealloc_mw")


@traced
def ibv_cmd_dereg_mr(ctx: Any, mr_handle: int) -> None:
    execute_write(ctx, uv.IB_USER_VERBS_CMD_DEREG_MR,
                  uv.ib_uverbs_dereg_mr(mr_handle=mr_handle), None, what="ibv_cmd_dereg_mr")


@traced
def ibv_cmd_create_comp_channel(ctx: Any) -> int:
    """Mirrors ibv_create_comp_channel()'s CREATE_COMP_CHANNEL write: the new fd."""
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL,
                         uv.ib_uverbs_create_comp_channel(),
                         uv.ib_uverbs_create_comp_channel_resp,
                         what="ibv_create_comp_channel")[0].fd


@traced
def ibv_cmd_create_cq(ctx: Any, cqe: int, comp_vector: int, drv_req: UStruct,
                      drv_resp_cls: type[UStruct], user_handle: int = 0,
                      channel: Any = None):
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_CQ,
                         uv.ib_uverbs_create_cq(user_handle=user_handle, cqe=cqe,
                                                comp_vector=comp_vector,
                                                comp_channel=channel.fd if channel else -1),
                         uv.ib_uverbs_create_cq_resp, drv_req, drv_resp_cls,
                         "ibv_cmd_create_cq")


@traced
def ibv_cmd_create_cq_ex(ctx: Any, attr: Any, drv_req: UStruct, drv_resp_cls: type[UStruct],
                         user_handle: int = 0):
    """Mirrors ibv_cmd_create_cq_ex2() -> ibv_icmd_create_cq_ex(): EOPNOTSUPP for a
    comp_mask past FLAGS | PD; timestamps ask for TIMESTAMP_COMPLETION, IGNORE_OVERRUN
    for IGNORE_OVERRUN; no flags: the legacy CREATE_CQ, else the extended one.
    Returns (handle, cqe, the provider's response).

    # EMU: rdma-core tries the ioctl method first; the emulated uverbs takes the
    # write() commands it falls back to.
    """
    if attr.comp_mask & ~(v.IBV_CQ_INIT_ATTR_MASK_FLAGS | v.IBV_CQ_INIT_ATTR_MASK_PD):
        raise VerbsError(errno.EOPNOTSUPP, "ibv_cmd_create_cq_ex")
    flags = 0
    if attr.wc_flags & (v.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
                        | v.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK):
        flags |= uv.IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION
    if attr.comp_mask & v.IBV_CQ_INIT_ATTR_MASK_FLAGS and \
            attr.flags & v.IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN:
        flags |= uv.IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN
    channel = attr.channel
    if not flags:
        resp, drv = ibv_cmd_create_cq(ctx, attr.cqe, attr.comp_vector, drv_req, drv_resp_cls,
                                      user_handle, channel)
        return resp.cq_handle, resp.cqe, drv
    R = uv.ib_uverbs_ex_create_cq_resp
    req = uv.ib_uverbs_ex_create_cq(user_handle=user_handle, cqe=attr.cqe,
                                    comp_vector=attr.comp_vector,
                                    comp_channel=channel.fd if channel else -1, flags=flags)
    raw = execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_CQ, req, R.SIZE,
                           "ibv_cmd_create_cq_ex", drv_req, drv_resp_cls.SIZE)
    resp = R.unpack(raw[:R.SIZE])
    return resp.base.cq_handle, resp.base.cqe, drv_resp_cls.unpack(raw[R.SIZE:])


@traced
def ibv_cmd_resize_cq(cq: Any, cqe: int, drv_req: UStruct) -> int:
    """Mirrors ibv_cmd_resize_cq(): RESIZE_CQ; the CQ's new cqe."""
    resp = execute_write(cq.context, uv.IB_USER_VERBS_CMD_RESIZE_CQ,
                         uv.ib_uverbs_resize_cq(cq_handle=cq.handle, cqe=cqe),
                         uv.ib_uverbs_resize_cq_resp, drv_req, None, "ibv_cmd_resize_cq")[0]
    return resp.cqe


@traced
def ibv_cmd_destroy_cq(ctx: Any, cq_handle: int) -> uv.ib_uverbs_destroy_cq_resp:
    """DESTROY_CQ; the response counts the events the kernel reported for the CQ."""
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_DESTROY_CQ,
                         uv.ib_uverbs_destroy_cq(cq_handle=cq_handle),
                         uv.ib_uverbs_destroy_cq_resp, what="ibv_cmd_destroy_cq")[0]


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


#: the create flags the extended command carries (CREATE_QP_EX2_SUP_CREATE_FLAGS)
CREATE_QP_EX2_SUP_CREATE_FLAGS = (v.IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
                                  | v.IBV_QP_CREATE_SCATTER_FCS
                                  | v.IBV_QP_CREATE_CVLAN_STRIPPING
                                  | v.IBV_QP_CREATE_SOURCE_QPN
                                  | v.IBV_QP_CREATE_PCI_WRITE_END_PADDING)


@traced
def ibv_cmd_create_qp_ex2(ctx: Any, attr_ex: Any, req: uv.ib_uverbs_create_qp,
                          drv_req: UStruct, drv_resp_cls: type[UStruct]):
    """Mirrors ibv_cmd_create_qp_ex2() (libibverbs/cmd_qp.c), what libmlx5 calls when
    the QP asks for create flags, a TSO header or RSS: EINVAL for a create flag the
    command cannot carry; the extended CREATE_QP (the legacy fields, then comp_mask,
    create_flags and the source QPN).  Returns (core base response, provider response).

    # EMU: rdma-core tries the ioctl method first; the emulated uverbs takes the
    # extended write() command it falls back to.
    """
    create_flags = 0
    source_qpn = 0
    if attr_ex.comp_mask & v.IBV_QP_INIT_ATTR_CREATE_FLAGS:
        if attr_ex.create_flags & ~CREATE_QP_EX2_SUP_CREATE_FLAGS:
            raise VerbsError(errno.EINVAL, f"ibv_cmd_create_qp_ex2: create_flags "
                             f"{attr_ex.create_flags:#x}")
        create_flags = attr_ex.create_flags
        if create_flags & v.IBV_QP_CREATE_SOURCE_QPN:
            source_qpn = attr_ex.source_qpn
    comp_mask = uv.IB_UVERBS_CREATE_QP_MASK_IND_TABLE \
        if attr_ex.comp_mask & v.IBV_QP_INIT_ATTR_IND_TABLE else 0
    ex = uv.ib_uverbs_ex_create_qp(
        user_handle=req.user_handle, pd_handle=req.pd_handle,
        send_cq_handle=req.send_cq_handle, recv_cq_handle=req.recv_cq_handle,
        srq_handle=req.srq_handle, max_send_wr=req.max_send_wr, max_recv_wr=req.max_recv_wr,
        max_send_sge=req.max_send_sge, max_recv_sge=req.max_recv_sge,
        max_inline_data=req.max_inline_data, sq_sig_all=req.sq_sig_all, qp_type=req.qp_type,
        is_srq=req.is_srq, comp_mask=comp_mask, create_flags=create_flags,
        source_qpn=source_qpn)
    R = uv.ib_uverbs_ex_create_qp_resp
    raw = execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_CREATE_QP, ex, R.SIZE,
                           "ibv_cmd_create_qp_ex2", drv_req, drv_resp_cls.SIZE)
    return R.unpack(raw[:R.SIZE]).base, drv_resp_cls.unpack(raw[R.SIZE:])


@traced
def ibv_cmd_create_srq(pd: Any, attr: Any, drv_req: UStruct, drv_resp_cls: type[UStruct],
                       user_handle: int = 0):
    """Mirrors ibv_cmd_create_srq() (legacy CREATE_SRQ write; user_handle names the SRQ
    in its async events): attr.attr gets the sizes the kernel answered; returns
    (core response: handle, provider response)."""
    a = attr.attr
    resp, drv = execute_write(pd.context, uv.IB_USER_VERBS_CMD_CREATE_SRQ,
                              uv.ib_uverbs_create_srq(user_handle=user_handle,
                                                      pd_handle=pd.handle, max_wr=a.max_wr,
                                                      max_sge=a.max_sge,
                                                      srq_limit=a.srq_limit),
                              uv.ib_uverbs_create_srq_resp, drv_req, drv_resp_cls,
                              "ibv_cmd_create_srq")
    a.max_wr, a.max_sge = resp.max_wr, resp.max_sge
    return resp, drv


@traced
def ibv_cmd_create_srq_ex(context: Any, srq: Any, attr: Any, drv_req: UStruct,
                          drv_resp_cls: type[UStruct], user_handle: int = 0):
    """Mirrors ibv_cmd_create_srq_ex() (the CREATE_XSRQ write): the SRQ type, its PD,
    an XRC SRQ's domain and CQ, the user_handle its async events name; attr.attr gets
    the sizes the kernel answered and an XRC SRQ its number (srq.srq_num).  Returns
    (core response, provider response)."""
    a = attr.attr
    req = uv.ib_uverbs_create_xsrq(user_handle=user_handle, srq_type=attr.srq_type,
                                   pd_handle=attr.pd.handle,
                                   max_wr=a.max_wr, max_sge=a.max_sge, srq_limit=a.srq_limit)
    if attr.srq_type == uv.IB_UVERBS_SRQT_XRC:
        req.xrcd_handle, req.cq_handle = attr.xrcd.handle, attr.cq.handle
    resp, drv = execute_write(context, uv.IB_USER_VERBS_CMD_CREATE_XSRQ, req,
                              uv.ib_uverbs_create_srq_resp, drv_req, drv_resp_cls,
                              "ibv_cmd_create_srq_ex")
    a.max_wr, a.max_sge = resp.max_wr, resp.max_sge
    srq.srq_type, srq.pd = attr.srq_type, attr.pd
    if attr.srq_type == uv.IB_UVERBS_SRQT_XRC:
        srq.xrcd, srq.cq, srq.srq_num = attr.xrcd, attr.cq, resp.srqn
    return resp, drv


@traced
def ibv_cmd_open_xrcd(context: Any, attr: Any) -> int:
    """Mirrors ibv_cmd_open_xrcd(): EOPNOTSUPP for comp_mask bits it does not know,
    EINVAL without both FD and OFLAGS; OPEN_XRCD; returns the handle."""
    if attr.comp_mask >= v.IBV_XRCD_INIT_ATTR_RESERVED:
        raise VerbsError(errno.EOPNOTSUPP, f"ibv_cmd_open_xrcd: comp_mask {attr.comp_mask:#x}")
    if not attr.comp_mask & v.IBV_XRCD_INIT_ATTR_FD or \
            not attr.comp_mask & v.IBV_XRCD_INIT_ATTR_OFLAGS:
        raise VerbsError(errno.EINVAL, "ibv_cmd_open_xrcd: FD and OFLAGS are required")
    resp, _ = execute_write(context, uv.IB_USER_VERBS_CMD_OPEN_XRCD,
                            uv.ib_uverbs_open_xrcd(fd=attr.fd & 0xFFFFFFFF, oflags=attr.oflags),
                            uv.ib_uverbs_open_xrcd_resp, what="ibv_cmd_open_xrcd")
    return resp.xrcd_handle


@traced
def ibv_cmd_close_xrcd(xrcd: Any) -> None:
    """Mirrors ibv_cmd_close_xrcd(): CLOSE_XRCD (EBUSY while its SRQs or QPs live)."""
    execute_write(xrcd.context, uv.IB_USER_VERBS_CMD_CLOSE_XRCD,
                  uv.ib_uverbs_close_xrcd(xrcd_handle=xrcd.handle), None,
                  what="ibv_cmd_close_xrcd")


@traced
def ibv_cmd_modify_srq(srq: Any, attr: Any, attr_mask: int) -> None:
    """Mirrors ibv_cmd_modify_srq(): MODIFY_SRQ (no response)."""
    execute_write(srq.context, uv.IB_USER_VERBS_CMD_MODIFY_SRQ,
                  uv.ib_uverbs_modify_srq(srq_handle=srq.handle, attr_mask=attr_mask,
                                          max_wr=attr.max_wr, srq_limit=attr.srq_limit),
                  None, what="ibv_cmd_modify_srq")


@traced
def ibv_cmd_query_srq(srq: Any, attr: Any) -> None:
    """Mirrors ibv_cmd_query_srq(): QUERY_SRQ into attr."""
    resp, _ = execute_write(srq.context, uv.IB_USER_VERBS_CMD_QUERY_SRQ,
                            uv.ib_uverbs_query_srq(srq_handle=srq.handle),
                            uv.ib_uverbs_query_srq_resp, what="ibv_cmd_query_srq")
    attr.max_wr, attr.max_sge, attr.srq_limit = resp.max_wr, resp.max_sge, resp.srq_limit


@traced
def ibv_cmd_destroy_srq(srq: Any) -> uv.ib_uverbs_destroy_srq_resp:
    """Mirrors ibv_cmd_destroy_srq() (the write path): DESTROY_SRQ; the response counts
    the async events the kernel reported for the SRQ (the caller waits for their
    acknowledgement: verbs_async.ibv_destroy_wait_events)."""
    return execute_write(srq.context, uv.IB_USER_VERBS_CMD_DESTROY_SRQ,
                         uv.ib_uverbs_destroy_srq(srq_handle=srq.handle),
                         uv.ib_uverbs_destroy_srq_resp, what="ibv_cmd_destroy_srq")[0]


@traced
def ibv_cmd_destroy_qp(ctx: Any, qp_handle: int) -> uv.ib_uverbs_destroy_qp_resp:
    """Mirrors ibv_cmd_destroy_qp(): DESTROY_QP; the response counts the async events
    the kernel reported for the QP (ibv_destroy_qp waits for their acknowledgement)."""
    return execute_write(ctx, uv.IB_USER_VERBS_CMD_DESTROY_QP,
                         uv.ib_uverbs_destroy_qp(qp_handle=qp_handle),
                         uv.ib_uverbs_destroy_qp_resp, what="ibv_cmd_destroy_qp")[0]


@traced
def ibv_cmd_create_ah(pd: Any, attr: Any, drv_resp_cls: type[UStruct] | None = None):
    """Mirrors ibv_cmd_create_ah(): CREATE_AH with the address attributes; returns
    (core response: the handle, the provider's response)."""
    grh = attr.grh
    cmd = uv.ib_uverbs_create_ah(
        pd_handle=pd.handle,
        attr=uv.ib_uverbs_ah_attr(
            grh=uv.ib_uverbs_global_route(dgid=bytes(grh.dgid), flow_label=grh.flow_label,
                                          sgid_index=grh.sgid_index, hop_limit=grh.hop_limit,
                                          traffic_class=grh.traffic_class),
            dlid=attr.dlid, sl=attr.sl, src_path_bits=attr.src_path_bits,
            static_rate=attr.static_rate, is_global=attr.is_global, port_num=attr.port_num))
    return execute_write(pd.context, uv.IB_USER_VERBS_CMD_CREATE_AH, cmd,
                         uv.ib_uverbs_create_ah_resp, None, drv_resp_cls, "ibv_cmd_create_ah")


@traced
def ibv_cmd_destroy_ah(ctx: Any, ah_handle: int) -> None:
    """Mirrors ibv_cmd_destroy_ah()."""
    execute_write(ctx, uv.IB_USER_VERBS_CMD_DESTROY_AH,
                  uv.ib_uverbs_destroy_ah(ah_handle=ah_handle), None, what="ibv_cmd_destroy_ah")


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


def copy_modify_qp_fields(qp: Any, attr: Any, attr_mask: int) -> uv.ib_uverbs_modify_qp:
    """Mirrors copy_modify_qp_fields(): the MODIFY_QP request with the attributes
    attr_mask names (the address vectors as ib_uverbs_qp_dest)."""
    cmd = uv.ib_uverbs_modify_qp(qp_handle=qp.handle, attr_mask=attr_mask)
    for bit, name in _MODIFY_FIELDS:
        if attr_mask & getattr(v, "IBV_QP_" + bit):
            setattr(cmd, name, getattr(attr, name))
    if attr_mask & v.IBV_QP_AV:
        cmd.dest = _dest(attr.ah_attr)
    if attr_mask & v.IBV_QP_ALT_PATH:
        cmd.alt_dest = _dest(attr.alt_ah_attr)
    return cmd


@traced
def ibv_cmd_modify_qp(qp: Any, attr: Any, attr_mask: int) -> None:
    """Mirrors ibv_cmd_modify_qp(): the attributes attr_mask names (copy_modify_qp_fields)
    in one MODIFY_QP write, no response.  EOPNOTSUPP for mask bits past
    IBV_QP_DEST_QPN (those need the extended command)."""
    if attr_mask & ~((v.IBV_QP_DEST_QPN << 1) - 1):
        raise VerbsError(errno.EOPNOTSUPP, "ibv_cmd_modify_qp")
    cmd = copy_modify_qp_fields(qp, attr, attr_mask)
    execute_write(qp.context, uv.IB_USER_VERBS_CMD_MODIFY_QP, cmd, None, what="ibv_cmd_modify_qp")


@traced
def ibv_cmd_modify_qp_ex(qp: Any, attr: Any, attr_mask: int, drv_req: UStruct,
                         drv_resp_cls: type[UStruct]) -> tuple[int, Any]:
    """Mirrors ibv_cmd_modify_qp_ex(): the attributes attr_mask names (copy_modify_qp_fields)
    in the extended MODIFY_QP, with the provider's request and response; returns
    (the core response's response_length, the provider's response).
    # EMU: the rate limit (IBV_QP_RATE_LIMIT) is not sent."""
    cmd = copy_modify_qp_fields(qp, attr, attr_mask)
    R = uv.ib_uverbs_ex_modify_qp_resp
    raw = execute_write_ex(qp.context, uv.IB_USER_VERBS_EX_CMD_MODIFY_QP,
                           uv.ib_uverbs_ex_modify_qp(base=cmd), R.SIZE, "ibv_cmd_modify_qp_ex",
                           drv_req, drv_resp_cls.SIZE)
    return R.unpack(raw[:R.SIZE]).response_length, drv_resp_cls.unpack(raw[R.SIZE:])


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


# -- the extended write() commands (rdma-core cmd_write.c _execute_cmd_write_ex) ---------
@traced
def execute_write_ex(ctx: Any, command: int, req: UStruct, resp_size: int,
                     what: str = "", drv_req: UStruct | None = None,
                     drv_resp_size: int = 0) -> bytes:
    """write() one extended command: ib_uverbs_cmd_hdr (command | FLAG_EXTENDED, the
    core request and response in 8-byte words), ib_uverbs_ex_cmd_hdr (the response
    pointer, the provider's words), the request, the provider's request; returns the
    resp_size + drv_resp_size response bytes."""
    proc, buf = ctx.proc, ctx.cmd_buf
    body = c_assign(req).pack()
    drv = c_assign(drv_req).pack() if drv_req is not None else b""
    hsize = uv.ib_uverbs_cmd_hdr.SIZE + uv.ib_uverbs_ex_cmd_hdr.SIZE
    count = hsize + len(body) + len(drv)
    hdr = uv.ib_uverbs_cmd_hdr(command=command | uv.IB_USER_VERBS_CMD_FLAG_EXTENDED,
                               in_words=len(body) // 8, out_words=resp_size // 8)
    total = resp_size + drv_resp_size
    ex_hdr = uv.ib_uverbs_ex_cmd_hdr(response=buf + RESP_OFFSET if total else 0,
                                     provider_in_words=len(drv) // 8,
                                     provider_out_words=drv_resp_size // 8)
    proc.store(buf, hdr.pack() + ex_hdr.pack() + body + drv)
    ret = proc.write(ctx.cmd_fd, buf, count)
    if ret != count:
        raise VerbsError(-ret if ret < 0 else 5, what or f"uverbs ex command {command}")
    return proc.load(buf + RESP_OFFSET, total) if total else b""


@traced
def ibv_cmd_query_device_any(ctx: Any, comp_mask: int = 0) -> v.ibv_device_attr_ex:
    """Mirrors ibv_cmd_query_device_any() for an ibv_device_attr_ex caller: EINVAL
    for an input comp_mask; the extended QUERY_DEVICE (on EOPNOTSUPP/ENOSYS the
    legacy one); each extended field is copied only when the kernel's
    response_length covers it (CAN_COPY).  phys_port_cnt_ex is the number of
    ports/ in the device's sysfs directory (the legacy count if there are none)."""
    if comp_mask:
        raise VerbsError(errno.EINVAL, "ibv_cmd_query_device_any: input comp_mask")
    R = uv.ib_uverbs_ex_query_device_resp
    try:
        resp = R.unpack(execute_write_ex(ctx, uv.IB_USER_VERBS_EX_CMD_QUERY_DEVICE,
                                         uv.ib_uverbs_ex_query_device(), R.SIZE,
                                         "ibv_cmd_query_device_any"))
    except VerbsError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        resp = R(base=ibv_cmd_query_device(ctx), response_length=R.offsetof("comp_mask"))
    attr = v.ibv_device_attr_ex(orig_attr=resp.base)

    def can_copy(field: str, size: int) -> bool:
        return resp.response_length >= R.offsetof(field) + size

    if can_copy("odp_caps", uv.ib_uverbs_odp_caps.SIZE):
        o = resp.odp_caps
        attr.odp_caps = v.ibv_odp_caps(o.general_caps, o.rc_odp_caps, o.uc_odp_caps,
                                       o.ud_odp_caps)
    if can_copy("timestamp_mask", 8):
        attr.completion_timestamp_mask = resp.timestamp_mask
    if can_copy("hca_core_clock", 8):
        attr.hca_core_clock = resp.hca_core_clock
    if can_copy("device_cap_flags_ex", 8):
        attr.device_cap_flags_ex = resp.device_cap_flags_ex
    if can_copy("rss_caps", uv.ib_uverbs_rss_caps.SIZE):
        r = resp.rss_caps
        attr.rss_caps = v.ibv_rss_caps(r.supported_qpts, r.max_rwq_indirection_tables,
                                       r.max_rwq_indirection_table_size)
    if can_copy("max_wq_type_rq", 4):
        attr.max_wq_type_rq = resp.max_wq_type_rq
    if can_copy("raw_packet_caps", 4):
        attr.raw_packet_caps = resp.raw_packet_caps
    if can_copy("tm_caps", uv.ib_uverbs_tm_caps.SIZE):
        t = resp.tm_caps
        attr.tm_caps = v.ibv_tm_caps(t.max_rndv_hdr_size, t.max_num_tags, t.flags, t.max_ops,
                                     t.max_sge)
    if can_copy("cq_moderation_caps", uv.ib_uverbs_cq_moderation_caps.SIZE):
        c = resp.cq_moderation_caps
        attr.cq_mod_caps = v.ibv_cq_moderation_caps(c.max_cq_moderation_count,
                                                    c.max_cq_moderation_period)
    if can_copy("max_dm_size", 8):
        attr.max_dm_size = resp.max_dm_size
    if can_copy("xrc_odp_caps", 4):
        attr.xrc_odp_caps = resp.xrc_odp_caps
    ports = ctx.proc.getdents(f"{ctx.device.ibdev_path}/ports")
    num_ports = len(ports) if isinstance(ports, list) else 0
    attr.phys_port_cnt_ex = num_ports or resp.base.phys_port_cnt
    return attr


# -- the ioctl() path (rdma-core cmd_ioctl.c), for driver methods ---------------------------
IOCTL_OUT_OFFSET = 3072  # where output attributes' buffers go in the scratch page


@traced
def execute_ioctl(ctx: Any, object_id: int, method_id: int,
                  attrs: list[tuple[int, int, str]], what: str = "") -> dict[int, int]:
    """ioctl(RDMA_VERBS_IOCTL) one method call; returns {attr_id: value} of the outputs.

    `attrs` are (attr_id, value, kind): "in" an inline input, "out4"/"out8" an
    output of 4/8 bytes (a pointer to a buffer), "idr" a handle (new objects
    get theirs written back; destroy names one), "ptr_out" an output into the
    caller's own memory, value (address, length) (fill_attr_out: the caller
    reads it there; not in the returned dict).
    """
    proc, buf = ctx.proc, ctx.cmd_buf
    out_at: dict[int, tuple[int, int]] = {}
    packed, next_out = [], buf + IOCTL_OUT_OFFSET
    for attr_id, value, kind in attrs:
        if kind in ("ptr_out", "ptr_in"):     # (address, length) in the caller's memory
            (value, size) = value
        else:
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


# -- importing a context and its objects (cmd_device.c, cmd_mr.c) ---------------------------
@traced
def ibv_cmd_query_context(ctx: Any, driver_attrs: list[tuple[int, Any, str]]) -> int:
    """Mirrors ibv_cmd_query_context(): UVERBS_METHOD_QUERY_CONTEXT with the provider's
    attributes linked in; sets ctx.num_comp_vectors and returns core_support."""
    out = execute_ioctl(ctx, ioc.UVERBS_OBJECT_DEVICE, ioc.UVERBS_METHOD_QUERY_CONTEXT,
                        [(ioc.UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS, 0, "out4"),
                         (ioc.UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT, 0, "out8"),
                         *driver_attrs], "ibv_cmd_query_context")
    ctx.num_comp_vectors = out[ioc.UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS]
    return out[ioc.UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT]


@traced
def ibv_cmd_alloc_async_fd(ctx: Any) -> None:
    """Mirrors ibv_cmd_alloc_async_fd(): UVERBS_METHOD_ASYNC_EVENT_ALLOC; the new
    file's fd (written back into the FD attribute) becomes ctx.async_fd."""
    out = execute_ioctl(ctx, ioc.UVERBS_OBJECT_ASYNC_EVENT, ioc.UVERBS_METHOD_ASYNC_EVENT_ALLOC,
                        [(ioc.UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE, 0, "idr")],
                        "ibv_cmd_alloc_async_fd")
    ctx.async_fd = out[ioc.UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE]


@traced
def ibv_cmd_query_mr(pd: Any, mr_handle: int) -> v.ibv_mr:
    """Mirrors ibv_cmd_query_mr(): UVERBS_METHOD_QUERY_MR for lkey, rkey and length; the
    MR is of type IBV_MR_TYPE_IMPORTED_MR, on `pd`, with no address (addr NULL)."""
    out = execute_ioctl(pd.context, ioc.UVERBS_OBJECT_MR, ioc.UVERBS_METHOD_QUERY_MR,
                        [(ioc.UVERBS_ATTR_QUERY_MR_HANDLE, mr_handle, "in8"),
                         (ioc.UVERBS_ATTR_QUERY_MR_RESP_LKEY, 0, "out4"),
                         (ioc.UVERBS_ATTR_QUERY_MR_RESP_RKEY, 0, "out4"),
                         (ioc.UVERBS_ATTR_QUERY_MR_RESP_LENGTH, 0, "out8")], "ibv_cmd_query_mr")
    return v.ibv_mr(pd.context, pd, 0, out[ioc.UVERBS_ATTR_QUERY_MR_RESP_LENGTH], mr_handle,
                    out[ioc.UVERBS_ATTR_QUERY_MR_RESP_LKEY],
                    out[ioc.UVERBS_ATTR_QUERY_MR_RESP_RKEY], v.IBV_MR_TYPE_IMPORTED_MR)

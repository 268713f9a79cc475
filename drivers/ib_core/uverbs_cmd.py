"""Mirrors drivers/infiniband/core/uverbs_cmd.c: the legacy write() command handlers.

Each handler gets the attribute bundle the write path built (the core
request at ucore.inbuf, the response buffer at ucore.outbuf, the driver's
udata after both), reads its request with uverbs_request(), calls into the
core and the driver, and writes its response with uverbs_response().  A
handler that creates an object hands its uobject to the write path
(uobj_finalize_uobj_create), which commits it on success and aborts it -
destroying the new hardware object - if anything after failed.
"""

from __future__ import annotations

from typing import TypeVar

from drivers.ib_core.device import rdma_zalloc_drv_obj
from drivers.ib_core.ib_verbs import (
    IB_LINK_LAYER_ETHERNET,
    IB_QPT_RAW_PACKET,
    IB_QPT_XRC_INI,
    IB_QPT_XRC_TGT,
    ib_check_mr_access,
    ib_cq_init_attr,
    ib_port_attr,
    ib_qp_cap,
    ib_qp_init_attr,
    ib_respond_udata,
)
from drivers.ib_core.rdma_core import (
    UVERBS_LOOKUP_READ,
    ib_uverbs_get_ucontext_file,
    rdma_alloc_begin_uobject,
    rdma_lookup_get_uobject,
    rdma_lookup_put_uobject,
    uobj_finalize_uobj_create,
    uobj_perform_destroy,
    uverbs_attr_bundle,
)
from drivers.ib_core.uverbs_std_types import (
    UVERBS_OBJECT_CQ,
    UVERBS_OBJECT_MR,
    UVERBS_OBJECT_PD,
    UVERBS_OBJECT_QP,
)
from drivers.ib_core.verbs import (
    ib_create_qp_user,
    ib_query_port,
    ib_reg_user_mr,
    rdma_port_get_link_layer,
)
from kernel_model.current import current
from kernel_model.errno import EINVAL, EOPNOTSUPP, EPERM, KernelError
from kernel_model.task import CAP_NET_RAW, capable
from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.ustruct import UStruct

T = TypeVar("T", bound=UStruct)

IB_UVERBS_QPF_GRH_REQUIRED = 1 << 0  # ib_uverbs_query_port_flags


def uverbs_request(attrs_: uverbs_attr_bundle, cls: type[T]) -> T:
    """Mirrors uverbs_request(): copy the core request (shorter: zero-filled)."""
    from drivers.ib_core.ib_verbs import ib_copy_from_udata
    return ib_copy_from_udata(cls, attrs_.ucore, min(attrs_.ucore.inlen, cls.SIZE))


def uverbs_response(attrs_: uverbs_attr_bundle, resp: UStruct) -> None:
    """Mirrors uverbs_response(): copy what fits, zero-fill the rest of the buffer."""
    ib_respond_udata(attrs_.ucore, resp)


def _lookup(type_, attrs_: uverbs_attr_bundle, handle: int):
    return rdma_lookup_get_uobject(type_, attrs_.ufile, handle, UVERBS_LOOKUP_READ, attrs_)


# -- context, device, port ----------------------------------------------------------
@traced
def ib_uverbs_get_context(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_get_context(): one ucontext per file (a second is EINVAL);
    ops.alloc_ucontext reads the driver request and writes its response; the
    async event file becomes a new fd, returned in the core response."""
    from drivers.ib_core.uverbs_main import ib_uverbs_alloc_async_event_file
    ufile = attrs_.ufile
    uverbs_request(attrs_, uv.ib_uverbs_get_context)
    with ufile.ucontext_lock:
        if ufile.ucontext is not None:
            raise KernelError(EINVAL, "ib_uverbs_get_context: file already has a ucontext")
        ib_dev = ufile.device.ib_dev
        ucontext = rdma_zalloc_drv_obj(ib_dev, "ib_ucontext")
        ucontext.ufile = ufile
        ib_dev.ops.alloc_ucontext(ucontext, attrs_.driver_udata)  # ib_init_ucontext
        try:
            fd = ib_uverbs_alloc_async_event_file(ufile)
            try:
                uverbs_response(attrs_, uv.ib_uverbs_get_context_resp(
                    async_fd=fd, num_comp_vectors=ib_dev.num_comp_vectors))
            except KernelError:
                current().files.close_fd(fd)
                raise
        except KernelError:
            ib_dev.ops.dealloc_ucontext(ucontext)  # err_uobj:
            raise
        ufile.ucontext = ucontext


@traced
def ib_uverbs_query_device(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_query_device(): the attributes cached at registration."""
    ucontext = ib_uverbs_get_ucontext_file(attrs_.ufile)
    uverbs_request(attrs_, uv.ib_uverbs_query_device)
    ib_dev = ucontext.device
    a = ib_dev.attrs
    uverbs_response(attrs_, uv.ib_uverbs_query_device_resp(  # copy_query_dev_fields()
        fw_ver=a.fw_ver, node_guid=ib_dev.node_guid, sys_image_guid=a.sys_image_guid,
        max_mr_size=a.max_mr_size, page_size_cap=a.page_size_cap, vendor_id=a.vendor_id,
        vendor_part_id=a.vendor_part_id, hw_ver=a.hw_ver, max_qp=a.max_qp,
        max_qp_wr=a.max_qp_wr, device_cap_flags=a.device_cap_flags & 0xFFFFFFFF,
        max_sge=min(a.max_send_sge, a.max_recv_sge), max_sge_rd=a.max_sge_rd,
        max_cq=a.max_cq, max_cqe=a.max_cqe, max_mr=a.max_mr, max_pd=a.max_pd,
        max_qp_rd_atom=a.max_qp_rd_atom, max_ee_rd_atom=a.max_ee_rd_atom,
        max_res_rd_atom=a.max_res_rd_atom, max_qp_init_rd_atom=a.max_qp_init_rd_atom,
        max_ee_init_rd_atom=a.max_ee_init_rd_atom, atomic_cap=a.atomic_cap, max_ee=a.max_ee,
        max_rdd=a.max_rdd, max_mw=a.max_mw, max_raw_ipv6_qp=a.max_raw_ipv6_qp,
        max_raw_ethy_qp=a.max_raw_ethy_qp, max_mcast_grp=a.max_mcast_grp,
        max_mcast_qp_attach=a.max_mcast_qp_attach,
        max_total_mcast_qp_attach=a.max_total_mcast_qp_attach, max_ah=a.max_ah,
        max_srq=a.max_srq, max_srq_wr=a.max_srq_wr, max_srq_sge=a.max_srq_sge,
        max_pkeys=a.max_pkeys, local_ca_ack_delay=a.local_ca_ack_delay,
        phys_port_cnt=ib_dev.phys_port_cnt))


@traced
def ib_uverbs_query_port(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_query_port(): ib_query_port, plus the link layer and,
    for RoCE, the GRH-required flag."""
    ucontext = ib_uverbs_get_ucontext_file(attrs_.ufile)
    cmd = uverbs_request(attrs_, uv.ib_uverbs_query_port)
    ib_dev = ucontext.device
    attr = ib_port_attr()
    ib_query_port(ib_dev, cmd.port_num, attr)
    link_layer = rdma_port_get_link_layer(ib_dev, cmd.port_num)
    uverbs_response(attrs_, uv.ib_uverbs_query_port_resp(
        port_cap_flags=attr.port_cap_flags, max_msg_sz=attr.max_msg_sz,
        bad_pkey_cntr=attr.bad_pkey_cntr, qkey_viol_cntr=attr.qkey_viol_cntr,
        gid_tbl_len=attr.gid_tbl_len, pkey_tbl_len=attr.pkey_tbl_len, lid=attr.lid,
        sm_lid=attr.sm_lid, state=attr.state, max_mtu=attr.max_mtu,
        active_mtu=attr.active_mtu, lmc=attr.lmc, max_vl_num=attr.max_vl_num,
        sm_sl=attr.sm_sl, subnet_timeout=attr.subnet_timeout,
        init_type_reply=attr.init_type_reply, active_width=attr.active_width,
        active_speed=attr.active_speed & 0xFF, phys_state=attr.phys_state,
        link_layer=link_layer,
        flags=IB_UVERBS_QPF_GRH_REQUIRED if link_layer == IB_LINK_LAYER_ETHERNET else 0))


# -- PD, MR ------------------------------------------------------------------------
@traced
def ib_uverbs_alloc_pd(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_alloc_pd()."""
    uverbs_request(attrs_, uv.ib_uverbs_alloc_pd)
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_PD, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)  # from here on the write path aborts it
    ib_dev = uobj.context.device
    pd = rdma_zalloc_drv_obj(ib_dev, "ib_pd")
    pd.uobject = uobj
    ib_dev.ops.alloc_pd(pd, attrs_.driver_udata)
    uobj.object = pd
    uverbs_response(attrs_, uv.ib_uverbs_alloc_pd_resp(pd_handle=uobj.id))


@traced
def ib_uverbs_dealloc_pd(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_dealloc_pd(): EBUSY while MRs or QPs use the PD."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_dealloc_pd)
    uobj_perform_destroy(UVERBS_OBJECT_PD, cmd.pd_handle, attrs_)


@traced
def ib_uverbs_reg_mr(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_reg_mr(): start and hca_va must share their page
    offset, the access flags must make sense, then ops.reg_user_mr in the PD."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_reg_mr)
    page_mask = current().machine.page_size - 1
    if cmd.start & page_mask != cmd.hca_va & page_mask:
        raise KernelError(EINVAL, "ib_uverbs_reg_mr: start and hca_va page offsets differ")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_MR, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    ib_check_mr_access(uobj.context.device, cmd.access_flags)
    pd_uobj = _lookup(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle)
    try:
        mr = ib_reg_user_mr(pd_uobj.object, cmd.start, cmd.length, cmd.hca_va,
                            cmd.access_flags, attrs_.driver_udata, uobj)
        uobj.object = mr
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    uverbs_response(attrs_, uv.ib_uverbs_reg_mr_resp(mr_handle=uobj.id, lkey=mr.lkey,
                                                     rkey=mr.rkey))


@traced
def ib_uverbs_dereg_mr(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_dereg_mr()."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_dereg_mr)
    uobj_perform_destroy(UVERBS_OBJECT_MR, cmd.mr_handle, attrs_)


# -- CQ ----------------------------------------------------------------------------
@traced
def ib_uverbs_create_cq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_cq() -> create_cq().

    EMU: completion channels are not modelled; comp_channel must be -1.
    """
    cmd = uverbs_request(attrs_, uv.ib_uverbs_create_cq)
    ufile = attrs_.ufile
    if cmd.comp_vector >= ufile.device.num_comp_vectors:
        raise KernelError(EINVAL, f"create_cq: comp_vector {cmd.comp_vector} out of range")
    if cmd.comp_channel >= 0:
        raise KernelError(EINVAL, "create_cq: completion channels are not supported")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_CQ, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    uobj.user_handle = cmd.user_handle
    ib_dev = uobj.context.device
    cq = rdma_zalloc_drv_obj(ib_dev, "ib_cq")
    cq.uobject = uobj
    ib_dev.ops.create_cq(cq, ib_cq_init_attr(cqe=cmd.cqe, comp_vector=cmd.comp_vector),
                         attrs_.driver_udata)
    uobj.object = cq
    uverbs_response(attrs_, uv.ib_uverbs_create_cq_resp(cq_handle=uobj.id, cqe=cq.cqe))


@traced
def ib_uverbs_destroy_cq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_destroy_cq(): EBUSY while QPs are attached."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_destroy_cq)
    uobj_perform_destroy(UVERBS_OBJECT_CQ, cmd.cq_handle, attrs_)
    uverbs_response(attrs_, uv.ib_uverbs_destroy_cq_resp())


# -- QP ----------------------------------------------------------------------------
@traced
def ib_uverbs_create_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_qp() -> create_qp(): look up the PD and CQs
    (read-locked for the duration), ops.create_qp, report the real caps.

    EMU: SRQs and XRC are not modelled (EOPNOTSUPP).
    """
    cmd = uverbs_request(attrs_, uv.ib_uverbs_create_qp)
    if cmd.qp_type == IB_QPT_RAW_PACKET and not capable(CAP_NET_RAW):
        raise KernelError(EPERM, "create_qp: RAW_PACKET QP needs CAP_NET_RAW")
    if cmd.is_srq or cmd.qp_type in (IB_QPT_XRC_INI, IB_QPT_XRC_TGT):
        raise KernelError(EOPNOTSUPP, "create_qp: SRQ and XRC QPs are not modelled")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_QP, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    uobj.user_handle = cmd.user_handle
    held = []
    try:
        pd_uobj = _lookup(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle)
        held.append(pd_uobj)
        scq_uobj = _lookup(UVERBS_OBJECT_CQ, attrs_, cmd.send_cq_handle)
        held.append(scq_uobj)
        if cmd.recv_cq_handle != cmd.send_cq_handle:
            rcq_uobj = _lookup(UVERBS_OBJECT_CQ, attrs_, cmd.recv_cq_handle)
            held.append(rcq_uobj)
        else:
            rcq_uobj = scq_uobj
        attr = ib_qp_init_attr(
            send_cq=scq_uobj.object, recv_cq=rcq_uobj.object, qp_type=cmd.qp_type,
            sq_sig_type=0 if cmd.sq_sig_all else 1,
            cap=ib_qp_cap(cmd.max_send_wr, cmd.max_recv_wr, cmd.max_send_sge,
                          cmd.max_recv_sge, cmd.max_inline_data))
        qp = ib_create_qp_user(uobj.context.device, pd_uobj.object, attr,
                               attrs_.driver_udata, uobj)
        uobj.object = qp
    finally:
        for held_uobj in held:
            rdma_lookup_put_uobject(held_uobj, UVERBS_LOOKUP_READ)
    cap = attr.cap
    uverbs_response(attrs_, uv.ib_uverbs_create_qp_resp(
        qp_handle=uobj.id, qpn=qp.qp_num, max_send_wr=cap.max_send_wr,
        max_recv_wr=cap.max_recv_wr, max_send_sge=cap.max_send_sge,
        max_recv_sge=cap.max_recv_sge, max_inline_data=cap.max_inline_data))


@traced
def ib_uverbs_destroy_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_destroy_qp()."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_destroy_qp)
    uobj_perform_destroy(UVERBS_OBJECT_QP, cmd.qp_handle, attrs_)
    uverbs_response(attrs_, uv.ib_uverbs_destroy_qp_resp())

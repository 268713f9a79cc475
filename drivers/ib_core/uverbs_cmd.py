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

from typing import Any, TypeVar

from drivers.ib_core.device import rdma_is_port_valid, rdma_zalloc_drv_obj
from drivers.ib_core.ib_verbs import (
    IB_AH_GRH,
    IB_LINK_LAYER_ETHERNET,
    IB_QP_ACCESS_FLAGS,
    IB_QP_ALT_PATH,
    IB_QP_ATTR_STANDARD_BITS,
    IB_QP_AV,
    IB_QP_CUR_STATE,
    IB_QP_DEST_QPN,
    IB_QP_EN_SQD_ASYNC_NOTIFY,
    IB_QP_MAX_DEST_RD_ATOMIC,
    IB_QP_MAX_QP_RD_ATOMIC,
    IB_QP_MIN_RNR_TIMER,
    IB_QP_PATH_MIG_STATE,
    IB_QP_PATH_MTU,
    IB_QP_PKEY_INDEX,
    IB_QP_PORT,
    IB_QP_QKEY,
    IB_QP_RETRY_CNT,
    IB_QP_RNR_RETRY,
    IB_QP_RQ_PSN,
    IB_QP_SQ_PSN,
    IB_QP_STATE,
    IB_QP_TIMEOUT,
    IB_QPS_ERR,
    IB_QPS_RTR,
    IB_QPT_RAW_PACKET,
    IB_QPT_XRC_INI,
    IB_QPT_XRC_TGT,
    IB_SIGNAL_ALL_WR,
    ib_check_mr_access,
    ib_copy_from_udata,
    ib_cq_init_attr,
    ib_global_route,
    ib_port_attr,
    ib_qp_attr,
    ib_qp_cap,
    ib_qp_init_attr,
    ib_respond_udata,
    rdma_ah_attr,
    rdma_ah_find_type,
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
from drivers.ib_core.uverbs_std_types_async_fd import ib_uverbs_alloc_async_event_file
from drivers.ib_core.verbs import (
    ib_create_qp_user,
    ib_modify_qp_with_udata,
    ib_query_port,
    ib_query_qp,
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
    return ib_copy_from_udata(cls, attrs_.ucore, min(attrs_.ucore.inlen, cls.SIZE))


def uverbs_response(attrs_: uverbs_attr_bundle, resp: UStruct) -> None:
    """Mirrors uverbs_response(): copy what fits, zero-fill the rest of the buffer."""
    ib_respond_udata(attrs_.ucore, resp)


def uobj_get_obj_read(type_: Any, attrs_: uverbs_attr_bundle, handle: int,
                      who: str) -> Any:
    """Mirrors uobj_get_obj_read(): the read-locked uobject behind a handle.

    The C macro turns any lookup failure (ENOENT for a handle the file does not
    hold, EINVAL for another type, EBUSY for one being destroyed) into NULL,
    and every write handler answers NULL with EINVAL - so does this.
    """
    try:
        return rdma_lookup_get_uobject(type_, attrs_.ufile, handle, UVERBS_LOOKUP_READ, attrs_)
    except KernelError as e:
        raise KernelError(EINVAL, f"{who}: {type_.name} handle {handle}: {e}") from None


# -- context, device, port ----------------------------------------------------------
@traced
def ib_uverbs_get_context(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_get_context(): one ucontext per file (a second is EINVAL);
    ops.alloc_ucontext reads the driver request and writes its response; the
    async event file becomes a new fd, returned in the core response."""
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
    pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle, "ib_uverbs_reg_mr")
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
        pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle, "create_qp")
        held.append(pd_uobj)
        scq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.send_cq_handle,
                                     "create_qp")
        held.append(scq_uobj)
        if cmd.recv_cq_handle != cmd.send_cq_handle:
            rcq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.recv_cq_handle,
                                         "create_qp")
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


def copy_ah_attr_from_uverbs(device: Any, dest: uv.ib_uverbs_qp_dest) -> rdma_ah_attr:
    """Mirrors copy_ah_attr_from_uverbs(): a uapi address vector as the core's (the
    type from the port: RoCE on an Ethernet port)."""
    ah = rdma_ah_attr(type=rdma_ah_find_type(device, dest.port_num))
    if dest.is_global:
        ah.ah_flags = IB_AH_GRH
        ah.grh = ib_global_route(dgid=dest.dgid, flow_label=dest.flow_label,
                                 sgid_index=dest.sgid_index, hop_limit=dest.hop_limit,
                                 traffic_class=dest.traffic_class)
    ah.dlid, ah.sl, ah.src_path_bits = dest.dlid, dest.sl, dest.src_path_bits
    ah.static_rate, ah.port_num = dest.static_rate, dest.port_num
    return ah


def copy_ah_attr_to_uverbs(ah: rdma_ah_attr) -> uv.ib_uverbs_qp_dest:
    """Mirrors copy_ah_attr_to_uverbs()."""
    dest = uv.ib_uverbs_qp_dest(dlid=ah.dlid, sl=ah.sl, src_path_bits=ah.src_path_bits,
                                static_rate=ah.static_rate, port_num=ah.port_num,
                                is_global=int(bool(ah.ah_flags & IB_AH_GRH)))
    if dest.is_global:
        grh = ah.grh
        dest.dgid, dest.flow_label, dest.sgid_index = grh.dgid, grh.flow_label, grh.sgid_index
        dest.hop_limit, dest.traffic_class = grh.hop_limit, grh.traffic_class
    return dest


def modify_qp_mask(qp_type: int, mask: int) -> int:
    """Mirrors modify_qp_mask(): the halves of an XRC pair ignore the other half's
    attributes."""
    if qp_type == IB_QPT_XRC_INI:
        return mask & ~(IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER)
    if qp_type == IB_QPT_XRC_TGT:
        return mask & ~(IB_QP_MAX_QP_RD_ATOMIC | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY)
    return mask


#: the scalar attributes MODIFY_QP copies, each under its mask bit (same name both sides)
_MODIFY_FIELDS = (
    (IB_QP_STATE, "qp_state"), (IB_QP_CUR_STATE, "cur_qp_state"),
    (IB_QP_PATH_MTU, "path_mtu"), (IB_QP_PATH_MIG_STATE, "path_mig_state"),
    (IB_QP_QKEY, "qkey"), (IB_QP_RQ_PSN, "rq_psn"), (IB_QP_SQ_PSN, "sq_psn"),
    (IB_QP_DEST_QPN, "dest_qp_num"), (IB_QP_ACCESS_FLAGS, "qp_access_flags"),
    (IB_QP_PKEY_INDEX, "pkey_index"), (IB_QP_EN_SQD_ASYNC_NOTIFY, "en_sqd_async_notify"),
    (IB_QP_MAX_QP_RD_ATOMIC, "max_rd_atomic"), (IB_QP_MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
    (IB_QP_MIN_RNR_TIMER, "min_rnr_timer"), (IB_QP_PORT, "port_num"), (IB_QP_TIMEOUT, "timeout"),
    (IB_QP_RETRY_CNT, "retry_cnt"), (IB_QP_RNR_RETRY, "rnr_retry"),
    (IB_QP_ALT_PATH, "alt_pkey_index"), (IB_QP_ALT_PATH, "alt_port_num"),
    (IB_QP_ALT_PATH, "alt_timeout"),
)


def _check_ports(qp: Any, cmd: uv.ib_uverbs_modify_qp) -> None:
    """modify_qp()'s port checks: the QP's port, the AV's (at INIT->RTR it must be
    the port the QP was given at RST->INIT; in SQD->SQD an AV alone also moves
    the port), the alternate path's."""
    mask, device = cmd.attr_mask, qp.device
    if mask & IB_QP_PORT and not rdma_is_port_valid(device, cmd.port_num):
        raise KernelError(EINVAL, f"modify_qp: port {cmd.port_num}")
    if mask & IB_QP_AV:
        if not rdma_is_port_valid(device, cmd.dest.port_num):
            raise KernelError(EINVAL, f"modify_qp: AV port {cmd.dest.port_num}")
        if mask & IB_QP_STATE and cmd.qp_state == IB_QPS_RTR:
            if cmd.dest.port_num != qp.port:
                raise KernelError(EINVAL, f"modify_qp: AV port {cmd.dest.port_num} is not "
                                  f"the QP's port {qp.port}")
        else:
            if mask & (IB_QP_AV | IB_QP_PORT) == IB_QP_AV | IB_QP_PORT and \
                    cmd.port_num != cmd.dest.port_num:
                raise KernelError(EINVAL, "modify_qp: port and AV port differ")
            if mask & (IB_QP_AV | IB_QP_PORT) == IB_QP_AV:
                cmd.attr_mask |= IB_QP_PORT
                cmd.port_num = cmd.dest.port_num
    if mask & IB_QP_ALT_PATH and (not rdma_is_port_valid(device, cmd.alt_port_num)
                                  or not rdma_is_port_valid(device, cmd.alt_dest.port_num)
                                  or cmd.alt_port_num != cmd.alt_dest.port_num):
        raise KernelError(EINVAL, "modify_qp: alternate path ports")


@traced
def modify_qp(attrs_: uverbs_attr_bundle, cmd: uv.ib_uverbs_modify_qp) -> None:
    """Mirrors modify_qp(): look the QP up (EINVAL for a bad handle), check the
    ports and the states' range, copy what attr_mask names into an ib_qp_attr
    (the AVs through copy_ah_attr_from_uverbs), ib_modify_qp_with_udata."""
    qp_uobj = uobj_get_obj_read(UVERBS_OBJECT_QP, attrs_, cmd.qp_handle, "modify_qp")
    try:
        qp = qp_uobj.object
        _check_ports(qp, cmd)
        mask = cmd.attr_mask
        if (mask & IB_QP_CUR_STATE and cmd.cur_qp_state > IB_QPS_ERR) or \
                (mask & IB_QP_STATE and cmd.qp_state > IB_QPS_ERR):
            raise KernelError(EINVAL, "modify_qp: QP state out of range")
        attr = ib_qp_attr()
        for bit, name in _MODIFY_FIELDS:
            if mask & bit:
                setattr(attr, name, getattr(cmd, name))
        if mask & IB_QP_AV:
            attr.ah_attr = copy_ah_attr_from_uverbs(qp.device, cmd.dest)
        if mask & IB_QP_ALT_PATH:
            attr.alt_ah_attr = copy_ah_attr_from_uverbs(qp.device, cmd.alt_dest)
        ib_modify_qp_with_udata(qp, attr, modify_qp_mask(qp.qp_type, mask),
                                attrs_.driver_udata)
    finally:
        rdma_lookup_put_uobject(qp_uobj, UVERBS_LOOKUP_READ)


@traced
def ib_uverbs_modify_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_modify_qp(): EOPNOTSUPP for attribute bits past the
    standard ones (they need the extended command), then modify_qp."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_modify_qp)
    if cmd.attr_mask & ~IB_QP_ATTR_STANDARD_BITS:
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_modify_qp: attr_mask {cmd.attr_mask:#x}")
    modify_qp(attrs_, cmd)


@traced
def ib_uverbs_query_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_query_qp(): ib_query_qp, then every attribute into the
    response (the QP is only read-locked for the query)."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_query_qp)
    qp_uobj = uobj_get_obj_read(UVERBS_OBJECT_QP, attrs_, cmd.qp_handle,
                                "ib_uverbs_query_qp")
    attr, init_attr = ib_qp_attr(), ib_qp_init_attr()
    try:
        ib_query_qp(qp_uobj.object, attr, cmd.attr_mask, init_attr)
    finally:
        rdma_lookup_put_uobject(qp_uobj, UVERBS_LOOKUP_READ)
    cap = init_attr.cap
    uverbs_response(attrs_, uv.ib_uverbs_query_qp_resp(
        qp_state=attr.qp_state, cur_qp_state=attr.cur_qp_state, path_mtu=attr.path_mtu,
        path_mig_state=attr.path_mig_state, qkey=attr.qkey, rq_psn=attr.rq_psn,
        sq_psn=attr.sq_psn, dest_qp_num=attr.dest_qp_num,
        qp_access_flags=attr.qp_access_flags, pkey_index=attr.pkey_index,
        alt_pkey_index=attr.alt_pkey_index, sq_draining=attr.sq_draining,
        max_rd_atomic=attr.max_rd_atomic, max_dest_rd_atomic=attr.max_dest_rd_atomic,
        min_rnr_timer=attr.min_rnr_timer, port_num=attr.port_num, timeout=attr.timeout,
        retry_cnt=attr.retry_cnt, rnr_retry=attr.rnr_retry, alt_port_num=attr.alt_port_num,
        alt_timeout=attr.alt_timeout, dest=copy_ah_attr_to_uverbs(attr.ah_attr),
        alt_dest=copy_ah_attr_to_uverbs(attr.alt_ah_attr), max_send_wr=cap.max_send_wr,
        max_recv_wr=cap.max_recv_wr, max_send_sge=cap.max_send_sge,
        max_recv_sge=cap.max_recv_sge, max_inline_data=cap.max_inline_data,
        sq_sig_all=int(init_attr.sq_sig_type == IB_SIGNAL_ALL_WR)))

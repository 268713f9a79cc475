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
    IB_MR_REREG_ACCESS,
    IB_MR_REREG_PD,
    IB_MR_REREG_SUPPORTED,
    IB_MR_REREG_TRANS,
    IB_MW_TYPE_1,
    IB_MW_TYPE_2,
    IB_QP_ACCESS_FLAGS,
    IB_QP_ALT_PATH,
    IB_QP_ATTR_STANDARD_BITS,
    IB_QP_AV,
    IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK,
    IB_QP_CREATE_CROSS_CHANNEL,
    IB_QP_CREATE_CVLAN_STRIPPING,
    IB_QP_CREATE_MANAGED_RECV,
    IB_QP_CREATE_MANAGED_SEND,
    IB_QP_CREATE_PCI_WRITE_END_PADDING,
    IB_QP_CREATE_SCATTER_FCS,
    IB_QP_CREATE_SOURCE_QPN,
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
    IB_QP_RATE_LIMIT,
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
    IB_SRQ_LIMIT,
    IB_SRQT_BASIC,
    IB_SRQT_TM,
    IB_SRQT_XRC,
    ib_check_mr_access,
    ib_copy_from_udata,
    ib_cq_init_attr,
    ib_device_attr,
    ib_global_route,
    ib_is_udata_cleared,
    ib_port_attr,
    ib_qp_attr,
    ib_qp_cap,
    ib_qp_init_attr,
    ib_respond_udata,
    ib_srq_attr,
    ib_srq_init_attr,
    rdma_ah_attr,
    rdma_ah_find_type,
)
from drivers.ib_core.rdma_core import (
    UVERBS_LOOKUP_DESTROY,
    UVERBS_LOOKUP_READ,
    UVERBS_LOOKUP_WRITE,
    ib_uverbs_get_ucontext_file,
    rdma_alloc_abort_uobject,
    rdma_alloc_begin_uobject,
    rdma_alloc_commit_uobject,
    rdma_assign_uobject,
    rdma_lookup_get_uobject,
    rdma_lookup_put_uobject,
    uobj_finalize_uobj_create,
    uobj_perform_destroy,
    uverbs_attr_bundle,
)
from drivers.ib_core.uverbs_comp_event import (
    ib_uverbs_alloc_comp_event_file,
    ib_uverbs_comp_handler,
    ib_uverbs_init_ucq,
    ib_uverbs_init_uevent,
    ib_uverbs_lookup_comp_file,
    ib_uverbs_release_ucq,
)
from drivers.ib_core.uverbs_std_types import (
    UVERBS_OBJECT_AH,
    UVERBS_OBJECT_CQ,
    UVERBS_OBJECT_MR,
    UVERBS_OBJECT_MW,
    UVERBS_OBJECT_PD,
    UVERBS_OBJECT_QP,
    UVERBS_OBJECT_SRQ,
    UVERBS_OBJECT_XRCD,
)
from drivers.ib_core.uverbs_std_types_async_fd import (
    ib_uverbs_alloc_async_event_file,
    ib_uverbs_cq_event_handler,
    ib_uverbs_get_async_event,
    ib_uverbs_qp_event_handler,
    ib_uverbs_srq_event_handler,
)
from drivers.ib_core.verbs import (
    IB_MR_TYPE_USER,
    ib_alloc_xrcd_user,
    ib_create_qp_user,
    ib_create_srq_user,
    ib_modify_qp_with_udata,
    ib_query_port,
    ib_query_qp,
    ib_reg_user_mr,
    rdma_create_user_ah,
    rdma_port_get_link_layer,
)
from kernel_model.current import current
from kernel_model.errno import EAGAIN, EBADF, EINVAL, EOPNOTSUPP, EPERM, KernelError
from kernel_model.fs import O_CREAT, O_EXCL, fput
from kernel_model.refcount import atomic_dec, atomic_inc, atomic_t
from kernel_model.task import CAP_NET_RAW, capable
from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.ustruct import UStruct

T = TypeVar("T", bound=UStruct)

IB_UVERBS_QPF_GRH_REQUIRED = 1 << 0  # ib_uverbs_query_port_flags


def uverbs_request(attrs_: uverbs_attr_bundle, cls: type[T]) -> T:
    """Mirrors uverbs_request(): copy the core request (shorter: zero-filled; longer:
    the bytes past it must be zero, EOPNOTSUPP otherwise)."""
    if attrs_.ucore.inlen > cls.SIZE and \
            not ib_is_udata_cleared(attrs_.ucore, cls.SIZE, attrs_.ucore.inlen - cls.SIZE):
        raise KernelError(EOPNOTSUPP, f"uverbs_request: non-zero bytes past {cls.__name__}")
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


def copy_query_dev_fields(ib_dev: Any, a: Any) -> uv.ib_uverbs_query_device_resp:
    """Mirrors copy_query_dev_fields(): the legacy response from ib_device_attr."""
    return uv.ib_uverbs_query_device_resp(
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
        phys_port_cnt=ib_dev.phys_port_cnt)


@traced
def ib_uverbs_query_device(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_query_device(): the attributes cached at registration."""
    ucontext = ib_uverbs_get_ucontext_file(attrs_.ufile)
    uverbs_request(attrs_, uv.ib_uverbs_query_device)
    ib_dev = ucontext.device
    uverbs_response(attrs_, copy_query_dev_fields(ib_dev, ib_dev.attrs))


@traced
def ib_uverbs_ex_query_device(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_query_device(): EINVAL for a comp_mask or reserved bit;
    the driver is asked afresh (ops.query_device with the driver udata), and the
    response is the legacy one plus the extended capabilities, response_length
    saying how much of it the caller's buffer took."""
    ucontext = ib_uverbs_get_ucontext_file(attrs_.ufile)
    ib_dev = ucontext.device
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_query_device)
    if cmd.comp_mask:
        raise KernelError(EINVAL, f"ib_uverbs_ex_query_device: comp_mask {cmd.comp_mask:#x}")
    if cmd.reserved:
        raise KernelError(EINVAL, "ib_uverbs_ex_query_device: reserved field set")
    a = ib_device_attr()
    ib_dev.ops.query_device(ib_dev, a, attrs_.driver_udata)
    odp = a.odp_caps
    resp = uv.ib_uverbs_ex_query_device_resp(
        base=copy_query_dev_fields(ib_dev, a),
        odp_caps=uv.ib_uverbs_odp_caps(general_caps=odp.general_caps,
                                       rc_odp_caps=odp.rc_odp_caps,
                                       uc_odp_caps=odp.uc_odp_caps,
                                       ud_odp_caps=odp.ud_odp_caps),
        xrc_odp_caps=odp.xrc_odp_caps, timestamp_mask=a.timestamp_mask,
        hca_core_clock=a.hca_core_clock, device_cap_flags_ex=a.device_cap_flags,
        rss_caps=uv.ib_uverbs_rss_caps(
            supported_qpts=a.rss_caps.supported_qpts,
            max_rwq_indirection_tables=a.rss_caps.max_rwq_indirection_tables,
            max_rwq_indirection_table_size=a.rss_caps.max_rwq_indirection_table_size),
        max_wq_type_rq=a.max_wq_type_rq, raw_packet_caps=a.raw_packet_caps,
        tm_caps=uv.ib_uverbs_tm_caps(
            max_rndv_hdr_size=a.tm_caps.max_rndv_hdr_size, max_num_tags=a.tm_caps.max_num_tags,
            max_ops=a.tm_caps.max_ops, max_sge=a.tm_caps.max_sge, flags=a.tm_caps.flags),
        cq_moderation_caps=uv.ib_uverbs_cq_moderation_caps(
            max_cq_moderation_count=a.cq_caps.max_cq_moderation_count,
            max_cq_moderation_period=a.cq_caps.max_cq_moderation_period),
        max_dm_size=a.max_dm_size)
    resp.response_length = min(attrs_.ucore.outlen, resp.SIZE)  # uverbs_response_length()
    uverbs_response(attrs_, resp)


def copy_port_attr_to_resp(attr: ib_port_attr, resp_cls: type[T], ib_dev: Any,
                           port_num: int, **extra: int) -> T:
    """Mirrors copy_port_attr_to_resp(): the legacy port answer from ib_port_attr, plus
    the link layer and, for RoCE, the GRH-required flag (shared by the write command
    and UVERBS_METHOD_QUERY_PORT, whose response_ex adds `extra`)."""
    link_layer = rdma_port_get_link_layer(ib_dev, port_num)
    return resp_cls(
        port_cap_flags=attr.port_cap_flags, max_msg_sz=attr.max_msg_sz,
        bad_pkey_cntr=attr.bad_pkey_cntr, qkey_viol_cntr=attr.qkey_viol_cntr,
        gid_tbl_len=attr.gid_tbl_len, pkey_tbl_len=attr.pkey_tbl_len, lid=attr.lid,
        sm_lid=attr.sm_lid, state=attr.state, max_mtu=attr.max_mtu,
        active_mtu=attr.active_mtu, lmc=attr.lmc, max_vl_num=attr.max_vl_num,
        sm_sl=attr.sm_sl, subnet_timeout=attr.subnet_timeout,
        init_type_reply=attr.init_type_reply, active_width=attr.active_width,
        active_speed=attr.active_speed & 0xFF, phys_state=attr.phys_state,
        link_layer=link_layer,
        flags=IB_UVERBS_QPF_GRH_REQUIRED if link_layer == IB_LINK_LAYER_ETHERNET else 0,
        **extra)


@traced
def ib_uverbs_query_port(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_query_port(): ib_query_port, then copy_port_attr_to_resp."""
    ucontext = ib_uverbs_get_ucontext_file(attrs_.ufile)
    cmd = uverbs_request(attrs_, uv.ib_uverbs_query_port)
    ib_dev = ucontext.device
    attr = ib_port_attr()
    ib_query_port(ib_dev, cmd.port_num, attr)
    uverbs_response(attrs_, copy_port_attr_to_resp(attr, uv.ib_uverbs_query_port_resp, ib_dev,
                                                   cmd.port_num))


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


@traced
def ib_uverbs_rereg_mr(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_rereg_mr(): change an MR's translation, PD and/or access.

    EINVAL for no flags, EOPNOTSUPP for unknown ones, EINVAL for TRANS when start
    and hca_va do not share their page offset; the MR handle's lookup errors
    (ENOENT, EINVAL for another type, EBUSY while in use); ib_check_mr_access's
    errors for ACCESS; EINVAL for a bad PD handle; the driver's errors.  The driver
    changes the MR in place (ops.rereg_user_mr returns None) or returns a new MR,
    which takes over the handle (a new uobject in the old one's slot) while the old
    MR is deregistered.  (A device-memory MR - EINVAL - is not modelled.)
    """
    cmd = uverbs_request(attrs_, uv.ib_uverbs_rereg_mr)
    if not cmd.flags:
        raise KernelError(EINVAL, "ib_uverbs_rereg_mr: no flags")
    if cmd.flags & ~IB_MR_REREG_SUPPORTED:
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_rereg_mr: unknown flags {cmd.flags:#x}")
    page_mask = current().machine.page_size - 1
    if cmd.flags & IB_MR_REREG_TRANS and cmd.start & page_mask != cmd.hca_va & page_mask:
        raise KernelError(EINVAL, "ib_uverbs_rereg_mr: start and hca_va page offsets differ")
    # uobj_get_write()
    uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_MR, attrs_.ufile, cmd.mr_handle,
                                   UVERBS_LOOKUP_WRITE, attrs_)
    try:
        mr = uobj.object
        if cmd.flags & IB_MR_REREG_ACCESS:
            ib_check_mr_access(mr.device, cmd.access_flags)
        orig_pd = mr.pd
        pd_uobj = None
        if cmd.flags & IB_MR_REREG_PD:
            pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle,
                                        "ib_uverbs_rereg_mr")
            new_pd = pd_uobj.object
        else:
            new_pd = mr.pd
        try:
            # the driver may create a new hardware object: a uobject ready to hold it
            new_uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_MR, attrs_)
            try:
                ib_dev = new_uobj.context.device
                new_mr = ib_dev.ops.rereg_user_mr(mr, cmd.flags, cmd.start, cmd.length,
                                                  cmd.hca_va, cmd.access_flags, new_pd,
                                                  attrs_.driver_udata)
                if new_mr is not None:
                    new_mr.device, new_mr.pd = new_pd.device, new_pd
                    new_mr.type, new_mr.uobject = IB_MR_TYPE_USER, uobj
                    atomic_inc(new_pd.usecnt)
                    new_mr.iova = cmd.hca_va
                    new_uobj.object = new_mr
                    # the new uobject takes the old one's handle; the old MR is destroyed
                    rdma_assign_uobject(uobj, new_uobj, attrs_)
                    rdma_alloc_commit_uobject(new_uobj, attrs_)
                    rdma_lookup_put_uobject(uobj, UVERBS_LOOKUP_DESTROY)   # uobj_put_destroy
                    new_uobj = uobj = None
                    mr = new_mr
                else:
                    if cmd.flags & IB_MR_REREG_PD:
                        atomic_dec(orig_pd.usecnt)
                        mr.pd = new_pd
                        atomic_inc(new_pd.usecnt)
                    if cmd.flags & IB_MR_REREG_TRANS:
                        mr.iova = cmd.hca_va
                uverbs_response(attrs_, uv.ib_uverbs_rereg_mr_resp(lkey=mr.lkey, rkey=mr.rkey))
            finally:
                if new_uobj is not None:
                    rdma_alloc_abort_uobject(new_uobj, attrs_)
        finally:
            if pd_uobj is not None:
                rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    finally:
        if uobj is not None:
            rdma_lookup_put_uobject(uobj, UVERBS_LOOKUP_WRITE)


@traced
def ib_uverbs_alloc_mw(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_alloc_mw(): a memory window of type 1 or 2 in the PD.

    EINVAL for a bad PD handle or another type; the driver's errors (EOPNOTSUPP
    from a device without alloc_mw)."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_alloc_mw)
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_MW, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)          # the write path aborts it on error
    ib_dev = uobj.context.device
    pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle, "ib_uverbs_alloc_mw")
    try:
        pd = pd_uobj.object
        if cmd.mw_type not in (IB_MW_TYPE_1, IB_MW_TYPE_2):
            raise KernelError(EINVAL, f"ib_uverbs_alloc_mw: memory window type {cmd.mw_type}")
        if ib_dev.ops.alloc_mw is None:
            raise KernelError(EOPNOTSUPP, "ib_uverbs_alloc_mw: no alloc_mw")
        mw = rdma_zalloc_drv_obj(ib_dev, "ib_mw")
        mw.device, mw.pd, mw.uobject, mw.type = ib_dev, pd, uobj, cmd.mw_type
        ib_dev.ops.alloc_mw(mw, attrs_.driver_udata)
        atomic_inc(pd.usecnt)
        uobj.object = mw
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    uverbs_response(attrs_, uv.ib_uverbs_alloc_mw_resp(mw_handle=uobj.id, rkey=mw.rkey))


@traced
def ib_uverbs_dealloc_mw(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_dealloc_mw()."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_dealloc_mw)
    uobj_perform_destroy(UVERBS_OBJECT_MW, cmd.mw_handle, attrs_)


# -- CQ ----------------------------------------------------------------------------
@traced
def ib_uverbs_create_comp_channel(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_comp_channel(): a new completion event file; its fd
    is the response."""
    uverbs_request(attrs_, uv.ib_uverbs_create_comp_channel)
    ib_uverbs_get_ucontext_file(attrs_.ufile)
    fd = ib_uverbs_alloc_comp_event_file(attrs_.ufile)
    try:
        uverbs_response(attrs_, uv.ib_uverbs_create_comp_channel_resp(fd=fd))
    except KernelError:
        current().files.close_fd(fd)
        raise


@traced
def create_cq(attrs_: uverbs_attr_bundle, cmd: uv.ib_uverbs_ex_create_cq) -> Any:
    """Mirrors create_cq(): EINVAL for a comp_vector beyond the device's; the channel
    (EBADF for an fd that is none); ops.create_cq with the flags; the CQ reports
    completion events to ib_uverbs_comp_handler.  Returns the new CQ."""
    ufile = attrs_.ufile
    if cmd.comp_vector >= ufile.device.num_comp_vectors:
        raise KernelError(EINVAL, f"create_cq: comp_vector {cmd.comp_vector} out of range")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_CQ, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    ev_file = None
    if cmd.comp_channel >= 0:
        ev_file = ib_uverbs_lookup_comp_file(cmd.comp_channel, ufile)
    ib_uverbs_init_ucq(uobj, ev_file, ib_uverbs_get_async_event(attrs_))
    try:
        uobj.user_handle = cmd.user_handle
        ib_dev = uobj.context.device
        cq = rdma_zalloc_drv_obj(ib_dev, "ib_cq")
        cq.uobject = uobj
        cq.comp_handler = ib_uverbs_comp_handler
        cq.cq_context = ev_file.ev_queue if ev_file is not None else None
        cq.event_handler = ib_uverbs_cq_event_handler
        ib_dev.ops.create_cq(cq, ib_cq_init_attr(cqe=cmd.cqe, comp_vector=cmd.comp_vector,
                                                 flags=cmd.flags), attrs_.driver_udata)
    except BaseException:
        ib_uverbs_release_ucq(uobj)                                      # err_file:
        raise
    uobj.object = cq
    return cq


@traced
def ib_uverbs_create_cq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_cq(): the legacy request as an extended one, create_cq."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_create_cq)
    cq = create_cq(attrs_, uv.ib_uverbs_ex_create_cq(
        user_handle=cmd.user_handle, cqe=cmd.cqe, comp_vector=cmd.comp_vector,
        comp_channel=cmd.comp_channel))
    uverbs_response(attrs_, uv.ib_uverbs_create_cq_resp(cq_handle=cq.uobject.id, cqe=cq.cqe))


@traced
def ib_uverbs_ex_create_cq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_create_cq(): EINVAL for a comp_mask or reserved bits, then
    create_cq with the flags; the response says how much of it the buffer took."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_create_cq)
    if cmd.comp_mask:
        raise KernelError(EINVAL, f"ib_uverbs_ex_create_cq: comp_mask {cmd.comp_mask:#x}")
    if cmd.reserved:
        raise KernelError(EINVAL, "ib_uverbs_ex_create_cq: reserved field set")
    cq = create_cq(attrs_, cmd)
    resp = uv.ib_uverbs_ex_create_cq_resp(
        base=uv.ib_uverbs_create_cq_resp(cq_handle=cq.uobject.id, cqe=cq.cqe))
    resp.response_length = min(attrs_.ucore.outlen, resp.SIZE)  # uverbs_response_length()
    uverbs_response(attrs_, resp)


@traced
def ib_uverbs_resize_cq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_resize_cq(): EINVAL for a bad handle; ops.resize_cq
    (EOPNOTSUPP without one); the CQ's new size is the response."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_resize_cq)
    cq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.cq_handle,
                                "ib_uverbs_resize_cq")
    try:
        cq = cq_uobj.object
        if cq.device.ops.resize_cq is None:
            raise KernelError(EOPNOTSUPP, "ib_uverbs_resize_cq: no resize_cq")
        cq.device.ops.resize_cq(cq, cmd.cqe, attrs_.driver_udata)
        uverbs_response(attrs_, uv.ib_uverbs_resize_cq_resp(cqe=cq.cqe))
    finally:
        rdma_lookup_put_uobject(cq_uobj, UVERBS_LOOKUP_READ)


@traced
def ib_uverbs_destroy_cq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_destroy_cq(): EBUSY while QPs are attached; the response
    counts the completion events read() reported, which the library waits to see
    acknowledged."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_destroy_cq)
    uobj = uobj_perform_destroy(UVERBS_OBJECT_CQ, cmd.cq_handle, attrs_)
    uverbs_response(attrs_, uv.ib_uverbs_destroy_cq_resp(
        comp_events_reported=uobj.comp_events_reported,
        async_events_reported=uobj.events_reported))


# -- QP ----------------------------------------------------------------------------
#: the create flags user space may ask for (create_qp's check; the rest are the kernel's)
_UVERBS_QP_CREATE_FLAGS = (IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK | IB_QP_CREATE_CROSS_CHANNEL
                           | IB_QP_CREATE_MANAGED_SEND | IB_QP_CREATE_MANAGED_RECV
                           | IB_QP_CREATE_SCATTER_FCS | IB_QP_CREATE_CVLAN_STRIPPING
                           | IB_QP_CREATE_SOURCE_QPN | IB_QP_CREATE_PCI_WRITE_END_PADDING)


@traced
def ib_uverbs_create_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_qp(): the legacy request as an extended one (no comp_mask,
    no create flags), create_qp."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_create_qp)
    create_qp(attrs_, uv.ib_uverbs_ex_create_qp(
        user_handle=cmd.user_handle, pd_handle=cmd.pd_handle,
        send_cq_handle=cmd.send_cq_handle, recv_cq_handle=cmd.recv_cq_handle,
        srq_handle=cmd.srq_handle, max_send_wr=cmd.max_send_wr, max_recv_wr=cmd.max_recv_wr,
        max_send_sge=cmd.max_send_sge, max_recv_sge=cmd.max_recv_sge,
        max_inline_data=cmd.max_inline_data, sq_sig_all=cmd.sq_sig_all, qp_type=cmd.qp_type,
        is_srq=cmd.is_srq))


@traced
def ib_uverbs_ex_create_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_create_qp(): EINVAL for a comp_mask bit beyond IND_TABLE or
    the reserved byte set, then create_qp."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_create_qp)
    if cmd.comp_mask & ~uv.IB_UVERBS_CREATE_QP_SUP_COMP_MASK:
        raise KernelError(EINVAL, f"ib_uverbs_ex_create_qp: comp_mask {cmd.comp_mask:#x}")
    if cmd.reserved:
        raise KernelError(EINVAL, "ib_uverbs_ex_create_qp: reserved field set")
    create_qp(attrs_, cmd)


@traced
def create_qp(attrs_: uverbs_attr_bundle, cmd: uv.ib_uverbs_ex_create_qp) -> None:
    """Mirrors create_qp() (uverbs_cmd.c): a RAW_PACKET QP needs CAP_NET_RAW (EPERM);
    an XRC target QP names its XRC domain in pd_handle (EINVAL for a bad handle) and
    nothing else; any other QP its PD, the SRQ (is_srq: EINVAL for a bad handle or an
    XRC SRQ; an XRC initiator has no receive side) and the CQs (read-locked for the
    duration); create flags beyond those user space may ask for are EINVAL, a source
    QPN needs CAP_NET_RAW (EPERM); ops.create_qp, report the real caps.  The domain's
    handle counts the target QP.
    # EMU: receive work-queue indirection tables (IND_TABLE) are not modelled: EOPNOTSUPP.
    """
    if cmd.qp_type == IB_QPT_RAW_PACKET and not capable(CAP_NET_RAW):
        raise KernelError(EPERM, "create_qp: RAW_PACKET QP needs CAP_NET_RAW")
    if cmd.comp_mask & uv.IB_UVERBS_CREATE_QP_MASK_IND_TABLE:
        raise KernelError(EOPNOTSUPP, "create_qp: RWQ indirection tables are not modelled")
    if cmd.create_flags & ~_UVERBS_QP_CREATE_FLAGS:
        raise KernelError(EINVAL, f"create_qp: create flags {cmd.create_flags:#x}")
    if cmd.create_flags & IB_QP_CREATE_SOURCE_QPN and not capable(CAP_NET_RAW):
        raise KernelError(EPERM, "create_qp: IB_QP_CREATE_SOURCE_QPN needs CAP_NET_RAW")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_QP, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    uobj.user_handle = cmd.user_handle
    ib_uverbs_init_uevent(uobj, ib_uverbs_get_async_event(attrs_))
    held = []
    if cmd.qp_type == IB_QPT_XRC_TGT:
        xrcd_uobj = uobj_get_obj_read(UVERBS_OBJECT_XRCD, attrs_, cmd.pd_handle, "create_qp")
        try:
            attr = ib_qp_init_attr(qp_type=cmd.qp_type, xrcd=xrcd_uobj.object,
                                   sq_sig_type=0 if cmd.sq_sig_all else 1,
                                   create_flags=cmd.create_flags,
                                   event_handler=ib_uverbs_qp_event_handler)
            qp = ib_create_qp_user(xrcd_uobj.object.device, None, attr, None, uobj)
            uobj.object = qp
            uobj.uxrcd = xrcd_uobj
            atomic_inc(xrcd_uobj.refcnt)
        finally:
            rdma_lookup_put_uobject(xrcd_uobj, UVERBS_LOOKUP_READ)
        _create_qp_response(attrs_, uv.ib_uverbs_create_qp_resp(qp_handle=uobj.id,
                                                                qpn=qp.qp_num))
        return
    if cmd.qp_type == IB_QPT_XRC_INI:
        cmd.max_recv_wr = cmd.max_recv_sge = 0
    try:
        pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle, "create_qp")
        held.append(pd_uobj)
        srq = None
        if cmd.is_srq and cmd.qp_type != IB_QPT_XRC_INI:
            srq_uobj = uobj_get_obj_read(UVERBS_OBJECT_SRQ, attrs_, cmd.srq_handle,
                                         "create_qp")
            held.append(srq_uobj)
            srq = srq_uobj.object
            if srq.srq_type == IB_SRQT_XRC:
                raise KernelError(EINVAL, "create_qp: an XRC SRQ serves XRC QPs only")
        scq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.send_cq_handle,
                                     "create_qp")
        held.append(scq_uobj)
        if cmd.qp_type == IB_QPT_XRC_INI:
            rcq_uobj = None
        elif cmd.recv_cq_handle != cmd.send_cq_handle:
            rcq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.recv_cq_handle,
                                         "create_qp")
            held.append(rcq_uobj)
        else:
            rcq_uobj = scq_uobj
        attr = ib_qp_init_attr(
            send_cq=scq_uobj.object, recv_cq=rcq_uobj.object if rcq_uobj else None, srq=srq,
            qp_type=cmd.qp_type,
            sq_sig_type=0 if cmd.sq_sig_all else 1, create_flags=cmd.create_flags,
            source_qpn=cmd.source_qpn if cmd.create_flags & IB_QP_CREATE_SOURCE_QPN else 0,
            cap=ib_qp_cap(cmd.max_send_wr, cmd.max_recv_wr, cmd.max_send_sge,
                          cmd.max_recv_sge, cmd.max_inline_data),
            event_handler=ib_uverbs_qp_event_handler)
        qp = ib_create_qp_user(uobj.context.device, pd_uobj.object, attr,
                               attrs_.driver_udata, uobj)
        uobj.object = qp
    finally:
        for held_uobj in held:
            rdma_lookup_put_uobject(held_uobj, UVERBS_LOOKUP_READ)
    cap = attr.cap
    _create_qp_response(attrs_, uv.ib_uverbs_create_qp_resp(
        qp_handle=uobj.id, qpn=qp.qp_num, max_send_wr=cap.max_send_wr,
        max_recv_wr=cap.max_recv_wr, max_send_sge=cap.max_send_sge,
        max_recv_sge=cap.max_recv_sge, max_inline_data=cap.max_inline_data))


def _create_qp_response(attrs_: uverbs_attr_bundle, base: uv.ib_uverbs_create_qp_resp) -> None:
    """create_qp's response: the extended one, of which a legacy caller's buffer takes
    the base (uverbs_response copies what fits); response_length says how much."""
    resp = uv.ib_uverbs_ex_create_qp_resp(base=base)
    resp.response_length = min(attrs_.ucore.outlen, resp.SIZE)  # uverbs_response_length()
    uverbs_response(attrs_, resp)


@traced
def ib_uverbs_destroy_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_destroy_qp(): the response counts the async events read()
    reported for the QP, which the library waits to see acknowledged."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_destroy_qp)
    uobj = uobj_perform_destroy(UVERBS_OBJECT_QP, cmd.qp_handle, attrs_)
    uverbs_response(attrs_, uv.ib_uverbs_destroy_qp_resp(
        events_reported=getattr(uobj, "events_reported", 0)))


# -- XRC domains -------------------------------------------------------------------
@traced
def ib_uverbs_open_xrcd(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_open_xrcd(): fd -1 is a private XRC domain; otherwise the
    domain shared by the file's inode (EBADF for an fd that is none): an existing
    one (EINVAL with O_EXCL) or, with O_CREAT, a new one entered in the device's
    inode table (EAGAIN without).  Each handle on a shared domain counts one use."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_open_xrcd)
    dev = attrs_.ufile.device
    # EMU: the handle is reserved before xrcd_tree_mutex is taken: the kernel takes
    # hw_destroy_rwsem with a trylock inside it, the model's down_read would order
    # the two locks against uverbs_free_xrcd's.  A failure aborts the handle either way.
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_XRCD, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    uobj.refcnt = atomic_t(0)
    with dev.xrcd_tree_mutex:
        inode, xrcd = None, None
        if cmd.fd != 0xFFFFFFFF:
            try:
                f = current().files.fget(cmd.fd)
            except KernelError:
                raise KernelError(EBADF, f"ib_uverbs_open_xrcd: fd {cmd.fd}") from None
            inode = f.f_inode
            fput(f)
            entry = dev.xrcd_tree.get(id(inode))
            xrcd = entry[1] if entry is not None else None
            if xrcd is None and not cmd.oflags & O_CREAT:
                raise KernelError(EAGAIN, "ib_uverbs_open_xrcd: no XRCD for this file "
                                  "and no O_CREAT")
            if xrcd is not None and cmd.oflags & O_EXCL:
                raise KernelError(EINVAL, "ib_uverbs_open_xrcd: O_EXCL and the file's "
                                  "XRCD exists")
        if xrcd is None:
            xrcd = ib_alloc_xrcd_user(uobj.context.device, inode, attrs_.driver_udata)
            if inode is not None:
                dev.xrcd_tree[id(inode)] = (inode, xrcd)    # xrcd_table_insert
        if inode is not None:
            atomic_inc(xrcd.usecnt)
        uobj.object = xrcd
    uverbs_response(attrs_, uv.ib_uverbs_open_xrcd_resp(xrcd_handle=uobj.id))


@traced
def ib_uverbs_close_xrcd(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_close_xrcd(): EBUSY while XRC SRQs or target QPs made
    through the handle live."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_close_xrcd)
    uobj_perform_destroy(UVERBS_OBJECT_XRCD, cmd.xrcd_handle, attrs_)


# -- SRQ ---------------------------------------------------------------------------
@traced
def __uverbs_create_xsrq(attrs_: uverbs_attr_bundle, cmd: uv.ib_uverbs_create_xsrq) -> None:
    """Mirrors __uverbs_create_xsrq(): an XRC SRQ's domain (EINVAL for a bad
    handle; the handle counts one user more) and CQ; the PD (EINVAL for a bad
    handle); ops.create_srq with the requested sizes, the new handle and the
    real sizes in the response (the SRQ number for an XRC SRQ only).

    EMU: tag-matching SRQs are not modelled (EOPNOTSUPP).
    """
    if cmd.srq_type == IB_SRQT_TM:
        raise KernelError(EOPNOTSUPP, "__uverbs_create_xsrq: tag-matching SRQs are not "
                          "modelled")
    if cmd.srq_type not in (IB_SRQT_BASIC, IB_SRQT_XRC):
        raise KernelError(EINVAL, f"__uverbs_create_xsrq: SRQ type {cmd.srq_type}")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_SRQ, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    uobj.user_handle = cmd.user_handle
    ib_uverbs_init_uevent(uobj, ib_uverbs_get_async_event(attrs_))
    attr = ib_srq_init_attr(attr=ib_srq_attr(cmd.max_wr, cmd.max_sge, cmd.srq_limit),
                            srq_type=cmd.srq_type, event_handler=ib_uverbs_srq_event_handler)
    held = []
    try:
        xrcd_uobj = None
        if cmd.srq_type == IB_SRQT_XRC:
            xrcd_uobj = uobj_get_obj_read(UVERBS_OBJECT_XRCD, attrs_, cmd.xrcd_handle,
                                          "__uverbs_create_xsrq")
            held.append(xrcd_uobj)
            attr.xrcd = xrcd_uobj.object
            cq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.cq_handle,
                                        "__uverbs_create_xsrq")
            held.append(cq_uobj)
            attr.cq = cq_uobj.object
        pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle,
                                    "__uverbs_create_xsrq")
        held.append(pd_uobj)
        srq = ib_create_srq_user(pd_uobj.object, attr, attrs_.driver_udata, uobj)
        uobj.object = srq
        if xrcd_uobj is not None:
            uobj.uxrcd = xrcd_uobj
            atomic_inc(xrcd_uobj.refcnt)
    finally:
        for h in held:
            rdma_lookup_put_uobject(h, UVERBS_LOOKUP_READ)
    uverbs_response(attrs_, uv.ib_uverbs_create_srq_resp(
        srq_handle=uobj.id, max_wr=attr.attr.max_wr, max_sge=attr.attr.max_sge,
        srqn=srq.srq_num if cmd.srq_type == IB_SRQT_XRC else 0))


@traced
def ib_uverbs_create_srq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_srq(): a basic SRQ through __uverbs_create_xsrq."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_create_srq)
    __uverbs_create_xsrq(attrs_, uv.ib_uverbs_create_xsrq(
        response=cmd.response, user_handle=cmd.user_handle, srq_type=IB_SRQT_BASIC,
        pd_handle=cmd.pd_handle, max_wr=cmd.max_wr, max_sge=cmd.max_sge,
        srq_limit=cmd.srq_limit))


@traced
def ib_uverbs_create_xsrq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_xsrq(): __uverbs_create_xsrq with the type given."""
    __uverbs_create_xsrq(attrs_, uverbs_request(attrs_, uv.ib_uverbs_create_xsrq))


@traced
def ib_uverbs_modify_srq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_modify_srq(): EINVAL for mask bits past IB_SRQ_LIMIT or a
    bad handle, then ops.modify_srq with the max_wr / srq_limit the mask names."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_modify_srq)
    if cmd.attr_mask > IB_SRQ_LIMIT:
        raise KernelError(EINVAL, f"ib_uverbs_modify_srq: attr_mask {cmd.attr_mask:#x}")
    srq_uobj = uobj_get_obj_read(UVERBS_OBJECT_SRQ, attrs_, cmd.srq_handle,
                                 "ib_uverbs_modify_srq")
    try:
        srq = srq_uobj.object
        srq.device.ops.modify_srq(srq, ib_srq_attr(max_wr=cmd.max_wr, srq_limit=cmd.srq_limit),
                                  cmd.attr_mask, attrs_.driver_udata)
    finally:
        rdma_lookup_put_uobject(srq_uobj, UVERBS_LOOKUP_READ)


@traced
def ib_uverbs_query_srq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_query_srq() -> ib_query_srq(): EINVAL for a bad handle,
    EOPNOTSUPP without ops.query_srq; the sizes and the armed limit."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_query_srq)
    srq_uobj = uobj_get_obj_read(UVERBS_OBJECT_SRQ, attrs_, cmd.srq_handle,
                                 "ib_uverbs_query_srq")
    attr = ib_srq_attr()
    try:
        srq = srq_uobj.object
        if srq.device.ops.query_srq is None:
            raise KernelError(EOPNOTSUPP, "ib_query_srq: no query_srq")
        srq.device.ops.query_srq(srq, attr)
    finally:
        rdma_lookup_put_uobject(srq_uobj, UVERBS_LOOKUP_READ)
    uverbs_response(attrs_, uv.ib_uverbs_query_srq_resp(
        max_wr=attr.max_wr, max_sge=attr.max_sge, srq_limit=attr.srq_limit))


@traced
def ib_uverbs_destroy_srq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_destroy_srq(): EBUSY while QPs use it; the response counts
    the async events read() reported for it, which the library waits to see
    acknowledged."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_destroy_srq)
    uobj = uobj_perform_destroy(UVERBS_OBJECT_SRQ, cmd.srq_handle, attrs_)
    uverbs_response(attrs_, uv.ib_uverbs_destroy_srq_resp(
        events_reported=uobj.events_reported))


# -- AH ----------------------------------------------------------------------------
@traced
def ib_uverbs_create_ah(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_create_ah(): EINVAL for a port the device does not have or a
    PD handle it cannot find; the address vector as the core's (its type from the
    port), rdma_create_user_ah, the new handle in the response."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_create_ah)
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_AH, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)  # from here on the write path aborts it
    ib_dev = uobj.context.device
    a = cmd.attr
    if not rdma_is_port_valid(ib_dev, a.port_num):
        raise KernelError(EINVAL, f"ib_uverbs_create_ah: port {a.port_num}")
    pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle, "ib_uverbs_create_ah")
    try:
        attr = rdma_ah_attr(type=rdma_ah_find_type(ib_dev, a.port_num), dlid=a.dlid, sl=a.sl,
                            src_path_bits=a.src_path_bits, static_rate=a.static_rate,
                            port_num=a.port_num)
        if a.is_global:
            g = a.grh
            attr.ah_flags = IB_AH_GRH
            attr.grh = ib_global_route(dgid=g.dgid, flow_label=g.flow_label,
                                       sgid_index=g.sgid_index, hop_limit=g.hop_limit,
                                       traffic_class=g.traffic_class)
        ah = rdma_create_user_ah(pd_uobj.object, attr, attrs_.driver_udata)
        ah.uobject = uobj
        uobj.user_handle = cmd.user_handle
        uobj.object = ah
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    uverbs_response(attrs_, uv.ib_uverbs_create_ah_resp(ah_handle=uobj.id))


@traced
def ib_uverbs_destroy_ah(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_destroy_ah()."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_destroy_ah)
    uobj_perform_destroy(UVERBS_OBJECT_AH, cmd.ah_handle, attrs_)


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
def ib_uverbs_ex_modify_qp(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_modify_qp(): EOPNOTSUPP for attribute bits past the
    standard ones and the rate limit, then modify_qp with the legacy part; the
    response is its length (the driver answers in its own udata, e.g. a DCT's
    number).  # EMU: the rate limit (IB_QP_RATE_LIMIT) is not passed on."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_modify_qp)
    resp = uv.ib_uverbs_ex_modify_qp_resp()
    resp.response_length = min(attrs_.ucore.outlen, resp.SIZE)  # uverbs_response_length()
    if cmd.base.attr_mask & ~(IB_QP_ATTR_STANDARD_BITS | IB_QP_RATE_LIMIT):
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_ex_modify_qp: attr_mask "
                          f"{cmd.base.attr_mask:#x}")
    modify_qp(attrs_, cmd.base)
    uverbs_response(attrs_, resp)


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

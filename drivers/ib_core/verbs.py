"""Mirrors drivers/infiniband/core/verbs.c: the core side of creating, modifying and
destroying verbs objects, around the driver's ops.

The core keeps the reference counts that make destroy order matter: a PD
counts the MRs and QPs made in it, a CQ the QPs attached to it
(`usecnt`).  Creating a QP takes a count on its PD and both CQs after the
driver succeeded; destroying it drops them after the driver has destroyed
the QP, so a PD or CQ is never freed under a live QP.

The QP state machine is a table (qp_state_table): for each legal
transition, the attributes a QP type must and may give.  The driver checks a
modify against it (ib_modify_qp_is_ok); the core's part of a modify
(_ib_modify_qp) is the address vector: its source GID must be in the port's
GID table (the QP holds that entry), a RoCE one must carry a GRH, and for a
connected QP the destination MAC is resolved from the destination GID.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.cache import rdma_get_gid_attr, rdma_hold_gid_attr, rdma_put_gid_attr
from drivers.ib_core.device import ib_query_port, rdma_zalloc_drv_obj  # noqa: F401 - re-exported
from drivers.ib_core.ib_addr import (
    ip_eth_mc_map,
    ipv6_addr_v4mapped,
    ipv6_eth_mc_map,
    rdma_get_ll_mac,
    rdma_is_multicast_addr,
    rdma_link_local_addr,
)
from drivers.ib_core.ib_verbs import (
    IB_AH_GRH,
    IB_GID_TYPE_ROCE,
    IB_LINK_LAYER_INFINIBAND,
    IB_QP_ACCESS_FLAGS,
    IB_QP_ALT_PATH,
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
    IB_QP_RATE_LIMIT,
    IB_QP_RETRY_CNT,
    IB_QP_RNR_RETRY,
    IB_QP_RQ_PSN,
    IB_QP_SQ_PSN,
    IB_QP_STATE,
    IB_QP_TIMEOUT,
    IB_QPS_ERR,
    IB_QPS_INIT,
    IB_QPS_RESET,
    IB_QPS_RTR,
    IB_QPS_RTS,
    IB_QPS_SQD,
    IB_QPS_SQE,
    IB_QPT_GSI,
    IB_QPT_RAW_PACKET,
    IB_QPT_RC,
    IB_QPT_SMI,
    IB_QPT_UC,
    IB_QPT_UD,
    IB_QPT_XRC_INI,
    IB_QPT_XRC_TGT,
    RDMA_AH_ATTR_TYPE_ROCE,
    RDMA_CREATE_AH_SLEEPABLE,
    ib_is_destroy_retryable,
    ib_mr,
    ib_qp,
    ib_qp_attr,
    ib_qp_init_attr,
    ib_udata,
    rdma_ah_attr,
    rdma_ah_init_attr,
    rdma_is_port_valid,
    rdma_protocol_ib,
    rdma_protocol_roce,
)
from kernel_model.errno import EBUSY, EINVAL, EOPNOTSUPP, KernelError
from kernel_model.refcount import atomic_dec, atomic_inc, atomic_read
from kernel_model.trace import traced

IB_MR_TYPE_USER = 3  # enum ib_mr_type: MEM_REG, SG_GAPS, DM, USER


def ib_destroy_usecnt(usecnt: Any, why: int, uobj: Any, what: str) -> None:
    """Mirrors ib_destroy_usecnt(): an object still used refuses (EBUSY) while
    the destroy may be retried."""
    if atomic_read(usecnt) and ib_is_destroy_retryable(why, uobj):
        raise KernelError(EBUSY, f"ib_destroy_usecnt: {what} still in use "
                          f"(usecnt {atomic_read(usecnt)})")


@traced
def ib_dealloc_pd_user(pd: Any, udata: ib_udata) -> None:
    """Mirrors ib_dealloc_pd_user(): the driver frees it (a PD still in use is a
    bug the kernel WARNs about)."""
    if atomic_read(pd.usecnt):
        pd.device.machine.report_bug("ib_dealloc_pd_user", f"{pd} freed while in use")
    pd.device.ops.dealloc_pd(pd, udata)


@traced
def ib_reg_user_mr(pd: Any, start: int, length: int, virt_addr: int, access: int,
                   udata: ib_udata, uobj: Any) -> ib_mr:
    """The REG_MR core steps: ops.reg_user_mr, then fill the core fields and
    count the MR on its PD (ib_uverbs_reg_mr)."""
    mr = pd.device.ops.reg_user_mr(pd, start, length, virt_addr, access, udata)
    mr.device, mr.pd, mr.type, mr.uobject = pd.device, pd, IB_MR_TYPE_USER, uobj
    atomic_inc(pd.usecnt)
    return mr


def ib_reg_user_mr_dmabuf(pd: Any, offset: int, length: int, iova: int, fd: int, access: int,
                          udata: ib_udata, uobj: Any) -> ib_mr:
    """The REG_DMABUF_MR core steps: ops.reg_user_mr_dmabuf, then the core fields and
    the PD's count, as for ib_reg_user_mr."""
    mr = pd.device.ops.reg_user_mr_dmabuf(pd, offset, length, iova, fd, access, udata)
    mr.device, mr.pd, mr.type, mr.uobject = pd.device, pd, IB_MR_TYPE_USER, uobj
    atomic_inc(pd.usecnt)
    return mr


@traced
def ib_dereg_mr_user(mr: ib_mr, udata: ib_udata) -> None:
    """Mirrors ib_dereg_mr_user(): ops.dereg_mr, then drop the PD's (and a device-memory
    MR's DM's) count."""
    pd, dm = mr.pd, getattr(mr, "dm", None)
    mr.device.ops.dereg_mr(mr, udata)
    atomic_dec(pd.usecnt)
    if dm is not None:
        atomic_dec(dm.usecnt)


@traced
def ib_destroy_cq_user(cq: Any, udata: ib_udata) -> None:
    """Mirrors ib_destroy_cq_user(): EBUSY while QPs use it, else ops.destroy_cq."""
    if atomic_read(cq.usecnt):
        raise KernelError(EBUSY, f"ib_destroy_cq_user: {cq} still has QPs")
    cq.device.ops.destroy_cq(cq, udata)


@traced
def ib_create_qp_user(device: Any, pd: Any, attr: ib_qp_init_attr, udata: ib_udata,
                      uobj: Any) -> ib_qp:
    """Mirrors ib_create_qp_user() -> create_qp(): allocate the driver's QP,
    fill the core fields, ops.create_qp, then count it on its PD and CQs (an
    XRC target, created without udata, on its XRC domain).
    # EMU: an XRC target QP is the QP itself: no shadow QP (create_xrc_qp_user),
    # as ibv_open_qp (sharing it between processes) is not modelled."""
    qp = rdma_zalloc_drv_obj(device, "ib_qp")
    qp.pd, qp.uobject, qp.qp_type = pd, uobj, attr.qp_type
    qp.send_cq, qp.recv_cq, qp.srq = attr.send_cq, attr.recv_cq, attr.srq
    qp.xrcd = attr.xrcd
    qp.event_handler, qp.qp_context = attr.event_handler, attr.qp_context
    device.ops.create_qp(qp, attr, udata)
    if qp.xrcd is not None:                 # an XRC target: its domain, no PD or CQs
        atomic_inc(qp.xrcd.usecnt)
        return qp
    atomic_inc(pd.usecnt)
    if qp.send_cq is not None:
        atomic_inc(qp.send_cq.usecnt)
    if qp.recv_cq is not None:
        atomic_inc(qp.recv_cq.usecnt)
    if qp.srq is not None:
        atomic_inc(qp.srq.usecnt)
    return qp


@traced
def ib_destroy_qp_user(qp: ib_qp, udata: ib_udata) -> None:
    """Mirrors ib_destroy_qp_user(): ops.destroy_qp, then drop the PD and CQ counts."""
    if atomic_read(qp.usecnt):
        raise KernelError(EBUSY, f"ib_destroy_qp_user: {qp} still in use")
    pd, scq, rcq, srq = qp.pd, qp.send_cq, qp.recv_cq, qp.srq
    qp.device.ops.destroy_qp(qp, udata)
    if qp.av_sgid_attr is not None:
        rdma_put_gid_attr(qp.av_sgid_attr)
        qp.av_sgid_attr = None
    if qp.xrcd is not None:
        atomic_dec(qp.xrcd.usecnt)
        return
    atomic_dec(pd.usecnt)
    if scq is not None:
        atomic_dec(scq.usecnt)
    if rcq is not None:
        atomic_dec(rcq.usecnt)
    if srq is not None:
        atomic_dec(srq.usecnt)


@traced
def ib_create_srq_user(pd: Any, attr: Any, udata: ib_udata, uobj: Any) -> Any:
    """The core half of __uverbs_create_xsrq(): allocate the driver's SRQ, fill the
    core fields, ops.create_srq (EOPNOTSUPP without one), then count it on its PD
    (and its CQ, for the types that have one)."""
    device = pd.device
    if device.ops.create_srq is None:
        raise KernelError(EOPNOTSUPP, "__uverbs_create_xsrq: no create_srq")
    srq = rdma_zalloc_drv_obj(device, "ib_srq")
    srq.pd, srq.uobject, srq.srq_type, srq.cq = pd, uobj, attr.srq_type, attr.cq
    srq.xrcd = attr.xrcd
    srq.event_handler, srq.srq_context = attr.event_handler, attr.srq_context
    device.ops.create_srq(srq, attr, udata)
    atomic_inc(pd.usecnt)
    if srq.cq is not None:
        atomic_inc(srq.cq.usecnt)
    if srq.xrcd is not None:
        atomic_inc(srq.xrcd.usecnt)
    return srq


@traced
def ib_destroy_srq_user(srq: Any, udata: ib_udata) -> None:
    """Mirrors ib_destroy_srq_user(): EBUSY while QPs use it, ops.destroy_srq, then
    drop the PD's (and CQ's) count."""
    if atomic_read(srq.usecnt):
        raise KernelError(EBUSY, f"ib_destroy_srq_user: {srq} still has QPs")
    srq.device.ops.destroy_srq(srq, udata)
    atomic_dec(srq.pd.usecnt)
    if srq.cq is not None:
        atomic_dec(srq.cq.usecnt)
    if srq.xrcd is not None:
        atomic_dec(srq.xrcd.usecnt)


@traced
def ib_alloc_xrcd_user(device: Any, inode: Any, udata: ib_udata) -> Any:
    """Mirrors ib_alloc_xrcd_user(): the driver's XRCD (EOPNOTSUPP without
    ops.alloc_xrcd), remembering the inode it is shared by."""
    if device.ops.alloc_xrcd is None:
        raise KernelError(EOPNOTSUPP, "ib_alloc_xrcd_user: no alloc_xrcd")
    xrcd = rdma_zalloc_drv_obj(device, "ib_xrcd")
    xrcd.inode = inode
    device.ops.alloc_xrcd(xrcd, udata)
    return xrcd


@traced
def ib_dealloc_xrcd_user(xrcd: Any, udata: ib_udata) -> None:
    """Mirrors ib_dealloc_xrcd_user(): EBUSY while SRQs or QPs use it."""
    if atomic_read(xrcd.usecnt):
        raise KernelError(EBUSY, f"ib_dealloc_xrcd_user: {xrcd} still in use")
    xrcd.device.ops.dealloc_xrcd(xrcd, udata)


def rdma_port_get_link_layer(device: Any, port: int) -> int:
    """Mirrors rdma_port_get_link_layer()."""
    if device.ops.get_link_layer is not None:
        return device.ops.get_link_layer(device, port)
    return IB_LINK_LAYER_INFINIBAND


# -- the QP state machine ----------------------------------------------------------------
_PKEY_PORT = IB_QP_PKEY_INDEX | IB_QP_PORT
_CUR = IB_QP_CUR_STATE
_ALT_ACC = IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS
_RTR_UC = IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN
_RTR_RC = _RTR_UC | IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER
_RTS_RC = IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_SQ_PSN | \
    IB_QP_MAX_QP_RD_ATOMIC
_TO_RTS_UC = _CUR | _ALT_ACC | IB_QP_PATH_MIG_STATE
_TO_RTS_RC = _TO_RTS_UC | IB_QP_MIN_RNR_TIMER
_CUR_QKEY = _CUR | IB_QP_QKEY
_PK_QK = IB_QP_PKEY_INDEX | IB_QP_QKEY
_SQD_ASYNC = {t: IB_QP_EN_SQD_ASYNC_NOTIFY for t in (IB_QPT_UD, IB_QPT_UC, IB_QPT_RC,
                                                    IB_QPT_XRC_INI, IB_QPT_XRC_TGT,
                                                    IB_QPT_SMI, IB_QPT_GSI)}
_VALID: tuple[dict[int, int], dict[int, int]] = ({}, {})

#: Mirrors qp_state_table: (cur, next) -> ({qp type: required attrs}, {qp type: optional
#: attrs}).  A pair not listed is no transition.  IB_QP_STATE is always allowed.
qp_state_table: dict[tuple[int, int], tuple[dict[int, int], dict[int, int]]] = {
    (IB_QPS_RESET, IB_QPS_RESET): _VALID,
    (IB_QPS_RESET, IB_QPS_INIT): ({
        IB_QPT_UD: _PKEY_PORT | IB_QP_QKEY, IB_QPT_RAW_PACKET: IB_QP_PORT,
        IB_QPT_UC: _PKEY_PORT | IB_QP_ACCESS_FLAGS, IB_QPT_RC: _PKEY_PORT | IB_QP_ACCESS_FLAGS,
        IB_QPT_XRC_INI: _PKEY_PORT | IB_QP_ACCESS_FLAGS,
        IB_QPT_XRC_TGT: _PKEY_PORT | IB_QP_ACCESS_FLAGS,
        IB_QPT_SMI: _PK_QK, IB_QPT_GSI: _PK_QK}, {}),
    (IB_QPS_INIT, IB_QPS_RESET): _VALID,
    (IB_QPS_INIT, IB_QPS_ERR): _VALID,
    (IB_QPS_INIT, IB_QPS_INIT): ({}, {
        IB_QPT_UD: _PKEY_PORT | IB_QP_QKEY, IB_QPT_UC: _PKEY_PORT | IB_QP_ACCESS_FLAGS,
        IB_QPT_RC: _PKEY_PORT | IB_QP_ACCESS_FLAGS,
        IB_QPT_XRC_INI: _PKEY_PORT | IB_QP_ACCESS_FLAGS,
        IB_QPT_XRC_TGT: _PKEY_PORT | IB_QP_ACCESS_FLAGS, IB_QPT_SMI: _PK_QK,
        IB_QPT_GSI: _PK_QK}),
    (IB_QPS_INIT, IB_QPS_RTR): ({
        IB_QPT_UC: _RTR_UC, IB_QPT_RC: _RTR_RC, IB_QPT_XRC_INI: _RTR_UC,
        IB_QPT_XRC_TGT: _RTR_RC}, {
        IB_QPT_UD: _PK_QK, IB_QPT_UC: _ALT_ACC | IB_QP_PKEY_INDEX,
        IB_QPT_RC: _ALT_ACC | IB_QP_PKEY_INDEX, IB_QPT_XRC_INI: _ALT_ACC | IB_QP_PKEY_INDEX,
        IB_QPT_XRC_TGT: _ALT_ACC | IB_QP_PKEY_INDEX, IB_QPT_SMI: _PK_QK, IB_QPT_GSI: _PK_QK}),
    (IB_QPS_RTR, IB_QPS_RESET): _VALID,
    (IB_QPS_RTR, IB_QPS_ERR): _VALID,
    (IB_QPS_RTR, IB_QPS_RTS): ({
        IB_QPT_UD: IB_QP_SQ_PSN, IB_QPT_UC: IB_QP_SQ_PSN, IB_QPT_RC: _RTS_RC,
        IB_QPT_XRC_INI: _RTS_RC, IB_QPT_XRC_TGT: IB_QP_TIMEOUT | IB_QP_SQ_PSN,
        IB_QPT_SMI: IB_QP_SQ_PSN, IB_QPT_GSI: IB_QP_SQ_PSN}, {
        IB_QPT_UD: _CUR_QKEY, IB_QPT_UC: _TO_RTS_UC, IB_QPT_RC: _TO_RTS_RC,
        IB_QPT_XRC_INI: _TO_RTS_UC, IB_QPT_XRC_TGT: _TO_RTS_RC, IB_QPT_SMI: _CUR_QKEY,
        IB_QPT_GSI: _CUR_QKEY, IB_QPT_RAW_PACKET: IB_QP_RATE_LIMIT}),
    (IB_QPS_RTS, IB_QPS_RESET): _VALID,
    (IB_QPS_RTS, IB_QPS_ERR): _VALID,
    (IB_QPS_RTS, IB_QPS_RTS): ({}, {
        IB_QPT_UD: _CUR_QKEY, IB_QPT_UC: _TO_RTS_UC, IB_QPT_RC: _TO_RTS_RC,
        IB_QPT_XRC_INI: _TO_RTS_UC, IB_QPT_XRC_TGT: _TO_RTS_RC, IB_QPT_SMI: _CUR_QKEY,
        IB_QPT_GSI: _CUR_QKEY, IB_QPT_RAW_PACKET: IB_QP_RATE_LIMIT}),
    (IB_QPS_RTS, IB_QPS_SQD): ({}, _SQD_ASYNC),
    (IB_QPS_SQD, IB_QPS_RESET): _VALID,
    (IB_QPS_SQD, IB_QPS_ERR): _VALID,
    (IB_QPS_SQD, IB_QPS_RTS): ({}, {
        IB_QPT_UD: _CUR_QKEY, IB_QPT_UC: _TO_RTS_UC, IB_QPT_RC: _TO_RTS_RC,
        IB_QPT_XRC_INI: _TO_RTS_UC, IB_QPT_XRC_TGT: _TO_RTS_RC, IB_QPT_SMI: _CUR_QKEY,
        IB_QPT_GSI: _CUR_QKEY}),
    (IB_QPS_SQD, IB_QPS_SQD): ({}, {
        IB_QPT_UD: _PK_QK,
        IB_QPT_UC: IB_QP_AV | _ALT_ACC | IB_QP_PKEY_INDEX | IB_QP_PATH_MIG_STATE,
        IB_QPT_RC: IB_QP_PORT | IB_QP_AV | _RTS_RC & ~IB_QP_SQ_PSN | IB_QP_MAX_DEST_RD_ATOMIC
        | _ALT_ACC | IB_QP_PKEY_INDEX | IB_QP_MIN_RNR_TIMER | IB_QP_PATH_MIG_STATE,
        IB_QPT_XRC_INI: IB_QP_PORT | IB_QP_AV | _RTS_RC & ~IB_QP_SQ_PSN | _ALT_ACC
        | IB_QP_PKEY_INDEX | IB_QP_PATH_MIG_STATE,
        IB_QPT_XRC_TGT: IB_QP_PORT | IB_QP_AV | IB_QP_TIMEOUT | IB_QP_MAX_DEST_RD_ATOMIC
        | _ALT_ACC | IB_QP_PKEY_INDEX | IB_QP_MIN_RNR_TIMER | IB_QP_PATH_MIG_STATE,
        IB_QPT_SMI: _PK_QK, IB_QPT_GSI: _PK_QK}),
    (IB_QPS_SQE, IB_QPS_RESET): _VALID,
    (IB_QPS_SQE, IB_QPS_ERR): _VALID,
    (IB_QPS_SQE, IB_QPS_RTS): ({}, {
        IB_QPT_UD: _CUR_QKEY, IB_QPT_UC: _CUR | IB_QP_ACCESS_FLAGS, IB_QPT_SMI: _CUR_QKEY,
        IB_QPT_GSI: _CUR_QKEY}),
    (IB_QPS_ERR, IB_QPS_RESET): _VALID,
    (IB_QPS_ERR, IB_QPS_ERR): _VALID,
}


@traced
def ib_modify_qp_is_ok(cur_state: int, next_state: int, type_: int, mask: int) -> bool:
    """Mirrors ib_modify_qp_is_ok(): a transition in the table, every required
    attribute given, nothing it does not take (IB_QP_CUR_STATE only from RTR,
    RTS, SQD or SQE)."""
    if mask & IB_QP_CUR_STATE and cur_state not in (IB_QPS_RTR, IB_QPS_RTS, IB_QPS_SQD,
                                                    IB_QPS_SQE):
        return False
    entry = qp_state_table.get((cur_state, next_state))
    if entry is None:
        return False
    req, opt = entry[0].get(type_, 0), entry[1].get(type_, 0)
    if mask & req != req:
        return False
    return not mask & ~(req | opt | IB_QP_STATE)


# -- modify ----------------------------------------------------------------------------------
def rdma_fill_sgid_attr(device: Any, ah_attr: rdma_ah_attr) -> Any:
    """Mirrors rdma_fill_sgid_attr() + rdma_check_ah_attr(): a valid port, a GRH
    where the port needs one (RoCE: always), and the source GID entry the
    sgid_index names, held (EINVAL outside the table, ENODATA for an empty
    slot).  Returns the entry to put when the modify is over, or None."""
    if not rdma_is_port_valid(device, ah_attr.port_num):
        raise KernelError(EINVAL, f"rdma_check_ah_attr: port {ah_attr.port_num}")
    if ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE and not ah_attr.ah_flags & IB_AH_GRH:
        raise KernelError(EINVAL, "rdma_check_ah_attr: a RoCE address vector needs a GRH")
    if not ah_attr.ah_flags & IB_AH_GRH or ah_attr.grh.sgid_attr is not None:
        return None
    ah_attr.grh.sgid_attr = rdma_get_gid_attr(device, ah_attr.port_num, ah_attr.grh.sgid_index)
    return ah_attr.grh.sgid_attr


def ib_resolve_unicast_gid_dmac(device: Any, ah_attr: rdma_ah_attr) -> None:
    """Mirrors ib_resolve_unicast_gid_dmac(): a link-local destination seen from a
    RoCE v1 source GID needs no IP stack - its MAC is in its EUI-64.

    # EMU: anything else goes to rdma_addr_find_l2_eth_by_grh() - the route and
    # the neighbour table - which the model does not have.  A link-local
    # destination from a RoCE v2 GID resolves as neighbour discovery would on
    # the one link (the EUI-64's MAC; the hop limit is left as given); any
    # other destination is EINVAL.
    """
    grh = ah_attr.grh
    if rdma_link_local_addr(grh.dgid) and grh.sgid_attr.gid_type == IB_GID_TYPE_ROCE:
        ah_attr.dmac = rdma_get_ll_mac(grh.dgid)
        return
    # rdma_addr_find_l2_eth_by_grh()  # EMU: see above
    if rdma_link_local_addr(grh.dgid):
        ah_attr.dmac = rdma_get_ll_mac(grh.dgid)
        return
    raise KernelError(EINVAL, "ib_resolve_unicast_gid_dmac: no neighbour table to resolve "
                      "a non-link-local GID")


@traced
def ib_resolve_eth_dmac(device: Any, ah_attr: rdma_ah_attr) -> None:
    """Mirrors ib_resolve_eth_dmac(): the destination MAC of a RoCE address vector -
    a multicast GID maps to a multicast MAC, a unicast one is resolved."""
    dgid = ah_attr.grh.dgid
    if rdma_is_multicast_addr(dgid):
        ah_attr.dmac = ip_eth_mc_map(dgid[12:]) if ipv6_addr_v4mapped(dgid) \
            else ipv6_eth_mc_map(dgid)
    else:
        ib_resolve_unicast_gid_dmac(device, ah_attr)


# -- address handles -------------------------------------------------------------------------
@traced
def _rdma_create_ah(pd: Any, ah_attr: rdma_ah_attr, flags: int, udata: ib_udata | None,
                    xmit_slave: Any = None) -> Any:
    """Mirrors _rdma_create_ah(): the driver's AH object, ops.create_user_ah (a user's)
    or ops.create_ah; on success it holds the source GID entry and counts in the PD.
    EOPNOTSUPP when the driver has no such op."""
    device = pd.device
    op = device.ops.create_user_ah if udata is not None else device.ops.create_ah
    if op is None:
        raise KernelError(EOPNOTSUPP, f"_rdma_create_ah: {device.name} has no "
                          f"{'create_user_ah' if udata is not None else 'create_ah'}")
    ah = rdma_zalloc_drv_obj(device, "ib_ah")
    ah.device, ah.pd, ah.type = device, pd, ah_attr.type
    sgid = ah_attr.grh.sgid_attr if ah_attr.ah_flags & IB_AH_GRH else None
    ah.sgid_attr = rdma_hold_gid_attr(sgid) if sgid is not None else None  # update_sgid_attr
    try:
        op(ah, rdma_ah_init_attr(ah_attr=ah_attr, flags=flags, xmit_slave=xmit_slave), udata)
    except KernelError:
        if ah.sgid_attr is not None:
            rdma_put_gid_attr(ah.sgid_attr)
        raise
    atomic_inc(pd.usecnt)
    return ah


@traced
def rdma_create_user_ah(pd: Any, ah_attr: rdma_ah_attr, udata: ib_udata) -> Any:
    """Mirrors rdma_create_user_ah(): check the address vector and hold its source GID
    entry (rdma_fill_sgid_attr: EINVAL for a bad port or a RoCE AV without a GRH,
    EINVAL/ENODATA for a bad sgid_index), resolve a RoCE destination's MAC
    (ib_resolve_eth_dmac), then _rdma_create_ah."""
    held = rdma_fill_sgid_attr(pd.device, ah_attr)
    try:
        if ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE:
            ib_resolve_eth_dmac(pd.device, ah_attr)
        return _rdma_create_ah(pd, ah_attr, RDMA_CREATE_AH_SLEEPABLE, udata)
    finally:
        if held is not None:  # rdma_unfill_sgid_attr()
            rdma_put_gid_attr(held)


@traced
def rdma_destroy_ah_user(ah: Any, flags: int, udata: ib_udata | None) -> None:
    """Mirrors rdma_destroy_ah_user(): ops.destroy_ah, then the PD's count and the
    source GID entry are released."""
    ah.device.ops.destroy_ah(ah, flags)
    atomic_dec(ah.pd.usecnt)
    if ah.sgid_attr is not None:
        rdma_put_gid_attr(ah.sgid_attr)
        ah.sgid_attr = None


def is_qp_type_connected(qp: ib_qp) -> bool:
    """Mirrors is_qp_type_connected()."""
    return qp.qp_type in (IB_QPT_UC, IB_QPT_RC, IB_QPT_XRC_INI, IB_QPT_XRC_TGT)


@traced
def _ib_modify_qp(qp: ib_qp, attr: ib_qp_attr, attr_mask: int, udata: ib_udata | None) -> None:
    """Mirrors _ib_modify_qp(): resolve the address vector (source GID entry,
    destination MAC for a user's connected RoCE QP), refuse alternate paths
    on RoCE, keep PSNs to 24 bits, then ops.modify_qp; on success the QP's
    port and source GID entry are the new ones.

    # EMU: no LAG (no xmit slave), no rdma counters, no P_Key security module.
    """
    port = attr.port_num if attr_mask & IB_QP_PORT else qp.port
    held = []
    try:
        if attr_mask & IB_QP_AV:
            held.append(rdma_fill_sgid_attr(qp.device, attr.ah_attr))
            if attr.ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE and is_qp_type_connected(qp) and \
                    udata is not None:  # a kernel user gives an already resolved AV
                ib_resolve_eth_dmac(qp.device, attr.ah_attr)
        if attr_mask & IB_QP_ALT_PATH:
            held.append(rdma_fill_sgid_attr(qp.device, attr.alt_ah_attr))
            if not (rdma_protocol_ib(qp.device, attr.alt_ah_attr.port_num)
                    and rdma_protocol_ib(qp.device, port)):
                raise KernelError(EINVAL, "_ib_modify_qp: alternate paths are IB only")
        if rdma_protocol_ib(qp.device, port) or rdma_protocol_roce(qp.device, port):
            if attr_mask & IB_QP_RQ_PSN and attr.rq_psn & ~0xFFFFFF:
                qp.device.log.append("_ib_modify_qp rq_psn overflow, masking to 24 bits")
                attr.rq_psn &= 0xFFFFFF
            if attr_mask & IB_QP_SQ_PSN and attr.sq_psn & ~0xFFFFFF:
                qp.device.log.append("_ib_modify_qp sq_psn overflow, masking to 24 bits")
                attr.sq_psn &= 0xFFFFFF
        qp.device.ops.modify_qp(qp, attr, attr_mask, udata)  # ib_security_modify_qp()
        if attr_mask & IB_QP_PORT:
            qp.port = attr.port_num
        if attr_mask & IB_QP_AV:  # rdma_update_sgid_attr()
            if qp.av_sgid_attr is not None:
                rdma_put_gid_attr(qp.av_sgid_attr)
            sgid = attr.ah_attr.grh.sgid_attr if attr.ah_attr.ah_flags & IB_AH_GRH else None
            qp.av_sgid_attr = rdma_hold_gid_attr(sgid) if sgid is not None else None
    finally:
        for sgid_attr in held:  # out_av: rdma_unfill_sgid_attr()
            if sgid_attr is not None:
                rdma_put_gid_attr(sgid_attr)


def ib_modify_qp_with_udata(qp: ib_qp, attr: ib_qp_attr, attr_mask: int,
                            udata: ib_udata | None) -> None:
    """Mirrors ib_modify_qp_with_udata()."""
    _ib_modify_qp(qp, attr, attr_mask, udata)


@traced
def ib_query_qp(qp: ib_qp, attr: ib_qp_attr, attr_mask: int,
                init_attr: ib_qp_init_attr) -> None:
    """Mirrors ib_query_qp(): ops.query_qp (EOPNOTSUPP if the driver has none)."""
    attr.ah_attr.grh.sgid_attr = attr.alt_ah_attr.grh.sgid_attr = None
    if qp.device.ops.query_qp is None:
        raise KernelError(EOPNOTSUPP, f"ib_query_qp: {qp.device.name} has no query_qp")
    qp.device.ops.query_qp(qp, attr, attr_mask, init_attr)

"""Mirrors drivers/infiniband/core/verbs.c: the core side of creating and
destroying verbs objects, around the driver's ops.

The core keeps the reference counts that make destroy order matter: a PD
counts the MRs and QPs made in it, a CQ the QPs attached to it
(`usecnt`).  Creating a QP takes a count on its PD and both CQs after the
driver succeeded; destroying it drops them after the driver has destroyed
the QP, so a PD or CQ is never freed under a live QP.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import (
    IB_LINK_LAYER_INFINIBAND,
    ib_mr,
    ib_port_attr,
    ib_qp,
    ib_qp_init_attr,
    ib_udata,
)
from kernel_model.errno import EBUSY, EINVAL, KernelError
from kernel_model.refcount import atomic_dec, atomic_inc, atomic_read
from kernel_model.trace import traced

IB_MR_TYPE_USER = 3  # enum ib_mr_type: MEM_REG, SG_GAPS, DM, USER


def ib_destroy_usecnt(usecnt: Any, why: int, uobj: Any, what: str) -> None:
    """Mirrors ib_destroy_usecnt(): an object still used refuses (EBUSY) while
    the destroy may be retried."""
    from drivers.ib_core.rdma_core import ib_is_destroy_retryable
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


@traced
def ib_dereg_mr_user(mr: ib_mr, udata: ib_udata) -> None:
    """Mirrors ib_dereg_mr_user(): ops.dereg_mr, then drop the PD's count."""
    pd = mr.pd
    mr.device.ops.dereg_mr(mr, udata)
    atomic_dec(pd.usecnt)


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
    fill the core fields, ops.create_qp, then count it on its PD and CQs."""
    from drivers.ib_core.device import rdma_zalloc_drv_obj
    qp = rdma_zalloc_drv_obj(device, "ib_qp")
    qp.pd, qp.uobject, qp.qp_type = pd, uobj, attr.qp_type
    qp.send_cq, qp.recv_cq, qp.srq = attr.send_cq, attr.recv_cq, attr.srq
    device.ops.create_qp(qp, attr, udata)
    atomic_inc(pd.usecnt)
    if qp.send_cq is not None:
        atomic_inc(qp.send_cq.usecnt)
    if qp.recv_cq is not None:
        atomic_inc(qp.recv_cq.usecnt)
    return qp


@traced
def ib_destroy_qp_user(qp: ib_qp, udata: ib_udata) -> None:
    """Mirrors ib_destroy_qp_user(): ops.destroy_qp, then drop the PD and CQ counts."""
    if atomic_read(qp.usecnt):
        raise KernelError(EBUSY, f"ib_destroy_qp_user: {qp} still in use")
    pd, scq, rcq = qp.pd, qp.send_cq, qp.recv_cq
    qp.device.ops.destroy_qp(qp, udata)
    atomic_dec(pd.usecnt)
    if scq is not None:
        atomic_dec(scq.usecnt)
    if rcq is not None:
        atomic_dec(rcq.usecnt)


@traced
def ib_query_port(device: Any, port: int, attr: ib_port_attr) -> None:
    """Mirrors ib_query_port(): valid port, then ops.query_port into a zeroed attr."""
    from drivers.ib_core.device import rdma_is_port_valid
    if not rdma_is_port_valid(device, port):
        raise KernelError(EINVAL, f"ib_query_port: {device.name} has no port {port}")
    device.ops.query_port(device, port, attr)


def rdma_port_get_link_layer(device: Any, port: int) -> int:
    """Mirrors rdma_port_get_link_layer()."""
    if device.ops.get_link_layer is not None:
        return device.ops.get_link_layer(device, port)
    return IB_LINK_LAYER_INFINIBAND

"""Mirrors the receive work queue (WQ) and RSS indirection table parts of ib_uverbs:
the extended write() commands of uverbs_cmd.c (ib_uverbs_ex_create_wq, _modify_wq,
_destroy_wq, _create_rwq_ind_table, _destroy_rwq_ind_table), their uobject types and
destroy functions of uverbs_std_types.c, and ib_destroy_wq_user of verbs.c.

    CREATE_WQ            the PD and CQ (read-locked), ops.create_wq; the WQ counts one
                         user of each; the real sizes and the WQ number answered
    MODIFY_WQ            the current state (given, or the WQ's) and the new one
    DESTROY_WQ           EBUSY while an indirection table names it; the response
                         counts the async events read() reported for it
    CREATE_RWQ_IND_TBL   1 << log_ind_tbl_size WQ handles after the request (each WQ
                         counts the table), ops.create_rwq_ind_table; the table number
    DESTROY_RWQ_IND_TBL  EBUSY while an RSS QP uses it; the WQs are let go

# EMU: one module instead of the three files; the WQs' async events (WQ_FATAL) are
# never raised by the model's device.
"""

from __future__ import annotations

import struct
from typing import Any

from drivers.ib_core.device import rdma_zalloc_drv_obj
from drivers.ib_core.ib_verbs import (
    IB_WQ_CUR_STATE,
    IB_WQ_FLAGS,
    IB_WQ_STATE,
    IB_WQS_ERR,
    ib_copy_from_udata,
    ib_rwq_ind_table_init_attr,
    ib_udata,
    ib_wq,
    ib_wq_attr,
    ib_wq_init_attr,
)
from drivers.ib_core.rdma_core import (
    UVERBS_LOOKUP_READ,
    ib_uobject,
    rdma_alloc_begin_uobject,
    rdma_lookup_put_uobject,
    uobj_finalize_uobj_create,
    uobj_perform_destroy,
    uverbs_attr_bundle,
    uverbs_obj_type,
)
from drivers.ib_core.uverbs_cmd import (
    uobj_get_obj_read,
    uverbs_request,
    uverbs_response,
)
from drivers.ib_core.uverbs_comp_event import ib_uverbs_init_uevent, ib_uverbs_release_uevent
from drivers.ib_core.uverbs_std_types import UVERBS_OBJECT_CQ, UVERBS_OBJECT_PD
from drivers.ib_core.uverbs_std_types_async_fd import ib_uverbs_get_async_event
from drivers.ib_core.verbs import ib_destroy_usecnt
from kernel_model.errno import EBUSY, EFAULT, EINVAL, EOPNOTSUPP, KernelError
from kernel_model.refcount import atomic_dec, atomic_inc, atomic_read
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user
from kernel_model.uapi import ib_user_verbs as uv


# -- verbs.c ------------------------------------------------------------------------------
@traced
def ib_destroy_wq_user(wq: ib_wq, udata: ib_udata) -> None:
    """Mirrors ib_destroy_wq_user(): EBUSY while an indirection table names the WQ; the
    driver destroys it; its PD and CQ lose a user."""
    if atomic_read(wq.usecnt):
        raise KernelError(EBUSY, f"ib_destroy_wq_user: {wq} still in use")
    cq, pd = wq.cq, wq.pd
    wq.device.ops.destroy_wq(wq, udata)
    atomic_dec(pd.usecnt)
    atomic_dec(cq.usecnt)


# -- uverbs_std_types.c -----------------------------------------------------------------------
def uverbs_free_wq(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_wq(): ib_destroy_wq_user (EBUSY while in use, when the destroy
    may be retried), then the WQ's async events still queued are dropped."""
    wq = uobj.object
    ib_destroy_usecnt(wq.usecnt, why, uobj, repr(wq))
    ib_destroy_wq_user(wq, attrs_.driver_udata)
    ib_uverbs_release_uevent(uobj)


def uverbs_free_rwq_ind_tbl(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_rwq_ind_tbl(): EBUSY while a QP uses the table; the driver
    destroys it; its WQs lose a user."""
    tbl = uobj.object
    if atomic_read(tbl.usecnt):
        raise KernelError(EBUSY, f"uverbs_free_rwq_ind_tbl: {tbl} still in use")
    tbl.device.ops.destroy_rwq_ind_table(tbl)
    for wq in tbl.ind_tbl:
        atomic_dec(wq.usecnt)


UVERBS_OBJECT_WQ = uverbs_obj_type("WQ", uverbs_free_wq)
UVERBS_OBJECT_RWQ_IND_TBL = uverbs_obj_type("RWQ_IND_TBL", uverbs_free_rwq_ind_tbl)


def _response_length(attrs_: uverbs_attr_bundle, size: int) -> int:
    """uverbs_response_length(): what of the response the caller's buffer takes."""
    return min(attrs_.ucore.outlen, size)


# -- uverbs_cmd.c -----------------------------------------------------------------------------
@traced
def ib_uverbs_ex_create_wq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_create_wq(): EOPNOTSUPP for a comp_mask; EINVAL for a PD or
    CQ handle that is none; ops.create_wq (EOPNOTSUPP without one)."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_create_wq)
    if cmd.comp_mask:
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_ex_create_wq: comp_mask {cmd.comp_mask:#x}")
    uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_WQ, attrs_)
    uobj_finalize_uobj_create(uobj, attrs_)
    uobj.user_handle = cmd.user_handle
    ib_uverbs_init_uevent(uobj, ib_uverbs_get_async_event(attrs_))
    pd_uobj = uobj_get_obj_read(UVERBS_OBJECT_PD, attrs_, cmd.pd_handle, "ib_uverbs_ex_create_wq")
    try:
        cq_uobj = uobj_get_obj_read(UVERBS_OBJECT_CQ, attrs_, cmd.cq_handle,
                                    "ib_uverbs_ex_create_wq")
        try:
            pd, cq = pd_uobj.object, cq_uobj.object
            if pd.device.ops.create_wq is None:
                raise KernelError(EOPNOTSUPP, "ib_uverbs_ex_create_wq: no create_wq")
            init = ib_wq_init_attr(wq_type=cmd.wq_type, max_wr=cmd.max_wr,
                                   max_sge=cmd.max_sge, cq=cq, create_flags=cmd.create_flags)
            wq = pd.device.ops.create_wq(pd, init, attrs_.driver_udata)
            wq.uobject = uobj
            uobj.object = wq
            wq.wq_type, wq.cq, wq.pd = init.wq_type, cq, pd
            atomic_inc(pd.usecnt)
            atomic_inc(cq.usecnt)
        finally:
            rdma_lookup_put_uobject(cq_uobj, UVERBS_LOOKUP_READ)
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    resp = uv.ib_uverbs_ex_create_wq_resp(wq_handle=uobj.id, max_sge=init.max_sge,
                                          max_wr=init.max_wr, wqn=wq.wq_num)
    resp.response_length = _response_length(attrs_, resp.SIZE)
    uverbs_response(attrs_, resp)


@traced
def ib_uverbs_ex_destroy_wq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_destroy_wq(): EINVAL for a comp_mask; EBUSY while in use."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_destroy_wq)
    if cmd.comp_mask:
        raise KernelError(EINVAL, f"ib_uverbs_ex_destroy_wq: comp_mask {cmd.comp_mask:#x}")
    resp = uv.ib_uverbs_ex_destroy_wq_resp()
    resp.response_length = _response_length(attrs_, resp.SIZE)
    uobj = uobj_perform_destroy(UVERBS_OBJECT_WQ, cmd.wq_handle, attrs_)
    resp.events_reported = uobj.events_reported
    uverbs_response(attrs_, resp)


@traced
def ib_uverbs_ex_modify_wq(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_modify_wq(): EINVAL for no attribute, one past FLAGS, a bad
    handle or a state past ERR; the current state defaults to the WQ's, the new state
    to the current; ops.modify_wq."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_modify_wq)
    if not cmd.attr_mask:
        raise KernelError(EINVAL, "ib_uverbs_ex_modify_wq: no attr_mask")
    if cmd.attr_mask > (IB_WQ_STATE | IB_WQ_CUR_STATE | IB_WQ_FLAGS):
        raise KernelError(EINVAL, f"ib_uverbs_ex_modify_wq: attr_mask {cmd.attr_mask:#x}")
    wq_uobj = uobj_get_obj_read(UVERBS_OBJECT_WQ, attrs_, cmd.wq_handle,
                                "ib_uverbs_ex_modify_wq")
    try:
        wq = wq_uobj.object
        attr = ib_wq_attr()
        if cmd.attr_mask & IB_WQ_FLAGS:
            attr.flags, attr.flags_mask = cmd.flags, cmd.flags_mask
        if cmd.attr_mask & IB_WQ_CUR_STATE:
            if cmd.curr_wq_state > IB_WQS_ERR:
                raise KernelError(EINVAL, f"ib_uverbs_ex_modify_wq: curr_wq_state "
                                  f"{cmd.curr_wq_state}")
            attr.curr_wq_state = cmd.curr_wq_state
        else:
            attr.curr_wq_state = wq.state
        if cmd.attr_mask & IB_WQ_STATE:
            if cmd.wq_state > IB_WQS_ERR:
                raise KernelError(EINVAL, f"ib_uverbs_ex_modify_wq: wq_state {cmd.wq_state}")
            attr.wq_state = cmd.wq_state
        else:
            attr.wq_state = attr.curr_wq_state
        wq.device.ops.modify_wq(wq, attr, cmd.attr_mask, attrs_.driver_udata)
    finally:
        rdma_lookup_put_uobject(wq_uobj, UVERBS_LOOKUP_READ)


def _wq_handles(attrs_: uverbs_attr_bundle, n: int) -> list[int]:
    """uverbs_request_next(): the n u32 WQ handles after the fixed request (EINVAL when
    the request is shorter; EFAULT when unreadable); uverbs_request_finish(): the bytes
    past them must be zero (EOPNOTSUPP)."""
    start = uv.ib_uverbs_ex_create_rwq_ind_table.SIZE
    ucore = attrs_.ucore
    if ucore.inlen < start + 4 * n:
        raise KernelError(EINVAL, f"ib_uverbs_ex_create_rwq_ind_table: {n} WQ handles do "
                          f"not fit in {ucore.inlen} bytes")
    raw = bytearray(4 * n)
    if copy_from_user(raw, ucore.inbuf + start, 4 * n):
        raise KernelError(EFAULT, "ib_uverbs_ex_create_rwq_ind_table: the WQ handles")
    rest = ucore.inlen - start - 4 * n
    if rest > 0:
        tail = bytearray(rest)
        if copy_from_user(tail, ucore.inbuf + start + 4 * n, rest) or any(tail):
            raise KernelError(EOPNOTSUPP, "ib_uverbs_ex_create_rwq_ind_table: non-zero "
                              "bytes past the WQ handles")
    return list(struct.unpack(f"<{n}I", raw))


@traced
def ib_uverbs_ex_create_rwq_ind_table(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_create_rwq_ind_table(): EOPNOTSUPP for a comp_mask; EINVAL for
    a size past IB_USER_VERBS_MAX_LOG_IND_TBL_SIZE or a WQ handle that is none; each WQ
    counts the table; ops.create_rwq_ind_table.  A failure lets every WQ go again."""
    cmd = uverbs_request_start(attrs_)
    if cmd.comp_mask:
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_ex_create_rwq_ind_table: comp_mask "
                          f"{cmd.comp_mask:#x}")
    if cmd.log_ind_tbl_size > uv.IB_USER_VERBS_MAX_LOG_IND_TBL_SIZE:
        raise KernelError(EINVAL, f"ib_uverbs_ex_create_rwq_ind_table: log_ind_tbl_size "
                          f"{cmd.log_ind_tbl_size}")
    handles = _wq_handles(attrs_, 1 << cmd.log_ind_tbl_size)
    held: list[ib_uobject] = []
    try:
        for h in handles:
            wq_uobj = uobj_get_obj_read(UVERBS_OBJECT_WQ, attrs_, h,
                                        "ib_uverbs_ex_create_rwq_ind_table")
            held.append(wq_uobj)
            atomic_inc(wq_uobj.object.usecnt)
        wqs = [u.object for u in held]
        uobj = rdma_alloc_begin_uobject(UVERBS_OBJECT_RWQ_IND_TBL, attrs_)
        uobj_finalize_uobj_create(uobj, attrs_)
        ib_dev = uobj.context.device
        if ib_dev.ops.create_rwq_ind_table is None:
            raise KernelError(EOPNOTSUPP, "ib_uverbs_ex_create_rwq_ind_table: no "
                              "create_rwq_ind_table")
        tbl = rdma_zalloc_drv_obj(ib_dev, "ib_rwq_ind_table")
        tbl.ind_tbl, tbl.log_ind_tbl_size = wqs, cmd.log_ind_tbl_size
        tbl.uobject = uobj
        ib_dev.ops.create_rwq_ind_table(
            tbl, ib_rwq_ind_table_init_attr(cmd.log_ind_tbl_size, wqs), attrs_.driver_udata)
        uobj.object = tbl
    except BaseException:
        for u in held:                                                   # put_wqs:
            atomic_dec(u.object.usecnt)
        raise
    finally:
        for u in held:
            rdma_lookup_put_uobject(u, UVERBS_LOOKUP_READ)
    resp = uv.ib_uverbs_ex_create_rwq_ind_table_resp(ind_tbl_handle=uobj.id,
                                                     ind_tbl_num=tbl.ind_tbl_num)
    resp.response_length = _response_length(attrs_, resp.SIZE)
    uverbs_response(attrs_, resp)


def uverbs_request_start(attrs_: uverbs_attr_bundle) -> uv.ib_uverbs_ex_create_rwq_ind_table:
    """Mirrors uverbs_request_start(): the fixed part of the request (the handles follow)."""
    size = uv.ib_uverbs_ex_create_rwq_ind_table.SIZE
    return ib_copy_from_udata(uv.ib_uverbs_ex_create_rwq_ind_table, attrs_.ucore,
                              min(attrs_.ucore.inlen, size))


@traced
def ib_uverbs_ex_destroy_rwq_ind_table(attrs_: uverbs_attr_bundle) -> None:
    """Mirrors ib_uverbs_ex_destroy_rwq_ind_table(): EOPNOTSUPP for a comp_mask."""
    cmd = uverbs_request(attrs_, uv.ib_uverbs_ex_destroy_rwq_ind_table)
    if cmd.comp_mask:
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_ex_destroy_rwq_ind_table: comp_mask "
                          f"{cmd.comp_mask:#x}")
    uobj_perform_destroy(UVERBS_OBJECT_RWQ_IND_TBL, cmd.ind_tbl_handle, attrs_)

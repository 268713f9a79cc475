"""Mirrors drivers/infiniband/core/uverbs_std_types*.c: the handle types and
how each one's hardware object is destroyed (the uverbs_free_* functions).

Destroy functions run for an explicit DESTROY command, for the file-wide
teardown (close, exit, device removal) and to abort a create whose response
could not be written; `why` says which, and decides whether an object still
in use may refuse (see ib_is_destroy_retryable).
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import RDMA_DESTROY_AH_SLEEPABLE
from drivers.ib_core.rdma_core import ib_uobject, uverbs_obj_type
from drivers.ib_core.uverbs_comp_event import ib_uverbs_release_ucq, ib_uverbs_release_uevent
from drivers.ib_core.verbs import (
    ib_dealloc_pd_user,
    ib_dealloc_xrcd_user,
    ib_dereg_mr_user,
    ib_destroy_cq_user,
    ib_destroy_qp_user,
    ib_destroy_srq_user,
    ib_destroy_usecnt,
    rdma_destroy_ah_user,
)
from kernel_model.errno import KernelError
from kernel_model.refcount import atomic_dec, atomic_inc, atomic_read


def uverbs_free_pd(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_pd(): EBUSY while MRs or QPs use it."""
    pd = uobj.object
    ib_destroy_usecnt(pd.usecnt, why, uobj, repr(pd))
    ib_dealloc_pd_user(pd, attrs_.driver_udata)


def uverbs_free_mr(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_mr()."""
    ib_dereg_mr_user(uobj.object, attrs_.driver_udata)


def uverbs_free_mw(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_mw() -> uverbs_dealloc_mw(): ops.dealloc_mw, then drop the
    PD's count."""
    mw = uobj.object
    pd = mw.pd
    mw.device.ops.dealloc_mw(mw)
    atomic_dec(pd.usecnt)


def uverbs_free_cq(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_cq(): EBUSY while QPs are attached."""
    cq = uobj.object
    ib_destroy_usecnt(cq.usecnt, why, uobj, repr(cq))
    ib_destroy_cq_user(cq, attrs_.driver_udata)
    ib_uverbs_release_ucq(uobj)


def uverbs_free_qp(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_qp(): then the XRC domain handle it was made in counts
    one user less."""
    ib_destroy_qp_user(uobj.object, attrs_.driver_udata)
    uxrcd = getattr(uobj, "uxrcd", None)
    if uxrcd is not None:
        atomic_dec(uxrcd.refcnt)
    ib_uverbs_release_uevent(uobj)


def uverbs_free_srq(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_srq(): EBUSY while QPs take receives from it; then its
    async events still queued are dropped (ib_uverbs_release_uevent)."""
    srq = uobj.object
    ib_destroy_usecnt(srq.usecnt, why, uobj, repr(srq))
    ib_destroy_srq_user(srq, attrs_.driver_udata)
    uxrcd = getattr(uobj, "uxrcd", None)
    if uxrcd is not None:                  # an XRC SRQ
        atomic_dec(uxrcd.refcnt)
    ib_uverbs_release_uevent(uobj)


def ib_uverbs_dealloc_xrcd(uobj: ib_uobject, xrcd: Any, why: int, attrs_: Any) -> None:
    """Mirrors ib_uverbs_dealloc_xrcd() (uverbs_cmd.c; here beside its one caller):
    an XRCD shared by an inode goes only with its last handle - then out of the
    device's inode table."""
    dev = attrs_.ufile.device
    inode = xrcd.inode
    if inode is not None:
        atomic_dec(xrcd.usecnt)
        if atomic_read(xrcd.usecnt):
            return
    try:
        ib_dealloc_xrcd_user(xrcd, attrs_.driver_udata)
    except KernelError:
        if inode is not None:
            atomic_inc(xrcd.usecnt)
        raise
    if inode is not None:
        dev.xrcd_tree.pop(id(inode), None)          # xrcd_table_delete


def uverbs_free_xrcd(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_xrcd(): EBUSY while XRC SRQs or target QPs made through
    this handle live; then ib_uverbs_dealloc_xrcd under the device's xrcd_tree_mutex."""
    ib_destroy_usecnt(uobj.refcnt, why, uobj, repr(uobj.object))
    with attrs_.ufile.device.xrcd_tree_mutex:
        ib_uverbs_dealloc_xrcd(uobj, uobj.object, why, attrs_)


def uverbs_free_ah(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_ah()."""
    rdma_destroy_ah_user(uobj.object, RDMA_DESTROY_AH_SLEEPABLE, attrs_.driver_udata)


UVERBS_OBJECT_PD = uverbs_obj_type("PD", uverbs_free_pd)
UVERBS_OBJECT_MR = uverbs_obj_type("MR", uverbs_free_mr)
UVERBS_OBJECT_MW = uverbs_obj_type("MW", uverbs_free_mw)
UVERBS_OBJECT_CQ = uverbs_obj_type("CQ", uverbs_free_cq)
UVERBS_OBJECT_QP = uverbs_obj_type("QP", uverbs_free_qp)
UVERBS_OBJECT_AH = uverbs_obj_type("AH", uverbs_free_ah)
UVERBS_OBJECT_SRQ = uverbs_obj_type("SRQ", uverbs_free_srq)
UVERBS_OBJECT_XRCD = uverbs_obj_type("XRCD", uverbs_free_xrcd)

"""Mirrors drivers/infiniband/core/uverbs_std_types*.c: the handle types and
how each one's hardware object is destroyed (the uverbs_free_* functions).

Destroy functions run for an explicit DESTROY command, for the file-wide
teardown (close, exit, device removal) and to abort a create whose response
could not be written; `why` says which, and decides whether an object still
in use may refuse (see ib_is_destroy_retryable).
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.rdma_core import ib_uobject, uverbs_obj_type
from drivers.ib_core.verbs import (
    ib_dealloc_pd_user,
    ib_dereg_mr_user,
    ib_destroy_cq_user,
    ib_destroy_qp_user,
    ib_destroy_usecnt,
)


def uverbs_free_pd(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_pd(): EBUSY while MRs or QPs use it."""
    pd = uobj.object
    ib_destroy_usecnt(pd.usecnt, why, uobj, repr(pd))
    ib_dealloc_pd_user(pd, attrs_.driver_udata)


def uverbs_free_mr(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_mr()."""
    ib_dereg_mr_user(uobj.object, attrs_.driver_udata)


def uverbs_free_cq(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_cq(): EBUSY while QPs are attached."""
    cq = uobj.object
    ib_destroy_usecnt(cq.usecnt, why, uobj, repr(cq))
    ib_destroy_cq_user(cq, attrs_.driver_udata)


def uverbs_free_qp(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_qp()."""
    ib_destroy_qp_user(uobj.object, attrs_.driver_udata)


UVERBS_OBJECT_PD = uverbs_obj_type("PD", uverbs_free_pd)
UVERBS_OBJECT_MR = uverbs_obj_type("MR", uverbs_free_mr)
UVERBS_OBJECT_CQ = uverbs_obj_type("CQ", uverbs_free_cq)
UVERBS_OBJECT_QP = uverbs_obj_type("QP", uverbs_free_qp)

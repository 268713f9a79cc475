"""pyverbs.srq: shared receive queues (ibv_create_srq / ibv_create_srq_ex, ibv_post_srq_recv,
ibv_modify_srq, ibv_query_srq, ibv_get_srq_num, ibv_destroy_srq).

SRQ(pd, SrqInitAttr) creates a basic SRQ on a PD; SRQ(ctx, SrqInitAttrEx) goes
through ibv_create_srq_ex (a basic one on attr.pd).  QPs created with srq=...
take their receives from it and are closed before it; destroying an SRQ a QP
still uses fails with EBUSY.  An XRC SRQ (SrqInitAttrEx: srq_type IBV_SRQT_XRC,
xrcd, cq, pd) serves the XRC receive QPs of its domain.  Tag-matching SRQs
(post_srq_ops, OpsWr) are not emulated: EOPNOTSUPP.
"""

from __future__ import annotations

from typing import Any

from userspace.libibverbs import verbs as v
from userspace.pyverbs.base import (
    NotEmulated,
    PyverbsCM,
    PyverbsObject,
    call,
    destroy,
    object_field,
    set_errno,
    struct_field,
    unsupported,
)
from userspace.pyverbs.device import Context
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.wr import RecvWR


class OpsWr(NotEmulated):
    """Mirrors pyverbs' OpsWr (tag-matching operations): not emulated."""

    _VERB = "create OpsWr"


class SrqAttr(PyverbsObject):
    """Mirrors pyverbs' SrqAttr (struct ibv_srq_attr)."""

    def __init__(self, max_wr: int = 100, max_sge: int = 1, srq_limit: int = 0) -> None:
        super().__init__()
        self.attr = v.ibv_srq_attr(max_wr, max_sge, srq_limit)

    max_wr = struct_field("max_wr")
    max_sge = struct_field("max_sge")
    srq_limit = struct_field("srq_limit")


class SrqInitAttr(PyverbsObject):
    """Mirrors pyverbs' SrqInitAttr (struct ibv_srq_init_attr): the sizes of `attr`,
    or zeros; ibv_create_srq writes the real sizes back into it."""

    def __init__(self, attr: SrqAttr | None = None) -> None:
        super().__init__()
        self.attr = v.ibv_srq_init_attr()
        if attr is not None:
            self.attr.attr = v.ibv_srq_attr(attr.max_wr, attr.max_sge, attr.srq_limit)

    max_wr = struct_field("max_wr", "attr.attr")
    max_sge = struct_field("max_sge", "attr.attr")
    srq_limit = struct_field("srq_limit", "attr.attr")


class SrqInitAttrEx(SrqInitAttr):
    """Mirrors pyverbs' SrqInitAttrEx (struct ibv_srq_init_attr_ex)."""

    def __init__(self, max_wr: int = 100, max_sge: int = 1, srq_limit: int = 0) -> None:
        PyverbsObject.__init__(self)
        self.attr = v.ibv_srq_init_attr_ex(attr=v.ibv_srq_attr(max_wr, max_sge, srq_limit))
        self._pd: PD | None = None
        self._xrcd: Any = None
        self._cq: Any = None
        self.max_num_tags = self.max_ops = 0

    comp_mask = struct_field("comp_mask")
    srq_type = struct_field("srq_type")

    pd = object_field("pd")

    xrcd = object_field("xrcd")

    cq = object_field("cq")


class SRQ(PyverbsCM):
    """Mirrors pyverbs' SRQ: on a PD (SrqInitAttr) or a Context (SrqInitAttrEx)."""

    def __init__(self, creator: PD | Context, attr: SrqInitAttr) -> None:
        super().__init__()
        self.cq = None
        if isinstance(creator, PD):
            self._create_srq(creator, attr)
        elif isinstance(creator, Context):
            self._create_srq_ex(creator, attr)
        else:
            raise PyverbsRDMAError("Srq needs either Context or PD for creation")
        self.logger.debug("SRQ Created")

    def _create_srq(self, pd: PD, init_attr: SrqInitAttr) -> None:
        self.srq = call("Failed to create SRQ", v.ibv_create_srq, pd.pd, init_attr.attr)
        self._created()
        pd.add_ref(self)

    def _create_srq_ex(self, context: Context, init_attr_ex: SrqInitAttrEx) -> None:
        self.srq = call("Failed to create SRQ", v.ibv_create_srq_ex, context.ctx,
                        init_attr_ex.attr)
        self._created()
        for parent in (init_attr_ex.cq, init_attr_ex.xrcd, init_attr_ex.pd):
            if parent is not None:
                parent.add_ref(self)
        self.cq = init_attr_ex.cq
        if init_attr_ex.pd is None:
            context.add_ref(self)

    def get_srq_num(self) -> int:
        """ibv_get_srq_num()."""
        self._check_open("SRQ.get_srq_num")
        return call("Failed to retrieve SRQ number", v.ibv_get_srq_num, self.srq)

    def modify(self, attr: SrqAttr, comp_mask: int) -> None:
        """ibv_modify_srq() of the attributes comp_mask (IBV_SRQ_*) names."""
        self._check_open("SRQ.modify")
        rc = v.ibv_modify_srq(self.srq, attr.attr, comp_mask)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to modify SRQ", rc)

    def query(self) -> SrqAttr:
        """ibv_query_srq(): the SRQ's sizes and armed limit."""
        self._check_open("SRQ.query")
        c_attr = call("Failed to query SRQ", v.ibv_query_srq, self.srq)
        return SrqAttr(c_attr.max_wr, c_attr.max_sge, c_attr.srq_limit)

    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:
        """ibv_post_srq_recv(); PyverbsRDMAError('Failed to post receive to SRQ.')."""
        self._check_open("SRQ.post_recv")
        bad: list = []
        rc = v.ibv_post_srq_recv(self.srq, wr.to_c(), bad)
        if rc:
            if bad_wr is not None and bad and bad[0] is not None:
                bad_wr.wr_id = bad[0].wr_id
            set_errno(rc)
            raise PyverbsRDMAError("Failed to post receive to SRQ.", rc)

    def post_srq_ops(self, wr: Any, bad_wr: Any = None) -> None:
        """Tag-matching operations: not emulated."""
        raise unsupported("post SRQ ops failed.")

    def _free(self) -> None:
        self.logger.debug("Closing SRQ")
        destroy("Failed to destroy SRQ", v.ibv_destroy_srq, self.srq)
        self.cq = None


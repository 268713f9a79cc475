"""pyverbs.wq: receive work queues and RSS indirection tables (ibv_create_wq,
ibv_modify_wq, ibv_destroy_wq, ibv_create_rwq_ind_table, ibv_destroy_rwq_ind_table).

WQ(ctx, WQInitAttr) creates a receive WQ (an RQ of the NIC) on the attribute's PD and
CQ, which close it first, as does the Context; RwqIndTable(ctx, RwqIndTableInitAttr)
groups 1 << log_ind_tbl_size of them for an RSS QP (each WQ closes the tables naming
it first).  Posting receives to a WQ is not emulated (EOPNOTSUPP): the device model
delivers no packets to it, and an RSS QP (QPInitAttrEx with ind_table) is refused by
the emulated libmlx5 with EOPNOTSUPP.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from typing import Any

from userspace.libibverbs import wq as w
from userspace.pyverbs.base import (
    AttrStruct,
    PyverbsCM,
    PyverbsObject,
    call,
    destroy,
    object_field,
    set_errno,
    struct_field,
    unsupported,
)
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError


class RwqIndTableInitAttr(PyverbsObject):
    """Mirrors pyverbs' RwqIndTableInitAttr (struct ibv_rwq_ind_table_init_attr)."""

    def __init__(self, log_ind_tbl_size: int = 5, wqs_list: list | None = None,
                 comp_mask: int = 0) -> None:
        super().__init__()
        self.wqs_list = list(wqs_list or [])
        self.attr = w.ibv_rwq_ind_table_init_attr(log_ind_tbl_size,
                                                  [wq.wq for wq in self.wqs_list], comp_mask)

    log_ind_tbl_size = property(lambda self: self.attr.log_ind_tbl_size)
    comp_mask = property(lambda self: self.attr.comp_mask)


class RxHashConf(AttrStruct):
    """Mirrors pyverbs' RxHashConf."""

    _FIELDS = ('rx_hash_function', 'rx_hash_key_len', 'rx_hash_key', 'rx_hash_fields_mask')


class WQAttr(PyverbsObject):
    """Mirrors pyverbs' WQAttr (struct ibv_wq_attr)."""

    def __init__(self, attr_mask: int = 0, wq_state: int = 0, curr_wq_state: int = 0,
                 flags: int = 0, flags_mask: int = 0) -> None:
        super().__init__()
        self.attr = w.ibv_wq_attr(attr_mask, wq_state, curr_wq_state, flags, flags_mask)

    attr_mask = struct_field("attr_mask")
    wq_state = struct_field("wq_state")
    curr_wq_state = struct_field("curr_wq_state")
    flags = struct_field("flags")
    flags_mask = struct_field("flags_mask")


class WQInitAttr(PyverbsObject):
    """Mirrors pyverbs' WQInitAttr (struct ibv_wq_init_attr)."""

    def __init__(self, wq_context: Any = None, wq_pd: Any = None, wq_cq: Any = None,
                 wq_type: int = w.IBV_WQT_RQ, max_wr: int = 100, max_sge: int = 1,
                 comp_mask: int = 0, create_flags: int = 0) -> None:
        super().__init__()
        self._pd, self._cq = wq_pd, wq_cq
        self.attr = w.ibv_wq_init_attr(
            wq_context=wq_context, wq_type=wq_type, max_wr=max_wr, max_sge=max_sge,
            pd=wq_pd.pd if wq_pd is not None else None,
            cq=wq_cq.cq if wq_cq is not None else None, comp_mask=comp_mask,
            create_flags=create_flags)

    wq_type = struct_field("wq_type")

    pd = object_field("pd")

    cq = object_field("cq")


class WQ(PyverbsCM):
    """Mirrors pyverbs' WQ: a receive work queue of a Context."""

    def __init__(self, ctx: Any, attr: WQInitAttr) -> None:
        super().__init__()
        self.wq = call("Failed to create WQ", w.ibv_create_wq, ctx.ctx, attr.attr)
        self._created()
        self.context = ctx
        ctx.add_ref(self)
        for parent in (attr.pd, attr.cq):
            if parent is not None:
                parent.add_ref(self)
        self.pd, self.cq = attr.pd, attr.cq

    @property
    def wqn(self) -> int:
        return self.wq.wq_num

    def modify(self, wq_attr: WQAttr) -> None:
        """ibv_modify_wq()."""
        self._check_open("WQ.modify")
        rc = w.ibv_modify_wq(self.wq, wq_attr.attr)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to modify WQ", rc)

    def post_recv(self, wr: Any, bad_wr: Any = None) -> None:
        """Receives on a WQ: not emulated (the device delivers nothing to it)."""
        raise unsupported("Failed to post recv")

    def _free(self) -> None:
        self.logger.debug("Closing WQ")
        destroy("Failed to destroy WQ", w.ibv_destroy_wq, self.wq)


class RwqIndTable(PyverbsCM):
    """Mirrors pyverbs' RwqIndTable: an RSS indirection table of WQs."""

    def __init__(self, ctx: Any, attr: RwqIndTableInitAttr) -> None:
        super().__init__()
        self.rwq_ind_table = call("Failed to create RwqIndTable",
                                  w.ibv_create_rwq_ind_table, ctx.ctx, attr.attr)
        self._created()
        self.context = ctx
        self.wqs = list(attr.wqs_list)
        ctx.add_ref(self)
        for wq in self.wqs:
            wq.add_ref(self)

    def _free(self) -> None:
        self.logger.debug("Closing RwqIndTable")
        destroy("Failed to destroy RwqIndTable", w.ibv_destroy_rwq_ind_table,
                self.rwq_ind_table)

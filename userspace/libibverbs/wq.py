"""Mirrors rdma-core libibverbs' receive work queues and RSS indirection tables: the
verbs of verbs.h (ibv_create_wq, ibv_modify_wq, ibv_destroy_wq, ibv_create_rwq_ind_table,
ibv_destroy_rwq_ind_table), their types, and the cmd.c functions that send the
extended write() commands (ibv_cmd_create_wq ... ibv_cmd_destroy_rwq_ind_table).

A verb without the provider's op is EOPNOTSUPP; the create verbs raise VerbsError
(the C returns NULL with errno), the others return 0 or the errno.
"""

from __future__ import annotations

import errno
import struct
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.ustruct import UStruct, uapi_struct
from userspace.libibverbs.cmd import VerbsError, execute_write_ex

# enum ibv_wq_type, ibv_wq_state, ibv_wq_attr_mask, ibv_wq_init_attr_mask, ibv_wq_flags
IBV_WQT_RQ = 0
IBV_WQS_RESET, IBV_WQS_RDY, IBV_WQS_ERR, IBV_WQS_UNKNOWN = 0, 1, 2, 3
IBV_WQ_ATTR_STATE, IBV_WQ_ATTR_CURR_STATE, IBV_WQ_ATTR_FLAGS = 1 << 0, 1 << 1, 1 << 2
IBV_WQ_ATTR_RESERVED = 1 << 3
IBV_WQ_INIT_ATTR_FLAGS, IBV_WQ_INIT_ATTR_RESERVED = 1 << 0, 1 << 1
IBV_WQ_FLAGS_CVLAN_STRIPPING, IBV_WQ_FLAGS_SCATTER_FCS = 1 << 0, 1 << 1
IBV_WQ_FLAGS_DELAY_DROP, IBV_WQ_FLAGS_PCI_WRITE_END_PADDING = 1 << 2, 1 << 3
IBV_WQ_FLAGS_RESERVED = 1 << 4
IBV_CREATE_IND_TABLE_RESERVED = 1 << 0


@attrs.define
class ibv_wq_init_attr:
    """Mirrors struct ibv_wq_init_attr (max_wr, max_sge: the real sizes come back)."""

    wq_context: Any = None
    wq_type: int = IBV_WQT_RQ
    max_wr: int = 0
    max_sge: int = 0
    pd: Any = None
    cq: Any = None
    comp_mask: int = 0
    create_flags: int = 0


@attrs.define
class ibv_wq_attr:
    """Mirrors struct ibv_wq_attr."""

    attr_mask: int = 0
    wq_state: int = IBV_WQS_RESET
    curr_wq_state: int = IBV_WQS_RESET
    flags: int = 0
    flags_mask: int = 0


@attrs.define(eq=False)
class ibv_wq:
    """Mirrors struct ibv_wq (the provider's object extends it)."""

    context: Any = None
    wq_context: Any = None
    pd: Any = None
    cq: Any = None
    wq_num: int = 0
    handle: int = 0
    state: int = IBV_WQS_RESET
    wq_type: int = IBV_WQT_RQ
    events_completed: int = 0


@attrs.define
class ibv_rwq_ind_table_init_attr:
    """Mirrors struct ibv_rwq_ind_table_init_attr."""

    log_ind_tbl_size: int = 0
    ind_tbl: list = attrs.Factory(list)
    comp_mask: int = 0


@attrs.define(eq=False)
class ibv_rwq_ind_table:
    """Mirrors struct ibv_rwq_ind_table."""

    context: Any = None
    ind_tbl_handle: int = 0
    ind_tbl_num: int = 0
    comp_mask: int = 0


# -- cmd.c ------------------------------------------------------------------------------------
@traced
def ibv_cmd_create_wq(context: Any, attr: ibv_wq_init_attr, wq: ibv_wq, drv_req: UStruct,
                      drv_resp_cls: type[UStruct]) -> UStruct:
    """Mirrors ibv_cmd_create_wq(): EINVAL for a comp_mask bit libibverbs does not know,
    EOPNOTSUPP for a create flag past the known ones; CREATE_WQ; EINVAL when the kernel's
    response is short.  The WQ takes its handle and number, attr the real sizes;
    returns the provider's response."""
    if attr.comp_mask >= IBV_WQ_INIT_ATTR_RESERVED:
        raise VerbsError(errno.EINVAL, f"ibv_cmd_create_wq: comp_mask {attr.comp_mask:#x}")
    if attr.pd is None or attr.cq is None:
        # EMU: the C dereferences the missing PD or CQ; here it is EINVAL
        raise VerbsError(errno.EINVAL, "ibv_cmd_create_wq: no PD or CQ")
    create_flags = 0
    if attr.comp_mask & IBV_WQ_INIT_ATTR_FLAGS:
        if attr.create_flags & ~(IBV_WQ_FLAGS_RESERVED - 1):
            raise VerbsError(errno.EOPNOTSUPP, f"ibv_cmd_create_wq: create_flags "
                             f"{attr.create_flags:#x}")
        create_flags = attr.create_flags
    req = uv.ib_uverbs_ex_create_wq(user_handle=id(wq) & (1 << 64) - 1,
                                    pd_handle=attr.pd.handle, cq_handle=attr.cq.handle,
                                    wq_type=attr.wq_type, max_sge=attr.max_sge,
                                    max_wr=attr.max_wr, create_flags=create_flags)
    R = uv.ib_uverbs_ex_create_wq_resp
    raw = execute_write_ex(context, uv.IB_USER_VERBS_EX_CMD_CREATE_WQ, req, R.SIZE,
                           "ibv_cmd_create_wq", drv_req, drv_resp_cls.SIZE)
    resp = R.unpack(raw[:R.SIZE])
    if resp.response_length < R.SIZE:
        raise VerbsError(errno.EINVAL, "ibv_cmd_create_wq: short response")
    wq.handle, wq.wq_num = resp.wq_handle, resp.wqn
    attr.max_wr, attr.max_sge = resp.max_wr, resp.max_sge
    wq.context, wq.cq, wq.pd, wq.wq_type = context, attr.cq, attr.pd, attr.wq_type
    return drv_resp_cls.unpack(raw[R.SIZE:])


@traced
def ibv_cmd_modify_wq(wq: ibv_wq, attr: ibv_wq_attr, drv_req: UStruct) -> None:
    """Mirrors ibv_cmd_modify_wq(): EINVAL for an attr_mask bit past FLAGS, EOPNOTSUPP
    for an unknown flag; MODIFY_WQ; on a state change the WQ's state follows."""
    if attr.attr_mask >= IBV_WQ_ATTR_RESERVED:
        raise VerbsError(errno.EINVAL, f"ibv_cmd_modify_wq: attr_mask {attr.attr_mask:#x}")
    req = uv.ib_uverbs_ex_modify_wq(curr_wq_state=attr.curr_wq_state, wq_state=attr.wq_state,
                                    wq_handle=wq.handle, attr_mask=attr.attr_mask)
    if attr.attr_mask & IBV_WQ_ATTR_FLAGS:
        if attr.flags_mask & ~(IBV_WQ_FLAGS_RESERVED - 1):
            raise VerbsError(errno.EOPNOTSUPP, f"ibv_cmd_modify_wq: flags_mask "
                             f"{attr.flags_mask:#x}")
        req.flags, req.flags_mask = attr.flags, attr.flags_mask
    execute_write_ex(wq.context, uv.IB_USER_VERBS_EX_CMD_MODIFY_WQ, req, 0,
                     "ibv_cmd_modify_wq", drv_req, 0)
    if attr.attr_mask & IBV_WQ_ATTR_STATE:
        wq.state = attr.wq_state


@traced
def ibv_cmd_destroy_wq(wq: ibv_wq) -> None:
    """Mirrors ibv_cmd_destroy_wq(): DESTROY_WQ; EINVAL for a short response.
    # EMU: no async event thread to wait for: the events the kernel reported for the
    # WQ (WQ_FATAL, never raised by the model) are not waited on."""
    R = uv.ib_uverbs_ex_destroy_wq_resp
    raw = execute_write_ex(wq.context, uv.IB_USER_VERBS_EX_CMD_DESTROY_WQ,
                           uv.ib_uverbs_ex_destroy_wq(wq_handle=wq.handle), R.SIZE,
                           "ibv_cmd_destroy_wq")
    if R.unpack(raw).response_length < R.SIZE:
        raise VerbsError(errno.EINVAL, "ibv_cmd_destroy_wq: short response")


def _ind_table_req(n: int) -> type[UStruct]:
    """struct ib_uverbs_ex_create_rwq_ind_table with its n handles, the whole padded to
    8 bytes ("the entire message must be size aligned to 8 bytes")."""
    size = -(-(8 + 4 * n) // 8) * 8

    @uapi_struct
    class ib_uverbs_ex_create_rwq_ind_table_n(UStruct):
        FIELDS = (("comp_mask", "I"), ("log_ind_tbl_size", "I"),
                  ("wq_handles", f"{size - 8}s"))

    return ib_uverbs_ex_create_rwq_ind_table_n


@traced
def ibv_cmd_create_rwq_ind_table(context: Any, init_attr: ibv_rwq_ind_table_init_attr,
                                 tbl: ibv_rwq_ind_table,
                                 drv_resp_cls: type[UStruct]) -> UStruct:
    """Mirrors ibv_cmd_create_rwq_ind_table(): EINVAL for a comp_mask; CREATE_RWQ_IND_TBL
    with the WQs' handles; EINVAL when the response is short."""
    if init_attr.comp_mask >= IBV_CREATE_IND_TABLE_RESERVED:
        raise VerbsError(errno.EINVAL, f"ibv_cmd_create_rwq_ind_table: comp_mask "
                         f"{init_attr.comp_mask:#x}")
    n = 1 << init_attr.log_ind_tbl_size
    cls = _ind_table_req(n)
    handles = struct.pack(f"<{n}I", *(wq.handle for wq in init_attr.ind_tbl[:n]))
    req = cls(log_ind_tbl_size=init_attr.log_ind_tbl_size,
              wq_handles=handles.ljust(cls.SIZE - 8, b"\0"))
    R = uv.ib_uverbs_ex_create_rwq_ind_table_resp
    raw = execute_write_ex(context, uv.IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL, req, R.SIZE,
                           "ibv_cmd_create_rwq_ind_table", None, drv_resp_cls.SIZE)
    resp = R.unpack(raw[:R.SIZE])
    if resp.response_length < R.SIZE:
        raise VerbsError(errno.EINVAL, "ibv_cmd_create_rwq_ind_table: short response")
    tbl.ind_tbl_handle, tbl.ind_tbl_num, tbl.context = \
        resp.ind_tbl_handle, resp.ind_tbl_num, context
    return drv_resp_cls.unpack(raw[R.SIZE:])


@traced
def ibv_cmd_destroy_rwq_ind_table(tbl: ibv_rwq_ind_table) -> None:
    """Mirrors ibv_cmd_destroy_rwq_ind_table(): DESTROY_RWQ_IND_TBL."""
    execute_write_ex(tbl.context, uv.IB_USER_VERBS_EX_CMD_DESTROY_RWQ_IND_TBL,
                     uv.ib_uverbs_ex_destroy_rwq_ind_table(ind_tbl_handle=tbl.ind_tbl_handle),
                     0, "ibv_cmd_destroy_rwq_ind_table")


# -- verbs.h ----------------------------------------------------------------------------------
def _op(ctx: Any, name: str) -> Any:
    op = getattr(ctx.ops, name, None)
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, f"ibv_{name}: the provider has no {name}")
    return op


def _errno(fn: Any, *args: Any) -> int:
    try:
        ret = fn(*args)
    except OSError as e:
        return e.errno
    return ret or 0


@traced
def ibv_create_wq(context: Any, attr: ibv_wq_init_attr) -> ibv_wq:
    """Mirrors ibv_create_wq(): the provider's create_wq (EOPNOTSUPP without one); the
    WQ keeps the caller's wq_context."""
    wq = _op(context, "create_wq")(context, attr)
    wq.wq_context = attr.wq_context
    wq.events_completed = 0
    return wq


@traced
def ibv_modify_wq(wq: ibv_wq, attr: ibv_wq_attr) -> int:
    """Mirrors ibv_modify_wq(): 0 or the errno."""
    return _errno(_op(wq.context, "modify_wq"), wq, attr)


@traced
def ibv_destroy_wq(wq: ibv_wq) -> int:
    """Mirrors ibv_destroy_wq(): 0 or the errno (EBUSY while a table names it)."""
    return _errno(_op(wq.context, "destroy_wq"), wq)


@traced
def ibv_create_rwq_ind_table(context: Any,
                             init_attr: ibv_rwq_ind_table_init_attr) -> ibv_rwq_ind_table:
    """Mirrors ibv_create_rwq_ind_table(): the provider's op (EOPNOTSUPP without one)."""
    return _op(context, "create_rwq_ind_table")(context, init_attr)


@traced
def ibv_destroy_rwq_ind_table(tbl: ibv_rwq_ind_table) -> int:
    """Mirrors ibv_destroy_rwq_ind_table(): 0 or the errno (EBUSY while a QP uses it)."""
    return _errno(_op(tbl.context, "destroy_rwq_ind_table"), tbl)

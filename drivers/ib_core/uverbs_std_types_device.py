"""Mirrors drivers/infiniband/core/uverbs_std_types_device.c: the DEVICE object's
global ioctl methods - here the port query (ibv_query_port) and the two GID queries
(ibv_query_gid_table, ibv_query_gid_ex).

UVERBS_METHOD_QUERY_PORT: ib_query_port into ib_uverbs_query_port_resp_ex (the
legacy answer, port_cap_flags2, active_speed_ex).
    EINVAL   a port the device does not have, no ucontext

UVERBS_METHOD_QUERY_GID_TABLE: every valid GID of every port, as an array of
ib_uverbs_gid_entry of the caller's entry size, and how many there are.
    EINVAL   flags set (none is defined), entry size 0, an entries buffer that is
             not a multiple of the entry size or holds no entry, more valid GIDs
             than it holds, no ucontext
UVERBS_METHOD_QUERY_GID_ENTRY: one (port, index) entry.
    EINVAL   flags set, a port the device does not have, an index outside the
             port's table, a response buffer other than 32 bytes, no ucontext
    ENODATA  an empty slot
UVERBS_METHOD_QUERY_CONTEXT: the file's ucontext described again (ibv_import_device).
    EINVAL   no ucontext
    EOPNOTSUPP  a driver without query_ucontext
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.cache import rdma_get_gid_attr, rdma_put_gid_attr, rdma_query_gid_table
from drivers.ib_core.device import ib_query_port
from drivers.ib_core.ib_verbs import ib_port_attr, rdma_is_port_valid
from drivers.ib_core.rdma_core import ib_uverbs_get_ucontext_file
from drivers.ib_core.uverbs_cmd import copy_port_attr_to_resp
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_attr_ptr_get_array_size,
    uverbs_attr_ptr_len,
    uverbs_copy_to,
    uverbs_copy_to_buf,
    uverbs_get_const,
    uverbs_get_flags32,
)
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import ib_user_ioctl_cmds as c
from kernel_model.uapi.ib_user_verbs import ib_uverbs_gid_entry, ib_uverbs_query_port_resp_ex

GID_ENTRY_SIZE = ib_uverbs_gid_entry.SIZE
_U64 = 8


def copy_gid_entries_to_user(attrs_: Any, entries: list[ib_uverbs_gid_entry],
                             user_entry_size: int) -> None:
    """Mirrors copy_gid_entries_to_user(): each entry in the caller's entry size
    (truncated, or followed by zeros when the caller's is larger)."""
    raw = b"".join(e.pack()[:user_entry_size].ljust(user_entry_size, b"\0") for e in entries)
    uverbs_copy_to_buf(attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, raw)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_QUERY_PORT(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_QUERY_PORT): the legacy fields as the write
    command has them, port_cap_flags2, and the full speed in active_speed_ex."""
    ib_dev = ib_uverbs_get_ucontext_file(attrs_.ufile).device
    port_num = uverbs_get_const(attrs_, c.UVERBS_ATTR_QUERY_PORT_PORT_NUM) & 0xFF  # a u8
    attr = ib_port_attr()
    ib_query_port(ib_dev, port_num, attr)
    resp = copy_port_attr_to_resp(attr, ib_uverbs_query_port_resp_ex, ib_dev, port_num,
                                  port_cap_flags2=attr.port_cap_flags2,
                                  active_speed_ex=attr.active_speed)
    uverbs_copy_to_buf(attrs_, c.UVERBS_ATTR_QUERY_PORT_RESP, resp.pack(), zero_tail=True)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_QUERY_GID_TABLE(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_QUERY_GID_TABLE)."""
    uverbs_get_flags32(attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_FLAGS, 0)
    user_entry_size = uverbs_get_const(attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE)
    if not user_entry_size:
        raise KernelError(EINVAL, "query_gid_table: entry size 0")
    uverbs_attr_ptr_len(attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES, _U64, _U64)
    max_entries = uverbs_attr_ptr_get_array_size(
        attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, user_entry_size)
    if max_entries <= 0:
        raise KernelError(EINVAL, "query_gid_table: the entries buffer holds no entry")
    ib_dev = ib_uverbs_get_ucontext_file(attrs_.ufile).device
    entries = rdma_query_gid_table(ib_dev, max_entries)
    copy_gid_entries_to_user(attrs_, entries, user_entry_size)
    uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES, len(entries), _U64)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_QUERY_GID_ENTRY(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_QUERY_GID_ENTRY).

    # EMU: netdev_ifindex stays 0 (no net_device behind a GID; the kernel leaves
    # it 0 too when rdma_read_gid_attr_ndev_rcu answers ENODEV).
    """
    uverbs_attr_ptr_len(attrs_, c.UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, GID_ENTRY_SIZE,
                        GID_ENTRY_SIZE)
    uverbs_get_flags32(attrs_, c.UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, 0)
    port_num = uverbs_get_const(attrs_, c.UVERBS_ATTR_QUERY_GID_ENTRY_PORT)
    gid_index = uverbs_get_const(attrs_, c.UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX)
    ib_dev = ib_uverbs_get_ucontext_file(attrs_.ufile).device
    if not rdma_is_port_valid(ib_dev, port_num):
        raise KernelError(EINVAL, f"query_gid_entry: {ib_dev.name} has no port {port_num}")
    gid_attr = rdma_get_gid_attr(ib_dev, port_num, gid_index)
    try:
        entry = ib_uverbs_gid_entry(gid=gid_attr.gid, gid_index=gid_attr.index,
                                    port_num=gid_attr.port_num, gid_type=gid_attr.gid_type)
        uverbs_copy_to_buf(attrs_, c.UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, entry.pack(),
                           zero_tail=True)
    finally:
        rdma_put_gid_attr(gid_attr)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_QUERY_CONTEXT(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_QUERY_CONTEXT): what GET_CONTEXT answered,
    asked again of the file's existing ucontext (ibv_import_device on a dup of the
    command fd): the completion vector count and core_support (each written only if
    the caller passed its attribute), then the driver's ops.query_ucontext.

    EINVAL without a ucontext (EIO once the device is gone); EOPNOTSUPP for a driver
    without query_ucontext; the driver's errors."""
    ucontext = ib_uverbs_get_ucontext_file(attrs_.ufile)
    ib_dev = ucontext.device
    if ib_dev.ops.query_ucontext is None:
        raise KernelError(EOPNOTSUPP, f"query_context: {ib_dev.name} has no query_ucontext")
    uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS,
                   attrs_.ufile.device.num_comp_vectors, 4)
    uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT,
                   c.IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS, _U64)
    ib_dev.ops.query_ucontext(ucontext, attrs_)


#: DECLARE_UVERBS_GLOBAL_METHODS(UVERBS_OBJECT_DEVICE, ...): the ones the model has
DEVICE_METHODS = {
    (c.UVERBS_OBJECT_DEVICE, c.UVERBS_METHOD_QUERY_PORT): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_QUERY_PORT,
        mandatory=(c.UVERBS_ATTR_QUERY_PORT_PORT_NUM, c.UVERBS_ATTR_QUERY_PORT_RESP)),
    (c.UVERBS_OBJECT_DEVICE, c.UVERBS_METHOD_QUERY_GID_TABLE): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_QUERY_GID_TABLE,
        mandatory=(c.UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE,
                   c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
                   c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES)),
    (c.UVERBS_OBJECT_DEVICE, c.UVERBS_METHOD_QUERY_GID_ENTRY): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_QUERY_GID_ENTRY,
        mandatory=(c.UVERBS_ATTR_QUERY_GID_ENTRY_PORT, c.UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX,
                   c.UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS,
                   c.UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY)),
    (c.UVERBS_OBJECT_DEVICE, c.UVERBS_METHOD_QUERY_CONTEXT): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_QUERY_CONTEXT),
}

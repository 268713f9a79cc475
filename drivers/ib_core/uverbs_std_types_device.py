"""Mirrors drivers/infiniband/core/uverbs_std_types_device.c: the DEVICE object's
global ioctl methods - here the two GID queries (ibv_query_gid_table, ibv_query_gid_ex).

UVERBS_METHOD_QUERY_GID_TABLE: every valid GID of every port, as an array of
ib_uverbs_gid_entry of the caller's entry size, and how many there are.
    EINVAL   flags set (none is defined), entry size 0, an entries buffer that is
             not a multiple of the entry size or holds no entry, more valid GIDs
             than it holds, no ucontext
UVERBS_METHOD_QUERY_GID_ENTRY: one (port, index) entry.
    EINVAL   flags set, a port the device does not have, an index outside the
             port's table, a response buffer other than 32 bytes, no ucontext
    ENODATA  an empty slot
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.cache import rdma_get_gid_attr, rdma_put_gid_attr, rdma_query_gid_table
from drivers.ib_core.ib_verbs import rdma_is_port_valid
from drivers.ib_core.rdma_core import ib_uverbs_get_ucontext_file
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_attr_ptr_get_array_size,
    uverbs_attr_ptr_len,
    uverbs_copy_to,
    uverbs_copy_to_buf,
    uverbs_get_const,
    uverbs_get_flags32,
)
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import ib_user_ioctl_cmds as c
from kernel_model.uapi.ib_user_verbs import ib_uverbs_gid_entry

GID_ENTRY_SIZE = ib_uverbs_gid_entry.SIZE
_U64 = 8


def copy_gid_entries_to_user(attrs_: Any, entries: list[ib_uverbs_gid_entry],
                             user_entry_size: int) -> None:
    """Mirrors copy_gid_entries_to_user(): each entry in the caller's entry size
    (truncated, or followed by zeros when the caller's is larger)."""
    raw = b"".join(e.pack()[:user_entry_size].ljust(user_entry_size, b"\0") for e in entries)
    uverbs_copy_to_buf(attrs_, c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, raw)


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


#: DECLARE_UVERBS_GLOBAL_METHODS(UVERBS_OBJECT_DEVICE, ...): the ones the model has
DEVICE_METHODS = {
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
}

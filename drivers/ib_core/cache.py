"""Mirrors drivers/infiniband/core/cache.c (the GID table), with the default-GID part of
roce_gid_mgmt.c and the gids/ and gid_attrs/types/ files of sysfs.c.

Each RoCE port has a GID table of gid_tbl_len entries (the port's immutable
data).  An entry is a GID, its type (RoCE v1 "IB/RoCE v1", RoCE v2 "RoCE v2")
and the port's MAC; it is referenced by everything that uses it as a source
address (a QP's primary path holds one, see verbs.py), and a deleted entry
stays in its slot, PENDING_DEL, until the last reference goes.  The device
learns of each entry through ops.add_gid / ops.del_gid (mlx5 programs its
RoCE address table).

At registration the first indices are reserved for the default GIDs, one per
RoCE version the port speaks: fe80::/64 + the modified EUI-64 of the port's
MAC, so index 0 is the RoCE v1 default GID and index 1 the RoCE v2 one.
# EMU: there are no net_devices and no IP stack: the port's MAC comes from
# the driver (ops.get_port_mac stands in for the netdev's dev_addr), and no
# IP-based GIDs are ever added (roce_gid_mgmt's netdev and inetaddr events).

Lock order: table.lock (mutex: add/del, may call into the driver) ->
table.rwlock (EMU: a spinlock for the kernel's rwlock_t; guards data_vec and
the entries' state for the lookups).
"""

from __future__ import annotations

from typing import Any

import attrs

from drivers.ib_core.ib_addr import LINK_LOCAL_PREFIX, addrconf_ifid_eui48, gid_to_str
from drivers.ib_core.ib_verbs import (
    IB_GID_TYPE_IB,
    IB_GID_TYPE_ROCE,
    IB_GID_TYPE_ROCE_UDP_ENCAP,
    IB_GID_TYPE_SIZE,
    rdma_end_port,
    rdma_is_port_valid,
    rdma_protocol_roce,
    rdma_protocol_roce_eth_encap,
    rdma_protocol_roce_udp_encap,
    rdma_start_port,
)
from kernel_model.errno import EINVAL, ENODATA, ENOSPC, KernelError
from kernel_model.locking import mutex_init, spin_lock_init
from kernel_model.sysfs import sysfs_create_group
from kernel_model.trace import traced
from kernel_model.uapi.ib_user_verbs import ib_uverbs_gid_entry

GID_TABLE_ENTRY_INVALID, GID_TABLE_ENTRY_VALID, GID_TABLE_ENTRY_PENDING_DEL = 0, 1, 2
#: Mirrors gid_type_str[] (what gid_attrs/types/<i> shows)
GID_TYPE_STR = {IB_GID_TYPE_IB: "IB/RoCE v1", IB_GID_TYPE_ROCE: "IB/RoCE v1",
                IB_GID_TYPE_ROCE_UDP_ENCAP: "RoCE v2"}


@attrs.define(eq=False)
class ib_gid_attr:
    """Mirrors struct ib_gid_attr: one GID table entry as its users see it."""

    device: Any
    gid: bytes
    gid_type: int
    index: int
    port_num: int
    mac: bytes = bytes(6)  # EMU: ndev->dev_addr (rdma_read_gid_l2_fields)

    def __repr__(self) -> str:
        return (f"GID {self.port_num}/{self.index} {gid_to_str(self.gid)} "
                f"{GID_TYPE_STR[self.gid_type]}")


class ib_gid_table_entry:
    """Mirrors struct ib_gid_table_entry: the attr, the driver's context, the kref."""

    def __init__(self, attr: ib_gid_attr):
        self.attr = attr
        self.context: Any = None   # what ops.add_gid left for ops.del_gid
        self.refcnt = 1            # kref: the table's reference
        self.state = GID_TABLE_ENTRY_INVALID

    def __repr__(self) -> str:
        states = ("invalid", "valid", "pending_del")
        return f"{self.attr!r} {states[self.state]} ref={self.refcnt}"


class ib_gid_table:
    """Mirrors struct ib_gid_table: one port's entries."""

    def __init__(self, sz: int):
        self.sz = sz
        self.lock = mutex_init("&table->lock")
        self.rwlock = spin_lock_init("&table->rwlock")
        self.default_gid_indices = 0
        # protected by rwlock (writers also hold lock):
        self.data_vec: list[ib_gid_table_entry | None] = [None] * sz

    def __repr__(self) -> str:
        return f"gid table sz={self.sz} entries={[e for e in self.data_vec if e]}"


def _table(device: Any, port: int) -> ib_gid_table:
    table = device.gid_tables.get(port) if rdma_is_port_valid(device, port) else None
    if table is None:
        raise KernelError(EINVAL, f"rdma_gid_table: {device.name} has no GID table on "
                          f"port {port}")
    return table


def _valid(entry: ib_gid_table_entry | None) -> bool:
    return entry is not None and entry.state == GID_TABLE_ENTRY_VALID


# -- references ---------------------------------------------------------------------------
def _entry_of(attr: ib_gid_attr) -> tuple[ib_gid_table, ib_gid_table_entry]:
    """container_of(attr, struct ib_gid_table_entry, attr): a RoCE entry keeps its
    slot until it is freed, so the slot names it."""
    table = _table(attr.device, attr.port_num)
    entry = table.data_vec[attr.index]
    assert entry is not None and entry.attr is attr, f"{attr!r} is not in its slot"
    return table, entry


def rdma_hold_gid_attr(attr: ib_gid_attr) -> ib_gid_attr:
    """Mirrors rdma_hold_gid_attr(): one more reference on the entry."""
    _entry_of(attr)[1].refcnt += 1
    return attr


def rdma_put_gid_attr(attr: ib_gid_attr) -> None:
    """Mirrors rdma_put_gid_attr(): the last reference frees the entry and its slot."""
    table, entry = _entry_of(attr)
    with table.rwlock:
        entry.refcnt -= 1
        if entry.refcnt == 0:
            table.data_vec[attr.index] = None  # free_gid_entry_locked()


@traced
def rdma_get_gid_attr(device: Any, port: int, index: int) -> ib_gid_attr:
    """Mirrors rdma_get_gid_attr(): the entry at index, held; EINVAL outside the
    table, ENODATA for an empty (or deleted) slot."""
    table = _table(device, port)
    if not 0 <= index < table.sz:
        raise KernelError(EINVAL, f"rdma_get_gid_attr: index {index} outside the "
                          f"{table.sz}-entry table")
    with table.rwlock:
        entry = table.data_vec[index]
        if not _valid(entry):
            raise KernelError(ENODATA, f"rdma_get_gid_attr: no GID at index {index}")
        entry.refcnt += 1
        return entry.attr


def rdma_query_gid(device: Any, port: int, index: int) -> bytes:
    """Mirrors rdma_query_gid(): the 16-byte GID at index; EINVAL if none."""
    table = _table(device, port)
    with table.rwlock:
        entry = table.data_vec[index] if 0 <= index < table.sz else None
        if not _valid(entry):
            raise KernelError(EINVAL, f"rdma_query_gid: no GID at index {index}")
        return entry.attr.gid


@traced
def rdma_query_gid_table(device: Any, max_entries: int) -> list[ib_uverbs_gid_entry]:
    """Mirrors rdma_query_gid_table(): every valid entry of every port, in port then
    index order, as ib_uverbs_gid_entry; EINVAL when there are more than max_entries.

    # EMU: netdev_ifindex stays 0 - the model has no net_device behind a GID
    # (rdma_read_gid_attr_ndev_rcu finds none).
    """
    entries: list[ib_uverbs_gid_entry] = []
    for port in range(rdma_start_port(device), rdma_end_port(device) + 1):
        table = _table(device, port)
        with table.rwlock:
            for entry in table.data_vec:
                if not _valid(entry):
                    continue
                if len(entries) >= max_entries:
                    raise KernelError(EINVAL, f"rdma_query_gid_table: more than {max_entries} "
                                      "valid GIDs")
                attr = entry.attr
                entries.append(ib_uverbs_gid_entry(gid=attr.gid, gid_index=attr.index,
                                                   port_num=attr.port_num,
                                                   gid_type=attr.gid_type))
    return entries


# -- add and delete -------------------------------------------------------------------------
def rdma_cap_roce_gid_table(device: Any, port: int) -> bool:
    """Mirrors rdma_cap_roce_gid_table(): the device keeps its own copy of the table."""
    return rdma_protocol_roce(device, port) and device.ops.add_gid is not None and \
        device.ops.del_gid is not None


def del_gid(device: Any, port: int, table: ib_gid_table, ix: int) -> None:
    """Mirrors del_gid(): the entry goes PENDING_DEL, the device forgets it (its
    answer is not checked), the table drops its reference."""
    with table.rwlock:
        entry = table.data_vec[ix]
        entry.state = GID_TABLE_ENTRY_PENDING_DEL
    if rdma_cap_roce_gid_table(device, port):
        try:
            device.ops.del_gid(entry.attr, entry.context)
        except KernelError:
            pass  # del_gid() ignores the driver's return
    rdma_put_gid_attr(entry.attr)


@traced
def add_modify_gid(table: ib_gid_table, attr: ib_gid_attr) -> None:
    """Mirrors add_modify_gid() -> add_roce_gid(): replace what is at attr.index,
    tell the device (ops.add_gid), then store the entry VALID."""
    if _valid(table.data_vec[attr.index]):
        del_gid(attr.device, attr.port_num, table, attr.index)
    entry = ib_gid_table_entry(attr)
    if rdma_cap_roce_gid_table(attr.device, attr.port_num):
        entry.context = attr.device.ops.add_gid(attr)
    with table.rwlock:  # store_gid_entry()
        entry.state = GID_TABLE_ENTRY_VALID
        table.data_vec[attr.index] = entry


def _find_empty(table: ib_gid_table, default_gid: bool) -> int:
    """find_gid()'s `empty`: the first free slot of the right kind (default or not)."""
    for ix, entry in enumerate(table.data_vec):
        if entry is None and bool(table.default_gid_indices >> ix & 1) == default_gid:
            return ix
    return -1


@traced
def __ib_cache_gid_add(device: Any, port: int, gid: bytes, attr: ib_gid_attr,
                       default_gid: bool) -> None:
    """Mirrors __ib_cache_gid_add(): a GID not yet in the table goes into the first
    free slot; ENOSPC when there is none (logged, as the kernel only warns)."""
    if gid == bytes(16):
        raise KernelError(EINVAL, "__ib_cache_gid_add: the zero GID")
    table = _table(device, port)
    with table.lock:
        if any(_valid(e) and e.attr.gid == gid and e.attr.gid_type == attr.gid_type
               for e in table.data_vec):
            return
        ix = _find_empty(table, default_gid)
        if ix < 0:
            raise KernelError(ENOSPC, f"__ib_cache_gid_add: no free slot for "
                              f"{gid_to_str(gid)}")
        attr.device, attr.index, attr.port_num, attr.gid = device, ix, port, gid
        add_modify_gid(table, attr)


def make_default_gid(mac: bytes) -> bytes:
    """Mirrors make_default_gid(): fe80::/64 + the MAC's modified EUI-64."""
    return LINK_LOCAL_PREFIX + addrconf_ifid_eui48(mac)


def roce_gid_type_mask_support(device: Any, port: int) -> int:
    """Mirrors roce_gid_type_mask_support(): a bit per GID type the port speaks."""
    if not rdma_protocol_roce(device, port):
        return 1 << IB_GID_TYPE_IB
    mask = 0
    if rdma_protocol_roce_eth_encap(device, port):
        mask |= 1 << IB_GID_TYPE_ROCE
    if rdma_protocol_roce_udp_encap(device, port):
        mask |= 1 << IB_GID_TYPE_ROCE_UDP_ENCAP
    return mask


@traced
def ib_cache_gid_set_default_gid(device: Any, port: int, mac: bytes, gid_type_mask: int) -> None:
    """Mirrors ib_cache_gid_set_default_gid(IB_CACHE_GID_DEFAULT_MODE_SET): the
    default GID once per GID type, each in its reserved slot (a failure is
    only logged, as the kernel's pr_warn)."""
    for gid_type in range(IB_GID_TYPE_SIZE):
        if not gid_type_mask >> gid_type & 1:
            continue
        attr = ib_gid_attr(device, bytes(16), gid_type, 0, port, mac)
        try:
            __ib_cache_gid_add(device, port, make_default_gid(mac), attr, True)
        except KernelError as e:
            device.log.append(f"__ib_cache_gid_add: unable to add gid: {e}")


def rdma_roce_rescan_device(device: Any) -> None:
    """Mirrors rdma_roce_rescan_device(): the default GIDs of every RoCE port.

    # EMU: the MAC is the driver's answer (ops.get_port_mac), not a netdev's.
    """
    if device.ops.get_port_mac is None:
        return
    for port in range(1, device.phys_port_cnt + 1):
        if not rdma_protocol_roce(device, port):
            continue
        try:
            mac = device.ops.get_port_mac(device, port)
        except KernelError as e:  # the rescan is void: a port without its MAC has no GIDs
            device.log.append(f"rdma_roce_rescan_device: port {port}: {e}")
            continue
        ib_cache_gid_set_default_gid(device, port, mac, roce_gid_type_mask_support(device, port))


# -- setup and cleanup ----------------------------------------------------------------------
@traced
def ib_cache_setup_one(device: Any) -> None:
    """Mirrors ib_cache_setup_one() -> gid_table_setup_one(): a table per port, the
    first indices reserved for the default GIDs, then the RoCE rescan."""
    for port in range(1, device.phys_port_cnt + 1):
        table = ib_gid_table(device.port_data[port].gid_tbl_len)
        ndefault = bin(roce_gid_type_mask_support(device, port)).count("1")
        table.default_gid_indices = (1 << min(ndefault, table.sz)) - 1  # reserve_default
        device.gid_tables[port] = table
    rdma_roce_rescan_device(device)


@traced
def ib_cache_cleanup_one(device: Any) -> None:
    """Mirrors ib_cache_cleanup_one(): every valid entry deleted (the device told),
    then the tables released - an entry someone still holds is a reference leak."""
    for port, table in device.gid_tables.items():
        with table.lock:  # cleanup_gid_table_port()
            for ix in range(table.sz):
                if _valid(table.data_vec[ix]):
                    del_gid(device, port, table, ix)
        leaked = [e for e in table.data_vec if e is not None]
        if leaked:  # release_gid_table()
            device.machine.report_bug("release_gid_table", f"GID entry ref leak: {leaked}")
    device.gid_tables = {}


# -- sysfs ---------------------------------------------------------------------------------
def show_port_gid(device: Any, port: int, index: int) -> str:
    """Mirrors show_port_gid(): the GID, or the zero GID for an empty slot (user
    space reads the whole table and must not stop at a hole)."""
    try:
        attr = rdma_get_gid_attr(device, port, index)
    except KernelError:
        return gid_to_str(bytes(16)) + "\n"
    text = gid_to_str(attr.gid) + "\n"
    rdma_put_gid_attr(attr)
    return text


def show_port_gid_attr_gid_type(device: Any, port: int, index: int) -> str:
    """Mirrors _show_port_gid_attr(print_gid_type): ENODATA for an empty slot."""
    attr = rdma_get_gid_attr(device, port, index)
    text = GID_TYPE_STR[attr.gid_type] + "\n"
    rdma_put_gid_attr(attr)
    return text


def ib_setup_gid_attrs(device: Any, base: str) -> None:
    """The gids/<i> and gid_attrs/types/<i> files of each port (sysfs.c
    alloc_port_table_group).  # EMU: no gid_attrs/ndevs (there are no netdevs)."""
    for port, table in device.gid_tables.items():
        sysfs_create_group(f"{base}/ports/{port}/gids", table.sz,
                           lambda i, p=port: show_port_gid(device, p, i))
        sysfs_create_group(f"{base}/ports/{port}/gid_attrs/types", table.sz,
                           lambda i, p=port: show_port_gid_attr_gid_type(device, p, i))

"""Mirrors the GID part of drivers/infiniband/hw/mlx5/main.c: set_roce_addr and the
add_gid / del_gid ops.

ib_core's GID table (drivers/ib_core/cache.py) tells the driver of every
entry it adds or deletes; mlx5 mirrors each into the device's RoCE address
table (mlx5_core_roce_gid_set -> SET_ROCE_ADDRESS) at the same index, with
the RoCE version of the GID type and, for RoCE v2, the L3 type of the GID
(IPv4 if v4-mapped, else IPv6).  The firmware then resolves an address
path's src_addr_index against that table.

Lock order: called under the GID table's lock (a mutex); one firmware command.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_addr import ipv6_addr_v4mapped
from drivers.ib_core.ib_verbs import IB_GID_TYPE_ROCE, IB_GID_TYPE_ROCE_UDP_ENCAP
from drivers.mlx5_core.gid import mlx5_core_roce_gid_set
from drivers.mlx5_core.ifc import (
    MLX5_ROCE_L3_TYPE_IPV4,
    MLX5_ROCE_L3_TYPE_IPV6,
    MLX5_ROCE_VERSION_1,
    MLX5_ROCE_VERSION_2,
)
from drivers.mlx5_core.vport import mlx5_query_nic_vport_mac_address
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, mlx5_ib_warn, to_mdev
from kernel_model.trace import traced

VLAN_CFI_MASK = 0x1000


@traced
def set_roce_addr(dev: mlx5_ib_dev, port_num: int, index: int, gid: bytes | None,
                  attr: Any) -> None:
    """Mirrors set_roce_addr(): the entry's version and L3 type, then the command
    (gid None clears the index).

    # EMU: no VLANs (vlan_id 0xffff: none), the MAC is the GID entry's own
    # (rdma_read_gid_l2_fields reads the netdev's).
    """
    vlan_id, roce_version, roce_l3_type = 0xFFFF, 0, 0
    if attr.gid_type == IB_GID_TYPE_ROCE:
        roce_version = MLX5_ROCE_VERSION_1
    elif attr.gid_type == IB_GID_TYPE_ROCE_UDP_ENCAP:
        roce_version = MLX5_ROCE_VERSION_2
        roce_l3_type = MLX5_ROCE_L3_TYPE_IPV4 if gid is not None and ipv6_addr_v4mapped(gid) \
            else MLX5_ROCE_L3_TYPE_IPV6
    else:
        mlx5_ib_warn(dev, f"Unexpected GID type {attr.gid_type}")
    mlx5_core_roce_gid_set(dev.mdev, index, roce_version, roce_l3_type, gid,
                           attr.mac if gid is not None else None, vlan_id < VLAN_CFI_MASK,
                           vlan_id, port_num)


@traced
def mlx5_ib_add_gid(attr: Any) -> None:
    """Mirrors mlx5_ib_add_gid(): program the new entry (no driver context kept).

    # EMU: MACsec GID operations are not modelled.
    """
    set_roce_addr(to_mdev(attr.device), attr.port_num, attr.index, attr.gid, attr)


@traced
def mlx5_ib_del_gid(attr: Any, context: Any) -> None:
    """Mirrors mlx5_ib_del_gid(): clear the entry."""
    set_roce_addr(to_mdev(attr.device), attr.port_num, attr.index, None, attr)


def mlx5_ib_get_port_mac(ibdev: mlx5_ib_dev, port: int) -> bytes:
    """The port's MAC for ib_core's default GIDs (the EMU get_port_mac op): what the
    mlx5e netdev takes as its dev_addr, the vport's permanent address."""
    return mlx5_query_nic_vport_mac_address(to_mdev(ibdev).mdev)

"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/lib/gid.c: the device's RoCE address table.

mlx5_core_roce_gid_set() programs one entry of the table the firmware keeps
for an Ethernet port (SET_ROCE_ADDRESS): the GID, the source MAC, the VLAN,
the RoCE version and L3 type.  An address path names its source GID by index
into this table (ads.src_addr_index); a NULL GID clears the entry.

Lock order: none (one firmware command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec_in
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CAP_PORT_TYPE_ETH,
    MLX5_CMD_OP_SET_ROCE_ADDRESS,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


@traced
def mlx5_core_roce_gid_set(dev: mlx5_core_dev, index: int, roce_version: int, roce_l3_type: int,
                           gid: bytes | None, mac: bytes | None, vlan: bool, vlan_id: int,
                           port_num: int) -> None:
    """Mirrors mlx5_core_roce_gid_set(): SET_ROCE_ADDRESS of one index (gid None: clear it).

    EINVAL on a device whose port is not Ethernet.
    """
    if MLX5_CAP_GEN(dev, "port_type") != MLX5_CAP_PORT_TYPE_ETH:
        raise KernelError(EINVAL, "mlx5_core_roce_gid_set: not an Ethernet port")
    in_ = IfcStruct("set_roce_address_in")
    addr = MLX5_ADDR_OF("set_roce_address_in", in_, "roce_address")
    if gid is not None:
        if vlan:
            MLX5_SET("roce_addr_layout", addr, "vlan_valid", 1)
            MLX5_SET("roce_addr_layout", addr, "vlan_id", vlan_id)
        mac_value = int.from_bytes(mac, "big")  # ether_addr_copy() over the two fields
        MLX5_SET("roce_addr_layout", addr, "source_mac_47_32", mac_value >> 32)
        MLX5_SET("roce_addr_layout", addr, "source_mac_31_0", mac_value)
        MLX5_ADDR_OF("roce_addr_layout", addr, "source_l3_address")[:] = gid
    MLX5_SET("roce_addr_layout", addr, "roce_version", roce_version)
    MLX5_SET("roce_addr_layout", addr, "roce_l3_type", roce_l3_type)
    if MLX5_CAP_GEN(dev, "num_vhca_ports") > 0:
        MLX5_SET("set_roce_address_in", in_, "vhca_port_num", port_num)
    MLX5_SET("set_roce_address_in", in_, "roce_address_index", index)
    MLX5_SET("set_roce_address_in", in_, "opcode", MLX5_CMD_OP_SET_ROCE_ADDRESS)
    mlx5_cmd_exec_in(dev, in_)

"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/vport.c: the function's NIC vport context.

The queries mlx5_ib makes for an Ethernet (RoCE) port - GUIDs, MTU, MAC,
minimum inline mode - and the two settings the core and mlx5_ib change:
RoCE enable (reference counted: mlx5_nic_vport_enable_roce /
mlx5_nic_vport_disable_roce) and local loopback.

Lock order: mdev->roce_lock is a leaf around roce_en and its command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_ETH, MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CAP_INLINE_MODE_L2,
    MLX5_CAP_INLINE_MODE_NOT_REQUIRED,
    MLX5_CAP_INLINE_MODE_VPORT_CONTEXT,
    MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_ADAPTER,
    MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT,
    MLX5_GET,
    MLX5_INLINE_MODE_L2,
    MLX5_INLINE_MODE_NONE,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.errno import KernelError
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


@traced
def mlx5_query_nic_vport_context(mdev: mlx5_core_dev, vport: int = 0,
                                 other_vport: int = 0) -> IfcStruct:
    """Mirrors mlx5_query_nic_vport_context(): the whole context (nic_vport_context)."""
    in_, out = IfcStruct("query_nic_vport_context_in"), IfcStruct("query_nic_vport_context_out")
    typ = "query_nic_vport_context_in"
    MLX5_SET(typ, in_, "opcode", MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT)
    MLX5_SET(typ, in_, "vport_number", vport)
    MLX5_SET(typ, in_, "other_vport", other_vport)
    mlx5_cmd_exec(mdev, in_, out)
    return MLX5_ADDR_OF("query_nic_vport_context_out", out, "nic_vport_context")


def _ctx_field(mdev: mlx5_core_dev, field: str) -> int:
    return MLX5_GET("nic_vport_context", mlx5_query_nic_vport_context(mdev), field)


def mlx5_query_nic_vport_node_guid(mdev: mlx5_core_dev) -> int:
    """Mirrors mlx5_query_nic_vport_node_guid()."""
    return _ctx_field(mdev, "node_guid")


def mlx5_query_nic_vport_system_image_guid(mdev: mlx5_core_dev) -> int:
    """Mirrors mlx5_query_nic_vport_system_image_guid()."""
    return _ctx_field(mdev, "system_image_guid")


@traced
def mlx5_core_query_vendor_id(mdev: mlx5_core_dev) -> int:
    """Mirrors mlx5_core_query_vendor_id(): QUERY_ADAPTER's ieee_vendor_id - the IEEE
    OUI (0x02c9 for Mellanox/NVIDIA), not the PCI vendor (0x15b3)."""
    in_, out = IfcStruct("query_adapter_in"), IfcStruct("query_adapter_out")
    MLX5_SET("query_adapter_in", in_, "opcode", MLX5_CMD_OP_QUERY_ADAPTER)
    mlx5_cmd_exec(mdev, in_, out)
    return MLX5_GET("query_adapter_out", out, "query_adapter_struct.ieee_vendor_id")


def mlx5_query_nic_vport_mtu(mdev: mlx5_core_dev) -> int:
    """Mirrors mlx5_query_nic_vport_mtu(): the hardware MTU (netdev MTU + L2 overhead)."""
    return _ctx_field(mdev, "mtu")


def mlx5_query_nic_vport_mac_address(mdev: mlx5_core_dev, vport: int = 0) -> bytes:
    """Mirrors mlx5_query_nic_vport_mac_address(): the 6-byte permanent MAC."""
    mac = MLX5_ADDR_OF("nic_vport_context", mlx5_query_nic_vport_context(mdev, vport),
                       "permanent_address")
    value = MLX5_GET("mac_address_layout", mac, "mac_addr_47_32") << 32 | MLX5_GET(
        "mac_address_layout", mac, "mac_addr_31_0")
    return value.to_bytes(6, "big")


def mlx5_query_nic_vport_min_inline(mdev: mlx5_core_dev, vport: int = 0) -> int:
    """Mirrors mlx5_query_nic_vport_min_inline()."""
    return MLX5_GET("nic_vport_context", mlx5_query_nic_vport_context(mdev, vport),
                    "min_wqe_inline_mode")


@traced
def mlx5_query_min_inline(mdev: mlx5_core_dev) -> int:
    """Mirrors mlx5_query_min_inline(): the inline mode the device requires of send WQEs."""
    mode = MLX5_CAP_ETH(mdev, "wqe_inline_mode")
    if mode == MLX5_CAP_INLINE_MODE_VPORT_CONTEXT:
        try:
            return mlx5_query_nic_vport_min_inline(mdev, 0)
        except KernelError:
            return MLX5_INLINE_MODE_L2  # fall through to the L2 default
    if mode == MLX5_CAP_INLINE_MODE_L2:
        return MLX5_INLINE_MODE_L2
    assert mode == MLX5_CAP_INLINE_MODE_NOT_REQUIRED
    return MLX5_INLINE_MODE_NONE


def _modify(mdev: mlx5_core_dev, **fields: int) -> None:
    """MODIFY_NIC_VPORT_CONTEXT of the given fields (field_select bit of the same name)."""
    in_ = IfcStruct("modify_nic_vport_context_in")
    MLX5_SET("modify_nic_vport_context_in", in_, "opcode", MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT)
    sel = MLX5_ADDR_OF("modify_nic_vport_context_in", in_, "field_select")
    ctx = MLX5_ADDR_OF("modify_nic_vport_context_in", in_, "nic_vport_context")
    for field, value in fields.items():
        MLX5_SET("modify_nic_vport_field_select", sel, field, 1)
        MLX5_SET("nic_vport_context", ctx, field, value)
    mlx5_cmd_exec(mdev, in_, IfcStruct("modify_nic_vport_context_out"))


@traced
def mlx5_nic_vport_enable_roce(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_nic_vport_enable_roce(): the first user turns roce_en on."""
    with mdev.roce_lock:
        if not mdev.roce_en:
            _modify(mdev, roce_en=1)
        mdev.roce_en += 1


@traced
def mlx5_nic_vport_disable_roce(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_nic_vport_disable_roce(): the last user turns roce_en off."""
    with mdev.roce_lock:
        if mdev.roce_en:
            mdev.roce_en -= 1
            if not mdev.roce_en:
                _modify(mdev, roce_en=0)


@traced
def mlx5_nic_vport_update_local_lb(mdev: mlx5_core_dev, enable: bool) -> None:
    """Mirrors mlx5_nic_vport_update_local_lb(): allow or block local loopback."""
    fields = {}
    if MLX5_CAP_GEN(mdev, "disable_local_lb_mc"):
        fields["disable_mc_local_lb"] = int(not enable)
    if MLX5_CAP_GEN(mdev, "disable_local_lb_uc"):
        fields["disable_uc_local_lb"] = int(not enable)
    if fields:
        _modify(mdev, **fields)


def mlx5_nic_vport_query_local_lb(mdev: mlx5_core_dev) -> bool:
    """Mirrors mlx5_nic_vport_query_local_lb(): is loopback allowed (both kinds)."""
    ctx = mlx5_query_nic_vport_context(mdev)
    return not (MLX5_GET("nic_vport_context", ctx, "disable_mc_local_lb")
                or MLX5_GET("nic_vport_context", ctx, "disable_uc_local_lb"))

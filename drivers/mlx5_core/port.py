"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/port.c: port registers (ACCESS_REG).

mlx5_ib's query_port for a RoCE port reads the link protocols from PTYS
(mlx5_port_query_eth_proto, then translate_eth_proto_oper to speed/width)
and the MTUs from PMTU.  Registers travel in ACCESS_REG's register_data; a
read has op_mod 1 (op_mod = !write).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_ACCESS_REG,
    MLX5_GET,
    MLX5_PTYS_EN,
    MLX5_REG_PMTU,
    MLX5_REG_PTYS,
    MLX5_SET,
    IfcStruct,
    memcpy_ifc,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


@traced
def mlx5_core_access_reg(dev: mlx5_core_dev, data_in: IfcStruct, data_out: IfcStruct,
                         reg_id: int, arg: int, write: bool) -> None:
    """Mirrors mlx5_core_access_reg(): read or write one register through ACCESS_REG."""
    in_, out = IfcStruct("access_register_in"), IfcStruct("access_register_out")
    MLX5_SET("access_register_in", in_, "opcode", MLX5_CMD_OP_ACCESS_REG)
    MLX5_SET("access_register_in", in_, "op_mod", int(not write))
    MLX5_SET("access_register_in", in_, "argument", arg)
    MLX5_SET("access_register_in", in_, "register_id", reg_id)
    memcpy_ifc(MLX5_ADDR_OF("access_register_in", in_, "register_data"), data_in)
    mlx5_cmd_exec(dev, in_, out)
    memcpy_ifc(data_out, MLX5_ADDR_OF("access_register_out", out, "register_data"))


@traced
def mlx5_query_port_ptys(dev: mlx5_core_dev, proto_mask: int, local_port: int = 1
                         ) -> IfcStruct:
    """Mirrors mlx5_query_port_ptys(): the PTYS register (a ptys_reg IfcStruct)."""
    ptys_in, ptys_out = IfcStruct("ptys_reg"), IfcStruct("ptys_reg")
    MLX5_SET("ptys_reg", ptys_in, "local_port", local_port)
    MLX5_SET("ptys_reg", ptys_in, "proto_mask", proto_mask)
    mlx5_core_access_reg(dev, ptys_in, ptys_out, MLX5_REG_PTYS, 0, False)
    return ptys_out


class mlx5_port_eth_proto:
    """Mirrors struct mlx5_port_eth_proto."""

    def __init__(self, cap: int, admin: int, oper: int):
        self.cap, self.admin, self.oper = cap, admin, oper

    def __repr__(self) -> str:
        return f"mlx5_port_eth_proto cap {self.cap:#x} admin {self.admin:#x} oper {self.oper:#x}"


def mlx5_port_query_eth_proto(dev: mlx5_core_dev, port: int, ext: bool) -> mlx5_port_eth_proto:
    """Mirrors mlx5_port_query_eth_proto(): capability/admin/oper link modes (ext or legacy)."""
    ptys = mlx5_query_port_ptys(dev, MLX5_PTYS_EN, port)
    pre = "ext_" if ext else ""
    return mlx5_port_eth_proto(*(MLX5_GET("ptys_reg", ptys, f"{pre}eth_proto_{w}")
                                 for w in ("capability", "admin", "oper")))


def _pmtu(dev: mlx5_core_dev, field: str, port: int) -> int:
    pmtu_in, pmtu_out = IfcStruct("pmtu_reg"), IfcStruct("pmtu_reg")
    MLX5_SET("pmtu_reg", pmtu_in, "local_port", port)
    mlx5_core_access_reg(dev, pmtu_in, pmtu_out, MLX5_REG_PMTU, 0, False)
    return MLX5_GET("pmtu_reg", pmtu_out, field)


def mlx5_query_port_max_mtu(dev: mlx5_core_dev, port: int = 1) -> int:
    """Mirrors mlx5_query_port_max_mtu(): PMTU.max_mtu (hardware MTU)."""
    return _pmtu(dev, "max_mtu", port)


def mlx5_query_port_oper_mtu(dev: mlx5_core_dev, port: int = 1) -> int:
    """Mirrors mlx5_query_port_oper_mtu(): PMTU.oper_mtu."""
    return _pmtu(dev, "oper_mtu", port)

"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/transobj.c: transport domains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


@traced
def mlx5_core_alloc_transport_domain(dev: mlx5_core_dev, uid: int = 0) -> int:
    """Mirrors mlx5_core_alloc_transport_domain(): ALLOC_TRANSPORT_DOMAIN; its number."""
    in_, out = IfcStruct("alloc_transport_domain_in"), IfcStruct("alloc_transport_domain_out")
    MLX5_SET("alloc_transport_domain_in", in_, "opcode", MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN)
    MLX5_SET("alloc_transport_domain_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("alloc_transport_domain_out", out, "transport_domain")


@traced
def mlx5_core_dealloc_transport_domain(dev: mlx5_core_dev, tdn: int, uid: int = 0) -> None:
    """Mirrors mlx5_core_dealloc_transport_domain(): DEALLOC_TRANSPORT_DOMAIN."""
    in_ = IfcStruct("dealloc_transport_domain_in")
    MLX5_SET("dealloc_transport_domain_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN)
    MLX5_SET("dealloc_transport_domain_in", in_, "uid", uid)
    MLX5_SET("dealloc_transport_domain_in", in_, "transport_domain", tdn)
    mlx5_cmd_exec(dev, in_, IfcStruct("dealloc_transport_domain_out"))

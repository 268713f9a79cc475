"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/mr.c: memory keys.

A memory key is the firmware's index (<< 8) or-ed with an 8-bit variant the
driver chooses (mkc.mkey_7_0), so a recycled index does not revive an old key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_CREATE_MKEY,
    MLX5_CMD_OP_DESTROY_MKEY,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


def mlx5_idx_to_mkey(mkey_idx: int) -> int:
    """Mirrors mlx5_idx_to_mkey()."""
    return (mkey_idx << 8) & 0xFFFFFFFF


def mlx5_mkey_to_idx(mkey: int) -> int:
    """Mirrors mlx5_mkey_to_idx()."""
    return mkey >> 8


def mlx5_mkey_variant(mkey: int) -> int:
    """Mirrors mlx5_mkey_variant()."""
    return mkey & 0xFF


@traced
def mlx5_core_create_mkey(dev: mlx5_core_dev, in_: IfcStruct) -> int:
    """Mirrors mlx5_core_create_mkey(): CREATE_MKEY; returns the mkey (index << 8 | variant)."""
    out = IfcStruct("create_mkey_out")
    MLX5_SET("create_mkey_in", in_, "opcode", MLX5_CMD_OP_CREATE_MKEY)
    mlx5_cmd_exec(dev, in_, out)
    mkey_index = MLX5_GET("create_mkey_out", out, "mkey_index")
    return MLX5_GET("create_mkey_in", in_, "memory_key_mkey_entry.mkey_7_0") | \
        mlx5_idx_to_mkey(mkey_index)


@traced
def mlx5_core_destroy_mkey(dev: mlx5_core_dev, mkey: int) -> None:
    """Mirrors mlx5_core_destroy_mkey(): DESTROY_MKEY by index (no uid, as the kernel does)."""
    in_ = IfcStruct("destroy_mkey_in")
    MLX5_SET("destroy_mkey_in", in_, "opcode", MLX5_CMD_OP_DESTROY_MKEY)
    MLX5_SET("destroy_mkey_in", in_, "mkey_index", mlx5_mkey_to_idx(mkey))
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_mkey_out"))

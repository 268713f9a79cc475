"""Mirrors the user-context part of drivers/infiniband/hw/mlx5/devx.c: the DEVX uid.

A user context opened with MLX5_IB_ALLOC_UCTX_DEVX gets a firmware user
context (CREATE_UCTX); its number, the uid, is stamped on every object the
context then creates, so the firmware refuses commands that name another
context's objects.
# EMU: only the uid is modelled - no DEVX object commands, no UCTX caps
# (RAW_TX / INTERNAL_DEV_RES need capabilities the emulated HCA lacks).
"""

from __future__ import annotations

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_CREATE_UCTX,
    MLX5_CMD_OP_DESTROY_UCTX,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced


@traced
def mlx5_ib_devx_create(dev: mlx5_ib_dev, is_user: bool) -> int:
    """Mirrors mlx5_ib_devx_create(): CREATE_UCTX; the new uid (EINVAL without uctx support)."""
    if not MLX5_CAP_GEN(dev.mdev, "log_max_uctx"):
        raise KernelError(EINVAL, "mlx5_ib_devx_create: device has no user contexts")
    in_, out = IfcStruct("create_uctx_in"), IfcStruct("create_uctx_out")
    MLX5_SET("create_uctx_in", in_, "opcode", MLX5_CMD_OP_CREATE_UCTX)
    MLX5_SET("create_uctx_in", in_, "uctx.cap", 0)
    mlx5_cmd_exec(dev.mdev, in_, out)
    return MLX5_GET("create_uctx_out", out, "uid")


@traced
def mlx5_ib_devx_destroy(dev: mlx5_ib_dev, uid: int) -> None:
    """Mirrors mlx5_ib_devx_destroy(): DESTROY_UCTX."""
    in_ = IfcStruct("destroy_uctx_in")
    MLX5_SET("destroy_uctx_in", in_, "opcode", MLX5_CMD_OP_DESTROY_UCTX)
    MLX5_SET("destroy_uctx_in", in_, "uid", uid)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("destroy_uctx_out"))

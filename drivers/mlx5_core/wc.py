"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/wc.c: is write-combining usable?

mlx5_ib hands out BlueFlame registers (bf_reg_size, WC mmaps) only if the
host can write-combine into the UAR BAR.  The kernel finds out once, on
first use, under wc_state_lock.

# EMU: the real test (mlx5_core_test_wc) creates a CQ and an SQ, posts a NOP
# through a BlueFlame register and polls for its completion, which needs the
# data path; here the device reports the platform's write-combining ability
# (Mlx5Config.write_combining) as its `bf` capability, and the test reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.driver import (
    MLX5_CAP_GEN,
    MLX5_WC_STATE_SUPPORTED,
    MLX5_WC_STATE_UNINITIALIZED,
    MLX5_WC_STATE_UNSUPPORTED,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


@traced
def mlx5_core_test_wc(mdev: mlx5_core_dev) -> None:
    """Mirrors mlx5_core_test_wc(): settle wc_state (see the EMU note above)."""
    ok = MLX5_CAP_GEN(mdev, "bf") and MLX5_CAP_GEN(mdev, "log_bf_reg_size")
    mdev.wc_state = MLX5_WC_STATE_SUPPORTED if ok else MLX5_WC_STATE_UNSUPPORTED


@traced
def mlx5_wc_support_get(mdev: mlx5_core_dev) -> bool:
    """Mirrors mlx5_wc_support_get(): test once, then answer from wc_state."""
    with mdev.wc_state_lock:
        if mdev.wc_state == MLX5_WC_STATE_UNINITIALIZED:
            mlx5_core_test_wc(mdev)
    return mdev.wc_state == MLX5_WC_STATE_SUPPORTED

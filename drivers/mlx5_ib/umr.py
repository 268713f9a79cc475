"""Mirrors drivers/infiniband/hw/mlx5/umr.c, the one call peer memory needs: revoking an mkey.

mlx5r_umr_revoke_mr() posts a UMR work request on the driver's UMR QP that
sets the mkey free and moves it to the UMR PD, and waits for its
completion.  "Once it returns the NIC will not be doing any DMA to the pages
under the MR, and any DMA in progress will be completed": later accesses
through the key complete in error, but the mkey itself stays until
DESTROY_MKEY at deregistration.

# EMU: the UMR QP is not modelled; the UMR is the firmware command
# EMU_UMR_REVOKE_MKEY (kernel_model/hw/mlx5_ifc.py), which has the same
# effect and the same completion rule.
"""

from __future__ import annotations

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY, MLX5_SET, IfcStruct
from drivers.mlx5_core.mr import mlx5_mkey_to_idx
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_mr, to_mdev
from kernel_model.trace import traced


@traced
def mlx5r_umr_revoke_mr(mr: mlx5_ib_mr) -> None:
    """Mirrors mlx5r_umr_revoke_mr(): the mkey free, in the UMR PD; DMA through it drained."""
    dev = to_mdev(mr.device)
    in_ = IfcStruct("emu_umr_revoke_mkey_in")
    MLX5_SET("emu_umr_revoke_mkey_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY)
    MLX5_SET("emu_umr_revoke_mkey_in", in_, "mkey_index", mlx5_mkey_to_idx(mr.mmkey.key))
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("emu_umr_revoke_mkey_out"))
    mr.revoked = True

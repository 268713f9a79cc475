"""Mirrors drivers/infiniband/hw/mlx5/umr.c: the UMRs peer memory needs.

Revoking an mkey (upstream and MLNX_OFED 5.x+), and - for the MLNX_OFED 4.x
mkey-cache path (ib_core ofed="4.9") - loading and enabling a cached one.

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
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY,
    MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY,
    MLX5_SET,
    IfcStruct,
)
from drivers.mlx5_core.mr import mlx5_mkey_to_idx
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_mr, to_mdev
from kernel_model.locking import schedule_timeout
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


@traced
def mlx5_ib_post_send_wait_update(mr: mlx5_ib_mr, in_: IfcStruct) -> None:
    """The UMR MLNX_OFED 4.x mlx5_ib_update_xlt posts on the UMR QP and waits for:
    the mkey's translation, PD, access and range loaded, and - with `enable` set in
    `in_` - the mkey turned on (EMU_UMR_UPDATE_MKEY stands for it, see the module's
    EMU note)."""
    dev = to_mdev(mr.device)
    MLX5_SET("emu_umr_update_mkey_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY)
    MLX5_SET("emu_umr_update_mkey_in", in_, "mkey_index", mlx5_mkey_to_idx(mr.mmkey.key))
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("emu_umr_update_mkey_out"))
    # wait_for_completion(&umr_context.done): the poster sleeps until the UMR's CQE
    # (# EMU: a one-jiffy sleep stands for the UMR QP's round trip)
    schedule_timeout(1)

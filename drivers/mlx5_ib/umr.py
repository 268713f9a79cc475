"""Mirrors drivers/infiniband/hw/mlx5/umr.c: the UMRs peer memory and rereg_mr need.

Revoking an mkey (upstream and MLNX_OFED 5.x+), changing a live mkey's PD and
access (rereg_mr), and - for the MLNX_OFED 4.x mkey-cache path (ib_core
ofed="4.9") - loading and enabling a cached one.

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

from drivers.ib_core.ib_verbs import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_RELAXED_ORDERING,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    ib_pd,
)
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS,
    MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY,
    MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY,
    MLX5_SET,
    IfcStruct,
)
from drivers.mlx5_core.mr import mlx5_mkey_to_idx
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, mlx5_ib_mr, to_mdev, to_mpd
from kernel_model.errno import EFAULT, KernelError
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


# EMU: the model's HCA capabilities have no umr_modify_atomic_disabled,
# relaxed_ordering_write_umr or relaxed_ordering_read_umr bits; they read as 0, as a
# ConnectX-6 Dx reports the first (the model's mkeys carry no relaxed-ordering bits)
_UMR_MODIFY_ATOMIC_DISABLED = _RELAXED_ORDERING_WRITE_UMR = _RELAXED_ORDERING_READ_UMR = 0


def mlx5r_umr_can_reconfig(dev: mlx5_ib_dev, current_access_flags: int,
                           target_access_flags: int) -> bool:
    """Mirrors mlx5r_umr_can_reconfig(): may a UMR change the access flags from the
    current to the target ones?  Not the atomic bit when the device forbids a UMR to
    modify it, nor relaxed ordering when the device does not let a UMR set it."""
    diffs = current_access_flags ^ target_access_flags
    if diffs & IB_ACCESS_REMOTE_ATOMIC and MLX5_CAP_GEN(dev.mdev, "atomic") and \
            _UMR_MODIFY_ATOMIC_DISABLED:
        return False
    if diffs & IB_ACCESS_RELAXED_ORDERING and \
            MLX5_CAP_GEN(dev.mdev, "relaxed_ordering_write") and not _RELAXED_ORDERING_WRITE_UMR:
        return False
    if diffs & IB_ACCESS_RELAXED_ORDERING and \
            MLX5_CAP_GEN(dev.mdev, "relaxed_ordering_read_pci_enabled") and \
            not _RELAXED_ORDERING_READ_UMR:
        return False
    return True


@traced
def mlx5r_umr_rereg_pd_access(mr: mlx5_ib_mr, pd: ib_pd, access_flags: int) -> None:
    """Mirrors mlx5r_umr_rereg_pd_access(): a UMR (MLX5_UMR_CHECK_FREE, the access and
    PD mkey-mask bits) that gives the live mkey the new PD and access flags; the key,
    translation and range stay.  EFAULT when the UMR completes in error (a free -
    revoked - mkey, a PD the device does not know): nothing changed.

    # EMU: the UMR is the firmware command EMU_UMR_REREG_PD_ACCESS (see the module's
    # EMU note); its failure stands for the error completion."""
    dev = to_mdev(mr.device)
    in_ = IfcStruct("emu_umr_rereg_pd_access_in")
    MLX5_SET("emu_umr_rereg_pd_access_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS)
    MLX5_SET("emu_umr_rereg_pd_access_in", in_, "mkey_index", mlx5_mkey_to_idx(mr.mmkey.key))
    mkc = MLX5_ADDR_OF("emu_umr_rereg_pd_access_in", in_, "memory_key_mkey_entry")
    MLX5_SET("mkc", mkc, "a", bool(access_flags & IB_ACCESS_REMOTE_ATOMIC))
    MLX5_SET("mkc", mkc, "rw", bool(access_flags & IB_ACCESS_REMOTE_WRITE))
    MLX5_SET("mkc", mkc, "rr", bool(access_flags & IB_ACCESS_REMOTE_READ))
    MLX5_SET("mkc", mkc, "lw", bool(access_flags & IB_ACCESS_LOCAL_WRITE))
    MLX5_SET("mkc", mkc, "lr", 1)
    MLX5_SET("mkc", mkc, "pd", to_mpd(pd).pdn)
    try:
        mlx5_cmd_exec(dev.mdev, in_, IfcStruct("emu_umr_rereg_pd_access_out"))
    except KernelError as e:
        # mlx5r_umr_post_send_wait(): a UMR completion in error is -EFAULT
        raise KernelError(EFAULT, f"mlx5r_umr_rereg_pd_access: reg umr failed: {e}") from None
    schedule_timeout(1)      # the poster waits for the UMR's CQE (as above)
    mr.access_flags = access_flags

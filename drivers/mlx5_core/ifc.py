"""Mirrors include/linux/mlx5/mlx5_ifc.h (and the constants of include/linux/mlx5/device.h).

The command and context layouts, opcodes and command statuses the driver
speaks.  They are the device's interface definition (the PRM), so the one
table lives in kernel_model/hw/mlx5_ifc.py where the firmware model reads it
too; this module is the driver's view of it, with the macros:

    in_ = IfcStruct("create_cq_in", pas=npages)      # kvzalloc(inlen, GFP_KERNEL)
    cqc = MLX5_ADDR_OF("create_cq_in", in_, "cq_context")
    MLX5_SET("cqc", cqc, "log_cq_size", ilog2(ncqe))
    MLX5_SET64("cqc", cqc, "dbr_addr", db_dma)

See kernel_model/hw/mlx5_ifc.py for the representation (# EMU there).
"""

from __future__ import annotations

from kernel_model.hw import mlx5_ifc as _prm
from kernel_model.hw.mlx5_ifc import *  # noqa: F403 - the PRM names, as the header has them
from kernel_model.hw.mlx5_ifc import LAYOUTS, IfcStruct, cpu_to_be64, memcpy_ifc  # noqa: F401

__mlx5_bit_sz = _prm.__mlx5_bit_sz

# include/linux/mlx5/device.h
MLX5_ADAPTER_PAGE_SHIFT = 12
MLX5_ADAPTER_PAGE_SIZE = 1 << MLX5_ADAPTER_PAGE_SHIFT
MLX5_BF_OFFSET = 0x800
MLX5_CQ_DOORBELL = 0x20
MLX5_EQ_DOORBEL_OFFSET = 0x40
MLX5_BFREGS_PER_UAR = 4
MLX5_NON_FP_BFREGS_PER_UAR = 2
MLX5_FP_BFREGS_PER_UAR = 2
MLX5_MAX_UARS = 256
MLX5_MAX_BFREGS = MLX5_MAX_UARS * MLX5_NON_FP_BFREGS_PER_UAR
CMD_IF_REV = 5
MLX5_MAX_COMMANDS = 32
MLX5_PCI_CMD_XPORT = 7
MLX5_DRIVER_SYND = 0xbadd00de

# struct mlx5_init_seg offsets
MLX5_ISEG_FW_REV = 0x0
MLX5_ISEG_CMDIF_REV_FW_SUB = 0x4
MLX5_ISEG_CMDQ_ADDR_H = 0x10
MLX5_ISEG_CMDQ_ADDR_L_SZ = 0x14
MLX5_ISEG_CMD_DBELL = 0x18
MLX5_ISEG_INITIALIZING = 0x1FC
MLX5_ISEG_INTERNAL_TIMER_H = 0x1000
MLX5_ISEG_INTERNAL_TIMER_L = 0x1004
MLX5_ISEG_HEALTH_COUNTER = 0x1010
MLX5_INIT_SEG_SIZE = 0x2010


def mlx5_to_sw_pkey_sz(pkey_sz: int) -> int:
    """Mirrors mlx5_to_sw_pkey_sz(): the capability's encoding -> P_Key table entries."""
    return 0 if pkey_sz > 5 else 128 << pkey_sz


def mlx5_get_gid_table_len(param: int) -> int:
    """Mirrors mlx5_get_gid_table_len() (an IB port's gid_table_size encoding)."""
    return 0 if param > 4 else 8 << param

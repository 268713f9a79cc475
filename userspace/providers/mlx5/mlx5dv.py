"""Mirrors rdma-core providers/mlx5/mlx5dv.h (plus a few constants of mlx5.h and mlx5-abi.h).

The numbers the pure-logic modules of the provider share: WQE building-block
sizes, the sizes of the WQE segments the sizing code adds up (the C code uses
sizeof() of the structs in mlx5dv.h), the bfreg/UAR geometry and the
direct-verbs flags.  Values are rdma-core's (v5x-v6x); the section comments
name the header each group comes from.
"""

from __future__ import annotations

# -- mlx5dv.h: work queue geometry -------------------------------------------------
MLX5_SEND_WQE_BB = 64          # a send WQE is built of 64-byte basic blocks
MLX5_SEND_WQE_SHIFT = 6
MLX5_RCV_DBR = 0               # 32-bit word of a doorbell record: receive counter
MLX5_SND_DBR = 1               # ... send counter

# sizeof() of the WQE segments (struct mlx5_wqe_*_seg in mlx5dv.h / wqe.h)
MLX5_WQE_CTRL_SEG_SIZE = 16
MLX5_WQE_RADDR_SEG_SIZE = 16
MLX5_WQE_ATOMIC_SEG_SIZE = 16
MLX5_WQE_DATA_SEG_SIZE = 16
MLX5_WQE_DATAGRAM_SEG_SIZE = 48
MLX5_WQE_XRC_SEG_SIZE = 16
MLX5_WQE_ETH_SEG_SIZE = 32
MLX5_WQE_ETH_PAD_SIZE = 16
MLX5_WQE_UMR_CTRL_SEG_SIZE = 48
MLX5_WQE_MKEY_CONTEXT_SEG_SIZE = 64
MLX5_WQE_UMR_KLM_SEG_SIZE = 16
MLX5_WQE_INL_DATA_SEG_SIZE = 4  # struct mlx5_wqe_inl_data_seg: one byte_count word
MLX5_RWQE_SIG_SIZE = 16         # struct mlx5_rwqe_sig

# -- mlx5dv.h: direct-verbs QP creation ------------------------------------------
MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS = 1 << 0
MLX5DV_QP_INIT_ATTR_MASK_DC = 1 << 1
MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS = 1 << 2

MLX5DV_DCTYPE_DCT = 1
MLX5DV_DCTYPE_DCI = 2

MLX5DV_QP_EX_WITH_MR_INTERLEAVED = 1 << 0
MLX5DV_QP_EX_WITH_MR_LIST = 1 << 1
MLX5DV_QP_EX_WITH_MKEY_CONFIGURE = 1 << 2

# -- mlx5.h ----------------------------------------------------------------------
MLX5_ADAPTER_PAGE_SIZE = 4096   # one UAR is 4 KiB whatever the system page size
MLX5_ADAPTER_PAGE_SHIFT = 12
MLX5_BF_OFFSET = 0x800          # BlueFlame registers start half way into a UAR
MLX5_QP_FLAGS_USE_UNDERLAY = 0x01
MLX5_CTX_FLAGS_NO_KERN_DYN_UAR = 1 << 1

# -- mlx5-abi.h: bfreg (uuar) accounting -----------------------------------------
MLX5_NUM_NON_FP_BFREGS_PER_UAR = 2   # the two "regular" registers of a UAR
NUM_BFREGS_PER_UAR = 4               # plus two fast-path ones
MLX5_MAX_UARS = 1 << 8
MLX5_MAX_BFREGS = MLX5_MAX_UARS * MLX5_NUM_NON_FP_BFREGS_PER_UAR
MLX5_DEF_TOT_UUARS = 8 * MLX5_NUM_NON_FP_BFREGS_PER_UAR
MLX5_MED_BFREGS_TSHOLD = 12

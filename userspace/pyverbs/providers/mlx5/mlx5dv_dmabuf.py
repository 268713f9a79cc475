"""pyverbs.providers.mlx5.mlx5dv_dmabuf: mlx5dv_reg_dmabuf_mr (rdma-core 50+).

mlx5dv_reg_dmabuf_mr is the mlx5 variant of ibv_reg_dmabuf_mr that takes mlx5 access
flags (MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT: the "data direct" DMA path of ConnectX-8
devices).  Plain dma-buf MRs are emulated (pyverbs.mr.DmaBufMR over the implicit host's
amdgpu render node); this variant is not modelled and fails with EOPNOTSUPP.
rdma-core's tests of it need cuda-python besides.
"""

from __future__ import annotations

from typing import Any

from userspace.pyverbs.base import PyverbsCM, unsupported
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD


class Mlx5DmaBufMR(MR):
    """Mirrors pyverbs' Mlx5DmaBufMR (mlx5dv_reg_dmabuf_mr): not emulated."""

    def __init__(self, pd: PD, offset: int = 0, length: int = 0, iova: int = 0, fd: int = -1,
                 access: int = 0, mlx5_access: int = 0, **kwargs: Any) -> None:
        PyverbsCM.__init__(self)
        raise unsupported(f"Failed to register a mlx5 dma-buf MR. length: {length}, "
                          f"access flags: {access} mlx5_access: {mlx5_access}")

"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/cq.c: completion queue objects.

The caller (mlx5_ib's create_cq_user, a kernel ULP) fills create_cq_in with
the CQ context - size, UAR, EQ number, page size, doorbell record address -
and the PAS of its buffer; mlx5_core_create_cq() resolves the EQ, runs
CREATE_CQ, and attaches the CQ to the EQ's table so completions can find it.
mlx5_core_destroy_cq() detaches it and runs DESTROY_CQ with the CQ's uid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.eq import mlx5_eqn2comp_eq
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_CREATE_CQ,
    MLX5_CMD_OP_DESTROY_CQ,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.errno import EEXIST, KernelError
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev
    from drivers.mlx5_core.eq import mlx5_eq


class mlx5_core_cq:
    """Mirrors struct mlx5_core_cq: the CQ as mlx5_core tracks it."""

    def __init__(self) -> None:
        self.cqn = 0
        self.cqe_sz = 64
        self.uid = 0
        self.cons_index = 0
        self.arm_sn = 0
        self.eq: mlx5_eq | None = None
        self.refcount = 0
        self.comp: Callable[[mlx5_core_cq], None] | None = None
        self.event: Callable[[mlx5_core_cq, int], None] | None = None

    def __repr__(self) -> str:
        return f"mlx5_core_cq {self.cqn:#x} uid {self.uid}"


@traced
def mlx5_core_create_cq(dev: mlx5_core_dev, cq: mlx5_core_cq, in_: IfcStruct,
                        out: IfcStruct | None = None) -> None:
    """Mirrors mlx5_core_create_cq() (mlx5_create_cq + mlx5_cmd_check)."""
    eqn = MLX5_GET("create_cq_in", in_, "cq_context.c_eqn_or_apu_element")
    eq = mlx5_eqn2comp_eq(dev, eqn)
    out = out if out is not None else IfcStruct("create_cq_out")
    MLX5_SET("create_cq_in", in_, "opcode", MLX5_CMD_OP_CREATE_CQ)
    mlx5_cmd_exec(dev, in_, out)
    cq.cqn = MLX5_GET("create_cq_out", out, "cqn")
    cq.cons_index = cq.arm_sn = 0
    cq.eq = eq
    cq.uid = MLX5_GET("create_cq_in", in_, "uid")
    cq.refcount = 1
    if cq.cqn in eq.cq_table:  # mlx5_eq_add_cq(): radix_tree_insert
        _destroy_cmd(dev, cq)   # err_cmd:
        raise KernelError(EEXIST, f"mlx5_core_create_cq: cqn {cq.cqn:#x} already on its EQ")
    eq.cq_table[cq.cqn] = cq


def _destroy_cmd(dev: mlx5_core_dev, cq: mlx5_core_cq) -> None:
    in_ = IfcStruct("destroy_cq_in")
    MLX5_SET("destroy_cq_in", in_, "opcode", MLX5_CMD_OP_DESTROY_CQ)
    MLX5_SET("destroy_cq_in", in_, "cqn", cq.cqn)
    MLX5_SET("destroy_cq_in", in_, "uid", cq.uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_cq_out"))


@traced
def mlx5_core_destroy_cq(dev: mlx5_core_dev, cq: mlx5_core_cq) -> None:
    """Mirrors mlx5_core_destroy_cq(): detach from the EQ, then DESTROY_CQ."""
    if cq.eq is not None and cq.eq.cq_table.get(cq.cqn) is cq:  # mlx5_eq_del_cq()
        del cq.eq.cq_table[cq.cqn]
    _destroy_cmd(dev, cq)
    cq.refcount -= 1

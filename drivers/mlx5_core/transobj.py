"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/transobj.c: transport domains and the
transport objects (TIS, TIR, SQ, RQ) - one firmware command each; the caller has
filled the context (and the uid) of the mailbox it passes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_CREATE_RQ,
    MLX5_CMD_OP_CREATE_RQT,
    MLX5_CMD_OP_CREATE_SQ,
    MLX5_CMD_OP_CREATE_TIR,
    MLX5_CMD_OP_CREATE_TIS,
    MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_DESTROY_RQ,
    MLX5_CMD_OP_DESTROY_SQ,
    MLX5_CMD_OP_MODIFY_RQ,
    MLX5_CMD_OP_MODIFY_SQ,
    MLX5_CMD_OP_QUERY_RQ,
    MLX5_CMD_OP_QUERY_SQ,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


@traced
def mlx5_core_alloc_transport_domain(dev: mlx5_core_dev, uid: int = 0) -> int:
    """Mirrors mlx5_core_alloc_transport_domain(): ALLOC_TRANSPORT_DOMAIN; its number."""
    in_, out = IfcStruct("alloc_transport_domain_in"), IfcStruct("alloc_transport_domain_out")
    MLX5_SET("alloc_transport_domain_in", in_, "opcode", MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN)
    MLX5_SET("alloc_transport_domain_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("alloc_transport_domain_out", out, "transport_domain")


@traced
def mlx5_core_dealloc_transport_domain(dev: mlx5_core_dev, tdn: int, uid: int = 0) -> None:
    """Mirrors mlx5_core_dealloc_transport_domain(): DEALLOC_TRANSPORT_DOMAIN."""
    in_ = IfcStruct("dealloc_transport_domain_in")
    MLX5_SET("dealloc_transport_domain_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN)
    MLX5_SET("dealloc_transport_domain_in", in_, "uid", uid)
    MLX5_SET("dealloc_transport_domain_in", in_, "transport_domain", tdn)
    mlx5_cmd_exec(dev, in_, IfcStruct("dealloc_transport_domain_out"))


# -- RQ, SQ -----------------------------------------------------------------------------------
@traced
def mlx5_core_create_rq(dev: mlx5_core_dev, in_: IfcStruct) -> int:
    """Mirrors mlx5_core_create_rq(): CREATE_RQ; the rqn."""
    out = IfcStruct("create_rq_out")
    MLX5_SET("create_rq_in", in_, "opcode", MLX5_CMD_OP_CREATE_RQ)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("create_rq_out", out, "rqn")


@traced
def mlx5_core_modify_rq(dev: mlx5_core_dev, rqn: int, in_: IfcStruct) -> None:
    """Mirrors mlx5_core_modify_rq(): MODIFY_RQ of rqn."""
    MLX5_SET("modify_rq_in", in_, "rqn", rqn)
    MLX5_SET("modify_rq_in", in_, "opcode", MLX5_CMD_OP_MODIFY_RQ)
    mlx5_cmd_exec(dev, in_, IfcStruct("modify_rq_out"))


@traced
def mlx5_core_destroy_rq(dev: mlx5_core_dev, rqn: int, uid: int = 0) -> None:
    """Mirrors mlx5_core_destroy_rq() (with uid: qpc.c's destroy_rq_tracked)."""
    in_ = IfcStruct("destroy_rq_in")
    MLX5_SET("destroy_rq_in", in_, "opcode", MLX5_CMD_OP_DESTROY_RQ)
    MLX5_SET("destroy_rq_in", in_, "rqn", rqn)
    MLX5_SET("destroy_rq_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_rq_out"))


@traced
def mlx5_core_query_rq(dev: mlx5_core_dev, rqn: int) -> IfcStruct:
    """Mirrors mlx5_core_query_rq(): QUERY_RQ (no uid: the kernel may query any RQ);
    the output (rq_context)."""
    in_, out = IfcStruct("query_rq_in"), IfcStruct("query_rq_out")
    MLX5_SET("query_rq_in", in_, "opcode", MLX5_CMD_OP_QUERY_RQ)
    MLX5_SET("query_rq_in", in_, "rqn", rqn)
    mlx5_cmd_exec(dev, in_, out)
    return out


@traced
def mlx5_core_create_sq(dev: mlx5_core_dev, in_: IfcStruct) -> int:
    """Mirrors mlx5_core_create_sq(): CREATE_SQ; the sqn."""
    out = IfcStruct("create_sq_out")
    MLX5_SET("create_sq_in", in_, "opcode", MLX5_CMD_OP_CREATE_SQ)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("create_sq_out", out, "sqn")


@traced
def mlx5_core_modify_sq(dev: mlx5_core_dev, sqn: int, in_: IfcStruct) -> None:
    """Mirrors mlx5_core_modify_sq(): MODIFY_SQ of sqn."""
    MLX5_SET("modify_sq_in", in_, "sqn", sqn)
    MLX5_SET("modify_sq_in", in_, "opcode", MLX5_CMD_OP_MODIFY_SQ)
    mlx5_cmd_exec(dev, in_, IfcStruct("modify_sq_out"))


@traced
def mlx5_core_destroy_sq(dev: mlx5_core_dev, sqn: int, uid: int = 0) -> None:
    """Mirrors mlx5_core_destroy_sq() (with uid: qpc.c's destroy_sq_tracked)."""
    in_ = IfcStruct("destroy_sq_in")
    MLX5_SET("destroy_sq_in", in_, "opcode", MLX5_CMD_OP_DESTROY_SQ)
    MLX5_SET("destroy_sq_in", in_, "sqn", sqn)
    MLX5_SET("destroy_sq_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_sq_out"))


@traced
def mlx5_core_query_sq_state(dev: mlx5_core_dev, sqn: int) -> int:
    """Mirrors mlx5_core_query_sq_state(): QUERY_SQ (no uid: the kernel may query any
    SQ); the SQ's state."""
    in_, out = IfcStruct("query_sq_in"), IfcStruct("query_sq_out")
    MLX5_SET("query_sq_in", in_, "opcode", MLX5_CMD_OP_QUERY_SQ)
    MLX5_SET("query_sq_in", in_, "sqn", sqn)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("sqc", MLX5_ADDR_OF("query_sq_out", out, "sq_context"), "state")


# -- TIR, TIS ---------------------------------------------------------------------------------
@traced
def mlx5_core_create_tir(dev: mlx5_core_dev, in_: IfcStruct) -> int:
    """Mirrors mlx5_core_create_tir(): CREATE_TIR; the tirn."""
    out = IfcStruct("create_tir_out")
    MLX5_SET("create_tir_in", in_, "opcode", MLX5_CMD_OP_CREATE_TIR)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("create_tir_out", out, "tirn")


@traced
def mlx5_core_create_tis(dev: mlx5_core_dev, in_: IfcStruct) -> int:
    """Mirrors mlx5_core_create_tis(): CREATE_TIS; the tisn."""
    out = IfcStruct("create_tis_out")
    MLX5_SET("create_tis_in", in_, "opcode", MLX5_CMD_OP_CREATE_TIS)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("create_tis_out", out, "tisn")


@traced
def mlx5_core_create_rqt(dev: mlx5_core_dev, in_: IfcStruct) -> int:
    """Mirrors mlx5_core_create_rqt(): CREATE_RQT; the rqtn."""
    out = IfcStruct("create_rqt_out")
    MLX5_SET("create_rqt_in", in_, "opcode", MLX5_CMD_OP_CREATE_RQT)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("create_rqt_out", out, "rqtn")

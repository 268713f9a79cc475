"""Mirrors drivers/infiniband/hw/mlx5/cmd.c: the firmware commands mlx5_ib issues itself.

Each is one mailbox through mlx5_cmd_exec (a failing status raises the
errno mlx5_core maps it to).  User-context objects carry the context's DEVX
uid, so the firmware ties them to that user context and refuses another's.
"""

from __future__ import annotations

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import mlx5_core_dev
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_ALLOC_UAR,
    MLX5_CMD_OP_DEALLOC_PD,
    MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_DEALLOC_UAR,
    MLX5_CMD_OP_DESTROY_RQT,
    MLX5_CMD_OP_DESTROY_TIR,
    MLX5_CMD_OP_DESTROY_TIS,
    MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.trace import traced


@traced
def mlx5_cmd_dump_fill_mkey(dev: mlx5_core_dev) -> int:
    """Mirrors mlx5_cmd_dump_fill_mkey(): QUERY_SPECIAL_CONTEXTS' dump_fill_mkey."""
    in_, out = IfcStruct("query_special_contexts_in"), IfcStruct("query_special_contexts_out")
    MLX5_SET("query_special_contexts_in", in_, "opcode", MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("query_special_contexts_out", out, "dump_fill_mkey")


@traced
def mlx5_cmd_null_mkey(dev: mlx5_core_dev) -> int:
    """Mirrors mlx5_cmd_null_mkey(): QUERY_SPECIAL_CONTEXTS' null_mkey (an access through
    it faults: the KSM entries of an implicit ODP MR with no child yet)."""
    in_, out = IfcStruct("query_special_contexts_in"), IfcStruct("query_special_contexts_out")
    MLX5_SET("query_special_contexts_in", in_, "opcode", MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("query_special_contexts_out", out, "null_mkey")


@traced
def mlx5_cmd_alloc_transport_domain(dev: mlx5_core_dev, uid: int) -> int:
    """Mirrors mlx5_cmd_alloc_transport_domain(): ALLOC_TRANSPORT_DOMAIN; the tdn."""
    in_, out = IfcStruct("alloc_transport_domain_in"), IfcStruct("alloc_transport_domain_out")
    MLX5_SET("alloc_transport_domain_in", in_, "opcode", MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN)
    MLX5_SET("alloc_transport_domain_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("alloc_transport_domain_out", out, "transport_domain")


@traced
def mlx5_cmd_dealloc_transport_domain(dev: mlx5_core_dev, tdn: int, uid: int) -> None:
    """Mirrors mlx5_cmd_dealloc_transport_domain(): DEALLOC_TRANSPORT_DOMAIN."""
    in_ = IfcStruct("dealloc_transport_domain_in")
    MLX5_SET("dealloc_transport_domain_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN)
    MLX5_SET("dealloc_transport_domain_in", in_, "uid", uid)
    MLX5_SET("dealloc_transport_domain_in", in_, "transport_domain", tdn)
    mlx5_cmd_exec(dev, in_, IfcStruct("dealloc_transport_domain_out"))


@traced
def mlx5_cmd_dealloc_pd(dev: mlx5_core_dev, pdn: int, uid: int) -> None:
    """Mirrors mlx5_cmd_dealloc_pd(): DEALLOC_PD with the PD's uid."""
    in_ = IfcStruct("dealloc_pd_in")
    MLX5_SET("dealloc_pd_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_PD)
    MLX5_SET("dealloc_pd_in", in_, "pd", pdn)
    MLX5_SET("dealloc_pd_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("dealloc_pd_out"))


@traced
def mlx5_cmd_uar_alloc(dev: mlx5_core_dev, uid: int) -> int:
    """Mirrors mlx5_cmd_uar_alloc(): ALLOC_UAR for a user context; the FW UAR index."""
    in_, out = IfcStruct("alloc_uar_in"), IfcStruct("alloc_uar_out")
    MLX5_SET("alloc_uar_in", in_, "opcode", MLX5_CMD_OP_ALLOC_UAR)
    MLX5_SET("alloc_uar_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("alloc_uar_out", out, "uar")


@traced
def mlx5_cmd_uar_dealloc(dev: mlx5_core_dev, uarn: int, uid: int) -> None:
    """Mirrors mlx5_cmd_uar_dealloc(): DEALLOC_UAR."""
    in_ = IfcStruct("dealloc_uar_in")
    MLX5_SET("dealloc_uar_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_UAR)
    MLX5_SET("dealloc_uar_in", in_, "uar", uarn)
    MLX5_SET("dealloc_uar_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("dealloc_uar_out"))


@traced
def mlx5_cmd_destroy_tir(dev: mlx5_core_dev, tirn: int, uid: int) -> None:
    """Mirrors mlx5_cmd_destroy_tir(): DESTROY_TIR with the owner's uid."""
    in_ = IfcStruct("destroy_tir_in")
    MLX5_SET("destroy_tir_in", in_, "opcode", MLX5_CMD_OP_DESTROY_TIR)
    MLX5_SET("destroy_tir_in", in_, "tirn", tirn)
    MLX5_SET("destroy_tir_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_tir_out"))


@traced
def mlx5_cmd_destroy_tis(dev: mlx5_core_dev, tisn: int, uid: int) -> None:
    """Mirrors mlx5_cmd_destroy_tis(): DESTROY_TIS with the owner's uid."""
    in_ = IfcStruct("destroy_tis_in")
    MLX5_SET("destroy_tis_in", in_, "opcode", MLX5_CMD_OP_DESTROY_TIS)
    MLX5_SET("destroy_tis_in", in_, "tisn", tisn)
    MLX5_SET("destroy_tis_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_tis_out"))


@traced
def mlx5_cmd_destroy_rqt(dev: mlx5_core_dev, rqtn: int, uid: int) -> None:
    """Mirrors mlx5_cmd_destroy_rqt(): DESTROY_RQT with the owner's uid."""
    in_ = IfcStruct("destroy_rqt_in")
    MLX5_SET("destroy_rqt_in", in_, "opcode", MLX5_CMD_OP_DESTROY_RQT)
    MLX5_SET("destroy_rqt_in", in_, "rqtn", rqtn)
    MLX5_SET("destroy_rqt_in", in_, "uid", uid)
    mlx5_cmd_exec(dev, in_, IfcStruct("destroy_rqt_out"))

"""pyverbs.providers.mlx5.mlx5dv: mlx5 direct verbs (mlx5dv_open_device, DevX,
UAR/VAR/PP allocation, DC, raw WQEs).

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from typing import Any

from userspace.pyverbs.base import AttrStruct, NotEmulated, unsupported


class Mlx5CQ(NotEmulated):
    """Mirrors pyverbs' Mlx5CQ: not emulated."""

    _VERB = "create Mlx5CQ"


class Mlx5Context(NotEmulated):
    """Mirrors pyverbs' Mlx5Context: not emulated."""

    _VERB = "create Mlx5Context"


class Mlx5Cqe64(AttrStruct):
    """Mirrors pyverbs' Mlx5Cqe64."""

    _FIELDS = ('addr',)


class Mlx5DCIStreamInitAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DCIStreamInitAttr."""

    _FIELDS = ('log_num_concurent', 'log_num_errored')


class Mlx5DVCQInitAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DVCQInitAttr."""

    _FIELDS = ('comp_mask', 'cqe_comp_res_format', 'flags', 'cqe_size')


class Mlx5DVContext(NotEmulated):
    """Mirrors pyverbs' Mlx5DVContext: not emulated."""

    _VERB = "create Mlx5DVContext"


class Mlx5DVContextAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DVContextAttr."""

    _FIELDS = ('flags', 'comp_mask')


class Mlx5DVDCInitAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DVDCInitAttr."""

    _FIELDS = ('dc_type', 'dct_access_key', 'dci_streams')


class Mlx5DVPortAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DVPortAttr."""

    _FIELDS = ()


class Mlx5DVQPInitAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DVQPInitAttr."""

    _FIELDS = ('comp_mask', 'create_flags', 'dc_init_attr', 'send_ops_flags')


class Mlx5DevxEq(NotEmulated):
    """Mirrors pyverbs' Mlx5DevxEq: not emulated."""

    _VERB = "create Mlx5DevxEq"


class Mlx5DevxMsiVector(NotEmulated):
    """Mirrors pyverbs' Mlx5DevxMsiVector: not emulated."""

    _VERB = "create Mlx5DevxMsiVector"


class Mlx5DevxObj(NotEmulated):
    """Mirrors pyverbs' Mlx5DevxObj: not emulated."""

    _VERB = "create Mlx5DevxObj"


class Mlx5DmOpAddr(AttrStruct):
    """Mirrors pyverbs' Mlx5DmOpAddr."""

    _FIELDS = ('dm', 'op')


class Mlx5PP(NotEmulated):
    """Mirrors pyverbs' Mlx5PP: not emulated."""

    _VERB = "create Mlx5PP"


class Mlx5QP(NotEmulated):
    """Mirrors pyverbs' Mlx5QP: not emulated."""

    _VERB = "create Mlx5QP"


class Mlx5UAR(NotEmulated):
    """Mirrors pyverbs' Mlx5UAR: not emulated."""

    _VERB = "create Mlx5UAR"


class Mlx5UMEM(NotEmulated):
    """Mirrors pyverbs' Mlx5UMEM: not emulated."""

    _VERB = "create Mlx5UMEM"


class Mlx5VAR(NotEmulated):
    """Mirrors pyverbs' Mlx5VAR: not emulated."""

    _VERB = "create Mlx5VAR"


class Mlx5VfioAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5VfioAttr."""

    _FIELDS = ()


class Wqe(AttrStruct):
    """Mirrors pyverbs' Wqe."""

    _FIELDS = ('segments', 'addr')


class WqeCtrlSeg(AttrStruct):
    """Mirrors pyverbs' WqeCtrlSeg."""

    _FIELDS = ('pi', 'opcode', 'opmod', 'qp_num', 'fm_ce_se', 'ds', 'signature', 'imm')


class WqeDataSeg(AttrStruct):
    """Mirrors pyverbs' WqeDataSeg."""

    _FIELDS = ('length', 'lkey', 'addr')


class WqeSeg(AttrStruct):
    """Mirrors pyverbs' WqeSeg."""

    _FIELDS = ()


def bitmask_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("bitmask_to_str: not emulated")


def context_comp_mask_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("context_comp_mask_to_str: not emulated")


def context_flags_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("context_flags_to_str: not emulated")


def cqe_comp_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("cqe_comp_to_str: not emulated")


def dc_type_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("dc_type_to_str: not emulated")


def qp_comp_mask_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("qp_comp_mask_to_str: not emulated")


def qp_create_flags_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("qp_create_flags_to_str: not emulated")


def qpts_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("qpts_to_str: not emulated")


def send_ops_flags_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("send_ops_flags_to_str: not emulated")


def swp_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("swp_to_str: not emulated")


def tunnel_offloads_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("tunnel_offloads_to_str: not emulated")

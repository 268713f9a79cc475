"""pyverbs.providers.mlx5.mlx5dv_objects: mlx5dv_init_obj: the provider's raw QP/CQ/SRQ
layouts.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import NotEmulated


class Mlx5DvCQ(NotEmulated):
    """Mirrors pyverbs' Mlx5DvCQ: not emulated."""

    _VERB = "create Mlx5DvCQ"


class Mlx5DvObj(NotEmulated):
    """Mirrors pyverbs' Mlx5DvObj: not emulated."""

    _VERB = "create Mlx5DvObj"


class Mlx5DvPD(NotEmulated):
    """Mirrors pyverbs' Mlx5DvPD: not emulated."""

    _VERB = "create Mlx5DvPD"


class Mlx5DvQP(NotEmulated):
    """Mirrors pyverbs' Mlx5DvQP: not emulated."""

    _VERB = "create Mlx5DvQP"


class Mlx5DvSRQ(NotEmulated):
    """Mirrors pyverbs' Mlx5DvSRQ: not emulated."""

    _VERB = "create Mlx5DvSRQ"

"""pyverbs.providers.mlx5.mlx5dv_sched: mlx5 QoS scheduling elements: not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class Mlx5dvSchedAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5dvSchedAttr."""

    _FIELDS = ('parent_sched_node', 'bw_share', 'max_avg_bw', 'flags', 'comp_mask')


class Mlx5dvSchedLeaf(NotEmulated):
    """Mirrors pyverbs' Mlx5dvSchedLeaf: not emulated."""

    _VERB = "create Mlx5dvSchedLeaf"


class Mlx5dvSchedNode(NotEmulated):
    """Mirrors pyverbs' Mlx5dvSchedNode: not emulated."""

    _VERB = "create Mlx5dvSchedNode"

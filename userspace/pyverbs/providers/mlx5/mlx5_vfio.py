"""pyverbs.providers.mlx5.mlx5_vfio: the mlx5 VFIO driver (a user-space mlx5 over
/dev/vfio): not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class Mlx5VfioAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5VfioAttr."""

    _FIELDS = ('pci_name', 'flags', 'comp_mask')


class Mlx5VfioContext(NotEmulated):
    """Mirrors pyverbs' Mlx5VfioContext: not emulated."""

    _VERB = "create Mlx5VfioContext"

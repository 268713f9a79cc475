"""pyverbs.providers.mlx5.dr_domain: mlx5 software steering (DR): not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import NotEmulated


class DrDomain(NotEmulated):
    """Mirrors pyverbs' DrDomain (mlx5dv_dr_domain_create): not emulated."""

    _VERB = "create DrDomain"

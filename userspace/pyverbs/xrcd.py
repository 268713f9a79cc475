"""pyverbs.xrcd: XRC domains (ibv_open_xrcd): not emulated yet.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class XRCD(NotEmulated):
    """Mirrors pyverbs' XRCD: not emulated."""

    _VERB = "create XRCD"


class XRCDInitAttr(AttrStruct):
    """Mirrors pyverbs' XRCDInitAttr."""

    _FIELDS = ('comp_mask', 'oflags', 'fd')

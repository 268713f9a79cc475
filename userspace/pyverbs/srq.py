"""pyverbs.srq: shared receive queues (ibv_create_srq, XRC SRQs, tag matching): not
emulated yet.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class OpsWr(NotEmulated):
    """Mirrors pyverbs' OpsWr: not emulated."""

    _VERB = "create OpsWr"


class SRQ(NotEmulated):
    """Mirrors pyverbs' SRQ: not emulated."""

    _VERB = "create SRQ"


class SrqAttr(AttrStruct):
    """Mirrors pyverbs' SrqAttr."""

    _FIELDS = ('max_wr', 'max_sge', 'srq_limit')


class SrqInitAttr(AttrStruct):
    """Mirrors pyverbs' SrqInitAttr."""

    _FIELDS = ('attr',)


class SrqInitAttrEx(AttrStruct):
    """Mirrors pyverbs' SrqInitAttrEx."""

    _FIELDS = ('max_wr', 'max_sge', 'srq_limit')

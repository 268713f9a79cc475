"""pyverbs.cmid: librdmacm's connection manager (CMID, event channels): the emulated
host has no netdev or IP stack for rdma_cm to resolve addresses over.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class AddrInfo(AttrStruct):
    """Mirrors pyverbs' AddrInfo."""

    _FIELDS = ('src', 'dst', 'src_service', 'dst_service', 'port_space', 'flags')


class CMEvent(NotEmulated):
    """Mirrors pyverbs' CMEvent: not emulated."""

    _VERB = "create CMEvent"


class CMEventChannel(NotEmulated):
    """Mirrors pyverbs' CMEventChannel: not emulated."""

    _VERB = "create CMEventChannel"


class CMID(NotEmulated):
    """Mirrors pyverbs' CMID: not emulated."""

    _VERB = "create CMID"


class ConnParam(AttrStruct):
    """Mirrors pyverbs' ConnParam."""

    _FIELDS = ('resources', 'depth', 'flow_control', 'retry', 'rnr_retry', 'srq', 'qp_num',
               'data_len')


class JoinMCAttrEx(AttrStruct):
    """Mirrors pyverbs' JoinMCAttrEx."""

    _FIELDS = ('addr', 'comp_mask', 'join_flags')


class UDParam(AttrStruct):
    """Mirrors pyverbs' UDParam."""

    _FIELDS = ('cm_event',)
